//! Root as a deputy: the file operations the supervisor (or the service's
//! worker) does on an agent's or a caller's behalf must not be redirected
//! by a symlink swapped into a parent directory between two path walks.
//! Each test swaps a component with `renameat2(RENAME_EXCHANGE)`, either in
//! a tight loop or the moment tartaros creates something, while tartaros
//! runs, and checks from the host side that a root-owned victim directory
//! outside every writable root gained nothing and lost nothing, and that
//! its file kept its owner.

mod common;
#[path = "support/service.rs"]
mod harness;

use std::ffi::CString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use harness::Service;

const CAROL: u32 = 47_000 + 151;
const DAVE: u32 = 47_000 + 152;

/// How long each race is run for (a win on the old code came within a
/// few dozen runs).
const RACE_FOR: Duration = Duration::from_secs(6);
const MAX_RUNS: usize = 150;

/// One race at a time: a flipper or a spinning swapper competing with
/// another test's for the CPU would lose the window it is there to hit.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A root-owned directory outside every writable root, with a root-only
/// file in it: what a redirected deputy would create in, chown or unlink.
struct Victim {
    dir: tempfile::TempDir,
}

impl Victim {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("tt-victim-")
            .tempdir()
            .unwrap();
        std::fs::set_permissions(dir.path(), PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::write(dir.path().join("victim"), "root's file\n").unwrap();
        std::fs::set_permissions(dir.path().join("victim"), PermissionsExt::from_mode(0o600))
            .unwrap();
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Asserts that the directory holds only its root-only file, unchanged.
    #[track_caller]
    fn assert_untouched(&self, what: &str) {
        let names: Vec<String> = std::fs::read_dir(self.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["victim".to_string()], "{what}: {names:?}");
        let dir = std::fs::symlink_metadata(self.path()).unwrap();
        assert_eq!((dir.uid(), dir.gid()), (0, 0), "{what}: the directory");
        let file = std::fs::symlink_metadata(self.path().join("victim")).unwrap();
        assert_eq!(
            (file.uid(), file.gid(), file.mode() & 0o7777),
            (0, 0, 0o600),
            "{what}: the victim file was chowned or chmodded"
        );
        assert_eq!(
            std::fs::read_to_string(self.path().join("victim")).unwrap(),
            "root's file\n",
            "{what}"
        );
    }
}

/// `renameat2(a, b, RENAME_EXCHANGE)` relative to `dir`: both names stay, their objects trade places atomically.
fn exchange_at(dir: libc::c_int, a: &CString, b: &CString) -> bool {
    // SAFETY: two NUL-terminated paths that outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            dir,
            a.as_ptr(),
            dir,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    rc == 0
}

/// Exchanges a real directory with a symlink to the victim in a tight
/// loop until dropped; the name that was the directory at the start is a
/// directory again afterwards.
struct Flipper {
    stop: Arc<AtomicBool>,
    flips: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl Flipper {
    /// Flips `dir/real` and `dir/link`.
    fn start(dir: &Path, real: &str, link: &str) -> Self {
        use std::os::fd::AsRawFd;
        let stop = Arc::new(AtomicBool::new(false));
        let flips = Arc::new(AtomicUsize::new(0));
        let parent = std::fs::File::open(dir).unwrap();
        let (a, b) = (CString::new(real).unwrap(), CString::new(link).unwrap());
        let (stopped, count) = (stop.clone(), flips.clone());
        let thread = std::thread::spawn(move || {
            let at = parent.as_raw_fd();
            while !stopped.load(Ordering::Relaxed) {
                if exchange_at(at, &a, &b) {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
            if count.load(Ordering::Relaxed) % 2 == 1 {
                exchange_at(at, &a, &b);
            }
        });
        Self {
            stop,
            flips,
            thread: Some(thread),
        }
    }

    fn flips(&self) -> usize {
        self.flips.load(Ordering::Relaxed)
    }
}

impl Drop for Flipper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Waits (up to 20 s) on an inotify watch of `parent/dir` until something
/// is created there, then exchanges `parent/dir` with `parent/link` at
/// once: as a real-time thread where the kernel allows, so that its
/// wake-up preempts the run it races. Returns whether it swapped in time:
/// while `name` still existed, i.e. before any removal of it.
fn swap_on_create(parent: &Path, dir: &str, name: &str, link: &str) -> JoinHandle<bool> {
    use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
    let at = std::fs::File::open(parent).unwrap();
    // SAFETY: inotify_init1 takes flags only.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    assert!(fd >= 0, "inotify_init1");
    // SAFETY: the kernel just gave us this descriptor.
    let inotify = unsafe { OwnedFd::from_raw_fd(fd) };
    let watched = CString::new(parent.join(dir).into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: an open inotify descriptor and a NUL-terminated path.
    let wd = unsafe { libc::inotify_add_watch(fd, watched.as_ptr(), libc::IN_CREATE) };
    assert!(wd >= 0, "inotify_add_watch");
    let moved = CString::new(format!("{link}/{name}")).unwrap();
    let (a, b) = (CString::new(dir).unwrap(), CString::new(link).unwrap());
    std::thread::spawn(move || {
        let param = libc::sched_param { sched_priority: 1 };
        // SAFETY: this thread's own policy, with a parameter we own; it
        // blocks until the event, so it never spins at that priority.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
        let mut poll = [nix::poll::PollFd::new(
            inotify.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let ready = nix::poll::poll(&mut poll, nix::poll::PollTimeout::from(20_000u16));
        if !matches!(ready, Ok(n) if n > 0) {
            return false;
        }
        exchange_at(at.as_raw_fd(), &a, &b)
            && nix::sys::stat::fstatat(
                Some(at.as_raw_fd()),
                moved.as_c_str(),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .is_ok()
    })
}

fn materialize_args(root: &Path, deny: &Path) -> Vec<String> {
    [
        "run",
        "-q",
        "--write",
        root.to_str().unwrap(),
        "--write-deny",
        deny.to_str().unwrap(),
        "--materialize",
        "--",
        "true",
    ]
    .map(str::to_string)
    .to_vec()
}

/// Runs `run` over and over while `W/.git` and a symlink to the victim
/// trade places, the denies alternating between a deep directory to create
/// (root creating it in the victim) and the victim's file name (root
/// chowning it). Returns how many runs got past the policy's own symlink
/// check (78) to the placeholders.
fn race_materialize(work: &Path, victim: &Victim, run: &dyn Fn(&[String]) -> Output) -> usize {
    let real = work.join(".git");
    let flipper = Flipper::start(work, ".git", ".gitlink");
    let denies = [real.join("hooks/pre-commit"), real.join("victim")];
    let mut codes: Vec<Option<i32>> = Vec::new();
    let mut reasons: Vec<String> = Vec::new();
    let started = Instant::now();
    let mut runs = 0;
    while runs < MAX_RUNS && started.elapsed() < RACE_FOR {
        let deny = &denies[runs % denies.len()];
        let out = run(&materialize_args(work, deny));
        runs += 1;
        codes.push(out.status.code());
        let why = stderr(&out).lines().last().unwrap_or("").to_string();
        let why = why
            .replace(work.to_str().unwrap(), "W")
            .replace(victim.path().to_str().unwrap(), "V");
        victim.assert_untouched(&format!("after run {runs} ({why})"));
        if out.status.code() != Some(0) && !reasons.contains(&why) && reasons.len() < 6 {
            reasons.push(why);
        }
    }
    let count = |code| codes.iter().filter(|c| **c == code).count();
    eprintln!(
        "{runs} runs in {:?}, {} flips; exit 0: {}, 78: {}, 125: {}",
        started.elapsed(),
        flipper.flips(),
        count(Some(0)),
        count(Some(78)),
        count(Some(125)),
    );
    eprintln!("why runs failed: {reasons:#?}");
    drop(flipper);
    runs - count(Some(78))
}

/// Prepares `W/.git` (a directory owned by `uid`) and `W/.gitlink` (a
/// symlink to the victim).
fn flip_pair(work: &Path, uid: u32, victim: &Victim) {
    std::fs::create_dir(work.join(".git")).unwrap();
    chown(&work.join(".git"), uid);
    std::os::unix::fs::symlink(victim.path(), work.join(".gitlink")).unwrap();
}

/// `DEPTH` nested directories in `dir`, then `proj` owned by `uid`: every
/// path-based call of the deputy walks them all again, which widens the
/// window between two of its calls on the same path (the reports' races
/// were won this way), while a walk by descriptor does not care. Kept
/// under 108 bytes: a longer root does not start through the service
/// (the init's loopback fails with EPERM, with or without this fix).
fn deep_root(dir: &Dir, uid: u32) -> PathBuf {
    const DEPTH: usize = 40;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut at = OwnedFd::from(std::fs::File::open(dir.path()).unwrap());
    for _ in 0..DEPTH {
        let mode = nix::sys::stat::Mode::from_bits_truncate(0o755);
        nix::sys::stat::mkdirat(Some(at.as_raw_fd()), "d", mode).unwrap();
        let flags = nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC;
        let fd = nix::fcntl::openat(Some(at.as_raw_fd()), "d", flags, mode).unwrap();
        // SAFETY: openat just returned this descriptor to us alone.
        at = unsafe { OwnedFd::from_raw_fd(fd) };
    }
    let mut path = dir.path().to_path_buf();
    path.extend(std::iter::repeat_n("d", DEPTH));
    path.push("proj");
    std::fs::create_dir(&path).unwrap();
    chown(&path, uid);
    path
}

#[test]
fn materialize_never_creates_or_chowns_through_a_swapped_parent() {
    if !can_run("deputy_materialize") {
        return;
    }
    let _serial = serial();
    let work = Dir::new();
    let victim = Victim::new();
    flip_pair(work.path(), NOBODY, &victim);
    let reached = race_materialize(work.path(), &victim, &|args| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        tartaros(&args, work.path())
    });
    victim.assert_untouched("after the race");
    assert!(reached >= 10, "too few runs to mean anything: {reached}");
}

#[test]
fn materialize_through_the_service_never_creates_or_chowns_outside() {
    if !can_run("deputy_materialize_service") {
        return;
    }
    let _serial = serial();
    let service = Service::start();
    let top = Dir::new();
    let work = deep_root(&top, CAROL);
    let victim = Victim::new();
    flip_pair(&work, CAROL, &victim);
    let reached = race_materialize(&work, &victim, &|args| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        service.run(CAROL, &args, &work)
    });
    victim.assert_untouched("after the race");
    assert!(reached >= 10, "too few runs to mean anything: {reached}");
    // The caller's placeholders are the caller's.
    let made = work.join("made/deep");
    let args = materialize_args(&work, &made);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = service.run(CAROL, &args, &work);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!work.join("made").exists(), "the placeholder stayed");
    drop(service);
}

/// A start that fails after the log exists (pids.max refuses the value)
/// unwinds it; the log's directory is swapped for a symlink to the victim
/// the moment the log is created.
fn race_log_unlink(work: &Path, victim: &Victim, uid: u32, run: &dyn Fn(&[&str]) -> Output) {
    let mut in_time = 0;
    for attempt in 0..10 {
        let (real, link) = (format!("d{attempt}"), format!("s{attempt}"));
        std::fs::create_dir(work.join(&real)).unwrap();
        chown(&work.join(&real), uid);
        std::os::unix::fs::symlink(victim.path(), work.join(&link)).unwrap();
        let swapper = swap_on_create(work, &real, "victim", &link);
        let log = work.join(&real).join("victim");
        let out = run(&[
            "run",
            "-q",
            "--max-procs",
            "99999999999",
            "--log",
            log.to_str().unwrap(),
            "--",
            "true",
        ]);
        let swapped = swapper.join().unwrap();
        eprintln!(
            "attempt {attempt}: exit {:?}, swapped in time {swapped}: {}",
            out.status.code(),
            stderr(&out).trim()
        );
        assert_ne!(out.status.code(), Some(0), "the start did not fail");
        victim.assert_untouched(&format!("attempt {attempt}"));
        // The log went from the directory it was made in (now named
        // `link`), not left behind.
        assert!(
            !work.join(&link).join("victim").exists(),
            "the unwritten log was left behind"
        );
        in_time += usize::from(swapped);
        if in_time == 3 {
            break;
        }
    }
    assert!(in_time > 0, "the swap never came before the log's removal");
}

#[test]
fn a_failed_start_never_unlinks_through_a_swapped_log_directory() {
    if !can_run("deputy_log_unlink") {
        return;
    }
    let _serial = serial();
    let work = Dir::new();
    let victim = Victim::new();
    race_log_unlink(work.path(), &victim, NOBODY, &|args| {
        tartaros(args, work.path())
    });
}

#[test]
fn a_failed_start_through_the_service_never_unlinks_outside() {
    if !can_run("deputy_log_unlink_service") {
        return;
    }
    let _serial = serial();
    let service = Service::start();
    let work = owned_dir(DAVE);
    let victim = Victim::new();
    race_log_unlink(work.path(), &victim, DAVE, &|args| {
        service.run(DAVE, args, work.path())
    });
    drop(service);
}
