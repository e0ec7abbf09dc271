//! The unix policy's mirrors: every directory under which the agent may
//! reach pathname sockets (the writable roots, the private /tmp, the
//! `--tmpfs` directories) shown a second time at `/dev/.u/<slot>`,
//! read-only and with `MOUNT_ATTR_NOSYMFOLLOW` (Linux 5.10). The eBPF unix
//! programs rewrite an allowed name `<root>/<rest>` to
//! `/dev/.u/<slot>/<rest>` before the kernel looks it up
//! (tartaros-ebpf/src/unix.rs), so no symlink under a root, planted before
//! or after the start, can lead a connect to a host socket: the lookup
//! fails with ELOOP at the link. The mirror grants nothing (read-only,
//! `nodev`, `noexec`), and cannot be reached by its own name (the policy
//! allows only the roots' names).
//!
//! No mount below a root is the root: a mirror is a copy of the root's own
//! mount alone (not recursive), and every other mount below the root (a
//! host mount under the project, a `--bind` target, a read deny's cover)
//! is covered in it by an empty read-only mount ([`covers`]), so a socket
//! name through such a mount point finds nothing (ENOENT), neither the
//! foreign mount's sockets nor what it hides in the root. Only a bind of a
//! directory onto itself (a pin, a write deny) shows the root's own
//! directory and is looked through. A root nested in another has a slot of
//! its own, matched first (slots are longest first, `kernel_watch.rs`).
//! See docs/ebpf.md, "No mount below a root is the root".
//!
//! Made by the init, as root in its mount namespace, after the mount plan
//! and the scope; the mount points are made with the private /dev.

use std::path::{Path, PathBuf};

use crate::mount_tree::{self, NO_DEV, NO_EXEC, NO_SUID, NO_SYMFOLLOW, READ_ONLY};

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("failed to {what} {path} for the unix socket policy: {source}")]
    Mount {
        what: &'static str,
        path: PathBuf,
        source: nix::Error,
    },
    #[error("failed to read the mount table {MOUNTINFO} for the unix socket policy: {0}")]
    Table(std::io::Error),
    #[error("failed to parse the line {0:?} of {MOUNTINFO} for the unix socket policy")]
    Line(String),
    #[error("failed to find the mount {id} of {path} in {MOUNTINFO} for the unix socket policy")]
    Missing { id: u64, path: PathBuf },
}

/// The init's own mount table (the fresh /proc of its PID namespace).
const MOUNTINFO: &str = "/proc/self/mountinfo";

/// The mirror of slot `slot` (the prefix the unix programs write).
pub fn point(slot: usize) -> PathBuf {
    let dir = String::from_utf8_lossy(tartaros_common::capture::UNIX_MIRROR);
    PathBuf::from(format!("{dir}{slot}"))
}

/// Mount points for `count` slots, made in the private /dev.
pub fn points(count: usize) -> Vec<PathBuf> {
    (0..count).map(point).collect()
}

