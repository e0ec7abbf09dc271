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

mod claims;
mod content;
mod dir_cache;
mod exec_opens;
mod join;
mod links;
mod notify;
mod pairing;
mod place;
mod queue;
mod relinked;
mod rewind;
mod tmpfile_links;
mod touched;
mod writes;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::effectlog::Record;
use join::{Join, Task};
use notify::{Group, Handle, RawEvent};
use place::{Facts, Member, Placement};

pub use content::{MAX_FILE_BYTES, MAX_FILES, MAX_LIST_BYTES, MAX_TOTAL_BYTES, trim};

/// The most a cut seal `files` list keeps when the log's filesystem has
/// no room for all of it (less when the log's reserve holds less; see
/// `effectlog::writer::space::seal_files_budget`).
pub const FULL_SEAL_FILES_BYTES: usize = 64 * 1024;

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

/// The watch of one run: created before the agent starts, fed the
/// capture's records by the log writer, finished after the drain.
pub struct FsWatch {
    group: Group,
    /// The run's cgroup as /proc/<pid>/cgroup names it (`/tartaros-...`).
    cgroup: String,
    place: Placement,
    /// When the last read of the group started.
    last_poll_ns: u64,
}

/// The regular files behind this process's standard streams, which the
/// agent inherits, with their descriptors.
fn standard_streams() -> impl Iterator<Item = (i32, PathBuf)> {
    (0..3)
        .filter_map(|fd| Some((fd, std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?)))
        .filter(|(_, path)| {
            path.is_absolute() && std::fs::metadata(path).is_ok_and(|m| m.is_file())
        })
}

fn standard_files() -> Vec<PathBuf> {
    standard_streams().map(|(_, path)| path).collect()
}

