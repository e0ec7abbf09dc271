//! Ring-buffer records to effect-log records ([`crate::effectlog::Record`]).
//!
//! Paths are what the agent passed. Relative ones are made absolute here
//! (the record then says `resolved_from`):
//! - against the process's cwd, from a model kept in event order: a
//!   process's cwd is read from `/proc/<pid>/cwd` the first time it is
//!   needed, inherited by forked children, and moved by the captured
//!   chdir / fchdir calls; so short-lived children (`rm`, `mkdir`) that
//!   are gone by the time their record is read still resolve
//!   (`decode_cwd.rs`; a cwd set through a descriptor is looked up after
//!   the call, and paths resolved against it are `cwd_unverified`);
//! - against `/proc/<pid>/fd/<dirfd>`, read when the record arrives (racy:
//!   the fd may have been closed or reused since);
//! - or they stay relative with `path_relative: true` when neither is
//!   known (the process is gone).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use serde_json::Value;
use tartaros_common::capture::{
    AT_FDCWD, EventHeader, ExecEvent, ExitEvent, ForkEvent, PATH_BYTES, SUN_PATH_MAX, SysAddrEvent,
    SysEvent, SysFileEvent, SysPath2Event, SysPathEvent, UnixEvent, effect, flag, nr, record,
    refused_sometimes, unix_hook, unix_verdict,
};
use tartaros_common::{AF_INET, AF_INET6, AF_UNIX, ConnectEvent, kind, syscalls, verdict};

use crate::effectlog::{Decision, Record, Target};

const EPERM: u64 = 1;
const EINTR: u64 = 4;
const EINPROGRESS: u64 = 115;

/// Record types read with `read_unaligned`.
///
/// # Safety
/// Implementors are `repr(C)` plain data (integers and integer arrays), so
/// every bit pattern is a valid value.
unsafe trait Plain: Copy {}
// SAFETY: all are repr(C) structs of integers and byte arrays
// (tartaros-common, with size asserts).
unsafe impl Plain for EventHeader {}
// SAFETY: as above.
unsafe impl Plain for ExecEvent {}
// SAFETY: as above.
unsafe impl Plain for ForkEvent {}
// SAFETY: as above.
unsafe impl Plain for ExitEvent {}
// SAFETY: as above.
unsafe impl Plain for SysEvent {}
// SAFETY: as above.
unsafe impl Plain for SysPathEvent {}
// SAFETY: as above.
unsafe impl Plain for SysPath2Event {}
// SAFETY: as above.
unsafe impl Plain for SysAddrEvent {}
// SAFETY: as above.
unsafe impl Plain for SysFileEvent {}
// SAFETY: as above.
unsafe impl Plain for UnixEvent {}
// SAFETY: as above.
unsafe impl Plain for ConnectEvent {}

fn read<T: Plain>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: the slice holds size_of::<T>() bytes, read_unaligned needs no
    // alignment, and `T: Plain` accepts every bit pattern.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// What a record turned into.
#[derive(Debug)]
pub(super) enum Decoded {
    Record(Record),
    /// A valid record that produces no log entry.
    Skip,
    /// Too short or of an unknown type.
    Invalid,
}

