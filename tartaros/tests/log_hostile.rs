//! Session 16's adversarial pass on the effect log: a hostile agent with
//! odd syscall entries, descriptors and names. Each test runs the agent
//! under `tartaros run --log` and checks, from the host side, the exact
//! record (kind, kernel path, verdict) or `verify`'s exit code. Needs root
//! and gcc (fails under CI=true without).

mod common;

use std::path::Path;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* A syscall whose number has bits above the low 32 set: the kernel runs
   the call of the low half (it takes the number as an int), seccomp sees
   the low half too, and `orig_ax` keeps the whole register. */
static long high(long nr, long a, long b, long c, long d) {
    long ret;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr | (1L << 32)), "D"(a), "S"(b), "d"(c), "r"(r10)
                     : "rcx", "r11", "memory");
    return ret;
}

int main(int argc, char **argv) {
    if (!strcmp(argv[1], "high-bits")) {
        /* argv[2]: a read-denied file; argv[3]: a file outside the roots;
           argv[4]: a file of the root to chmod. */
        long r = high(SYS_openat, AT_FDCWD, (long)argv[2], O_RDONLY, 0);
        if (r != -EACCES) return 20;
        r = high(SYS_openat, AT_FDCWD, (long)argv[3], O_WRONLY | O_CREAT, 0644);
        if (r >= 0) return 21;
        r = high(SYS_fchmodat, AT_FDCWD, (long)argv[4], 01755, 0);
        if (r) return 22;
        return 0;
    }
    if (!strcmp(argv[1], "map-stdin")) {
        /* Standard input is a file of the root opened read-write by the
           launcher: changed through a shared mapping only, no write(2),
           no open(2) in the sandbox, so no notification and no record. */
        char *p = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, 0, 0);
        if (p == MAP_FAILED) return 30;
        memcpy(p, "EVIL", 4);
        return msync(p, 4096, MS_SYNC) ? 31 : 0;
    }
    if (!strcmp(argv[1], "via-link")) {
        /* argv[2]: the secret; argv[3]: a link of the root to it. A
           refused read through the link, and one through the magic link
           of /proc/self/root. */
        char p[4096];
        if (symlink(argv[2], argv[3])) return 40;
        if (open(argv[3], O_RDONLY) >= 0) return 41;
        snprintf(p, sizeof p, "/proc/self/root%s", argv[2]);
        if (open(p, O_RDONLY) >= 0) return 42;
        execl(argv[3], "x", (char *)0);
        return errno == EACCES ? 0 : 43;
    }
    return 1;
}
"#;

/// The records of `kind` naming `path` in `key` (`path` unless told).
fn naming<'a>(records: &'a [Value], kind: &str, key: &str, path: &Path) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["kind"] == kind && r["target"][key].as_str() == path.to_str())
        .collect()
}

/// `syscall` with bit 32 of the number set runs the call of the low half:
/// a refused read of a secret, a refused write outside the roots and a
/// chmod in the root (sticky: setuid is refused), each made that way, must be recorded with
/// their verdicts as if made plainly (before: the capture compared the
/// whole register with its table and recorded none of them, and `verify`
/// said ok).
#[test]
fn calls_with_high_bits_in_the_syscall_number_are_recorded() {
    if !usable("hostile_high_bits") {
        return;
    }
    let (root, bin, secret) = (Dir::new(), Dir::open_to_all(), secret_dir());
    let agent = compile(&bin, "agent", AGENT);
    let key = secret.join("key");
    let outside = Path::new("/etc/tartaros-hostile-high-bits");
    let tool = root.file("tool", "#!/bin/sh\n");
    let argv = [
        agent.to_str().unwrap(),
        "high-bits",
        key.to_str().unwrap(),
        outside.to_str().unwrap(),
        tool.to_str().unwrap(),
    ];
    let (records, code, line) = run_denying(&root, secret.path(), &argv);
    assert!(!outside.exists(), "the write outside the roots happened");
    let read = naming(&records, "open", "path", &key);
    assert_eq!(read.len(), 1, "refused read of {key:?}: {records:#?}");
    assert_eq!(read[0]["decision"], "denied");
    assert_eq!(read[0]["errno"], 13);
    let write = naming(&records, "create", "path", outside);
    assert_eq!(write.len(), 1, "refused write of {outside:?}: {records:#?}");
    assert_eq!(write[0]["decision"], "denied");
    let chmod = naming(&records, "chmod", "path", &tool);
    assert_eq!(chmod.len(), 1, "chmod of {tool:?}: {records:#?}");
    assert_eq!(chmod[0]["decision"], "allowed");
    assert_eq!(chmod[0]["target"]["mode"], 0o1755);
    assert_eq!(chmod[0]["target"]["path_source"], "kernel");
    assert_eq!(code, Some(0), "verify: {line}");
}

