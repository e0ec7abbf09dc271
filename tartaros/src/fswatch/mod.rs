//! Kernel-sourced paths for the effect log (issue 13, DESIGN.md section 5):
//! a fanotify group with filesystem marks on the writable roots reports
//! every change there with the kernel's own file handles, and the log's
//! writer joins it with the capture's records before they are written.
//!
//! - a successful file record gets `"path_source": "kernel"`, its path
//!   from the kernel, and the agent's string as `claimed_path` (or
//!   `claimed_from` / `claimed_to`) where the two differ;
//! - denied and unconfirmed records keep the agent's string with
//!   `"path_source": "agent"`;
//! - changes no record claims (io_uring, core files, ...) become records
//!   of their own with `"uncaptured": true`;
//! - writes become one `write` record per process and file (`count`
//!   notifications, `size` at close);
//! - the files created or modified are hashed into the seal's `files`.
//!
//! Design and limits: docs/ebpf.md, "Kernel-sourced paths".

mod content;
mod join;
mod notify;
mod writes;

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::effectlog::Record;
use join::{Join, Notice, Task, bit};
use notify::{DirEntry, Group, Handle, RawEvent};

pub use content::{MAX_FILE_BYTES, MAX_FILES, MAX_LIST_BYTES, MAX_TOTAL_BYTES, trim};

/// The seal's `files` are cut to this many bytes when the log's
/// filesystem has less room than they need (plus this much again).
pub const FULL_SEAL_FILES_BYTES: usize = 64 * 1024;

/// How long a thread found outside the sandbox is not looked up again
/// (a pid is not reused that fast; a sandbox thread is in the cgroup from
/// its first instruction, so the verdict cannot change while it lives).
const HOST_VERDICT_NS: u64 = 1_000_000_000;
/// Bound of the thread-verdict and directory-path caches.
const CACHE_ENTRIES: usize = 16_384;

/// Errors of the kernel-sourced path watch.
#[derive(Debug, thiserror::Error)]
pub enum FsWatchError {
    #[error(
        "failed to create the fanotify group for kernel-sourced paths: {0}; it needs root (CAP_SYS_ADMIN) and Linux 5.17 (FAN_RENAME, file handles)"
    )]
    Init(#[source] std::io::Error),
    #[error(
        "failed to watch the filesystem of {path} for kernel-sourced paths: {source}; its filesystem must support file handles (ext4, xfs, btrfs, tmpfs)"
    )]
    Mark {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to find the run's cgroup {0} under a cgroup v2 mount")]
    Cgroup(PathBuf),
}

/// Membership of a thread in the run, read from /proc.
enum Member {
    Sandbox(Task),
    Host,
    Gone,
}

/// The watch of one run: created before the agent starts, fed the
/// capture's records by the log writer, finished after the drain.
pub struct FsWatch {
    group: Group,
    join: Join,
    roots: Vec<PathBuf>,
    /// The run's cgroup as /proc/<pid>/cgroup names it (`/tartaros-...`).
    cgroup: String,
    host: HashMap<u32, u64>,
    dirs: HashMap<Handle, Option<PathBuf>>,
    /// Notifications of threads that were gone before they could be
    /// placed, in the roots: placed when a record names the thread.
    unplaced: Vec<Notice>,
    lost: u64,
    /// When the last read of the group started.
    last_poll_ns: u64,
}

impl FsWatch {
    /// Marks the filesystems of `roots`; call before any process joins
    /// `cgroup_dir`, so that no change precedes the watch.
    pub fn start(roots: &[PathBuf], cgroup_dir: &Path) -> Result<Self, FsWatchError> {
        let roots: Vec<PathBuf> = roots
            .iter()
            .map(|r| r.canonicalize().unwrap_or_else(|_| r.clone()))
            .collect();
        let cgroup = relative_cgroup(cgroup_dir)
            .ok_or_else(|| FsWatchError::Cgroup(cgroup_dir.to_path_buf()))?;
        let group = Group::new(&roots)?;
        let wall_offset = i128::from(crate::effectlog::wall_now_ns())
            - i128::from(crate::effectlog::mono_now_ns());
        Ok(Self {
            group,
            join: Join::new(wall_offset),
            roots,
            cgroup,
            host: HashMap::new(),
            dirs: HashMap::new(),
            unplaced: Vec::new(),
            lost: 0,
            last_poll_ns: 0,
        })
    }

