//! The janitor: a small process, forked before the async runtime exists,
//! that outlives the supervisor only to clean up after it. The supervisor
//! tells it, over a pipe, what to remove if the run does not end normally
//! (the run's cgroups and the materialized placeholders); if the pipe closes
//! without a final "done" (the supervisor was SIGKILLed), it kills and
//! removes the cgroups and the placeholders. Forking (no exec) costs a
//! fraction of a millisecond, which matters for start-up.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use nix::unistd::Pid;

#[derive(Debug, thiserror::Error)]
pub enum JanitorError {
    #[error("failed to start the janitor: {0}")]
    Fork(nix::Error),
}

/// The supervisor's end of the janitor's pipe.
pub struct Janitor {
    pipe: File,
}

impl Janitor {
    /// Forks the janitor. Must be called while the process has a single
    /// thread (before the tokio runtime starts): the child runs Rust code.
    pub fn fork() -> Result<Self, JanitorError> {
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(JanitorError::Fork)?;
        let supervisor = nix::unistd::getpid();
        // SAFETY: the process is single-threaded here (documented contract,
        // called from the CLI before the runtime is built).
        match unsafe { nix::unistd::fork() }.map_err(JanitorError::Fork)? {
            nix::unistd::ForkResult::Child => {
                drop(write);
                let code = serve(File::from(read), supervisor);
                // SAFETY: leave without running the parent's atexit state.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { .. } => {
                drop(read);
                Ok(Self {
                    pipe: File::from(write),
                })
            }
        }
    }

    /// Asks for `path` (a run cgroup, v2) to be killed and removed.
    pub fn cgroup(&mut self, path: &Path) {
        self.say("cgroup", path);
    }

    /// Asks for a v1 limit cgroup to be removed.
    pub fn v1(&mut self, path: &Path) {
        self.say("v1", path);
    }

    /// Asks for an empty placeholder directory to be removed.
    pub fn placeholder(&mut self, path: &Path) {
        self.say("placeholder", path);
    }

    /// Asks for the run's ring to be taken out of the pin cache's `EVENTS`
    /// (and a spare put in) once the supervisor is gone, whether it ended
    /// normally or not (`ebpf::CgroupPrograms::leave_ring`): the waits for
    /// the grace periods are then nobody's.
    pub fn ring(&mut self, left: &crate::ebpf::LeftRing) {
        self.say(&format!("ring\t{}\t{}", left.key, left.bytes), &left.pin);
    }

    /// Asks for the live log (descriptor `fd` of the supervisor, named
    /// `path`) to be let go of its append-only flag should the supervisor
    /// die before the seal, which clears it itself (`append_only.rs`).
    /// Told before the flag is set: a supervisor killed in between leaves
    /// nothing to undo, and clearing an unset flag changes nothing.
    pub fn log(&mut self, fd: std::os::fd::RawFd, path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let Ok(st) = nix::sys::stat::fstat(fd) else {
            return;
        };
        let hex: String = path
            .as_os_str()
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let line = format!("{fd}\t{}\t{}\t{hex}", st.st_dev, st.st_ino);
        self.say("log", Path::new(&line));
    }

    /// The run ended normally and cleaned up itself: the janitor exits.
    pub fn done(mut self) {
        let _ = self.pipe.write_all(b"done\n");
    }

    fn say(&mut self, what: &str, path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let mut line = format!("{what}\t").into_bytes();
        line.extend_from_slice(path.as_os_str().as_bytes());
        line.push(b'\n');
        let _ = self.pipe.write_all(&line);
    }
}

/// A live log the janitor was told of: the supervisor's descriptor
/// reopened while it lived, or else its name and inode, to be found again
/// when the supervisor is gone (it died before the janitor read the line:
/// round 20 found a log left append-only that way, 1 of 30 random kills).
struct LiveLog {
    reopened: Option<File>,
    dev: u64,
    ino: u64,
    path: PathBuf,
}

impl LiveLog {
    /// From what follows "log\t": `<fd>\t<dev>\t<ino>\t<path in hex>`.
    fn parse(rest: &Path, supervisor: Pid) -> Option<Self> {
        use std::os::unix::ffi::OsStrExt;
        let mut parts = rest.as_os_str().as_bytes().split(|b| *b == b'\t');
        let mut field = || std::str::from_utf8(parts.next()?).ok();
        let fd = field()?;
        let dev = field()?.parse().ok()?;
        let ino = field()?.parse().ok()?;
        let hex = field()?.as_bytes();
        let bytes = hex
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        Some(Self {
            reopened: reopen_supervisors(Path::new(fd), supervisor),
            dev,
            ino,
            path: PathBuf::from(std::ffi::OsStr::from_bytes(&bytes)),
        })
    }