/// The seal's entry of `path`, if any.
fn sealed<'a>(records: &'a [Value], path: &Path) -> Option<&'a Value> {
    seal(records)["files"]
        .as_array()?
        .iter()
        .find(|f| f["path"].as_str() == path.to_str())
}

/// A launcher that hands the agent a file of a root as a read-write
/// standard stream (`<> file`, Python's `open(f, "w+")`): the agent
/// changes it through a shared mapping only, which sends no notification
/// and makes no captured call. The seal must hash the file as it was left
/// (before: the file was in no record and not in the seal, and `verify`
/// said ok).
#[test]
fn a_standard_stream_changed_through_a_mapping_is_sealed() {
    if !usable("hostile_map_stdin") {
        return;
    }
    let (root, exe, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&exe, "agent", AGENT);
    let file = root.file("notes.txt", "original content\n");
    let log = logs.join("effects.jsonl");
    let stdin = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file)
        .unwrap();
    let out = std::process::Command::new(bin())
        .args(["run", "-q", "--write", root.path().to_str().unwrap()])
        .args(["--log", log.to_str().unwrap(), "--"])
        .args([agent.to_str().unwrap(), "map-stdin"])
        .current_dir(root.path())
        .stdin(stdin)
        .output()
        .unwrap();
    assert!(out.status.success(), "run: {}", stderr(&out));
    let now = std::fs::read(&file).unwrap();
    assert_eq!(now, b"EVILinal content\n", "the agent's change");
    let records = records(&log);
    let entry = sealed(&records, &file);
    let entry = entry.unwrap_or_else(|| panic!("{file:?} not in the seal: {:#}", seal(&records)));
    assert_eq!(entry["sha256"], sha256_hex(&now));
    assert_eq!(entry["size"], now.len());
}

/// A refused read through a link (`innocent` -> the secret) or through
/// `/proc/self/root`, and a refused exec through the link: the refused
/// call reached no descriptor the kernel
/// could name, so the record has the agent's string, which named a file
/// of the root (or a `/proc` alias) instead of the secret, and `verify`
/// said a plain ok. The record must name the secret, say that it was
/// reached through a link resolved after the call, and `verify` must count
/// it among the agent's claims.
#[test]
fn a_refused_read_through_a_link_names_the_file_it_reached() {
    if !usable("hostile_via_link") {
        return;
    }
    let (root, exe, secret) = (Dir::new(), Dir::open_to_all(), secret_dir());
    let agent = compile(&exe, "agent", AGENT);
    let key = secret.join("key");
    let link = root.join("innocent");
    let argv = [
        agent.to_str().unwrap(),
        "via-link",
        key.to_str().unwrap(),
        link.to_str().unwrap(),
    ];
    let (records, code, line) = run_denying(&root, secret.path(), &argv);
    let refused: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] == "open" && r["decision"] == "denied")
        .collect();
    assert_eq!(refused.len(), 2, "{records:#?}");
    for r in &refused {
        assert_eq!(r["target"]["path"].as_str(), key.to_str(), "{r:#}");
        assert_eq!(r["target"]["path_via_link"], true, "{r:#}");
        assert_eq!(r["target"]["path_source"], "agent", "{r:#}");
    }
    assert_eq!(refused[0]["target"]["claimed_path"].as_str(), link.to_str());
    let exec: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] == "exec" && r["decision"] == "denied")
        .collect();
    assert_eq!(exec.len(), 1, "{records:#?}");
    assert_eq!(
        exec[0]["target"]["path"].as_str(),
        key.to_str(),
        "{:#}",
        exec[0]
    );
    assert_eq!(exec[0]["target"]["path_via_link"], true, "{:#}", exec[0]);
    assert_eq!(code, Some(0), "verify: {line}");
    assert!(
        line.contains("3 refused attempts are named by the agent's string alone"),
        "verify: {line}"
    );
}
