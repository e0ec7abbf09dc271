//! Adversarial round 17: state an agent leaves on, or holds over, a host
//! inode it owns or only reads. The kernel checks the owner (or nothing,
//! for page-cache advice), never the mount, so a read-only descriptor of
//! a host file of the agent's uid reached `F_SET_RW_HINT` (a write-life
//! hint stored in the inode, left after the run), `F_SETLEASE` (the
//! host's writers wait up to 45 s each), `posix_fadvise(DONTNEED)`
//! (drops the host's page cache of any readable file) and
//! `madvise(MADV_COLD / MADV_PAGEOUT)` on a mapping of it (reclaims the
//! host's cache of an owned file; session 28). The filter refuses the
//! three commands and that advice with EPERM, and the log has each
//! attempt. Asserted from the host: the inode's hint, a non-blocking write
//! open (which fails at once on a leased file), the file's pages in the
//! page cache (`mincore`), `/proc/locks`, and the log's records. Ordinary
//! `fcntl` and advice keep working. Needs root and gcc.

mod common;

use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

use common::logged::*;
use common::*;
use serde_json::Value;

const F_GET_RW_HINT: libc::c_int = 1035;
const F_SET_RW_HINT: u64 = 1036;
const F_SET_FILE_RW_HINT: u64 = 1038;
const F_SETLEASE: u64 = 1024;
const POSIX_FADV_DONTNEED: u64 = 4;
const MADV_COLD: u64 = 20;
const MADV_PAGEOUT: u64 = 21;
/// Big enough that "resident" is many pages, not one.
const VICTIM_LEN: usize = 1 << 20;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static void tried(const char *label, long rc) {
    printf("%s %d\n", label, rc == 0 ? 0 : errno);
    fflush(stdout);
}

int main(int argc, char **argv) {
    const char *victim = argv[1], *work = argv[2];
    char path[4096];
    /* A lease break signals the holder; the old binary's lease must not
       end the agent before the host looks. */
    signal(SIGIO, SIG_IGN);
    int fd = open(victim, O_RDONLY);
    if (fd < 0) { perror("victim"); return 2; }
    uint64_t hint = 5; /* RWH_WRITE_LIFE_EXTREME */
    tried("rw_hint", syscall(SYS_fcntl, fd, 1036, &hint));
    tried("file_rw_hint", syscall(SYS_fcntl, fd, 1038, &hint));
    tried("lease", syscall(SYS_fcntl, fd, F_SETLEASE, F_RDLCK));
    tried("dontneed", syscall(SYS_fadvise64, fd, 0, 0, POSIX_FADV_DONTNEED));
    /* Reclaim advice works on the pages mapped here: touch them all. */
    long len = 1 << 20;
    char *m = mmap(0, len, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return 14;
    volatile char sum = 0;
    for (long i = 0; i < len; i += 4096) sum += m[i];
    tried("cold", syscall(SYS_madvise, m, len, 20));
    tried("pageout", syscall(SYS_madvise, m, len, 21));
    /* Controls: every one must work. */
    if (syscall(SYS_fcntl, fd, F_GETFL) < 0) return 10;
    if (syscall(SYS_fcntl, fd, F_SETFD, FD_CLOEXEC) != 0) return 11;
    if (syscall(SYS_fadvise64, fd, 0, 0, POSIX_FADV_SEQUENTIAL) != 0) return 12;
    if (syscall(SYS_madvise, m, len, MADV_WILLNEED) != 0) return 15;
    char *a = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED || syscall(SYS_madvise, a, 4096, MADV_DONTNEED) != 0) return 16;
    snprintf(path, sizeof path, "%s/lockme", work);
    int lk = open(path, O_RDWR | O_CREAT, 0644);
    struct flock l = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
    if (lk < 0 || syscall(SYS_fcntl, lk, F_SETLK, &l) != 0) return 13;
    /* Hold everything while the host looks. */
    snprintf(path, sizeof path, "%s/ready", work);
    close(open(path, O_WRONLY | O_CREAT, 0644));
    snprintf(path, sizeof path, "%s/go", work);
    for (int i = 0; i < 600 && access(path, F_OK) != 0; i++) usleep(50000);
    return 0;
}
"#;

/// The host's write-life hint of `path`.
fn rw_hint(path: &Path) -> u64 {
    let file = std::fs::File::open(path).unwrap();
    let mut hint = u64::MAX;
    // SAFETY: F_GET_RW_HINT writes one u64 at the pointer.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), F_GET_RW_HINT, &mut hint as *mut u64) };
    assert_eq!(rc, 0, "F_GET_RW_HINT: {}", std::io::Error::last_os_error());
    hint
}

