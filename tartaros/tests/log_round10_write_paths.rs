//! Adversarial round 10 on the log's writes: the ways to change a file's
//! bytes that are not write(2) and that no earlier round tried
//! (`copy_file_range`, `splice` from a pipe, `vmsplice` then `splice`,
//! `tee` then `splice`, `sendfile` to a file, `pwritev2` with
//! `RWF_APPEND`, `fallocate` PUNCH_HOLE and INSERT_RANGE, a grandchild
//! writing through a descriptor its opener left behind when it exited,
//! an `O_TMPFILE` linked in through `/proc/self/fd`), and Linux AIO (no
//! change notification at all: it must be refused, and the refusal be a
//! record). Each changed file must be a `write` record under its kernel
//! name and be in the seal with the hash the host reads. Needs root and
//! gcc (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <stdio.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static int rw(const char *name) { return open(name, O_RDWR); }

static int pipe_to(const char *name, int how) {
    int p[2], q[2], fd = rw(name);
    if (fd < 0 || pipe(p) || pipe(q)) return 1;
    char msg[] = "SPLICED-BYTES";
    struct iovec v = {msg, sizeof msg - 1};
    if (how == 0 && write(p[1], msg, v.iov_len) != (ssize_t)v.iov_len) return 2;
    if (how == 1 && vmsplice(p[1], &v, 1, 0) != (ssize_t)v.iov_len) return 3;
    if (how == 2) {
        if (write(p[1], msg, v.iov_len) != (ssize_t)v.iov_len) return 4;
        if (tee(p[0], q[1], v.iov_len, 0) != (ssize_t)v.iov_len) return 5;
        loff_t off = 100;
        return splice(q[0], NULL, fd, &off, v.iov_len, 0) == (ssize_t)v.iov_len ? 0 : 6;
    }
    loff_t off = 100;
    return splice(p[0], NULL, fd, &off, v.iov_len, 0) == (ssize_t)v.iov_len ? 0 : 7;
}

static int copied(void) {
    int in = open("source", O_RDONLY), out = rw("copied");
    loff_t a = 0, b = 50;
    if (in < 0 || out < 0) return 1;
    if (copy_file_range(in, &a, out, &b, 100, 0) != 100) return 2;
    off_t c = 0;
    int s = rw("sent");
    if (s < 0 || lseek(s, 200, SEEK_SET) != 200) return 3;
    return sendfile(s, in, &c, 100) == 100 ? 0 : 4;
}

static int appended(void) {
    int fd = rw("appended");
    char msg[] = "APPENDED";
    struct iovec v = {msg, sizeof msg - 1};
    if (fd < 0) return 1;
    return pwritev2(fd, &v, 1, 0, RWF_APPEND) == (ssize_t)v.iov_len ? 0 : 2;
}

static int holes(void) {
    int p = rw("punched"), i = rw("inserted");
    if (p < 0 || fallocate(p, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 4096)) return 1;
    if (i < 0 || fallocate(i, FALLOC_FL_INSERT_RANGE, 4096, 4096)) return 2;
    return 0;
}

/* The opener forks a grandchild and exits; the grandchild writes on. */
static int orphaned(void) {
    int ready[2];
    if (pipe(ready)) return 1;
    pid_t p = fork();
    if (p == 0) {
        int fd = rw("orphaned");
        if (fd < 0) _exit(1);
        pid_t g = fork();
        if (g == 0) {
            char c;
            if (read(ready[0], &c, 1) != 1) _exit(1);
            _exit(pwrite(fd, "ORPHAN", 6, 10) == 6 ? 0 : 1);
        }
        _exit(0);
    }
    int st;
    if (waitpid(p, &st, 0) != p || st) return 2;
    if (write(ready[1], "g", 1) != 1) return 3;
    close(ready[1]);
    /* The grandchild is no child of ours: wait for its write on disk. */
    for (int i = 0; i < 500; i++) {
        char buf[6];
        int fd = open("orphaned", O_RDONLY);
        if (fd >= 0 && pread(fd, buf, 6, 10) == 6 && !memcmp(buf, "ORPHAN", 6)) return 0;
        if (fd >= 0) close(fd);
        usleep(10000);
    }
    return 4;
}