/// Decoding state: clock offset, known sandbox processes, per-batch caches.
pub(super) struct Decoder {
    /// CLOCK_REALTIME - CLOCK_MONOTONIC, to give each record a wall time.
    wall_offset: i128,
    /// Parent of each sandbox process seen (for connect-filter records,
    /// which carry no ppid).
    ppids: HashMap<u32, u32>,
    /// Processes seen in the sandbox and not yet exited.
    known: HashSet<u32>,
    /// cwd per process (see the module documentation).
    cwds: HashMap<u32, String>,
    /// Processes whose modelled cwd no kernel record vouches for
    /// (`decode_cwd.rs`).
    cwd_unsure: HashSet<u32>,
    /// Processes sharing one `fs_struct` (`CLONE_FS`): tgid to the tgid
    /// of one of them.
    fs_peers: HashMap<u32, u32>,
    /// Processes a thread of which may have a cwd of its own (round 25b).
    fs_split: HashSet<u32>,
    /// `NSpid` of sandbox processes (host pid first), for signal targets.
    nspids: HashMap<u32, Option<Vec<i64>>>,
    proc_root: String,
    /// (tgid, ppid) of the last record, whose table entries are current.
    last: (u32, u32),
    /// Per thread: the destination the kernel's connect / sendmsg hook
    /// saw during the call in flight (`decode_net.rs`).
    kernel_dests: HashMap<u32, Vec<net::Note<Option<std::net::SocketAddr>>>>,
    /// Per thread: the unix socket names the kernel's unix hook saw
    /// during the call in flight, as records show them.
    kernel_unix: HashMap<u32, Vec<net::Note<Option<String>>>>,
    /// The refusal a call's own record does not tell (`take_refusal`).
    refusal: Option<Record>,
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the kernel to fill.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

impl Decoder {
    pub fn new() -> Self {
        Self {
            wall_offset: clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_MONOTONIC),
            ppids: HashMap::new(),
            kernel_dests: HashMap::new(),
            kernel_unix: HashMap::new(),
            refusal: None,
            known: HashSet::new(),
            cwds: HashMap::new(),
            cwd_unsure: HashSet::new(),
            fs_peers: HashMap::new(),
            fs_split: HashSet::new(),
            nspids: HashMap::new(),
            proc_root: "/proc".into(),
            last: (0, 0),
        }
    }

    /// Forgets the cwd model: after lost events a chdir may be missing,
    /// so cwds are read from /proc again.
    pub fn forget_cwds(&mut self) {
        self.cwds.clear();
    }

    fn wall(&self, mono: u64) -> u64 {
        u64::try_from(i128::from(mono) + self.wall_offset).unwrap_or(0)
    }

    pub fn decode(&mut self, bytes: &[u8]) -> Decoded {
        let Some(r) = bytes.get(28..30).map(|b| u16::from_ne_bytes([b[0], b[1]])) else {
            return Decoded::Invalid;
        };
        let effect =
            match r {
                record::EXEC => read::<ExecEvent>(bytes).map(|e| self.exec(&e)),
                record::FORK => read::<ForkEvent>(bytes).map(|e| self.fork(&e)),
                record::EXIT => read::<ExitEvent>(bytes).map(|e| self.exit(&e)),
                record::SYS => read::<SysEvent>(bytes).map(|e| self.sys(&e, None, None, None)),
                record::SYS_PATH => read::<SysPathEvent>(bytes)
                    .map(|e| self.sys(&e.sys, Some(&e.path[..]), None, None)),
                record::SYS_PATH2 => read::<SysPath2Event>(bytes)
                    .map(|e| self.sys(&e.sys, Some(&e.path[..]), Some(&e.path2[..]), None)),
                record::SYS_ADDR => read::<SysAddrEvent>(bytes)
                    .map(|e| self.sys(&e.sys, None, None, Some(&e.addr[..]))),
                record::SYS_FILE => read::<SysFileEvent>(bytes).map(|e| self.sys_file(&e)),
                record::UNIX => read::<UnixEvent>(bytes).map(|e| self.unix(&e)),
                k if (kind::CONNECT4..=kind::SOCK_CREATE).contains(&k) => {
                    read::<ConnectEvent>(bytes).map(|e| self.connect_event(&e))
                }
                _ => None,
            };
        match effect {
            Some(Some(e)) => Decoded::Record(e),
            Some(None) => Decoded::Skip,
            None => Decoded::Invalid,
        }
    }

    /// The record around `target` for a capture header.
    fn effect(
        &mut self,
        kind: &'static str,
        h: &EventHeader,
        errno: u64,
        mut target: Target,
    ) -> Record {
        // Records come in runs from one process: skip the table updates
        // while the process and its parent stay the same.
        if self.last != (h.tgid, h.ppid) {
            self.last = (h.tgid, h.ppid);
            self.known.insert(h.tgid);
            if h.ppid != 0 {
                self.ppids.insert(h.tgid, h.ppid);
            }
        }
        if h.pid != h.tgid {
            target.insert("tid", h.pid);
        }
        if h.flags & flag::PPID_UNREADABLE != 0 {
            target.insert("ppid_unreadable", true);
        }
        let decision = if errno == 0 {
            Decision::Allowed
        } else {
            Decision::Denied
        };
        Record {
            kind,
            pid: h.tgid,
            ppid: h.ppid,
            uid: h.uid,
            mono_ns: h.ktime_ns,
            wall_ns: self.wall(h.ktime_ns),
            decision,
            errno,
            target,
        }
    }

