//! Adversarial round 13 on the log: notifications that a kernel side
//! effect of one call queues, taken by a later record that only its
//! position pairs (its name lives in a page the capture cannot read).
//!
//! - A unix `bind` that fails with `EINVAL` (the socket is bound already)
//!   creates its socket file and removes it again. The next `open(O_CREAT)`
//!   of a cold name was logged as a create of that transient socket file,
//!   named by the kernel, and the real file as an `uncaptured` create
//!   (8 of 8 runs, `verify` ok).
//! - A write clears the set-uid bit of the file it writes (`FAN_ATTRIB`
//!   merged with the write's `FAN_MODIFY`). A later `chmod` of a cold name
//!   was logged as a chmod of the written file, with the mode it never got
//!   (3 of 3 runs, `verify` ok).
//!
//! Each record must name its own file. Needs root and gcc.

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

/// The name is read from a page that nothing touches before the call
/// (a file mapping with `MADV_RANDOM`: no fault-around maps it early).
const COLD: &str = r#"
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
static const char *cold(const char *file) {
    int fd = open(file, O_RDONLY);
    if (fd < 0) return 0;
    char *m = mmap(0, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED || madvise(m, 4096, MADV_RANDOM)) return 0;
    close(fd);
    return m;
}
"#;

const BIND: &str = r#"
#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>
int main(int argc, char **argv) {
    const char *name = cold(argv[2]);
    if (!name || chdir(argv[1])) return 9;
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strcpy(a.sun_path, "s1.sock");
    if (bind(s, (void *)&a, sizeof a)) return 10;
    strcpy(a.sun_path, "ghost.sock");
    if (bind(s, (void *)&a, sizeof a) == 0 || errno != EINVAL) return 11;
    int fd = open(name, O_CREAT | O_WRONLY, 0644);
    if (fd < 0 || write(fd, "x\n", 2) != 2 || close(fd)) return 12;
    return 0;
}
"#;

const CHMOD: &str = r#"
#include <sys/stat.h>
int main(int argc, char **argv) {
    const char *name = cold(argv[2]);
    if (!name || chdir(argv[1])) return 9;
    int fd = open("innocent", O_WRONLY);
    if (fd < 0 || write(fd, "x", 1) != 1 || close(fd)) return 10;
    return chmod(name, 0777) ? 11 : 0;
}
"#;

/// Runs `agent` (C, after [`COLD`]) logged in `root` with the arguments
/// `root` and a file holding `cold_name`, which it reads into a cold page;
/// returns the records and `verify`'s exit code and line.
fn run_cold(root: &Dir, agent: &str, cold_name: &str) -> (Vec<Value>, Option<i32>, String) {
    let (bin, logs) = (Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", &format!("{COLD}{agent}"));
    let name = bin.file("name", &format!("{cold_name}\0"));
    chown(&name, NOBODY);
    let dir = root.path().to_str().unwrap();
    let (out, records, code, line) = run_logged_verdict(
        root,
        &logs,
        &[agent.to_str().unwrap(), dir, name.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    (records, code, line)
}

fn path_of(r: &Value) -> &str {
    field(r, "path").unwrap_or("")
}

#[test]
fn a_failed_bind_s_transient_socket_file_names_no_later_create() {
    if !usable("round13_bind") {
        return;
    }
    for run in 0..3 {
        let root = Dir::new();
        let dir = root.path().to_str().unwrap();
        let real = format!("{dir}/real");
        let (records, code, line) = run_cold(&root, BIND, &real);
        let ghost = format!("{dir}/ghost.sock");
        let creates: Vec<&Value> = records.iter().filter(|r| r["kind"] == "create").collect();
        let opened: Vec<&&Value> = creates
            .iter()
            .filter(|r| r["target"]["flags"].as_u64() == Some(65))
            .collect();
        assert_eq!(opened.len(), 1, "run {run}: {creates:#?}");
        assert_eq!(path_of(opened[0]), real, "run {run}: {}", opened[0]);
        assert_eq!(field(opened[0], "path_source"), Some("kernel"));
        // The transient socket file is the failed bind's, named by the
        // kernel; no record calls it a create or removal nothing made.
        let binds: Vec<&Value> = records
            .iter()
            .filter(|r| r["kind"] == "bind" && path_of(r) == ghost)
            .collect();
        assert_eq!(binds.len(), 1, "run {run}: {records:#?}");
        assert_eq!(
            (binds[0]["decision"].as_str(), binds[0]["errno"].as_i64()),
            (Some("denied"), Some(i64::from(libc::EINVAL))),
            "{}",
            binds[0]
        );
        assert_eq!(
            field(binds[0], "path_source"),
            Some("kernel"),
            "{}",
            binds[0]
        );
        let stray: Vec<&Value> = records
            .iter()
            .filter(|r| {
                r["target"]["uncaptured"] == true || (r["kind"] != "bind" && path_of(r) == ghost)
            })
            .collect();
        assert!(stray.is_empty(), "run {run}: {stray:#?}");
        assert_eq!(code, Some(0), "run {run}: verify {line}");
    }
}

#[test]
fn a_write_s_cleared_set_uid_bit_names_no_later_chmod() {
    if !usable("round13_chmod") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    for run in 0..3 {
        let root = Dir::new();
        let (innocent, evil) = (root.file("innocent", "a"), root.file("evil", "b"));
        for (file, mode) in [(&innocent, 0o4755), (&evil, 0o644)] {
            chown(file, NOBODY);
            std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let (records, code, line) = run_cold(&root, CHMOD, evil.to_str().unwrap());
        let mode =
            |f: &std::path::Path| std::fs::metadata(f).unwrap().permissions().mode() & 0o7777;
        assert_eq!((mode(&innocent), mode(&evil)), (0o755, 0o777));
        let chmods: Vec<&Value> = records.iter().filter(|r| r["kind"] == "chmod").collect();
        assert_eq!(chmods.len(), 1, "run {run}: {chmods:#?}");
        let chmod = chmods[0];
        assert_eq!(chmod["target"]["mode"].as_u64(), Some(0o777), "{chmod}");
        // Its own file, or (when its notification merged with another
        // call's) the agent's unread name, never the written file.
        assert_ne!(
            path_of(chmod),
            innocent.to_str().unwrap(),
            "run {run}: {chmod}"
        );
        if field(chmod, "path_source") == Some("kernel") {
            assert_eq!(path_of(chmod), evil.to_str().unwrap(), "{chmod}");
        }
        // The cleared bit is the kernel's change of the written file.
        let cleared = records.iter().any(|r| {
            r["kind"] == "attrib"
                && path_of(r) == innocent.to_str().unwrap()
                && r["target"]["uncaptured"] == true
        });
        assert!(cleared, "run {run}: {records:#?}");
        assert_eq!(code, Some(0), "run {run}: verify {line}");
    }
}