static int tmpfile_linked(void) {
    int fd = open(".", O_TMPFILE | O_RDWR, 0644);
    if (fd < 0 || write(fd, "TMPFILE", 7) != 7) return 1;
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    if (linkat(AT_FDCWD, proc, AT_FDCWD, "tmplinked", AT_SYMLINK_FOLLOW)) return 2;
    return write(fd, "+AFTER", 6) == 6 ? 0 : 3;
}

/* Linux AIO writes with no fsnotify event: the sandbox refuses it. */
static int aio(void) {
    aio_context_t ctx = 0;
    if (syscall(SYS_io_setup, 8, &ctx) == 0) return 1;
    return errno == EPERM || errno == ENOSYS ? 0 : 2;
}

int main(int argc, char **argv) {
    if (chdir(argv[1])) return 9;
    int r;
    if ((r = pipe_to("spliced", 0))) return 10 + r;
    if ((r = pipe_to("vmspliced", 1))) return 20 + r;
    if ((r = pipe_to("teed", 2))) return 30 + r;
    if ((r = copied())) return 40 + r;
    if ((r = appended())) return 50 + r;
    if ((r = holes())) return 60 + r;
    if ((r = orphaned())) return 70 + r;
    if ((r = tmpfile_linked())) return 80 + r;
    if ((r = aio())) return 90 + r;
    return 0;
}
"#;

const FILES: [&str; 11] = [
    "spliced",
    "vmspliced",
    "teed",
    "copied",
    "sent",
    "appended",
    "punched",
    "inserted",
    "orphaned",
    "tmplinked",
    "source",
];

#[test]
fn writes_by_splice_copy_sendfile_append_holes_and_orphans_are_named_and_sealed() {
    if !usable("round10_write_paths") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let dir = root.path().to_str().unwrap();
    for name in FILES.iter().filter(|f| **f != "tmplinked") {
        let body: String = (0..16384)
            .map(|i| (b'a' + (i % 26) as u8) as char)
            .collect();
        root.file(name, &body);
    }
    let (out, records) = run_logged(&root, &logs, &[agent.to_str().unwrap(), dir]);
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let sealed: Vec<Value> = seal(&records)["files"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut wrong = Vec::new();
    // `source` was only read: no write record, not in the seal.
    for name in &FILES[..10] {
        let path = format!("{dir}/{name}");
        let writes: Vec<&Value> = records
            .iter()
            .filter(|r| r["kind"] == "write" && field(r, "path") == Some(path.as_str()))
            .collect();
        if writes.is_empty() {
            wrong.push(format!("{name}: no write record"));
        }
        for w in &writes {
            if w["target"]["path_source"] != "kernel" || w["target"].get("deleted").is_some() {
                wrong.push(format!("{name}: {w}"));
            }
        }
        if let Some(m) = seal_mismatch(&records, &path) {
            wrong.push(format!("{name}: {m}"));
        }
    }
    let source = format!("{dir}/source");
    assert!(
        sealed.iter().all(|f| f["path"] != source.as_str()),
        "a file only read is sealed as changed"
    );
    assert!(
        std::fs::read(root.join("tmplinked"))
            .unwrap()
            .starts_with(b"TMPFILE+AFTER")
    );
    // The refused AIO call is a record of its own.
    let refused_aio = records
        .iter()
        .any(|r| r["decision"] == "denied" && r.to_string().contains("io_setup"));
    if !refused_aio {
        wrong.push("no record of the refused io_setup".into());
    }
    assert!(
        wrong.is_empty(),
        "{}\nrecords: {records:#?}",
        wrong.join("\n")
    );
}