    /// The descriptor to wait on (readable when notifications are queued).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.group.raw_fd()
    }

    /// Joins a batch of capture records with the kernel's notifications;
    /// returns the records to write, in order.
    pub fn admit(&mut self, records: Vec<Record>) -> Vec<Record> {
        self.join.learn(&records);
        let mut out = self.poll();
        out.extend(self.join.join(records, crate::effectlog::mono_now_ns()));
        out
    }

    /// Reads what is queued and settles what has waited long enough.
    pub fn tick(&mut self) -> Vec<Record> {
        let mut out = self.poll();
        out.extend(self.join.join(Vec::new(), crate::effectlog::mono_now_ns()));
        out
    }

    /// Notifications lost since the last call (queue overflow or a failed
    /// read), for a gap record.
    pub fn take_lost(&mut self) -> u64 {
        std::mem::take(&mut self.lost)
    }

    /// Everything left, once the cgroup is empty and the capture drained:
    /// the last records and the seal's `files` (with `files_omitted`).
    pub fn finish(&mut self) -> (Vec<Record>, Value) {
        let mut out = self.poll();
        for n in std::mem::take(&mut self.unplaced) {
            let task = self.join.task(n.tid).unwrap_or(Task {
                tgid: n.tid,
                ppid: 0,
                uid: 0,
            });
            out.extend(self.join.notice(n, task));
        }
        out.extend(self.join.finish(crate::effectlog::mono_now_ns()));
        let (files, omitted) = content::seal_files(self.join.touched(), &self.roots);
        let omitted = omitted + self.join.untracked();
        let mut seal = serde_json::Map::new();
        seal.insert("files".into(), Value::Array(files));
        if omitted > 0 {
            seal.insert("files_omitted".into(), omitted.into());
        }
        (out, Value::Object(seal))
    }

    fn poll(&mut self) -> Vec<Record> {
        let mut out = Vec::new();
        let after = self.last_poll_ns;
        self.last_poll_ns = crate::effectlog::mono_now_ns();
        let events = match self.group.read_all() {
            Ok(events) => events,
            Err(e) => {
                eprintln!("tartaros: failed to read file notifications: {e}");
                self.lost += 1;
                return out;
            }
        };
        let now = crate::effectlog::mono_now_ns();
        for event in events {
            if event.mask & bit::OVERFLOW != 0 {
                self.lost += 1;
                continue;
            }
            if event.entry.is_none() && event.mask & !(bit::ATTRIB | bit::ONDIR) == 0 {
                // An inode change with no directory entry: the link count
                // of a file being linked or unlinked, whose link / unlink
                // is reported with its entry.
                continue;
            }
            let member = match self.join.task(event.tid) {
                Some(task) => Member::Sandbox(task),
                None if self.host.get(&event.tid).is_some_and(|&until| until > now) => {
                    continue;
                }
                None => self.member(event.tid),
            };
            match member {
                Member::Host => {
                    if self.host.len() >= CACHE_ENTRIES {
                        self.host.retain(|_, until| *until > now);
                    }
                    self.host.insert(event.tid, now + HOST_VERDICT_NS);
                }
                Member::Sandbox(task) => {
                    self.join.add_task(event.tid, task);
                    let n = self.notice(&event, now, after);
                    out.extend(self.join.notice(n, task));
                }
                Member::Gone => {
                    let n = self.notice(&event, now, after);
                    let in_roots = n
                        .path
                        .as_deref()
                        .is_some_and(|p| self.roots.iter().any(|r| Path::new(p).starts_with(r)));
                    if in_roots {
                        self.unplaced.push(n);
                    }
                }
            }
        }
        // A thread that was gone may have been named by a record since.
        let unplaced = std::mem::take(&mut self.unplaced);
        for n in unplaced {
            match self.join.task(n.tid) {
                Some(task) => out.extend(self.join.notice(n, task)),
                None => self.unplaced.push(n),
            }
        }
        out
    }

    fn notice(&mut self, event: &RawEvent, now: u64, after: u64) -> Notice {
        let (raw, name) = match &event.entry {
            Some(entry) => (self.entry_path(entry), display(&entry.name)),
            None => (None, String::new()),
        };
        let new_raw = event.new_entry.as_ref().and_then(|e| self.entry_path(e));
        if event.mask & bit::ONDIR != 0 && event.mask & (bit::RENAME | bit::DELETE) != 0 {
            // Cached paths below a moved or removed directory are stale.
            self.dirs.clear();
        }
        Notice {
            tid: event.tid,
            mask: event.mask,
            claimed: 0,
            path: raw.as_deref().map(display_path),
            name,
            new_path: new_raw.as_deref().map(display_path),
            raw,
            new_raw,
            read_ns: now,
            after_ns: after,
        }
    }

    fn entry_path(&mut self, entry: &DirEntry) -> Option<PathBuf> {
        let dir = match self.dirs.get(&entry.dir) {
            Some(dir) => dir.clone(),
            None => {
                let dir = self.group.resolve(&entry.dir);
                if self.dirs.len() >= CACHE_ENTRIES {
                    self.dirs.clear();
                }
                self.dirs.insert(entry.dir.clone(), dir.clone());
                dir
            }
        }?;
        if entry.name.is_empty() || entry.name == b"." {
            return Some(dir);
        }
        Some(dir.join(std::ffi::OsStr::from_bytes(&entry.name)))
    }

    fn member(&self, tid: u32) -> Member {
        let Ok(cgroups) = std::fs::read_to_string(format!("/proc/{tid}/cgroup")) else {
            return Member::Gone;
        };
        if !in_cgroup(&cgroups, &self.cgroup) {
            return Member::Host;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
            return Member::Gone;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u32>().ok())
        };
        Member::Sandbox(Task {
            tgid: field("Tgid:").unwrap_or(tid),
            ppid: field("PPid:").unwrap_or(0),
            uid: field("Uid:").unwrap_or(0),
        })
    }
}

