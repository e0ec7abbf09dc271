//! Refused calls whose name passes through a link.
//!
//! A refused call reaches no descriptor and sends no notification, so its
//! record has only the agent's string. When that string passes through a
//! symlink (`innocent` -> the secret) or a magic link of `/proc`
//! (`/proc/self/root/...`, `/proc/self/fd/3`, `/dev/fd/3`), the string
//! names another file than the one the kernel refused: the link, a file of
//! the root, or nothing a reviewer would search for. The kernel's own name
//! of the refused file is out of reach here (Landlock refuses it inside
//! `security_file_open`, whose file the capture never sees), so the link is
//! resolved when the record is joined, soon after the call: the record
//! then names the file the link led to, keeps the agent's string as its
//! claim, and says `{key}_via_link` so that `verify` counts it among the
//! names resolved after the call (`effectlog/unnamed.rs`). The agent can
//! re-point the link in between; that is why it stays a claim.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use crate::effectlog::Record;
use crate::effectlog::names::{display_path, on_disk};

/// `/proc/<pid>/` entries that are magic links to a file or directory.
const PROC_LINKS: [&str; 5] = ["root", "cwd", "fd", "exe", "map_files"];

/// Marks (and names, where it can) the agent's strings of a refused file
/// record that pass through a link.
pub(super) fn mark(r: &mut Record) {
    for (key, claim) in [
        ("path", "claimed_path"),
        ("from", "claimed_from"),
        ("to", "claimed_to"),
    ] {
        let Some(shown) = r.target.get(key).and_then(Value::as_str) else {
            continue;
        };
        if !shown.starts_with('/') || r.target.get(claim).is_some() {
            continue;
        }
        let shown = shown.to_string();
        let follow = key == "path" && follows_last(r);
        let Some(reached) = through_link(&on_disk(&shown), follow) else {
            continue;
        };
        r.target.insert(format!("{key}_via_link"), true);
        if let Some(reached) = reached {
            let reached = display_path(&reached);
            if reached != shown {
                r.target.insert(claim, shown);
                r.target.insert(key, reached);
            }
        }
    }
}

/// Whether the call followed a link at the last component of its path:
/// execs do, opens do unless `O_NOFOLLOW` or `O_CREAT | O_EXCL`; calls on the name
/// itself (unlink, rename, mkdir, `lsetxattr`, ...) do not, and the
/// others are not told apart here, so only their directories are
/// followed.
fn follows_last(r: &Record) -> bool {
    const O_CREAT_EXCL: u64 = (libc::O_CREAT | libc::O_EXCL) as u64;
    if r.kind == "exec" {
        return true;
    }
    if !matches!(r.kind, "open" | "create" | "truncate") {
        return false;
    }
    let flags = r.target.get("flags").and_then(Value::as_u64).unwrap_or(0);
    flags & libc::O_NOFOLLOW as u64 == 0 && flags & O_CREAT_EXCL != O_CREAT_EXCL
}

/// `None` when no component of `path` is a link (the last one only when
/// `follow`); else the file it leads to now, when the supervisor can tell
/// (`Some(None)` when it cannot: a descriptor or cwd of the agent's, read
/// from `/proc`, is its claim).
fn through_link(path: &Path, follow: bool) -> Option<Option<PathBuf>> {
    let parts: Vec<Component> = path.components().collect();
    if let [Component::RootDir, Component::Normal(top), rest @ ..] = parts.as_slice() {
        match (top.as_bytes(), rest) {
            // `/proc/<pid>/root/...` is `/...` in the agent's root, which
            // holds the host's paths; the other magic links name the
            // agent's descriptors and directories.
            (b"proc", [_, Component::Normal(link), inner @ ..]) if link.as_bytes() == b"root" => {
                let inner: PathBuf = std::iter::once(Component::RootDir)
                    .chain(inner.iter().copied())
                    .collect();
                return Some(through_link(&inner, follow).unwrap_or(Some(inner)));
            }
            (b"proc", [_, Component::Normal(link), ..])
                if PROC_LINKS.iter().any(|l| l.as_bytes() == link.as_bytes()) =>
            {
                return Some(None);
            }
            (b"dev", [Component::Normal(name), ..])
                if [&b"fd"[..], b"stdin", b"stdout", b"stderr"].contains(&name.as_bytes()) =>
            {
                return Some(None);
            }
            // The agent's `/proc` and `/dev` are its own: their other
            // entries are not the supervisor's to look at.
            (b"proc" | b"dev", _) => return None,
            _ => {}
        }
    }
    let mut prefix = PathBuf::new();
    let mut linked = false;
    let walked = if follow {
        parts.len()
    } else {
        parts.len().saturating_sub(1)
    };
    for part in &parts[..walked] {
        prefix.push(part);
        if matches!(part, Component::Normal(_))
            && std::fs::symlink_metadata(&prefix).is_ok_and(|m| m.file_type().is_symlink())
        {
            linked = true;
            break;
        }
    }
    if !linked {
        return None;
    }
    if follow {
        return Some(resolve(path));
    }
    let parent = path.parent().and_then(|p| p.canonicalize().ok());
    Some(
        parent
            .zip(path.file_name())
            .map(|(dir, name)| dir.join(name)),
    )
}

/// `path` with every link followed; when the file itself does not
/// resolve, its parent resolved and the last name, or the last name's
/// link target (a dangling link names the file it would create).
fn resolve(path: &Path) -> Option<PathBuf> {
    if let Ok(p) = path.canonicalize() {
        return Some(p);
    }
    let name = OsString::from_vec(path.file_name()?.as_bytes().to_vec());
    let parent = path.parent()?.canonicalize().ok()?;
    let at = parent.join(name);
    Some(match std::fs::read_link(&at) {
        Ok(target) => parent.join(target),
        Err(_) => at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_links_are_claims_and_plain_paths_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::write(&real, "x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let real = real.canonicalize().unwrap();
        let follow = |p: &Path| through_link(p, true);
        assert_eq!(follow(&real), None);
        assert_eq!(follow(&link), Some(Some(real.clone())));
        assert_eq!(
            through_link(&link, false),
            None,
            "a call on the link itself"
        );
        let dirlink = dir.path().join("dirlink");
        std::os::unix::fs::symlink(dir.path(), &dirlink).unwrap();
        assert_eq!(
            through_link(&dirlink.join("link"), false),
            Some(Some(real.parent().unwrap().join("link"))),
            "the directories are followed, not the last name"
        );
        let via_root = Path::new("/proc/self/root").join(real.strip_prefix("/").unwrap());
        assert_eq!(follow(&via_root), Some(Some(real.clone())));
        assert_eq!(follow(Path::new("/proc/self/fd/3")), Some(None));
        assert_eq!(follow(Path::new("/proc/42/cwd/x")), Some(None));
        assert_eq!(follow(Path::new("/dev/fd/3")), Some(None));
        assert_eq!(follow(Path::new("/proc/1/environ")), None);
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nothing"), &dangling).unwrap();
        let parent = dir.path().canonicalize().unwrap();
        assert_eq!(
            follow(&dangling),
            Some(Some(parent.join("nothing"))),
            "a dangling link names the file it would create"
        );
    }
}