    fn exec(&mut self, e: &ExecEvent) -> Option<Record> {
        let h = &e.header;
        let mut t = Target::new();
        self.put_path(
            &mut t,
            "path",
            h.tgid,
            AT_FDCWD,
            &e.filename,
            e.filename_len,
            h.flags & flag::PATH_UNREADABLE != 0,
            h.flags & flag::PATH_TRUNCATED != 0,
        );
        let args_len = usize::try_from(e.args_len).unwrap_or(0).min(e.args.len());
        let mut argv: Vec<Value> = Vec::new();
        if args_len > 0 {
            let raw = &e.args[..args_len];
            let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
            // As names are shown: lossy U+FFFD merged distinct arguments.
            for arg in raw.split(|&b| b == 0).take(e.argc as usize) {
                argv.push(shown(arg).into());
            }
        }
        let truncated = h.flags & flag::ARGV_TRUNCATED != 0 || (argv.len() as u32) < e.argc;
        t.insert("argv", Value::Array(argv));
        t.insert("argc", e.argc);
        if truncated {
            t.insert("argv_truncated", true);
        }
        if h.flags & flag::ARGV_UNREADABLE != 0 {
            t.insert("argv_unreadable", true);
        }
        file::put_binary(&mut t, &e.file);
        Some(self.effect("exec", h, 0, t))
    }

    fn fork(&mut self, e: &ForkEvent) -> Option<Record> {
        self.known.insert(e.child);
        self.ppids.insert(e.child, e.header.tgid);
        self.inherit_cwd(e.header.tgid, e.child, e.header.flags);
        let mut t = Target::new();
        t.insert("child", e.child);
        Some(self.effect("fork", &e.header, 0, t))
    }

    fn exit(&mut self, e: &ExitEvent) -> Option<Record> {
        let mut t = Target::new();
        let status = e.status;
        if status & 0x7f == 0 {
            t.insert("code", (status >> 8) & 0xff);
        } else {
            t.insert("signal", status & 0x7f);
            if status & 0x80 != 0 {
                t.insert("core", true);
            }
        }
        let effect = self.effect("exit", &e.header, 0, t);
        let tgid = e.header.tgid;
        self.last = (0, 0);
        self.known.remove(&tgid);
        self.ppids.remove(&tgid);
        self.nspids.remove(&tgid);
        self.forget_cwd(tgid);
        Some(effect)
    }

