use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;

use super::*;
use crate::effectlog::Target;

/// An allowed `setxattr` record of `name` on `path`, named by the kernel.
fn set(path: &Path, name: &str, shared: bool) -> Record {
    let mut target = Target::new();
    target.insert("path", path.to_string_lossy().into_owned());
    target.insert("path_source", "kernel");
    target.insert("op", "set");
    target.insert("name", name.to_string());
    if shared {
        target.insert("name_shared", true);
    }
    Record {
        kind: "xattr",
        pid: 10,
        ppid: 1,
        uid: 0,
        mono_ns: 5,
        wall_ns: 5,
        decision: Decision::Allowed,
        errno: 0,
        target,
    }
}

fn flag(r: &Record, key: &str) -> bool {
    r.target.get(key) == Some(&Value::from(true))
}

#[test]
fn a_name_someone_else_could_rewrite_is_unproven_though_the_file_shows_it() {
    // Round 23: a forked child flipped `user.A` to `user.B` in a shared
    // page while the call ran; the file had `user.A` from before, so the
    // record of a set of `user.A` passed the existence check.
    let dir = std::env::temp_dir().join(format!("tartaros-xattr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("f");
    std::fs::write(&file, b"").unwrap();
    let path = CString::new(file.as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated strings and a one-byte value that outlive the call.
    let rc = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"user.A".as_ptr(),
            c"h".as_ptr().cast(),
            1,
            0,
        )
    };
    if rc != 0 {
        eprintln!("skipping: no user xattrs on {}", dir.display());
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    let mut j = Join::new(0);
    let mut out = vec![set(&file, "user.A", true), set(&file, "user.A", false)];
    j.prove_arguments(&mut out, 10, true);
    std::fs::remove_dir_all(&dir).unwrap();
    let shared = out.iter().find(|r| flag(r, "name_shared")).unwrap();
    assert!(flag(shared, "name_unproven"), "{shared:?}");
    assert_eq!(
        shared.target.get("name_source"),
        Some(&Value::from("agent"))
    );
    // Alone in private memory, the name read is the one the kernel copied.
    let alone = out.iter().find(|r| !flag(r, "name_shared")).unwrap();
    assert!(!flag(alone, "name_unproven"), "{alone:?}");
    assert_eq!(
        alone.target.get("name_source"),
        Some(&Value::from("kernel"))
    );
}
