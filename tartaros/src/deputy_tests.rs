//! The descriptor walks of deputy.rs, in a temporary directory (no root
//! needed): what they make, and that a symlink anywhere on the way makes
//! nothing outside.

use super::*;
use std::os::unix::fs::MetadataExt;

fn base() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    (dir, base)
}

fn names<'a>(list: &[&'a str]) -> Vec<&'a OsStr> {
    list.iter().map(|s| OsStr::new(*s)).collect()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn me() -> Identity {
    Identity {
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
    }
}

#[test]
fn only_the_missing_levels_are_made_and_listed() {
    let (_keep, base) = base();
    std::fs::create_dir_all(base.join("root/.git")).unwrap();
    let root = base.join("root");
    let walked = make_dirs(&root, &names(&[".git", "hooks", "pre"]), Some(me())).unwrap();
    assert_eq!(
        walked.created,
        vec![root.join(".git/hooks"), root.join(".git/hooks/pre")]
    );
    assert!(root.join(".git/hooks/pre").is_dir());
    let meta = std::fs::metadata(root.join(".git/hooks/pre")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (me().uid, me().gid));
    // A second walk finds everything there and makes nothing.
    let again = make_dirs(&root, &names(&[".git", "hooks", "pre"]), None).unwrap();
    assert!(again.created.is_empty());
}

#[test]
fn a_symlinked_component_makes_nothing_outside() {
    let (_keep, base) = base();
    let outside = base.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir_all(base.join("root/a")).unwrap();
    std::os::unix::fs::symlink(&outside, base.join("root/a/link")).unwrap();
    let root = base.join("root");
    let err = make_dirs(&root, &names(&["a", "link", "x"]), Some(me()))
        .err()
        .unwrap();
    let (path, source) = err.into_parts();
    assert_eq!(path, root.join("a/link"));
    assert_eq!(source.raw_os_error(), Some(libc::ELOOP));
    // A link as the last name is refused too, not followed.
    let last = make_dirs(&root, &names(&["a", "link"]), None)
        .err()
        .unwrap();
    assert_eq!(last.into_parts().1.raw_os_error(), Some(libc::ELOOP));
    assert!(entries(&outside).is_empty());
    assert_eq!(entries(&root.join("a")), vec!["link".to_string()]);
}

#[test]
fn a_failed_walk_removes_the_levels_it_made() {
    let (_keep, base) = base();
    let outside = base.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir_all(base.join("root")).unwrap();
    let root = base.join("root");
    // `..` is refused after `made` was created: `made` is removed again.
    let err = make_dirs(&root, &names(&["made", "..", "x"]), None)
        .err()
        .unwrap();
    assert_eq!(err.into_parts().1.raw_os_error(), Some(libc::EINVAL));
    assert!(entries(&root).is_empty());
    assert!(entries(&outside).is_empty());
}

#[test]
fn a_root_reached_through_a_symlink_is_refused() {
    let (_keep, base) = base();
    std::fs::create_dir_all(base.join("real")).unwrap();
    std::os::unix::fs::symlink(base.join("real"), base.join("alias")).unwrap();
    let err = make_dirs(&base.join("alias"), &names(&["x"]), None)
        .err()
        .unwrap();
    assert_eq!(err.into_parts().1.raw_os_error(), Some(libc::ELOOP));
    assert!(entries(&base.join("real")).is_empty());
}

#[test]
fn only_an_empty_directory_of_ours_is_given_away() {
    let (_keep, base) = base();
    std::fs::create_dir_all(base.join("full/x")).unwrap();
    std::fs::create_dir_all(base.join("empty")).unwrap();
    let open = |p: &Path| OwnedFd::from(File::open(p).unwrap());
    assert_eq!(
        give(&open(&base.join("full")), me()),
        Err(nix::Error::EEXIST)
    );
    assert_eq!(give(&open(&base.join("empty")), me()), Ok(()));
}

#[test]
fn a_mount_point_file_is_made_without_following_links() {
    let (_keep, base) = base();
    make_mount_point(&base.join("a/b/file"), false).unwrap();
    assert!(base.join("a/b/file").is_file());
    make_mount_point(&base.join("a/c/d"), true).unwrap();
    assert!(base.join("a/c/d").is_dir());
    std::fs::create_dir(base.join("outside")).unwrap();
    std::os::unix::fs::symlink(base.join("outside"), base.join("a/link")).unwrap();
    assert!(make_mount_point(&base.join("a/link/x"), true).is_err());
    assert!(make_mount_point(&base.join("a/link/y"), false).is_err());
    assert!(entries(&base.join("outside")).is_empty());
}

#[test]
fn a_created_file_is_removed_from_where_it_was_made_only() {
    let (_keep, base) = base();
    let flags = libc::O_WRONLY | libc::O_APPEND;
    std::fs::create_dir_all(base.join("d")).unwrap();
    std::fs::create_dir_all(base.join("victims")).unwrap();
    std::fs::write(base.join("victims/log"), "keep").unwrap();
    let (_file, created) = create_file(&base.join("d/log"), flags, 0o600).unwrap();
    assert_eq!(
        std::fs::metadata(base.join("d/log")).unwrap().mode() & 0o777,
        0o600
    );
    // The log's directory is swapped for a link to the victims'.
    std::fs::rename(base.join("d"), base.join("moved")).unwrap();
    std::os::unix::fs::symlink(base.join("victims"), base.join("d")).unwrap();
    assert!(created.remove());
    assert_eq!(
        std::fs::read_to_string(base.join("victims/log")).unwrap(),
        "keep"
    );
    assert!(!base.join("moved/log").exists());
}

#[test]
fn a_created_file_replaced_under_its_name_is_left_alone() {
    let (_keep, base) = base();
    let (_file, created) = create_file(&base.join("log"), libc::O_WRONLY, 0o600).unwrap();
    std::fs::write(base.join("other"), "keep").unwrap();
    std::fs::rename(base.join("other"), base.join("log")).unwrap();
    assert!(!created.remove());
    assert_eq!(std::fs::read_to_string(base.join("log")).unwrap(), "keep");
}

#[test]
fn an_existing_name_or_a_link_is_never_created_through() {
    let (_keep, base) = base();
    std::fs::write(base.join("there"), "x").unwrap();
    std::os::unix::fs::symlink(base.join("target"), base.join("link")).unwrap();
    for name in ["there", "link"] {
        let err = create_file(&base.join(name), libc::O_WRONLY, 0o600).err();
        assert_eq!(
            err.map(|e| e.kind()),
            Some(std::io::ErrorKind::AlreadyExists),
            "{name}"
        );
    }
    assert!(!base.join("target").exists());
}