    fn sys(
        &mut self,
        s: &SysEvent,
        path: Option<&[u8]>,
        path2: Option<&[u8]>,
        addr: Option<&[u8]>,
    ) -> Option<Record> {
        let h = &s.header;
        if h.effect == effect::CHDIR {
            self.chdir(s, path);
            return None;
        }
        let kind = effect::name(h.effect);
        if kind == "event" {
            return None;
        }
        let (mut errno, mut t) = (errno_of(s.ret), Target::new());
        let flags = h.flags;
        if h.effect == effect::SYSCALL
            && flags & (flag::ABI_IA32 | flag::ABI_X32) == 0
            && refused_sometimes::contains(s.nr)
        {
            // Every EPERM of these reaches here; the kernel's own (a hard
            // limit raised without the capability) is no attempt the
            // filter refused.
            let args = super::targets::filtered_args(s);
            let rule = crate::seccomp::refusing_rule(syscalls::name_of(s.nr)?, &args)?;
            super::targets::put_refused_args(&mut t, &rule, &args);
        }
        // An xattr record's second string is the attribute's name, and the
        // fd-based calls have no path.
        let xattr_fd = matches!(s.nr, nr::FSETXATTR | nr::FREMOVEXATTR);
        let (path, path2) = if h.effect == effect::XATTR {
            let name = path2.and_then(|p| cstr(p, s.len2)).map(shown);
            t.insert("name", name.unwrap_or_default());
            flags_for(
                &mut t,
                "name",
                flags & flag::PATH2_UNREADABLE != 0,
                flags & flag::PATH2_TRUNCATED != 0,
            );
            if flags & flag::NAME_READ_AFTER != 0 {
                t.insert("name_read_after", true);
            }
            (path.filter(|_| !xattr_fd), None)
        } else {
            (path, path2)
        };
        match (path, path2) {
            (Some(p), Some(p2)) => {
                let (k1, k2) = if h.effect == effect::SYMLINK {
                    ("target", "path")
                } else {
                    ("from", "to")
                };
                if h.effect == effect::SYMLINK {
                    // The link's contents are stored, never looked up now.
                    let v = cstr(p, s.len).map(shown).unwrap_or_default();
                    t.insert(k1, v);
                    flags_for(
                        &mut t,
                        k1,
                        flags & flag::PATH_UNREADABLE != 0,
                        flags & flag::PATH_TRUNCATED != 0,
                    );
                } else {
                    self.put_path(
                        &mut t,
                        k1,
                        h.tgid,
                        s.fd,
                        p,
                        s.len,
                        flags & flag::PATH_UNREADABLE != 0,
                        flags & flag::PATH_TRUNCATED != 0,
                    );
                }
                self.put_path(
                    &mut t,
                    k2,
                    h.tgid,
                    s.fd2,
                    p2,
                    s.len2,
                    flags & flag::PATH2_UNREADABLE != 0,
                    flags & flag::PATH2_TRUNCATED != 0,
                );
            }
            (Some(p), None) => {
                self.put_path(
                    &mut t,
                    "path",
                    h.tgid,
                    s.fd,
                    p,
                    s.len,
                    flags & flag::PATH_UNREADABLE != 0,
                    flags & flag::PATH_TRUNCATED != 0,
                );
            }
            _ => {}
        }
        // Another task could rewrite the name before the kernel copied it:
        // the join proves it by a notification or keeps it as a claim.
        if flags & flag::NAME_SHARED != 0 && (path.is_some() || path2.is_some()) {
            t.insert("name_shared", true);
        }
        if flags & flag::PATH_READ_AFTER != 0 && path.is_some() {
            t.insert("path_read_after", true);
        }
        self.doubt_split_call(&mut t, h.tgid, flags);
        // A `SYS_FILE` record names its file from the kernel (`decode_file.rs`).
        let fd_target = path.is_none()
            && addr.is_none()
            && h.record != record::SYS_FILE
            && h.effect != effect::SIGNAL
            && h.effect != effect::SYSCALL;
        if fd_target {
            t.insert("fd", s.fd);
            match self.fd_path(h.tgid, s.fd) {
                Some(p) => {
                    t.insert("path", p);
                    t.insert("resolved_from", "fd");
                }
                None => {
                    t.insert("path_unresolved", true);
                }
            }
        }
        match h.effect {
            effect::OPEN | effect::CREATE | effect::TRUNCATE
                if s.nr != nr::TRUNCATE && s.nr != nr::FTRUNCATE =>
            {
                t.insert("flags", s.args[0]);
                if h.effect == effect::CREATE {
                    t.insert("mode", s.args[1] & 0o7777);
                }
                if h.effect == effect::TRUNCATE {
                    t.insert("length", 0);
                }
                if flags & flag::ADDR_UNREADABLE != 0 {
                    t.insert("flags_unreadable", true);
                }
            }
            effect::TRUNCATE => {
                t.insert("length", s.args[0] as i64);
            }
            effect::MKDIR | effect::CHMOD => {
                t.insert("mode", s.args[0] & 0o7777);
            }
            effect::UNLINK | effect::RMDIR if s.nr == nr::UNLINKAT => {
                t.insert("flags", s.args[0]);
            }
            effect::RENAME | effect::LINK if s.args[0] != 0 => {
                t.insert("flags", s.args[0]);
                // RENAME_WHITEOUT leaves a character device (0, 0) at
                // `from` that no notification or record names otherwise.
                if h.effect == effect::RENAME && s.args[0] & 4 != 0 && s.ret >= 0 {
                    t.insert("whiteout", true);
                }
            }
            effect::CHOWN => {
                t.insert("uid", s.args[0] as u32 as i32);
                t.insert("gid", s.args[1] as u32 as i32);
            }
            effect::CONNECT | effect::SENDTO | effect::BIND => {
                errno = self.put_net(&mut t, s, addr, errno)?;
                // A bind's name makes a file and no hook reports the
                // kernel's copy: the join proves it as a path (round 18).
                if h.effect == effect::BIND && flags & flag::NAME_SHARED != 0 {
                    t.insert("name_shared", true);
                }
            }
            effect::SIGNAL => self.put_signal(&mut t, s),
            _ => super::targets::put_more(&mut t, s),
        }
        Some(self.effect(kind, h, errno, t))
    }