/// The standard streams the agent inherits open for writing that are
/// regular files in a root (the stdio relay passes those as they are): a
/// stream opened read-write (`<> file`, Python's `open(f, "w+")`) can be
/// changed through a shared mapping, which sends no notification, by an
/// agent that makes no captured call on it. So the seal hashes them
/// whatever happens to them, like a file the agent opened for writing.
fn writable_standard_files(roots: &[PathBuf]) -> Vec<PathBuf> {
    standard_streams()
        .filter(|(fd, path)| {
            roots.iter().any(|r| path.starts_with(r))
                && nix::fcntl::fcntl(*fd, nix::fcntl::FcntlArg::F_GETFL)
                    .is_ok_and(|flags| flags & libc::O_ACCMODE != libc::O_RDONLY)
        })
        .map(|(_, path)| path)
        .collect()
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
        let mut place = Placement::new(Join::new(wall_offset), roots);
        place.join.probe = group.probe();
        place.inherited = standard_files();
        for path in writable_standard_files(&place.roots) {
            place.join.touch_inherited(&path);
        }
        Ok(Self {
            group,
            cgroup,
            place,
            last_poll_ns: 0,
        })
    }

    /// Joins a batch of capture records with the kernel's notifications;
    /// returns the records to write, in order.
    pub fn admit(&mut self, records: Vec<Record>) -> Vec<Record> {
        self.place.join.learn(&records);
        let read_to = records.iter().map(|r| r.mono_ns).max();
        let mut out = self.poll();
        out.extend(
            self.place
                .join
                .join(records, crate::effectlog::mono_now_ns()),
        );
        if let Some(mono_ns) = read_to {
            self.place.ring_read_to(mono_ns);
        }
        out
    }

    /// Reads what is queued and settles what has waited long enough.
    pub fn tick(&mut self) -> Vec<Record> {
        let mut out = self.poll();
        out.extend(
            self.place
                .join
                .join(Vec::new(), crate::effectlog::mono_now_ns()),
        );
        out
    }

    /// Whether the kernel reports each file's own handle (`notify.rs`).
    pub fn reports_fid(&self) -> bool {
        self.group.reports_fid()
    }

    /// What stops the watch once the sandbox is empty (see [`Marks`]).
    pub fn marks(&self) -> Marks {
        Marks(self.group.dup())
    }

    /// Notifications lost since the last call (queue overflow or a failed
    /// read), and those whose path could not be taken back to their place
    /// in the stream (`rewind.rs`), each with its gap's `lost_kind`.
    pub fn take_lost(&mut self) -> [(u64, &'static str); 2] {
        [
            (std::mem::take(&mut self.place.lost), "file-notification"),
            (std::mem::take(&mut self.place.unsure), "file-name-position"),
        ]
    }

    /// Everything left, once the cgroup is empty and the capture drained:
    /// the last records and the seal's `files` (with `files_omitted`).
    pub fn finish(&mut self) -> (Vec<Record>, Value) {
        let mut out = Vec::new();
        loop {
            let (records, more) = self.poll_batch();
            out.extend(records);
            if !more {
                break;
            }
        }
        out.extend(self.place.finish(crate::effectlog::mono_now_ns()));
        let touched = self.place.join.settled_touched(&self.place.roots);
        let (files, omitted) = content::seal_files(touched.iter(), &self.place.roots);
        let omitted = omitted + touched.untracked() + self.group.unnamed_dirs();
        let mut seal = serde_json::Map::new();
        seal.insert("files".into(), Value::Array(files));
        if omitted > 0 {
            seal.insert("files_omitted".into(), omitted.into());
        }
        (out, Value::Object(seal))
    }

    /// Reads one batch of notifications (the rest waits for the next tick).
    fn poll(&mut self) -> Vec<Record> {
        self.poll_batch().0
    }

    /// [`Self::poll`], and whether another batch may be waiting.
    fn poll_batch(&mut self) -> (Vec<Record>, bool) {
        let after = self.last_poll_ns;
        self.last_poll_ns = crate::effectlog::mono_now_ns();
        let (events, more) = match self.group.read_all() {
            Ok(read) => read,
            Err(e) => {
                eprintln!("tartaros: failed to read file notifications: {e}");
                self.place.lost += 1;
                return (Vec::new(), false);
            }
        };
        let facts = ProcFacts {
            group: std::cell::RefCell::new(&mut self.group),
            cgroup: &self.cgroup,
        };
        let now = crate::effectlog::mono_now_ns();
        let out = self.place.place(events, now, after, &facts);
        let more = more || self.place.more_ahead;
        if !more {
            // The queue was empty during this read: what was queued
            // before it began has been read.
            self.place.join.notices_read_through(self.last_poll_ns);
        }
        (out, more)
    }
}

/// The group's marks, held apart from the watch (which the log's writer
/// owns), to be removed as soon as the sandbox is empty: no sandbox change
/// can follow, the queued ones stay readable, and the kernel's slow part
/// of closing the group (freeing marks) starts while the log is drained.
pub struct Marks(Option<std::os::fd::OwnedFd>);

impl Marks {
    /// Stops new notifications. Call only once no sandbox process is left.
    pub fn remove(self) {
        if let Some(fd) = &self.0 {
            notify::unmark_all(fd);
        }
    }
}

/// The host facts, from /proc and the group's filesystems.
struct ProcFacts<'a> {
    group: std::cell::RefCell<&'a mut Group>,
    cgroup: &'a str,
}

impl Facts for ProcFacts<'_> {
    fn resolve(&self, dir: &Handle) -> Option<PathBuf> {
        self.group.borrow().resolve(dir)
    }

    fn read_ahead(&self) -> Option<std::io::Result<(Vec<RawEvent>, bool)>> {
        Some(self.group.borrow_mut().read_all())
    }

    fn member(&self, tid: u32) -> Member {
        let Ok(cgroups) = std::fs::read_to_string(format!("/proc/{tid}/cgroup")) else {
            return Member::Gone;
        };
        if !in_cgroup(&cgroups, self.cgroup) {
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
        w.set_seal_fields(json!({"files": files, "ignored": 1}));
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
