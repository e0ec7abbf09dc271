//! Arguments that are not paths but that a record presents as what the
//! kernel did: a symlink's contents, an inode-flag ioctl's flags, an
//! extended attribute's name. The capture reads them from the agent's
//! memory when the call starts and the kernel copies them a moment later,
//! so a second thread, or another process writing a `MAP_SHARED` page,
//! could make the record say what the call did not do (adversarial round
//! 18: `verify` ok on symlinks whose contents, files whose flags, and
//! attributes whose names were not the record's). Each is asked of the
//! kernel's own object once the record is joined, in user space (the
//! `sys_exit` programs have no verifier budget to spare), and only these
//! record kinds pay:
//! - a symlink's contents never change after it is made: they are read
//!   through the handle its create notification gave (`target_source:
//!   "kernel"`; the agent's string as `claimed_target` when it differed),
//!   or stay the agent's claim (`target_unproven`) when the link is gone;
//! - `FS_IOC_SETFLAGS`: the file's flags are read back (`FS_IOC_GETFLAGS`)
//!   and compared on the bits a caller may set (`flags_source`,
//!   `claimed_flags`, `flags_unproven`);
//! - an attribute set must exist on the kernel's file, a removed one must
//!   not (`name_source`); when neither holds and no record of a later
//!   call on that name came within [`HOLD_NS`], the record names an
//!   attribute the call did not change (`name_unproven`, which `verify`
//!   calls incomplete). A name someone else could rewrite (`name_shared`:
//!   a thread, or a page of a shared or file-backed mapping) is unproven
//!   whatever the file shows.

use std::ffi::CString;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::Path;

use serde_json::Value;

use super::{HOLD_NS, Join, Notice, tid_of};
use crate::effectlog::{Decision, Record, names};
use crate::fswatch::notify::Handle;
use crate::fswatch::pairing::kernel_named;

/// `FS_IOC_GETFLAGS` (`_IOR('f', 1, long)`).
const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
/// `FS_FL_USER_MODIFIABLE` (include/uapi/linux/fs.h): the bits a caller's
/// `FS_IOC_SETFLAGS` may change; the others are the filesystem's own
/// (`EXTENTS`, ...), which it reports whatever the caller passed.
const USER_MODIFIABLE: u64 = 0x0003_80ff;
/// The most (file, attribute) pairs remembered with their last record's
/// time, for a record held back behind a later call on its name.
const MAX_SEEN: usize = 4096;

/// The handle of the notification `n` that named the symlink record `r`.
pub(super) fn link_handle(r: &Record, n: &Notice) -> Option<Handle> {
    if r.kind == "symlink" {
        n.fid.clone()
    } else {
        None
    }
}

impl Join {
    /// Keeps the handle of the notification that named a symlink record
    /// ([`link_handle`]), for [`Self::prove_arguments`].
    pub(super) fn keep_link_handle(&mut self, r: &Record, fid: Option<Handle>) {
        if let Some(fid) = fid {
            self.link_handles.insert((tid_of(r), r.mono_ns), fid);
        }
    }

