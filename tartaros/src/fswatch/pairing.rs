//! The pairing rules of the join: the notification as the join sees it,
//! which notification kind a record of each kind claims, and how a claimed
//! notification names the record's file (the kernel's path, the agent's
//! string kept as the claim).

use std::path::PathBuf;

use serde_json::Value;

use super::notify::Handle;
use crate::effectlog::Record;

/// The notification bits, as fanotify reports them.
pub(super) mod bit {
    pub const MODIFY: u64 = libc::FAN_MODIFY;
    pub const ATTRIB: u64 = libc::FAN_ATTRIB;
    pub const CREATE: u64 = libc::FAN_CREATE;
    pub const DELETE: u64 = libc::FAN_DELETE;
    pub const RENAME: u64 = libc::FAN_RENAME;
    pub const ONDIR: u64 = libc::FAN_ONDIR;
    /// An exec's open of a file it runs (script, interpreter, `ld.so`).
    pub const OPEN_EXEC: u64 = libc::FAN_OPEN_EXEC;
    pub const OVERFLOW: u64 = libc::FAN_Q_OVERFLOW;
}

/// A sandbox thread, as the capture or /proc describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Task {
    pub tgid: u32,
    pub ppid: u32,
    pub uid: u32,
}

/// One notification of a sandbox thread, its directory resolved.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Notice {
    pub tid: u32,
    /// What the kernel reported.
    pub mask: u64,
    /// Bits a record has claimed. The kernel merges identical
    /// notifications still queued (a `utime` and a `setxattr` of one file
    /// are one `FAN_ATTRIB`), so a claimed bit still confirms later
    /// records with the same path; it no longer pairs by position.
    pub claimed: u64,
    /// The entry's path now (`None`: its directory is gone).
    pub path: Option<String>,
    /// The entry's name, as the kernel reported it.
    pub name: String,
    /// The new path of a rename.
    pub new_path: Option<String>,
    /// `path` and `new_path` as the kernel's bytes (they are shown
    /// escaped when not UTF-8).
    pub raw: Option<PathBuf>,
    pub new_raw: Option<PathBuf>,
    /// CLOCK_MONOTONIC when it was read.
    pub read_ns: u64,
    /// When the read before it started: the notification was queued
    /// later (else that read would have returned it).
    pub after_ns: u64,
    /// The file's own handle, when the kernel reports it.
    pub fid: Option<Handle>,
}

impl Notice {
    pub(super) fn is_dir(&self) -> bool {
        self.mask & bit::ONDIR != 0
    }
}

/// The notification bit a successful record of `kind` must have caused,
/// and whether it is about a directory (`None`: either, as the record
/// does not say). `None` for kinds that change no directory entry or
/// inode (an open without create) and for kinds that are no file effect.
pub(super) fn wanted(kind: &str) -> Option<(u64, Option<bool>)> {
    Some(match kind {
        "create" | "link" | "symlink" | "mknod" | "bind" => (bit::CREATE, Some(false)),
        "mkdir" => (bit::CREATE, Some(true)),
        "unlink" => (bit::DELETE, Some(false)),
        "rmdir" => (bit::DELETE, Some(true)),
        "rename" => (bit::RENAME, None),
        "truncate" => (bit::MODIFY, Some(false)),
        // Metadata changes of files and directories alike. Not `setflags`
        // (FS_IOC_SETFLAGS): the kernel sends no notification for it, so
        // the record could only take another call's.
        "chmod" | "chown" | "utime" | "xattr" => (bit::ATTRIB, None),
        _ => return None,
    })
}

/// [`wanted`] for the record `r`: a `bind` makes a file only with a unix
/// pathname. An abstract name (or an inet address) makes none, and such a
/// record took a later bind's create notification by position, naming
/// that socket file after the abstract name and leaving the later bind's
/// file in no record (round 18). An unreadable name is still paired.
pub(super) fn wanted_of(r: &Record) -> Option<(u64, Option<bool>)> {
    let family = r.target.get("family").and_then(Value::as_str);
    if r.kind == "bind"
        && (r.target.get("abstract").is_some() || family.is_some_and(|f| f != "unix"))
    {
        return None;
    }
    wanted(r.kind)
}