    /// The log's file: the reopened descriptor, or the name if it still
    /// leads to the same inode (no link followed at the end).
    fn file(self) -> Option<File> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        if let Some(file) = self.reopened {
            return Some(file);
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&self.path)
            .ok()?;
        let meta = file.metadata().ok()?;
        (meta.dev() == self.dev && meta.ino() == self.ino && meta.is_file()).then_some(file)
    }
}

/// The supervisor's descriptor `fd` (a decimal string), opened anew
/// through `/proc` while the supervisor lives. `getppid()` would name our
/// new parent (a reaper) once the supervisor died, and its descriptor `fd`
/// is another file; the supervisor's pid cannot be reused while we are
/// still its child (we are re-parented before it is released), so it is
/// checked after the open.
fn reopen_supervisors(fd: &Path, supervisor: Pid) -> Option<File> {
    let fd: u32 = fd.to_str()?.parse().ok()?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .open(format!("/proc/{supervisor}/fd/{fd}"))
        .ok()?;
    (nix::unistd::getppid() == supervisor).then_some(file)
}

/// The descriptor the janitor keeps its pipe on; every other one is closed
/// or `/dev/null`.
const PIPE_FD: i32 = 3;

/// The janitor's life: detach from the terminal, wait, clean up.
fn serve(pipe: File, supervisor: Pid) -> i32 {
    let _ = nix::unistd::setsid();
    // Hold nothing of the launcher's: its working directory (often the
    // writable root) kept the user's filesystem busy after the run
    // returned (`umount` failed with EBUSY while we exited), and its other
    // descriptors (a harness's --status-fd pipe) would not reach EOF until
    // we were gone. Every path we are told is absolute.
    let _ = nix::unistd::chdir("/");
    let pipe = keep_only(pipe);
    // Nor its command line: we may outlive the supervisor by a grace
    // period or two (`remove_rings`), and a process still carrying the
    // agent's command after `run` returned looked like a leftover of the
    // agent to a harness scanning for one (the lab's el-seal-after-drain,
    // 2 of 160 runs under load). Without a title we clean up anyway.
    let _ = crate::proc_title::retitle(b"tartaros-janitor\0");
    let mut cgroups = Vec::new();
    let mut v1 = Vec::new();
    let mut placeholders = Vec::new();
    let mut rings = Vec::new();
    let mut logs = Vec::new();
    for line in BufReader::new(pipe).split(b'\n').map_while(Result::ok) {
        use std::os::unix::ffi::OsStrExt;
        let Some(tab) = line.iter().position(|b| *b == b'\t') else {
            if line == b"done" {
                remove_rings(&rings);
                return 0;
            }
            continue;
        };
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(&line[tab + 1..]));
        match &line[..tab] {
            b"cgroup" => cgroups.push(path),
            b"v1" => v1.push(path),
            b"placeholder" => placeholders.push(path),
            // Reopened at once, while the supervisor holds it: after its
            // death no name can be trusted to lead to the same file.
            b"log" => logs.extend(LiveLog::parse(&path, supervisor)),
            // "ring\t<key>\t<bytes>\t<pin>"
            // (Told again at registration: once is enough.)
            b"ring" => {
                if let Some(left) = ring_line(&path)
                    && !rings
                        .iter()
                        .any(|r: &crate::ebpf::LeftRing| r.key == left.key)
                {
                    rings.push(left);
                }
            }
            _ => {}
        }
    }
    // The pipe closed without "done": the supervisor died.
    remove_rings(&rings);
    for log in logs.into_iter().filter_map(LiveLog::file) {
        let _ = crate::append_only::set(&log, false);
    }
    let mut code = 0;
    for cgroup in &cgroups {
        if crate::cgroup::kill_and_remove(cgroup, crate::cgroup::TEARDOWN_TIMEOUT).is_err() {
            code = 1;
        }
    }
    for dir in &v1 {
        crate::cgroup::remove_v1(dir, crate::cgroup::TEARDOWN_TIMEOUT);
    }
    crate::materialize::cleanup_placeholders(&placeholders);
    code
}

