//! Session 15's adversarial review of the effect log: ways a hostile
//! agent made the log miss an effect, name the wrong file, or made
//! `verify` say ok when it should not. Each test runs the agent under
//! `tartaros run --log` and checks the records and `verify`'s exit code
//! from the host side. Needs root and gcc (fails under CI=true without).

mod common;

use std::path::Path;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/fs.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *there;
static int move_cwd(void *arg) {
    return chdir(there) ? 1 : 0;
}

static void *idle(void *arg) {
    usleep(300000);
    return arg;
}

int main(int argc, char **argv) {
    if (!strcmp(argv[1], "setflags")) {
        /* An inode flag set while another thread shares the fd table:
           no notification names the file, and the capture cannot vouch
           for the file at the number. */
        pthread_t t;
        pthread_create(&t, 0, idle, 0);
        int fd = open(argv[2], O_RDONLY), flags = 0;
        if (fd < 0 || ioctl(fd, FS_IOC_GETFLAGS, &flags)) return 5;
        flags |= FS_NODUMP_FL | FS_NOATIME_FL;
        if (ioctl(fd, FS_IOC_SETFLAGS, &flags)) return 6;
        pthread_join(t, 0);
        return 0;
    }
    if (!strcmp(argv[1], "unfaulted")) {
        /* The path to read lies on a page of a file mapping never
           touched: the kernel faults it in, the capture cannot. */
        int h = open(argv[2], O_RDONLY);
        char *p = mmap(0, 4096, PROT_READ, MAP_PRIVATE, h, 0);
        if (p == MAP_FAILED) return 2;
        return open(p, O_RDONLY) < 0 ? 0 : 3;
    }
    if (!strcmp(argv[1], "dirfd")) {
        /* A refused read relative to a directory descriptor, then another
           directory put at that number before the record is read. */
        int d = open(argv[2], O_PATH | O_DIRECTORY);
        if (d < 0) return 7;
        int fd = openat(d, argv[3], O_RDONLY);
        if (argc > 4) return fd < 0 ? 0 : 3; /* gone at once */
        dup2(open("/usr", O_PATH | O_DIRECTORY), d);
        usleep(200000);
        return fd < 0 ? 0 : 3;
    }
    if (!strcmp(argv[1], "fchdir")) {
        /* The same through the cwd: fchdir, then another directory at
           the number before the record is read. */
        int d = open(argv[2], O_PATH | O_DIRECTORY);
        if (d < 0 || fchdir(d)) return 7;
        dup2(open("/usr", O_PATH | O_DIRECTORY), d);
        int fd = open(argv[3], O_RDONLY);
        usleep(200000);
        return fd < 0 ? 0 : 3;
    }
    if (!strcmp(argv[1], "clone-fs")) {
        /* A CLONE_FS child moves its parent's cwd with its own chdir. */
        there = argv[2];
        char *stack = malloc(65536);
        pid_t child = clone(move_cwd, stack + 65536, CLONE_FS | SIGCHLD, 0);
        int status = 1;
        if (child < 0 || waitpid(child, &status, 0) < 0 || status) return 8;
        return open(argv[3], O_RDONLY) < 0 ? 0 : 3;
    }
    if (!strcmp(argv[1], "symlink-cwd")) {
        /* Into a directory through a link, a refused read there, then
           the link replaced by a directory of the root. */
        if (symlink(argv[2], "lnk") || chdir("lnk")) return 9;
        usleep(200000);
        int fd = open(argv[3], O_RDONLY);
        if (chdir("/") || unlink(argv[4]) || mkdir(argv[4], 0755)) return 10;
        usleep(100000);
        return fd < 0 ? 0 : 3;
    }
    if (!strcmp(argv[1], "read")) {
        return open(argv[2], O_RDONLY) < 0 ? 0 : 3;
    }
    if (!strcmp(argv[1], "whiteout")) {
        /* Leaves a character device (0, 0) where argv[2] was. */
        return syscall(SYS_renameat2, AT_FDCWD, argv[2], AT_FDCWD, argv[3],
                       RENAME_WHITEOUT) ? 4 : 0;
    }
    return 1;
}
"#;

fn refused_opens(records: &[Value]) -> Vec<&Value> {
    records
        .iter()
        .filter(|r| r["kind"] == "open" && r["decision"] == "denied")
        .collect()
}

/// One refused read of the secret's `key` by the agent's `mode`, given
/// the secret's parent directory and `<secret>/key` relative to it (then
/// `extra`): the record of that read, and verify's code and line.
struct RefusedRead {
    root: Dir,
    secret: Dir,
    record: Value,
    code: Option<i32>,
    line: String,
}