    /// Sets `key` (and its flags) from a path buffer, resolving a relative
    /// path against the process's cwd or `dirfd`.
    #[allow(clippy::too_many_arguments)]
    fn put_path(
        &mut self,
        t: &mut Target,
        key: &'static str,
        tgid: u32,
        dirfd: i32,
        buf: &[u8],
        len: i32,
        unreadable: bool,
        truncated: bool,
    ) {
        flags_for(t, key, unreadable, truncated);
        let Some(raw) = cstr(buf, len).filter(|_| !unreadable) else {
            t.insert(key, "");
            return;
        };
        let path = shown(raw);
        if path.starts_with('/') {
            t.insert(key, path);
            return;
        }
        if dirfd == AT_FDCWD && self.cwd_doubted(tgid) {
            t.insert("cwd_unverified", true);
        }
        let (base, from) = if dirfd == AT_FDCWD {
            (self.cwd(tgid), "cwd")
        } else if dirfd >= 0 {
            (self.fd_path(tgid, dirfd), "dirfd")
        } else {
            (None, "")
        };
        let from_key: Cow<'static, str> = if key == "path" {
            "resolved_from".into()
        } else {
            format!("{key}_resolved_from").into()
        };
        match base {
            Some(base) => {
                t.insert(key, join(&base, &path));
                t.insert(from_key, from);
            }
            None => {
                t.insert(key, path);
                t.insert(format!("{key}_relative"), true);
                if dirfd != AT_FDCWD {
                    t.insert(format!("{key}_dirfd"), dirfd);
                }
            }
        }
    }
}

/// The errno of a syscall result (0 on success). The kernel's internal
/// restart codes (512-516) are what the caller sees as EINTR or a restart.
fn errno_of(ret: i64) -> u64 {
    if ret >= 0 {
        return 0;
    }
    match ret.unsigned_abs() {
        512..=516 => EINTR,
        e => e,
    }
}

fn flags_for(t: &mut Target, key: &str, unreadable: bool, truncated: bool) {
    if unreadable {
        t.insert(format!("{key}_unreadable"), true);
    }
    if truncated {
        t.insert(format!("{key}_truncated"), true);
    }
}

/// The string in `buf` as the read helper returned it (`len` bytes with
/// the NUL, or an error).
fn cstr(buf: &[u8], len: i32) -> Option<&[u8]> {
    let len = usize::try_from(len)
        .ok()
        .filter(|&l| l > 0)?
        .min(buf.len())
        .min(PATH_BYTES);
    let s = &buf[..len];
    let end = s.iter().position(|&b| b == 0).unwrap_or(len);
    Some(&s[..end])
}

/// An agent's name as the log shows kernel names, so that the two compare
/// equal for one file and two files never show one name.
pub(super) fn shown(b: &[u8]) -> String {
    crate::effectlog::names::display(b)
}

/// `rel` appended to `base`, without `.` components (which change nothing;
/// `..` stays: through a symlink it is not the lexical parent).
fn join(base: &str, rel: &str) -> String {
    let mut out = base.trim_end_matches('/').to_owned();
    for part in rel.split('/').filter(|p| !p.is_empty() && *p != ".") {
        out.push('/');
        out.push_str(part);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

#[path = "decode_cwd.rs"]
mod cwd;
#[path = "decode_file.rs"]
mod file;
#[path = "decode_net.rs"]
mod net;
#[path = "decode_proc.rs"]
mod proc_info;

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