/// A ring left by the run, from what follows "ring\t" on its line.
fn ring_line(rest: &Path) -> Option<crate::ebpf::LeftRing> {
    use std::os::unix::ffi::OsStrExt;
    let mut parts = rest.as_os_str().as_bytes().splitn(3, |b| *b == b'\t');
    let mut number = || std::str::from_utf8(parts.next()?).ok()?.parse::<u64>().ok();
    let key = number()?;
    let bytes = u32::try_from(number()?).ok()?;
    let pin = PathBuf::from(std::ffi::OsStr::from_bytes(parts.next()?));
    Some(crate::ebpf::LeftRing { pin, key, bytes })
}

fn remove_rings(rings: &[crate::ebpf::LeftRing]) {
    rings.iter().for_each(crate::ebpf::retire_pinned_ring);
}

/// Leaves the process with `pipe` on [`PIPE_FD`], `/dev/null` on 0-2 and
/// no other descriptor. A pipe that cannot be moved is kept where it is
/// (the cleanup matters more than the launcher's descriptors).
fn keep_only(pipe: File) -> File {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, IntoRawFd as _};
    let fd = pipe.into_raw_fd();
    // SAFETY: descriptor calls on a freshly forked single-threaded process;
    // `fd` is ours and is owned again by the File returned.
    unsafe {
        let fd = if fd == PIPE_FD {
            fd
        } else if libc::dup2(fd, PIPE_FD) == PIPE_FD {
            libc::close(fd);
            PIPE_FD
        } else {
            return File::from_raw_fd(fd);
        };
        if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
            for std_fd in 0..=2 {
                libc::dup2(null.as_raw_fd(), std_fd);
            }
        }
        libc::syscall(libc::SYS_close_range, (PIPE_FD + 1) as u32, u32::MAX, 0u32);
        File::from_raw_fd(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_told_after_the_supervisor_died_is_found_by_its_name_and_inode() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("effects\tlog\n.jsonl");
        let file = std::fs::File::create(&path).unwrap();
        let meta = file.metadata().unwrap();
        let hex: String = path
            .to_str()
            .unwrap()
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect();
        // Our own pid as the "supervisor": we are not its child, as after
        // its death, so the descriptor is not reopened.
        let own = nix::unistd::getpid();
        let line = |ino: u64| format!("99\t{}\t{ino}\t{hex}", meta.dev());
        let told = LiveLog::parse(Path::new(&line(meta.ino())), own).unwrap();
        assert!(told.reopened.is_none());
        let found = told.file().unwrap();
        assert_eq!(found.metadata().unwrap().ino(), meta.ino());
        // Another inode at the name is left alone.
        let other = LiveLog::parse(Path::new(&line(meta.ino() + 1)), own).unwrap();
        assert!(other.file().is_none());
        assert!(LiveLog::parse(Path::new("99\t1\t2\tzz"), own).is_none());
    }

    #[test]
    fn a_log_is_reopened_only_through_the_process_that_is_still_our_parent() {
        let file = tempfile::tempfile().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file).to_string();
        // Our own descriptor opens, but we are not our own parent: a dead
        // supervisor's pid, or a reaper's descriptor of that number, is
        // never taken for the log.
        let own = nix::unistd::getpid();
        assert!(std::fs::File::open(format!("/proc/{own}/fd/{fd}")).is_ok());
        assert!(reopen_supervisors(Path::new(&fd), own).is_none());
        assert!(reopen_supervisors(Path::new("x"), nix::unistd::getppid()).is_none());
    }

    #[test]
    fn a_ring_line_gives_back_what_the_supervisor_said() {
        let left = crate::ebpf::LeftRing {
            pin: PathBuf::from("/run/tartaros/bpf/full_ab/map_EVENTS"),
            key: 0x1234_5678_9abc,
            bytes: 8 << 20,
        };
        let said = format!("{}\t{}\t{}", left.key, left.bytes, left.pin.display());
        assert_eq!(ring_line(Path::new(&said)), Some(left));
        for bad in ["x\t1\t/p", "1\tx\t/p", "1\t4294967296\t/p", "1\t2", ""] {
            assert_eq!(ring_line(Path::new(bad)), None, "{bad:?}");
        }
    }
}