fn refused_read(mode: &str, extra: impl Fn(&Dir) -> Vec<String>) -> RefusedRead {
    let (root, bin, secret) = (Dir::new(), Dir::open_to_all(), secret_dir());
    let agent = compile(&bin, "agent", AGENT);
    let dir = secret.path().to_str().unwrap();
    let (parent, leaf) = dir.rsplit_once('/').unwrap();
    let relative = format!("{leaf}/key");
    let extra = extra(&root);
    let mut argv = vec![agent.to_str().unwrap(), mode, parent, relative.as_str()];
    argv.extend(extra.iter().map(String::as_str));
    let (records, code, line) = run_denying(&root, secret.path(), &argv);
    let refused = refused_opens(&records);
    assert_eq!(refused.len(), 1, "{records:#?}");
    let record = refused[0].clone();
    eprintln!("{mode}: recorded as {}", record["target"]);
    RefusedRead {
        root,
        secret,
        record,
        code,
        line,
    }
}

/// The name lies on a page the capture cannot read at entry (a file
/// mapping never touched). Until round 22 the record named no file and
/// the log was `incomplete` (and the run exited 122): every refused read
/// of a literal on an untouched `.rodata` page did that. The call failed,
/// so the kernel's copy had faulted the page in, and `sys_exit` reads the
/// name then: the agent's claim, marked `path_read_after`.
#[test]
fn a_refused_read_whose_name_the_capture_could_not_read_at_entry_is_named_after_the_call() {
    if !usable("adv_unfaulted") {
        return;
    }
    let (root, bin, secret) = (Dir::new(), Dir::open_to_all(), secret_dir());
    chown(root.path(), NOBODY);
    let agent = compile(&bin, "agent", AGENT);
    let key = secret.join("key");
    let mut page = key.to_str().unwrap().as_bytes().to_vec();
    page.resize(4096, 0);
    let name_file = bin.join("name.bin");
    std::fs::write(&name_file, &page).unwrap();
    chown(&name_file, NOBODY);
    let (records, code, line) = run_denying(
        &root,
        secret.path(),
        &[
            agent.to_str().unwrap(),
            "unfaulted",
            name_file.to_str().unwrap(),
        ],
    );
    let refused = refused_opens(&records);
    assert_eq!(refused.len(), 1, "{records:#?}");
    let target = &refused[0]["target"];
    assert_eq!(refused[0]["errno"], 13, "{}", refused[0]);
    assert_eq!(target["path"], key.to_str().unwrap(), "{}", refused[0]);
    assert_eq!(target["path_source"], "agent", "{}", refused[0]);
    assert_eq!(target["path_read_after"], true, "{}", refused[0]);
    assert!(target.get("path_unreadable").is_none(), "{}", refused[0]);
    assert_eq!(code, Some(0), "verify: {line}");
    assert!(line.contains("agent's string alone"), "{line}");
}

#[test]
fn a_refused_read_whose_name_is_cut_is_not_ok() {
    if !usable("adv_cut_name") {
        return;
    }
    let (root, bin, secret) = (Dir::new(), Dir::open_to_all(), secret_dir());
    chown(root.path(), NOBODY);
    let agent = compile(&bin, "agent", AGENT);
    // 300 bytes of "./" before the secret's name: the capture keeps 255.
    let dir = secret.path().to_str().unwrap();
    let (parent, leaf) = dir.rsplit_once('/').unwrap();
    let long = format!("{parent}/{}{leaf}/key", "./".repeat(150));
    let (records, code, line) = run_denying(
        &root,
        secret.path(),
        &[agent.to_str().unwrap(), "read", &long],
    );
    let refused = refused_opens(&records);
    assert_eq!(refused.len(), 1, "{records:#?}");
    assert_eq!(
        refused[0]["target"]["path_truncated"], true,
        "{}",
        refused[0]
    );
    assert!(
        !refused[0]["target"]["path"]
            .as_str()
            .unwrap()
            .contains("key"),
        "{}",
        refused[0]
    );
    assert_eq!(code, Some(3), "verify: {line}");
}