    /// Checks the arguments of the records about to be written against
    /// the kernel's objects (see the module doc). An xattr record whose
    /// name the file does not show waits up to [`HOLD_NS`] for a later
    /// call on that name (its record may be read after the check), then
    /// goes out ahead of the batch; with `all`, nothing waits.
    pub(super) fn prove_arguments(&mut self, out: &mut Vec<Record>, now_ns: u64, all: bool) {
        let batch = std::mem::take(out);
        let mut kept = Vec::with_capacity(batch.len());
        let mut unshown: Vec<(Record, u64)> = std::mem::take(&mut self.unshown_xattrs);
        for mut r in batch {
            if r.kind == "xattr" && !prove_name(&mut r) {
                unshown.push((r, now_ns));
                continue;
            }
            match r.kind {
                "symlink" => self.prove_target(&mut r),
                "setflags" => prove_flags(&mut r),
                _ => {}
            }
            kept.push(r);
        }
        let keys: Vec<_> = unshown
            .iter()
            .map(|(r, _)| (xattr_key(r), r.mono_ns))
            .collect();
        let mut ready = Vec::new();
        for (i, (mut r, at)) in unshown.into_iter().enumerate() {
            let Some(key) = &keys[i].0 else {
                ready.push(r);
                continue;
            };
            let later = |l: &Record| l.mono_ns > r.mono_ns && xattr_key(l).as_ref() == Some(key);
            let changed_later = kept.iter().any(later)
                || keys
                    .iter()
                    .any(|(k, ns)| *ns > r.mono_ns && k.as_ref() == Some(key))
                || self.xattrs_seen.get(key).is_some_and(|&ns| ns > r.mono_ns);
            if changed_later {
                // `setfattr -n x; setfattr -x x`: the later call explains it.
                ready.push(r);
            } else if all || now_ns.saturating_sub(at) > HOLD_NS {
                // The call changed another attribute than the record names.
                r.target.insert("name_unproven", true);
                ready.push(r);
            } else {
                self.unshown_xattrs.push((r, at));
            }
        }
        if self.xattrs_seen.len() > MAX_SEEN {
            self.xattrs_seen.clear();
        }
        ready.extend(kept);
        for r in &ready {
            if let Some(key) = xattr_key(r) {
                let ns = self.xattrs_seen.entry(key).or_default();
                *ns = (*ns).max(r.mono_ns);
            }
        }
        *out = ready;
    }

    fn prove_target(&mut self, r: &mut Record) {
        let handle = self.link_handles.remove(&(tid_of(r), r.mono_ns));
        if r.decision != Decision::Allowed {
            return;
        }
        let Some(path) = kernel_named(r) else {
            // The link's name is the agent's claim, and so are its contents
            // (its create notification is a record of its own).
            r.target.insert("target_source", "agent");
            return;
        };
        // No handle reported (an older kernel), or of a filesystem the
        // probe cannot open handles on: by the kernel's name.
        let read = handle
            .and_then(|fid| self.probe.readlink(&fid))
            .unwrap_or_else(|| {
                std::fs::read_link(names::on_disk(&path))
                    .ok()
                    .map(|p| p.into_os_string())
            });
        let Some(contents) = read else {
            r.target.insert("target_source", "agent");
            r.target.insert("target_unproven", true);
            return;
        };
        let kernel = names::display(contents.as_bytes());
        let agent = r.target.get("target").and_then(Value::as_str);
        if agent != Some(kernel.as_str()) {
            let agent = agent.unwrap_or_default().to_string();
            r.target.insert("claimed_target", agent);
            r.target.insert("target", kernel);
        }
        r.target.insert("target_source", "kernel");
    }
}

/// An `FS_IOC_SETFLAGS` record's flags against the file's.
fn prove_flags(r: &mut Record) {
    let cmd = r.target.get("cmd").and_then(Value::as_str);
    if r.decision != Decision::Allowed || cmd != Some("FS_IOC_SETFLAGS") {
        return;
    }
    // Unreadable at entry (round 23: a page the capture could not fault
    // in): the file's flags after the call are the record's.
    let claimed = r.target.get("flags").and_then(Value::as_u64);
    let at = |k: &str| r.target.get(k).and_then(Value::as_u64);
    let inode = at("dev").zip(at("ino"));
    let kernel = kernel_named(r).and_then(|p| inode_flags(&names::on_disk(&p), inode));
    match (kernel, claimed) {
        (Some(k), Some(claimed)) if (k ^ claimed) & USER_MODIFIABLE == 0 => {}
        (Some(k), Some(claimed)) => {
            r.target.insert("claimed_flags", claimed);
            r.target.insert("flags", k);
        }
        (Some(k), None) => r.target.insert("flags", k),
        (None, _) => {
            r.target.insert("flags_source", "agent");
            r.target.insert("flags_unproven", true);
            return;
        }
    }
    r.target.insert("flags_source", "kernel");
}

