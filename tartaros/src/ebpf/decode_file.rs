//! Records of calls on a descriptor that carry the file the kernel had
//! behind it ([`SysFileEvent`]: `fchmod`, `fsetxattr`, `futimens`, the
//! inode-flag ioctls, `*at` calls with `AT_EMPTY_PATH`, opens for
//! writing): the path is the kernel's names at the syscall's exit, not a
//! `/proc/<pid>/fd` lookup made when the record is read (by then the
//! process may be gone, or the fd closed or reused). With a shared fd
//! table the record asserts no path (`path_unverified`). See docs/ebpf.md,
//! "Descriptor-named calls".

use std::os::unix::fs::MetadataExt;

use tartaros_common::capture::{
    FILE_NAMES_BYTES, KernelFile, SysFileEvent, effect, file_status, flag,
};

use super::*;

impl Decoder {
    pub(super) fn sys_file(&mut self, e: &SysFileEvent) -> Option<Record> {
        if e.sys.header.flags & flag::OPENS_FILE != 0 {
            return self.opened_file(e);
        }
        // An xattr call's attribute name, read at entry.
        let name = (e.sys.header.effect == effect::XATTR).then_some(&e.path[..]);
        let mut r = self.sys(&e.sys, None, name, None)?;
        if e.sys.header.effect == effect::SIGNAL {
            // A pidfd: its file names a process, not a path.
            self.pidfd_target(&mut r.target, e);
            return Some(r);
        }
        let t = &mut r.target;
        t.insert("fd", e.sys.fd);
        let status = e.file.status;
        if status & file_status::FD_CHANGED != 0 {
            // Another thread sharing the fd table put another file at
            // this number during the call: the file named is the one
            // there at exit, which may not be the one the call changed.
            t.insert("fd_changed", true);
        }
        let names = names_of(&e.file);
        if e.sys.header.flags & flag::FD_SHARED != 0 {
            unverified(t, &e.file, names.as_deref());
            return Some(r);
        }
        // Named as it was before its last link went, when it has none.
        put_inode(t, &e.file);
        if status & file_status::COMPLETE != 0
            && let Some(names) = names
        {
            t.insert("path", path_of(&names));
            t.insert("path_source", "kernel");
            return Some(r);
        }
        t.insert("kernel_path_incomplete", incomplete(status));
        if let Some(names) = names.filter(|n| !n.is_empty()) {
            // The leaf side, which the kernel did name.
            t.insert("kernel_tail", path_of(&names).trim_start_matches('/'));
        }
        // Last resort, racy: the fd of a process that is still there, and
        // only if it still holds the inode the kernel named.
        let known = (status & (file_status::NO_LAYOUT | file_status::NO_FILE) == 0)
            .then_some((user_dev(e.file.dev), e.file.ino));
        match self.fd_path_checked(e.sys.header.tgid, e.sys.fd, known) {
            Some(p) => {
                t.insert("path", p);
                t.insert("resolved_from", "fd");
                t.insert("path_source", "proc");
            }
            None => unresolved(t),
        }
        Some(r)
    }

