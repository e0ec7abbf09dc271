//! Adversarial round 9: capture under load. Eight threads each create,
//! write, rename and (every other file) unlink 1,500 files while the main
//! thread forks and execs. The log must hold every effect under the name
//! the kernel gave it, with the seal's hash of every file left, or verify
//! as incomplete; never `ok` with a gap or a wrong name. Needs root and
//! gcc (fails under CI=true without).

mod common;

use std::collections::{BTreeSet, HashMap};

use common::logged::*;
use common::*;

const THREADS: usize = 8;
const FILES: usize = 1_500;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static long files;

static void *churn(void *arg) {
    long t = (long)arg;
    char a[64], b[64], body[64];
    for (long j = 0; j < files; j++) {
        snprintf(a, sizeof a, "t%ld_%ld", t, j);
        snprintf(b, sizeof b, "r%ld_%ld", t, j);
        int fd = open(a, O_CREAT | O_EXCL | O_WRONLY, 0644);
        int n = snprintf(body, sizeof body, "%ld.%ld\n", t, j);
        if (fd < 0 || write(fd, body, n) != n || close(fd)) exit(10);
        if (rename(a, b)) exit(11);
        if (j % 2 && unlink(b)) exit(12);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (chdir(argv[1])) return 9;
    long threads = atol(argv[2]);
    files = atol(argv[3]);
    pthread_t th[64];
    for (long t = 0; t < threads; t++)
        if (pthread_create(&th[t], NULL, churn, (void *)t)) return 8;
    for (int i = 0; i < 40; i++) {
        pid_t p = fork();
        if (p == 0) {
            execl("/bin/true", "true", (char *)NULL);
            _exit(127);
        }
        waitpid(p, NULL, 0);
    }
    for (long t = 0; t < threads; t++) pthread_join(th[t], NULL);
    return 0;
}
"#;

#[test]
fn a_churn_of_many_threads_is_logged_whole_or_verifies_incomplete() {
    if !usable("round9_load") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let dir = root.path().to_str().unwrap();
    let (threads, files) = (THREADS.to_string(), FILES.to_string());
    let (out, records, code, line) = run_logged_verdict(
        &root,
        &logs,
        &[agent.to_str().unwrap(), dir, &threads, &files],
    );
    let expected = if code == Some(3) { 122 } else { 0 };
    assert_eq!(out.status.code(), Some(expected), "{}", stderr(&out));
    let lost = seal(&records)["lost"].as_u64().unwrap_or(0);
    eprintln!("verify: {line}; lost {lost}; {} records", records.len());
    if code == Some(3) {
        // Incomplete, and it says why: nothing more to hold it to.
        assert!(lost > 0 || line.contains("incomplete"), "{line}");
        return;
    }
    assert_eq!(code, Some(0), "{line}");
    // The tree, from the host.
    let mut kept = BTreeSet::new();
    for t in 0..THREADS {
        for j in (0..FILES).step_by(2) {
            kept.insert(format!("{dir}/r{t}_{j}"));
        }
    }
    let on_disk: BTreeSet<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().path().to_str().unwrap().to_string())
        .collect();
    assert_eq!(on_disk, kept);
    // Every effect, by its kernel name, exactly once.
    let mut seen: HashMap<(&str, String), usize> = HashMap::new();
    for r in records.iter().filter(|r| allowed(r)) {
        let kind = r["kind"].as_str().unwrap_or("");
        let name = match kind {
            "create" | "unlink" => field(r, "path"),
            "rename" => field(r, "to"),
            _ => continue,
        };
        let Some(name) = name.filter(|n| n.starts_with(dir)) else {
            continue;
        };
        assert_eq!(r["target"]["path_source"], "kernel", "{r}");
        *seen.entry((kind, name.to_string())).or_default() += 1;
    }
    for t in 0..THREADS {
        for j in 0..FILES {
            let (a, b) = (format!("{dir}/t{t}_{j}"), format!("{dir}/r{t}_{j}"));
            assert_eq!(seen.get(&("create", a.clone())), Some(&1), "create {a}");
            assert_eq!(seen.get(&("rename", b.clone())), Some(&1), "rename to {b}");
            let unlinked = seen.get(&("unlink", b.clone())).copied();
            assert_eq!(unlinked, (j % 2 == 1).then_some(1), "unlink {b}");
        }
    }
    // The seal hashes every file left, as the host reads it.
    let sealed: HashMap<&str, &str> = seal(&records)["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| Some((f["path"].as_str()?, f["sha256"].as_str()?)))
        .collect();
    for path in &kept {
        let host = sha256_hex(&std::fs::read(path).unwrap());
        assert_eq!(
            sealed.get(path.as_str()).copied(),
            Some(host.as_str()),
            "{path}"
        );
    }
}