/// Whether a refused record still made (and removed) its file: a unix
/// `bind` that failed with `EINVAL` (the socket was bound already) or
/// `EINTR` creates the socket file before it finds that out and removes it
/// again (`unix_bind_bsd`). Its notifications are its own: left
/// unclaimed, a later record whose name the capture could not read took
/// them by position and was named after the transient socket file.
pub(super) fn made_and_removed(r: &Record) -> bool {
    r.kind == "bind"
        && r.decision != crate::effectlog::Decision::Allowed
        && matches!(i32::try_from(r.errno), Ok(libc::EINVAL | libc::EINTR))
}

/// Whether a notification may stand for a record of `want` that only its
/// position can pair (its name unread). Not a metadata change merged with
/// a modify: a write or truncate clears a file's set-uid and set-gid bits
/// (`file_remove_privs`: `FAN_ATTRIB`, then the write's `FAN_MODIFY`,
/// which the kernel merges), an effect of that call, not of a later
/// `chmod` of another file.
pub(super) fn fits_by_position(n: &Notice, want: u64) -> bool {
    want != bit::ATTRIB || n.mask & bit::MODIFY == 0
}

/// The notification a record named by the kernel's file still claims (its
/// own, by path): the calls by descriptor that have one. Not the opens for
/// writing: a create notification of the same name is another effect.
pub(super) fn named_pairs(kind: &str) -> Option<(u64, Option<bool>)> {
    match kind {
        "chmod" | "chown" | "utime" | "xattr" | "truncate" => wanted(kind),
        _ => None,
    }
}

/// The path of a record the capture named from the kernel's file.
pub(super) fn kernel_named(r: &Record) -> Option<String> {
    let source = r.target.get("path_source").and_then(Value::as_str)?;
    if !matches!(source, "kernel" | "proc") {
        return None;
    }
    r.target
        .get("path")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// Record kinds whose path is the agent's (denied, or never confirmed).
pub(super) fn is_file_kind(kind: &str) -> bool {
    kind == "open" || wanted(kind).is_some()
}

/// The key of a record's (or claim's) main path.
pub(super) fn main_key(kind: &str) -> &'static str {
    match kind {
        "rename" | "link" => "to",
        _ => "path",
    }
}

/// The path of `n` in the role of a record's main path.
pub(super) fn notice_main<'a>(n: &'a Notice, kind: &str) -> Option<&'a str> {
    if kind == "rename" {
        n.new_path.as_deref()
    } else {
        n.path.as_deref()
    }
}

/// Names a record's file from the kernel: its path becomes the kernel's
/// and the agent's string, where it differs, is kept as the claim.
pub(super) fn apply(r: &mut Record, n: &Notice) {
    let pairs: &[(&'static str, &'static str, Option<&String>)] = if r.kind == "rename" {
        &[
            ("from", "claimed_from", n.path.as_ref()),
            ("to", "claimed_to", n.new_path.as_ref()),
        ]
    } else if r.kind == "link" {
        &[("to", "claimed_to", n.path.as_ref())]
    } else {
        &[("path", "claimed_path", n.path.as_ref())]
    };
    if pairs.iter().any(|(_, _, k)| k.is_none()) {
        // The directory was gone before its handle could be read: only
        // the name is the kernel's.
        r.target.insert("path_source", "agent");
        r.target.insert("kernel_name", n.name.clone());
        return;
    }
    for (key, claim_key, kernel) in pairs {
        let Some(kernel) = kernel else { continue };
        let agent = r
            .target
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_string);
        match agent {
            Some(agent) if agent == **kernel => {}
            // An fd-based call (fchmod, futimens, ...): the agent named
            // no path, the kernel does.
            None => {
                r.target.insert(*key, kernel.to_string());
                r.target.remove(&format!("{key}_unresolved"));
            }
            Some(agent) => {
                r.target.insert(*claim_key, agent);
                r.target.insert(*key, kernel.to_string());
            }
        }
    }
    r.target.insert("path_source", "kernel");
    if r.kind == "link" {
        // Its notification names only the new link: the existing file's
        // name is the agent's string, resolved after the call.
        r.target.insert("from_source", "agent");
    }
}