/// How many of `path`'s pages are in the page cache.
fn resident_pages(path: &Path) -> usize {
    let file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    // SAFETY: a fresh read-only shared mapping of a file we hold open,
    // only passed to mincore and unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let page = 4096;
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `vec` has one byte per page of the mapping.
    let rc = unsafe { libc::mincore(map, len, vec.as_mut_ptr()) };
    // SAFETY: the mapping made above, not used after.
    unsafe { libc::munmap(map, len) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().filter(|b| *b & 1 != 0).count()
}

/// `/proc/locks` lines of the file `path` (`MAJ:MIN:INODE`, in hex).
fn locks_of(path: &Path) -> Vec<String> {
    let meta = std::fs::metadata(path).unwrap();
    let dev = meta.dev();
    let id = format!(
        "{:02x}:{:02x}:{} ",
        libc::major(dev),
        libc::minor(dev),
        meta.ino()
    );
    std::fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&id))
        .map(str::to_string)
        .collect()
}

/// The refused `syscall` records of `name` whose `key` is `value`.
fn refused<'a>(records: &'a [Value], name: &str, key: &str, value: u64) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["kind"] == "syscall" && r["target"]["syscall"] == name)
        .filter(|r| r["target"][key] == value)
        .collect()
}

#[test]
fn an_agent_owning_a_host_file_leaves_no_hint_lease_or_dropped_cache() {
    if !usable("escape_round17_host_inodes") {
        return;
    }
    let (host, work, exes, logs) = (Dir::new(), Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&exes, "agent", AGENT);
    // A host file outside every root, the agent's uid its owner; written,
    // flushed and read back, so its pages are clean and resident.
    let victim = host.file("victim", &"x".repeat(VICTIM_LEN));
    std::fs::File::open(&victim).unwrap().sync_all().unwrap();
    let _ = std::fs::read(&victim).unwrap();
    let pages = VICTIM_LEN / 4096;
    assert_eq!(resident_pages(&victim), pages, "the host's cache is warm");
    assert_eq!(rw_hint(&victim), 0, "no hint before the run");
    let log = logs.join("effects.jsonl");
    let mut run = KillOnDrop(Some(
        Command::new(bin())
            .args(["run", "--write", work.path().to_str().unwrap()])
            .args(["--log", log.to_str().unwrap(), "--"])
            .arg(&agent)
            .arg(&victim)
            .arg(work.path())
            .current_dir(work.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tartaros"),
    ));
    assert!(eventually(30, || work.join("ready").exists()), "no start");
    // While the agent holds its descriptors: no lease (a leased file's
    // write open fails at once with O_NONBLOCK), the control's record
    // lock is there, the hint unset, the cache still warm.
    let open = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&victim);
    let leases: Vec<_> = locks_of(&victim);
    let lock = locks_of(&work.join("lockme"));
    let hint = rw_hint(&victim);
    let resident = resident_pages(&victim);
    std::fs::write(work.join("go"), "").unwrap();
    let out = run.take().wait_with_output().unwrap();
    eprintln!("{}{}", stdout(&out), stderr(&out));
    // Every host-side check at once: one run shows each wall that failed.
    let mut wrong = Vec::new();
    if let Err(e) = &open {
        wrong.push(format!("the host's write open of the file: {e} (a lease)"));
    }
    if !leases.is_empty() {
        wrong.push(format!("locks on the host file: {leases:?}"));
    }
    if hint != 0 {
        wrong.push(format!("write-life hint {hint} on the host inode"));
    }
    if resident != pages {
        wrong.push(format!(
            "{resident} of {pages} pages left in the host's cache"
        ));
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(
        lock.iter()
            .any(|l| l.contains("POSIX") && l.contains("WRITE")),
        "the control's F_SETLK: {lock:?}"
    );
    assert_eq!(out.status.code(), Some(0), "a control failed");
    assert_eq!(rw_hint(&victim), 0, "a hint after the run");
    let records = records(&log);
    for (name, key, value) in [
        ("fcntl", "cmd", F_SET_RW_HINT),
        ("fcntl", "cmd", F_SET_FILE_RW_HINT),
        ("fcntl", "cmd", F_SETLEASE),
        ("fadvise64", "advice", POSIX_FADV_DONTNEED),
        ("madvise", "advice", MADV_COLD),
        ("madvise", "advice", MADV_PAGEOUT),
    ] {
        let found = refused(&records, name, key, value);
        assert_eq!(found.len(), 1, "{name} {key}={value}: {found:#?}");
        let r = found[0];
        assert_eq!(r["decision"], "denied", "{r}");
        assert_eq!(r["errno"], 1, "EPERM: {r}");
        assert_eq!(r["target"]["refused_by"], "seccomp", "{r}");
    }
    // The controls were allowed: no record of them.
    let others: Vec<_> = records
        .iter()
        .filter(|r| r["kind"] == "syscall")
        .filter(|r| {
            matches!(
                r["target"]["syscall"].as_str(),
                Some("fcntl" | "fadvise64" | "madvise")
            )
        })
        .collect();
    assert_eq!(others.len(), 6, "{others:#?}");
    let verify = tartaros(&["log", "verify", log.to_str().unwrap()], Path::new("/"));
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
}