/// The inode flags of the regular file or directory at `path` (no link
/// followed), if it is the inode `(dev, ino)` the record named.
fn inode_flags(path: &Path, inode: Option<(u64, u64)>) -> Option<u64> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let kind = meta.file_type();
    if !(kind.is_file() || kind.is_dir()) || kind.is_fifo() {
        return None;
    }
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    let fd = nix::fcntl::open(
        path,
        nix::fcntl::OFlag::from_bits_truncate(flags | libc::O_CLOEXEC),
        nix::sys::stat::Mode::empty(),
    )
    .ok()?;
    // SAFETY: `open` returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = nix::sys::stat::fstat(fd.as_raw_fd()).ok()?;
    if inode.is_some_and(|(dev, ino)| (st.st_dev, st.st_ino) != (dev, ino))
        || (st.st_dev, st.st_ino) != (meta.dev(), meta.ino())
    {
        // Another file at the name by now.
        return None;
    }
    let mut flags: libc::c_long = 0;
    // SAFETY: the kernel writes at most a `long` into `flags`, which
    // outlives the call; `fd` is an open descriptor.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_GETFLAGS, &mut flags) };
    (rc == 0).then_some(flags as u64 & 0xffff_ffff)
}

/// The file and attribute an allowed xattr record names from the kernel.
fn xattr_key(r: &Record) -> Option<(String, String)> {
    if r.kind != "xattr" || r.decision != Decision::Allowed {
        return None;
    }
    let name = r.target.get("name").and_then(Value::as_str)?;
    Some((kernel_named(r)?, name.to_string()))
}

/// An xattr record's name against the kernel's file: present after a
/// set, absent after a removal. `false` when the file shows otherwise
/// (the record is marked `name_source: "agent"` and waits).
fn prove_name(r: &mut Record) -> bool {
    let shared = r.target.get("name_shared").is_some();
    if shared && r.kind == "xattr" && r.decision == Decision::Allowed {
        // Another task or process could rewrite the name between the
        // capture's read and the kernel's copy (a thread; a forked child
        // on a `MAP_SHARED` page, round 23): the file showing the name
        // after a set (or not after a removal) proves nothing, since it
        // may have held it before (or never), and no later call explains
        // which attribute the kernel changed.
        r.target.insert("name_source", "agent");
        // Whether the path is the kernel's or (a thread rewrote it too)
        // the agent's claim, the kernel's `attrib` names the file only.
        r.target.insert("name_unproven", true);
        return true;
    }
    let Some((path, name)) = xattr_key(r) else {
        return true;
    };
    let set = r.target.get("op").and_then(Value::as_str) == Some("set");
    let size = value_size(&names::on_disk(&path), &name);
    let holds = match size {
        Ok(_) => true,
        Err(nix::errno::Errno::ENODATA) => false,
        // Not a file this host can ask (gone, unsupported): unchecked.
        Err(_) => {
            r.target.insert("name_source", "agent");
            return true;
        }
    };
    if holds == set {
        r.target.insert("name_source", "kernel");
        if let (Ok(size), None) = (size, r.target.get("size")) {
            // `setxattrat`'s size is in a struct the capture does not
            // read: the value's size now is the kernel's.
            r.target.insert("size", size);
            r.target.insert("size_source", "kernel");
        }
        return true;
    }
    r.target.insert("name_source", "agent");
    // Only a `user.` or `trusted.` attribute is stored as it was set: a
    // POSIX ACL equal to the file's mode is not stored at all (only the
    // mode changes), and `security.` names belong to the modules.
    !(name.starts_with("user.") || name.starts_with("trusted."))
}

/// The size of the attribute `name`'s value on `path` (no link followed).
fn value_size(path: &Path, name: &str) -> Result<u64, nix::errno::Errno> {
    let raw = names::undisplay(name).unwrap_or_else(|| name.as_bytes().to_vec());
    let name = CString::new(raw).map_err(|_| nix::errno::Errno::EINVAL)?;
    let path = CString::new(path.as_os_str().as_bytes()).map_err(|_| nix::errno::Errno::EINVAL)?;
    // SAFETY: both strings are NUL-terminated and outlive the call; a
    // NULL buffer of size 0 asks only for the value's size.
    let n = unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    if n < 0 {
        return Err(nix::errno::Errno::last());
    }
    Ok(n as u64)
}

#[cfg(test)]
#[path = "join_arguments_tests.rs"]
mod tests;