fn fail<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> MirrorError + 'a {
    move |source| MirrorError::Mount {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Mirrors `dirs[slot]` at [`point`]`(slot)`, in slot order (the order of
/// the unix programs' prefixes), each with its foreign submounts covered.
pub fn apply(dirs: &[PathBuf]) -> Result<(), MirrorError> {
    if dirs.is_empty() {
        return Ok(());
    }
    // Read before any mirror exists, so none is taken for a root's mount.
    let text = std::fs::read_to_string(MOUNTINFO).map_err(MirrorError::Table)?;
    let table = parse_mountinfo(&text)?;
    for (slot, dir) in dirs.iter().enumerate() {
        let at = mount_tree::open_no_symlinks(dir).map_err(fail("open", dir))?;
        // A root that is a file (`--write ./notes.txt`) has no name below
        // it, so no socket to mirror: its slot stays the empty directory
        // of the private /dev, where every rewritten name finds nothing.
        // (A file cannot be mounted onto that directory: EINVAL.)
        if !is_directory(&at).map_err(fail("inspect", dir))? {
            continue;
        }
        let top = mount_tree::mount_id(&at).map_err(fail("find the mount of", dir))?;
        let hidden = covers(&table, top, dir)?;
        // The root's own mount alone. Only a root init gets here (the
        // policy is eBPF): in a user namespace the kernel would refuse this
        // copy (EINVAL) when host mounts are locked below the root.
        let copy = mount_tree::clone_tree(&at, false).map_err(fail("copy", dir))?;
        mount_tree::set_flags(
            &copy,
            READ_ONLY | NO_SUID | NO_DEV | NO_EXEC | NO_SYMFOLLOW,
            0,
            true,
        )
        .map_err(fail("make symlink-free", dir))?;
        let point = point(slot);
        let onto = mount_tree::open_no_symlinks(&point).map_err(fail("open", &point))?;
        mount_tree::attach(&copy, &onto).map_err(fail("mount the mirror of", dir))?;
        // Before the agent exists: nothing can move these names meanwhile.
        for below in hidden {
            let path = point.join(&below);
            let at = mount_tree::open_no_symlinks(&path).map_err(fail("open", &path))?;
            mount_tree::cover(&at).map_err(fail("cover the foreign mount at", &dir.join(below)))?;
        }
    }
    Ok(())
}

fn is_directory(at: &std::os::fd::OwnedFd) -> Result<bool, nix::Error> {
    use std::os::fd::AsRawFd;
    let st = nix::sys::stat::fstat(at.as_raw_fd())?;
    Ok(st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

/// One line of the mount table, as far as the covers need it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountLine {
    id: u64,
    parent: u64,
    /// `major:minor` of its filesystem.
    dev: String,
    /// The directory of that filesystem the mount shows.
    root: PathBuf,
    /// Where it is mounted.
    point: PathBuf,
}

/// `/proc/self/mountinfo`: a line the covers cannot read fails the start
/// (it could be a foreign mount).
fn parse_mountinfo(text: &str) -> Result<Vec<MountLine>, MirrorError> {
    text.lines()
        .filter(|line| !line.is_empty())
        .map(|line| {
            let mut fields = line.split(' ');
            let mut next = || {
                fields
                    .next()
                    .ok_or_else(|| MirrorError::Line(line.to_owned()))
            };
            let (id, parent, dev, root, point) = (next()?, next()?, next()?, next()?, next()?);
            let number = |s: &str| s.parse().map_err(|_| MirrorError::Line(line.to_owned()));
            Ok(MountLine {
                id: number(id)?,
                parent: number(parent)?,
                dev: dev.to_owned(),
                root: unescape(root),
                point: unescape(point),
            })
        })
        .collect()
}

/// Undoes the kernel's octal escapes (`\040` for a space, `\134` for a
/// backslash...) in a mountinfo path.
pub(crate) fn unescape(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                let value = d.iter().fold(0u32, |v, b| v * 8 + u32::from(b - b'0'));
                out.push(value as u8);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Whether `child` (mounted on `parent`) shows the very directory of
/// `parent`'s filesystem that it is mounted on: a bind of a directory onto
/// itself, such as a pin or a write deny, through which the root's own
/// mount shows the same names.
fn shows_itself(parent: &MountLine, child: &MountLine) -> bool {
    let Ok(below) = child.point.strip_prefix(&parent.point) else {
        return false;
    };
    child.dev == parent.dev && child.root == parent.root.join(below)
}

/// The mount points below `root` (relative to it, outermost first, none
/// below another) that show something other than the root's own mount
/// `top`: every mount below it, except that a bind of a directory onto
/// itself is looked through (its own submounts are judged the same way).
/// The mirror, a copy of `top` alone, covers each of them.
fn covers(table: &[MountLine], top: u64, root: &Path) -> Result<Vec<PathBuf>, MirrorError> {
    let find = |id: u64| table.iter().find(|m| m.id == id);
    if find(top).is_none() {
        return Err(MirrorError::Missing {
            id: top,
            path: root.to_path_buf(),
        });
    }
    let mut found = Vec::new();
    let mut through = vec![top];
    while let Some(id) = through.pop() {
        let Some(parent) = find(id) else { continue };
        let children = table
            .iter()
            .filter(|m| m.parent == id && m.id != id && m.point.starts_with(root));
        for child in children {
            if shows_itself(parent, child) {
                through.push(child.id);
            } else if let Ok(below) = child.point.strip_prefix(root) {
                found.push(below.to_path_buf());
            }
        }
    }
    found.sort();
    found.dedup();
    let mut outermost: Vec<PathBuf> = Vec::new();
    for path in found {
        if !outermost.iter().any(|o| path.starts_with(o)) {
            outermost.push(path);
        }
    }
    Ok(outermost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_points_are_what_the_unix_programs_write() {
        assert_eq!(point(0), PathBuf::from("/dev/.u/0"));
        assert_eq!(points(2), vec![point(0), point(1)]);
        let prefix = format!("{}/", point(7).display());
        assert_eq!(prefix.len(), tartaros_common::capture::UNIX_MIRROR_LEN);
    }

    /// A host `/` (8:1), the writable root /w held from it and attached,
    /// with: a pin of /w/a (a bind of itself) and a read deny's tmpfs
    /// below it, a host bind of /srv/run (same disk) at /w/run, a tmpfs
    /// at "/w/my sock" with a mount below it, a file covered by
    /// /dev/null, a mount outside /w, and the base's own copy of /w/run
    /// under the attached root (hidden by it).
    const TABLE: &str = "\
20 1 8:1 / / ro - ext4 /dev/sda1 rw
21 20 8:1 /srv/run /w/run ro - ext4 /dev/sda1 rw
30 20 8:1 /w /w rw - ext4 /dev/sda1 rw
31 30 8:1 /srv/run /w/run rw - ext4 /dev/sda1 rw
32 30 0:50 / /w/my\\040sock rw - tmpfs tmpfs rw
33 32 0:51 / /w/my\\040sock/deeper rw - tmpfs tmpfs rw
34 30 8:1 /w/a /w/a rw - ext4 /dev/sda1 rw
35 34 0:52 / /w/a/secret ro - tmpfs tmpfs ro
36 30 0:5 /null /w/.env ro - devtmpfs udev rw
37 20 0:53 / /other rw - tmpfs tmpfs rw
";

    #[test]
    fn every_mount_below_a_root_but_its_own_directory_is_covered() {
        let table = parse_mountinfo(TABLE).unwrap();
        assert_eq!(table[4].point, PathBuf::from("/w/my sock"));
        let covered = covers(&table, 30, Path::new("/w")).unwrap();
        let want: Vec<PathBuf> = [".env", "a/secret", "my sock", "run"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(
            covered, want,
            "the pin is looked through, nothing below a cover"
        );
        // A nested root that is no mount point: the mount it lies on.
        assert_eq!(
            covers(&table, 30, Path::new("/w/a")).unwrap(),
            vec![PathBuf::from("secret")]
        );
        // The pinned root itself (its topmost mount).
        assert_eq!(
            covers(&table, 34, Path::new("/w/a")).unwrap(),
            vec![PathBuf::from("secret")]
        );
        assert!(covers(&table, 99, Path::new("/w")).is_err());
        assert!(parse_mountinfo("20 1 8:1\n").is_err());
        assert!(parse_mountinfo("x 1 8:1 / / rw\n").is_err());
    }

    #[test]
    fn a_bind_of_another_directory_of_the_same_disk_is_foreign() {
        let root = MountLine {
            id: 1,
            parent: 0,
            dev: "8:1".into(),
            root: "/home/u".into(),
            point: "/w".into(),
        };
        let child = |dev: &str, from: &str| MountLine {
            id: 2,
            parent: 1,
            dev: dev.into(),
            root: from.into(),
            point: "/w/x".into(),
        };
        assert!(shows_itself(&root, &child("8:1", "/home/u/x")));
        assert!(!shows_itself(&root, &child("8:1", "/home/u/y")));
        assert!(!shows_itself(&root, &child("8:2", "/home/u/x")));
        assert!(!shows_itself(&root, &child("8:1", "/home/u/x//deleted")));
        assert_eq!(unescape("a\\134b\\011c\\9"), PathBuf::from("a\\b\tc\\9"));
    }
}