#[test]
fn an_inode_flag_set_on_a_shared_descriptor_is_not_ok() {
    if !usable("adv_shared_setflags") {
        return;
    }
    let (root, bin, secret) = (Dir::new(), Dir::open_to_all(), secret_dir());
    let agent = compile(&bin, "agent", AGENT);
    let file = root.file("hook.sh", "#!/bin/sh\n");
    let (records, code, line) = run_denying(
        &root,
        secret.path(),
        &[agent.to_str().unwrap(), "setflags", file.to_str().unwrap()],
    );
    let set: Vec<&Value> = records.iter().filter(|r| r["kind"] == "setflags").collect();
    assert_eq!(set.len(), 1, "{records:#?}");
    assert_eq!(set[0]["decision"], "allowed", "{}", set[0]);
    assert_eq!(set[0]["target"]["path_unverified"], true, "{}", set[0]);
    // No record names the file from the kernel.
    assert!(
        !records
            .iter()
            .any(|r| r["target"]["path"] == file.to_str().unwrap()
                && r["target"]["path_source"] == "kernel"),
        "{records:#?}"
    );
    // Before: `ok`, with the flag's file named only by a claim.
    assert_eq!(code, Some(3), "verify: {line}");
    assert!(line.contains("shared descriptor"), "{line}");
}

#[test]
fn a_refused_read_relative_to_a_swapped_descriptor_is_marked_as_the_agents_claim() {
    if !usable("adv_dirfd") {
        return;
    }
    // The record names what was at the number when it was read, says that
    // this name is the agent's claim, resolved after the call, and verify
    // counts it. Before: `ok` with nothing said. (A refused attempt changed
    // nothing; `grep -r` into a denied directory is the same shape, and
    // must not make every such log incomplete.)
    let r = refused_read("dirfd", |_| Vec::new());
    let t = &r.record["target"];
    assert_eq!(t["resolved_from"], "dirfd", "{t}");
    assert_eq!(t["path_source"], "agent", "{t}");
    assert_eq!(r.code, Some(0), "verify: {}", r.line);
    let counted = "1 refused attempts are named by the agent's string alone";
    assert!(r.line.contains(counted), "{}", r.line);
    // Gone before the record is read: nothing to resolve it against.
    let r = refused_read("dirfd", |_| vec!["exit".into()]);
    assert_eq!(r.record["target"]["path_source"], "agent", "{}", r.record);
    assert_eq!(r.code, Some(0), "verify: {}", r.line);
    assert!(r.line.contains(counted), "{}", r.line);
}

#[test]
fn a_refused_read_relative_to_a_cwd_set_through_a_swapped_descriptor_is_marked_as_the_agents_claim()
{
    if !usable("adv_fchdir") {
        return;
    }
    // Before: `ok`, a refused read of the secret logged under /usr as if
    // the kernel had named it. Now the record says the cwd is unconfirmed
    // and verify counts the claim.
    let r = refused_read("fchdir", |_| Vec::new());
    let t = &r.record["target"];
    assert_eq!(t["resolved_from"], "cwd", "{t}");
    assert_eq!(t["cwd_unverified"], true, "{t}");
    assert_eq!(r.code, Some(0), "verify: {}", r.line);
    assert!(
        r.line.contains("named by the agent's string alone"),
        "{}",
        r.line
    );
}

#[test]
fn a_refused_read_after_a_clone_fs_child_s_chdir_names_the_secret() {
    if !usable("adv_clone_fs") {
        return;
    }
    // Before: the parent's cwd model stayed in the root, and the refused
    // read of the secret was logged as `<root>/<dir>/key`, verify ok.
    let r = refused_read("clone-fs", |_| Vec::new());
    let t = &r.record["target"];
    assert_eq!(t["path"].as_str(), r.secret.join("key").to_str(), "{t}");
    assert_eq!(t["resolved_from"], "cwd", "{t}");
    assert_eq!(r.code, Some(0), "verify: {}", r.line);
}

