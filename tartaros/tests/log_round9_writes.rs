//! Adversarial round 9 on the log's writes: changes made through a
//! descriptor the writer did not open itself (received by SCM_RIGHTS from
//! a process that then renamed the file and exited, taken with
//! `pidfd_getfd`, kept across an exec by a `CLONE_FILES` child), through
//! a shared mapping of such a descriptor, and by the calls round 7 did
//! not try (`fallocate` ZERO_RANGE and COLLAPSE_RANGE, `ftruncate`,
//! `O_DIRECT`). Each file must be a `write` record under the name it has
//! in the tree, and in the seal with the hash of what the host reads.
//! Needs root and gcc (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int send_fd(int sock, int fd) {
    char byte = 'F', buf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&byte, 1};
    struct msghdr m = {0};
    m.msg_iov = &iov; m.msg_iovlen = 1;
    m.msg_control = buf; m.msg_controllen = sizeof buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET; c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return sendmsg(sock, &m, 0) == 1 ? 0 : -1;
}

static int recv_fd(int sock) {
    char byte, buf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&byte, 1};
    struct msghdr m = {0};
    m.msg_iov = &iov; m.msg_iovlen = 1;
    m.msg_control = buf; m.msg_controllen = sizeof buf;
    if (recvmsg(sock, &m, 0) != 1) return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (!c || c->cmsg_type != SCM_RIGHTS) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

/* A child opens `passed`, sends the descriptor, renames the file and
 * exits; the receiver writes, then changes it through a mapping. */
static int passed(void) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return 1;
    pid_t p = fork();
    if (p == 0) {
        int fd = open("passed", O_RDWR);
        if (fd < 0 || send_fd(sv[0], fd)) _exit(1);
        char ok;
        if (read(sv[0], &ok, 1) != 1) _exit(1);
        _exit(rename("passed", "passed.moved") ? 1 : 0);
    }
    int fd = recv_fd(sv[1]);
    if (fd < 0) return 2;
    if (write(sv[1], "k", 1) != 1) return 3;
    int st;
    if (waitpid(p, &st, 0) != p || st) return 4;
    if (pwrite(fd, "RECEIVED", 8, 0) != 8) return 5;
    char *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return 6;
    memcpy(m + 8, "MAPPED", 6);
    if (msync(m, 4096, MS_SYNC)) return 7;
    return 0;
}

/* The opener stays; another process takes its descriptor. EPERM (the
 * sandbox may refuse the call) is not a failure of the test. */
static int grabbed(void) {
    int fd = open("grabbed", O_WRONLY);
    if (fd < 0) return 1;
    int sv[2];
    if (pipe(sv)) return 2;
    pid_t p = fork();
    if (p == 0) {
        char c;
        _exit(read(sv[0], &c, 1) == 1 ? 0 : 1);
    }
    int pidfd = syscall(SYS_pidfd_open, p, 0);
    int got = pidfd < 0 ? -1 : syscall(SYS_pidfd_getfd, pidfd, fd, 0);
    if (write(sv[1], "x", 1) != 1) return 3;
    waitpid(p, NULL, 0);
    /* From here on only the copy is written (or the original, if the
     * call was refused). */
    int w = got >= 0 ? got : fd;
    if (got >= 0) close(fd);
    return pwrite(w, "GRABBED", 7, 0) == 7 ? 0 : 4;
}

static int shared_child(void *arg) {
    (void)arg;
    execl("/bin/sh", "sh", "-c", "echo EXECED >&7", (char *)NULL);
    return 1;
}

/* A CLONE_FILES child execs holding the descriptor (exec unshares the
 * table, the descriptor stays) and writes through it. */
static int execed(void) {
    int fd = open("execed", O_WRONLY | O_APPEND);
    if (fd < 0 || dup2(fd, 7) != 7) return 1;
    close(fd);
    char *stack = malloc(1 << 16);
    pid_t p = clone(shared_child, stack + (1 << 16), CLONE_FILES | SIGCHLD, NULL);
    if (p < 0) return 2;
    int st;
    if (waitpid(p, &st, 0) != p || st) return 3;
    return 0;
}

static int calls(void) {
    int z = open("zero", O_RDWR);
    if (z < 0 || fallocate(z, FALLOC_FL_ZERO_RANGE, 4096, 4096)) return 1;
    int c = open("collapse", O_RDWR);
    if (c < 0 || fallocate(c, FALLOC_FL_COLLAPSE_RANGE, 0, 4096)) return 2;
    int t = open("ftrunc", O_RDWR);
    if (t < 0 || ftruncate(t, 100)) return 3;
    int d = open("direct", O_WRONLY | O_DIRECT);
    void *buf;
    if (d < 0 || posix_memalign(&buf, 4096, 4096)) return 4;
    memset(buf, 'D', 4096);
    if (pwrite(d, buf, 4096, 4096) != 4096) return 5;
    return 0;
}