    /// An open for writing that succeeded without creating its file: the
    /// record of its agent string, named by the file the kernel put at the
    /// returned descriptor. With an incomplete walk (a tree deeper than
    /// the walk) the descriptor is looked up while the process holds it,
    /// checked against the kernel's inode; failing that the record says
    /// the path is unresolved, and the seal counts the file as unhashed.
    fn opened_file(&mut self, e: &SysFileEvent) -> Option<Record> {
        let mut r = self.sys(&e.sys, Some(&e.path[..]), None, None)?;
        let t = &mut r.target;
        let status = e.file.status;
        // `deleted`: an `O_TMPFILE` (named `#<ino>` by the kernel), or a
        // file unlinked by another thread during the open.
        put_inode(t, &e.file);
        let names = names_of(&e.file).filter(|_| status & file_status::COMPLETE != 0);
        let Some(names) = names else {
            t.insert("kernel_path_incomplete", incomplete(status));
            mark_write_mode(t);
            if let Some(tail) = names_of(&e.file).filter(|n| !n.is_empty()) {
                t.insert("kernel_tail", path_of(&tail).trim_start_matches('/'));
            }
            let known = (status & (file_status::NO_LAYOUT | file_status::NO_FILE) == 0)
                .then_some((user_dev(e.file.dev), e.file.ino));
            let fd = i32::try_from(e.sys.ret).unwrap_or(-1);
            let by_fd = known.and_then(|k| self.fd_path_checked(e.sys.header.tgid, fd, Some(k)));
            let found = by_fd.map(|p| (p, "fd")).or_else(|| {
                let claim = t.get("path").and_then(|v| v.as_str())?;
                let tail = t.get("kernel_tail").and_then(|v| v.as_str())?;
                Some((claim_checked(claim, tail, known?)?, "check"))
            });
            match found {
                Some((p, from)) => {
                    if let Some(agent) = t.get("path").and_then(|v| v.as_str())
                        && agent != p
                    {
                        let agent = agent.to_string();
                        t.insert("claimed_path", agent);
                    }
                    t.remove("path_unresolved");
                    t.remove("cwd_unverified");
                    t.insert("path", p);
                    t.insert("resolved_from", from);
                    t.insert("path_source", "proc");
                }
                None => unresolved(t),
            }
            return Some(r);
        };
        let kernel = path_of(&names);
        if let Some(agent) = t.get("path").and_then(|v| v.as_str()).map(str::to_string)
            && agent != kernel
        {
            t.insert("claimed_path", agent);
        }
        t.remove("resolved_from");
        t.remove("path_unresolved");
        t.insert("path", kernel);
        t.insert("path_source", "kernel");
        mark_write_mode(t);
        Some(r)
    }

    /// `/proc/<tgid>/fd/<fd>`, if it still names `(dev, ino)` when known.
    fn fd_path_checked(&self, tgid: u32, fd: i32, known: Option<(u64, u64)>) -> Option<String> {
        if fd < 0 {
            return None;
        }
        let link = format!("{}/{tgid}/fd/{fd}", self.proc_root);
        if let Some((dev, ino)) = known {
            let meta = std::fs::metadata(&link).ok()?;
            if (meta.dev(), meta.ino()) != (dev, ino) {
                return None;
            }
        }
        self.fd_path(tgid, fd)
    }
}

/// A record whose file the kernel's walk did not name whole and that no
/// lookup confirmed: whatever `path` it has is the agent's string (a
/// relative name joined to the modelled cwd, which a tree deeper than the
/// walk or a cwd string cut at 255 bytes can point at a decoy; adversarial
/// round 25b), so it says so, and `log verify` counts the file as unnamed
/// (`effectlog/unnamed.rs`).
fn unresolved(t: &mut Target) {
    t.insert("path_unresolved", true);
    if t.get("path").is_some() {
        t.insert("path_source", "agent");
    }
}

/// A name of the kernel's file `(dev, ino)` checked after the call, when
/// the kernel's walk was cut and the process's descriptor is gone: the
/// agent's absolute string, without symlinks, if it leads to that inode
/// now and ends in the names the kernel did read (`kernel_tail`). A name
/// the file has when the record is read, like the descriptor's: a rename
/// after the call is its own record.
fn claim_checked(claim: &str, tail: &str, (dev, ino): (u64, u64)) -> Option<String> {
    if !claim.starts_with('/') || tail.is_empty() {
        return None;
    }
    let canonical = std::fs::canonicalize(crate::effectlog::names::on_disk(claim)).ok()?;
    let meta = std::fs::symlink_metadata(&canonical).ok()?;
    if (meta.dev(), meta.ino()) != (dev, ino) {
        return None;
    }
    let shown = crate::effectlog::names::display_path(&canonical);
    shown
        .strip_suffix(tail)
        .is_some_and(|head| head.ends_with('/'))
        .then_some(shown)
}

/// A call on a descriptor of a shared fd table: another thread could have
/// swapped the descriptor between the kernel's lookup and the exit, where
/// the file was read, even back again (`fd_changed` sees only a file that
/// stayed swapped). So the record asserts no path: the file read at exit
/// is `fd_path_at_exit`, and the file the call changed is named by its
/// kernel notification (the join leaves it to it; docs/ebpf.md,
/// "Descriptor-named calls").
fn unverified(t: &mut Target, f: &KernelFile, names: Option<&[&[u8]]>) {
    t.insert("fd_shared", true);
    t.insert("path_unverified", true);
    match names {
        Some(names) if f.status & file_status::COMPLETE != 0 => {
            t.insert("fd_path_at_exit", path_of(names));
        }
        _ => t.insert("fd_at_exit_incomplete", incomplete(f.status)),
    }
}