#[test]
fn a_rename_that_leaves_a_whiteout_says_so() {
    if !usable("adv_whiteout") {
        return;
    }
    let (root, bin, secret) = (Dir::new(), Dir::open_to_all(), secret_dir());
    let agent = compile(&bin, "agent", AGENT);
    let a = root.file("a", "data\n");
    let b = root.join("b");
    let (records, code, line) = run_denying(
        &root,
        secret.path(),
        &[
            agent.to_str().unwrap(),
            "whiteout",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "verify: {line}");
    // The kernel left a character device (0, 0) where `a` was ...
    use std::os::unix::fs::FileTypeExt as _;
    assert!(
        std::fs::symlink_metadata(&a)
            .unwrap()
            .file_type()
            .is_char_device()
    );
    // ... which no notification names: the rename's record must say so.
    let renames: Vec<&Value> = records.iter().filter(|r| r["kind"] == "rename").collect();
    assert_eq!(renames.len(), 1, "{records:#?}");
    let t = &renames[0]["target"];
    assert_eq!(t["from"].as_str(), a.to_str(), "{t}");
    assert_eq!(t["path_source"], "kernel", "{t}");
    // Before: only `flags: 4`.
    assert_eq!(t["whiteout"], true, "{t}");
}

#[test]
fn a_refused_read_in_a_cwd_reached_through_a_replaced_link_names_the_secret() {
    if !usable("adv_symlink_cwd") {
        return;
    }
    // Before: `<root>/lnk/<dir>/key`, a file of the root once the link
    // was replaced, verify ok.
    let r = refused_read("symlink-cwd", |root| {
        vec![root.join("lnk").to_string_lossy().into_owned()]
    });
    let lnk = r.root.join("lnk");
    assert!(lnk.is_dir() && !lnk.is_symlink());
    let t = &r.record["target"];
    assert_eq!(t["path"].as_str(), r.secret.join("key").to_str(), "{t}");
    assert_eq!(r.code, Some(0), "verify: {}", r.line);
}

#[test]
fn a_log_rewritten_offline_fails_against_the_printed_head() {
    if !usable("adv_rechained") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let log = logs.join("effects.jsonl");
    let r = root.path().to_str().unwrap();
    let out = tartaros(
        &[
            "run",
            "--write",
            r,
            "--chdir",
            r,
            "--log",
            log.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "echo x > evidence; rm evidence",
        ],
        root.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let head = err
        .split("effect log sealed, head ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no head printed: {err}"))
        .to_string();
    // Drop the unlink, re-chain every line after it, recompute the seal.
    let all = records(&log);
    let mut records: Vec<Value> = all
        .iter()
        .filter(|r| r["kind"] != "unlink")
        .cloned()
        .collect();
    assert_eq!(records.len() + 1, all.len(), "one unlink: {all:#?}");
    let mut prev = "0".repeat(64);
    let mut counts = serde_json::Map::new();
    let mut text = String::new();
    for (seq, r) in records.iter_mut().enumerate() {
        r["seq"] = seq.into();
        r["prev"] = prev.clone().into();
        let kind = r["kind"].as_str().unwrap().to_string();
        if kind == "seal" {
            r["counts"] = Value::Object(counts.clone());
            r["head"] = prev.clone().into();
            r.as_object_mut().unwrap().remove("digest");
            let body = tartaros::effectlog::to_canonical(r).unwrap();
            r["digest"] = sha256_hex(body.as_bytes()).into();
        } else {
            let n = counts.get(&kind).and_then(Value::as_u64).unwrap_or(0);
            counts.insert(kind, (n + 1).into());
        }
        let line = tartaros::effectlog::to_canonical(r).unwrap();
        prev = sha256_hex(line.as_bytes());
        text.push_str(&line);
        text.push('\n');
    }
    let forged = logs.join("forged.jsonl");
    std::fs::write(&forged, text).unwrap();
    let f = forged.to_str().unwrap();
    // The chain alone cannot tell: it is a hash, not a signature.
    let plain = tartaros(&["log", "verify", f], Path::new("/"));
    assert_eq!(plain.status.code(), Some(0), "{}", stdout(&plain));
    // The head the run printed can.
    let anchored = tartaros(&["log", "verify", "--head", &head, f], Path::new("/"));
    assert_eq!(anchored.status.code(), Some(1), "{}", stdout(&anchored));
    assert!(stdout(&anchored).contains("not the expected"));
    let original = tartaros(
        &["log", "verify", "--head", &head, log.to_str().unwrap()],
        Path::new("/"),
    );
    assert_eq!(original.status.code(), Some(0), "{}", stdout(&original));
}

/// The routine shape of the claims above: `grep -r` and `find` walking
/// into a read-denied directory open it by directory descriptor and exit
/// before their records are read. The refusals are in the log, and the
/// log verifies `ok` (a verdict every such run earned would tell a
/// reviewer nothing).
#[test]
fn a_tree_walk_into_a_denied_directory_verifies_ok() {
    if !usable("adv_walk") {
        return;
    }
    let root = Dir::new();
    let denied = root.join("secret");
    std::fs::create_dir(&denied).unwrap();
    std::fs::write(denied.join("key"), "the secret\n").unwrap();
    let (records, code, line) = run_denying(
        &root,
        &denied,
        &["sh", "-c", "grep -r zzz . ; find . > /dev/null; true"],
    );
    let refused: Vec<&Value> = records
        .iter()
        .filter(|r| {
            r["decision"] == "denied"
                && r["target"]["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with("secret"))
        })
        .collect();
    assert!(!refused.is_empty(), "no refusal of the walk: {records:#?}");
    assert_eq!(code, Some(0), "verify: {line}");
}