/// A kernel name as the log shows it: itself when it is UTF-8; otherwise
/// every byte that is not part of valid UTF-8 as `\xNN` and every `\` as
/// `\\`, so that two different names never show the same (U+FFFD would
/// let an agent give two files one name, or hide one from the seal).
pub fn display(bytes: &[u8]) -> String {
    if let Ok(s) = std::str::from_utf8(bytes) {
        return s.to_string();
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// [`display`] of a path.
pub fn display_path(path: &Path) -> String {
    display(path.as_os_str().as_bytes())
}

/// Whether a /proc/<pid>/cgroup text puts the task in `cgroup` or below.
fn in_cgroup(text: &str, cgroup: &str) -> bool {
    text.lines().filter_map(|l| l.strip_prefix("0::")).any(|p| {
        p == cgroup
            || p.strip_prefix(cgroup)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// The cgroup directory relative to its cgroup v2 mount, as /proc names it.
fn relative_cgroup(dir: &Path) -> Option<String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    relative_cgroup_in(&mountinfo, dir)
}

fn relative_cgroup_in(mountinfo: &str, dir: &Path) -> Option<String> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            (right.split_whitespace().next() == Some("cgroup2"))
                .then(|| left.split_whitespace().nth(4))
                .flatten()
        })
        .filter_map(|mount| dir.strip_prefix(mount).ok())
        .map(|rel| format!("/{}", rel.to_string_lossy()))
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effectlog::{ExitStatus, Genesis, LogWriter, Seal, verify_file};
    use serde_json::json;

    fn sealed_with(dir: &Path, name: &str, files: Value) -> crate::effectlog::Verdict {
        let path = dir.join(name);
        let mut w = LogWriter::create(&path).unwrap();
        w.genesis(Genesis::new(json!({}), vec![], vec![], vec![]))
            .unwrap();
        w.set_seal_files(json!({"files": files, "ignored": 1}));
        w.seal(Seal {
            exit_status: ExitStatus::Code(0),
            cgroup_empty: true,
        })
        .unwrap();
        verify_file(&path)
    }

    #[test]
    fn verify_accepts_the_seals_files_and_refuses_a_bad_list() {
        let dir = tempfile::tempdir().unwrap();
        let hash = "ab".repeat(32);
        let good = json!([
            {"path": "/w/a", "size": 1, "sha256": hash},
            {"path": "/w/b", "size": 99, "sha256": null, "skipped": "too large"},
        ]);
        let v = sealed_with(dir.path(), "good", good);
        assert_eq!(v.code, 0, "{}", v.message);
        let unsorted = json!([
            {"path": "/w/b", "size": 1, "sha256": hash},
            {"path": "/w/a", "size": 1, "sha256": hash},
        ]);
        let v = sealed_with(dir.path(), "unsorted", unsorted);
        assert_eq!(v.code, 1, "{}", v.message);
        let unhashed = json!([{"path": "/w/a", "size": 1, "sha256": null}]);
        assert_eq!(sealed_with(dir.path(), "unhashed", unhashed).code, 1);
    }

    #[test]
    fn names_that_are_not_utf8_are_shown_escaped_and_distinct() {
        assert_eq!(display(b"/w/plain \\ name"), "/w/plain \\ name");
        assert_eq!(display(b"/w/\xff"), "/w/\\xff");
        assert_eq!(display(b"/w/\\\xfe"), "/w/\\\\\\xfe");
        assert_ne!(display(b"/w/\xff"), display(b"/w/\xfe"));
    }

    #[test]
    fn the_run_cgroup_is_named_relative_to_the_cgroup2_mount() {
        let mountinfo = "\
25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
";
        let dir = Path::new("/sys/fs/cgroup/unified/tartaros-1/sub");
        assert_eq!(
            relative_cgroup_in(mountinfo, dir).as_deref(),
            Some("/tartaros-1/sub")
        );
        assert_eq!(
            relative_cgroup_in(mountinfo, Path::new("/sys/fs/cgroup/pids/x")),
            None
        );
    }

    #[test]
    fn cgroup_lines_match_the_run_and_below_only() {
        let text = "12:pids:/x\n0::/tartaros-ab/sub\n";
        assert!(in_cgroup(text, "/tartaros-ab"));
        assert!(!in_cgroup(text, "/tartaros-a"));
        assert!(in_cgroup("0::/tartaros-ab\n", "/tartaros-ab"));
        assert!(!in_cgroup("0::/\n", "/tartaros-ab"));
    }
}