/// Only a file the kernel opened for writing gets here (`FMODE_WRITE`):
/// when the flags the agent's memory gave (`openat2`) say otherwise, or
/// could not be read, the record says which is the kernel's.
fn mark_write_mode(t: &mut Target) {
    const O_ACCMODE: u64 = 3;
    const O_PATH: u64 = 0o10_000_000;
    let claimed = t.get("flags").and_then(|v| v.as_u64()).unwrap_or(0);
    let unreadable = t.get("flags_unreadable").is_some();
    if unreadable || claimed & O_ACCMODE == 0 || claimed & O_PATH != 0 {
        t.insert("opened_for_writing", true);
    }
}

/// `ino`, `dev` (as `stat` reports them) and `deleted` (no link left) of a
/// file that was read.
fn put_inode(t: &mut Target, f: &KernelFile) {
    if f.status & (file_status::NO_LAYOUT | file_status::NO_FILE) == 0 {
        t.insert("ino", f.ino);
        t.insert("dev", user_dev(f.dev));
        if f.nlink == 0 {
            t.insert("deleted", true);
        } else if f.nlink > 1 {
            // Other names of the same file: the seal looks for them.
            t.insert("links", f.nlink);
        }
    }
}

/// What an exec ran (`bprm->file`), as the kernel named it: `binary`,
/// beside the `path` the caller gave (a symlink, a `/proc/self/fd/N`, a
/// script whose interpreter this is); `binary_deleted` for a file with no
/// link left (a memfd, an unlinked file), `binary_incomplete` and why when
/// the walk was not whole, with the names it read in `binary_tail`.
pub(super) fn put_binary(t: &mut Target, f: &KernelFile) {
    let status = f.status;
    if status & (file_status::NO_LAYOUT | file_status::NO_FILE) == 0 && f.nlink == 0 {
        t.insert("binary_deleted", true);
    }
    let names = names_of(f);
    if status & file_status::COMPLETE != 0
        && let Some(names) = &names
    {
        t.insert("binary", path_of(names));
        return;
    }
    t.insert("binary_incomplete", incomplete(status));
    if let Some(names) = names.filter(|n| !n.is_empty()) {
        // The leaf side the kernel did name (`memfd:<name>` for a memfd).
        let tail = path_of(&names);
        let tail = tail.trim_start_matches('/');
        // A tree deeper than the walk: the caller's string names the
        // binary only if it leads to it (it is the modelled cwd joined to
        // a relative name, which can point at a decoy; round 25b).
        let deep = status & (file_status::NO_LAYOUT | file_status::NO_FILE) == 0
            && incomplete(status) == TOO_DEEP;
        let claim = t.get("path").and_then(|v| v.as_str());
        match claim
            .filter(|_| deep)
            .and_then(|c| claim_checked(c, tail, (user_dev(f.dev), f.ino)))
        {
            Some(binary) => {
                t.insert("binary", binary);
                t.insert("binary_checked", true);
            }
            None if deep => t.insert("binary_unresolved", true),
            None => {}
        }
        t.insert("binary_tail", tail);
    }
}

/// Why a walk that ran out of room gave no whole path.
const TOO_DEEP: &str = "too deep";

/// Why a walk with `status` gave no whole path.
fn incomplete(status: u32) -> &'static str {
    if status & file_status::NO_LAYOUT != 0 {
        "no file offsets in the kernel BTF"
    } else if status & file_status::NO_FILE != 0 {
        "fd not open at exit"
    } else if status & file_status::DISCONNECTED != 0 {
        "disconnected dentry"
    } else if status & file_status::UNREADABLE != 0 {
        "unreadable"
    } else if status & file_status::COMPLETE != 0 {
        "a name the kernel holds is not a path component"
    } else {
        TOO_DEEP
    }
}