int main(int argc, char **argv) {
    if (chdir(argv[1])) return 9;
    int r;
    if ((r = passed())) return 10 + r;
    if ((r = grabbed())) return 20 + r;
    if ((r = execed())) return 30 + r;
    if ((r = calls())) return 40 + r;
    return 0;
}
"#;

const FILES: [&str; 7] = [
    "passed", "grabbed", "execed", "zero", "collapse", "ftrunc", "direct",
];

#[test]
fn writes_through_passed_grabbed_and_inherited_descriptors_are_named_and_sealed() {
    if !usable("round9_writes") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let dir = root.path().to_str().unwrap();
    for name in FILES {
        std::fs::write(root.join(name), vec![b'.'; 16384]).unwrap();
        chown(&root.join(name), NOBODY);
    }
    let (out, records) = run_logged(&root, &logs, &[agent.to_str().unwrap(), dir]);
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let passed = std::fs::read(root.join("passed.moved")).unwrap();
    assert_eq!(&passed[..14], b"RECEIVEDMAPPED");
    assert!(
        std::fs::read(root.join("execed"))
            .unwrap()
            .ends_with(b"EXECED\n")
    );
    let sealed: Vec<Value> = seal(&records)["files"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names = FILES.map(|f| if f == "passed" { "passed.moved" } else { f });
    for name in names {
        let path = format!("{dir}/{name}");
        let writes: Vec<&Value> = records
            .iter()
            .filter(|r| r["kind"] == "write" && field(r, "path") == Some(path.as_str()))
            .collect();
        assert!(
            !writes.is_empty(),
            "no write record of {path}: {records:#?}"
        );
        for w in &writes {
            assert!(w["target"].get("deleted").is_none(), "{w}");
            assert_eq!(w["target"]["path_source"], "kernel", "{w}");
        }
        let hash = sealed
            .iter()
            .find(|f| f["path"] == path.as_str())
            .and_then(|f| f["sha256"].as_str());
        let on_host = sha256_hex(&std::fs::read(&path).unwrap());
        assert_eq!(hash, Some(on_host.as_str()), "{path} in the seal");
    }
    // No write is said to have gone to the name the file left.
    let old = format!("{dir}/passed");
    assert!(
        records
            .iter()
            .all(|r| r["kind"] != "write" || field(r, "path") != Some(old.as_str())),
        "{records:#?}"
    );
}

/// A double-forked child that keeps changing a file through a shared
/// mapping (no notification at all) while the agent exits at once: the
/// run kills the cgroup, then seals, so the seal's hash must be what the
/// host reads afterwards, and the file must be in the seal at all.
const MAPPER: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    char name[] = "mapped";
    if (chdir(argv[1])) return 9;
    int ready[2];
    if (pipe(ready)) return 10;
    pid_t p = fork();
    if (p == 0) {
        if (setsid() < 0 || fork() != 0) _exit(0);
        int fd = open(name, O_RDWR);
        char *m = fd < 0 ? MAP_FAILED : mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) _exit(1);
        close(fd);
        /* Changed once through, then said so, then on until killed. */
        for (int i = 0; i < 4096; i++) m[i] = 'A';
        if (write(ready[1], "r", 1) != 1) _exit(1);
        for (unsigned long i = 0;; i++) m[i % 4096] = 'a' + i % 26;
    }
    waitpid(p, NULL, 0);
    char c;
    return read(ready[0], &c, 1) == 1 ? 0 : 11;
}
"#;

#[test]
fn a_mapping_written_until_the_cgroup_is_killed_is_sealed_as_it_is_left() {
    if !usable("round9_mapped_outlives") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "mapper", MAPPER);
    let dir = root.path().to_str().unwrap();
    let mapped = root.file("mapped", &".".repeat(4096));
    let (out, records) = run_logged(&root, &logs, &[agent.to_str().unwrap(), dir]);
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let on_host = std::fs::read(&mapped).unwrap();
    assert!(
        !on_host.contains(&b'.'),
        "the mapping did not change it all"
    );
    let hash = seal(&records)["files"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["path"] == mapped.to_str().unwrap()))
        .and_then(|f| f["sha256"].as_str())
        .map(str::to_string);
    assert_eq!(hash, Some(sha256_hex(&on_host)));
    // Nothing of the run is left running.
    let left = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| c.starts_with(agent.to_str().unwrap().as_bytes()))
        .count();
    assert_eq!(left, 0, "a mapper outlived the run");
}