/// The names of `e`, leaf first (`None` when the buffer is inconsistent).
fn names_of(e: &KernelFile) -> Option<Vec<&[u8]>> {
    let len = usize::try_from(e.names_len).ok()?;
    if len > FILE_NAMES_BYTES {
        return None;
    }
    let raw = &e.names[..len];
    let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
    if raw.is_empty() {
        return (e.depth == 0).then(Vec::new);
    }
    let names: Vec<&[u8]> = raw.split(|&b| b == 0).collect();
    // Every name was read whole, and a name never holds a `/` or a NUL.
    let sane = names.len() == e.depth as usize
        && names
            .iter()
            .all(|n| !n.is_empty() && !n.contains(&b'/') && *n != b"." && *n != b"..");
    sane.then_some(names)
}

/// `/` + the names root first, shown as the log shows kernel names.
fn path_of(names: &[&[u8]]) -> String {
    if names.is_empty() {
        return "/".into();
    }
    let mut bytes = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum());
    for n in names.iter().rev() {
        bytes.push(b'/');
        bytes.extend_from_slice(n);
    }
    crate::effectlog::names::display(&bytes)
}

/// The kernel's `dev_t` (major << 20 | minor) as `stat` reports it.
pub(super) fn user_dev(dev: u32) -> u64 {
    libc::makedev(dev >> 20, dev & 0xf_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(names: &[&str], status: u32) -> SysFileEvent {
        let mut buf = [0u8; FILE_NAMES_BYTES];
        let mut off = 0;
        for n in names {
            buf[off..off + n.len()].copy_from_slice(n.as_bytes());
            off += n.len() + 1;
        }
        // SAFETY: plain data; every bit pattern is valid.
        let mut e: SysFileEvent = unsafe { std::mem::zeroed() };
        e.file.names = buf;
        e.file.names_len = off as u32;
        e.file.depth = names.len() as u32;
        e.file.status = status;
        e.file.dev = (8 << 20) | 1;
        e.file.ino = 42;
        e.file.nlink = 1;
        e
    }

    #[test]
    fn names_are_joined_root_first() {
        let e = event(&["flagged", "work", "lab"], file_status::COMPLETE);
        let names = names_of(&e.file).unwrap();
        assert_eq!(path_of(&names), "/lab/work/flagged");
        assert_eq!(path_of(&[]), "/");
        assert_eq!(user_dev(e.file.dev), libc::makedev(8, 1));
    }

    #[test]
    fn inconsistent_buffers_are_refused() {
        let mut e = event(&["a", "b"], file_status::COMPLETE);
        e.file.depth = 3;
        assert!(names_of(&e.file).is_none());
        let e = event(&["a/b"], file_status::COMPLETE);
        assert!(names_of(&e.file).is_none());
        let mut e = event(&["a"], file_status::COMPLETE);
        e.file.names_len = FILE_NAMES_BYTES as u32 + 1;
        assert!(names_of(&e.file).is_none());
    }

    #[test]
    fn a_claim_names_the_file_only_when_it_leads_to_its_inode_and_ends_in_its_tail() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("deep/a");
        let decoy = dir.path().join("decoy/a");
        std::fs::create_dir_all(&real).unwrap();
        std::fs::create_dir_all(&decoy).unwrap();
        std::fs::write(real.join("f"), "x").unwrap();
        std::fs::write(decoy.join("f"), "y").unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
        let m = std::fs::metadata(real.join("f")).unwrap();
        let known = (m.dev(), m.ino());
        let shown = |p: &std::path::Path| crate::effectlog::names::display_path(p);
        let canonical = shown(&std::fs::canonicalize(real.join("f")).unwrap());
        assert_eq!(
            claim_checked(&shown(&real.join("f")), "a/f", known),
            Some(canonical.clone())
        );
        assert_eq!(
            claim_checked(&shown(&decoy.join("f")), "a/f", known),
            None,
            "another inode"
        );
        assert_eq!(
            claim_checked(&shown(&real.join("f")), "b/f", known),
            None,
            "another tail"
        );
        assert_eq!(
            claim_checked(&shown(&real.join("f")), "", known),
            None,
            "no tail"
        );
        assert_eq!(claim_checked("a/f", "a/f", known), None, "a relative claim");
        let via_link = shown(&dir.path().join("link/f"));
        assert_eq!(
            claim_checked(&via_link, "a/f", known),
            Some(canonical),
            "named without the link"
        );
        assert_eq!(
            claim_checked(&shown(&real.join("f")), "xa/f", known),
            None,
            "a tail is whole names"
        );
    }
}
