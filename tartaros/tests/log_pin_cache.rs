//! The pin cache of every program (ebpf/pin_full.rs), as the `--log` runs
//! of root use it: the first run verifies and pins them all, later runs
//! attach the pinned programs themselves, each run's tracing links marked
//! with its own cookie. Asserted from the host: two runs at once each log
//! exactly their own effects, once (without the cookie each run's links
//! also recorded the other's effects, and every effect twice); the links
//! are gone after the runs; the runs' rings are taken out of the pinned
//! `EVENTS` after them (by their janitors, which leave at most two fresh
//! spares for the runs to come), also after a SIGKILL or a refusal; a
//! live run's ring listed as a spare is not handed to the next run; a
//! tampered cache is detected, warned about and replaced; `tartaros cache
//! drop` leaves nothing.
//!
//! One test, in steps: the cache is host-wide state.

mod common;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::pins::*;
use common::*;

/// Files each agent creates, and programs it runs.
const FILES: usize = 60;
const EXECS: usize = 3;

/// A `--log` run whose agent waits for `go` (after writing `ready`), then
/// creates `FILES` files named `<tag><i>` in its writable root and runs
/// `/bin/true` `EXECS` times.
fn agent(work: &Dir, log: &Path, tag: &str, go: Option<&Path>) -> Child {
    let w = work.path().display();
    let wait = go.map_or(String::new(), |p| {
        format!(
            "open('{w}/ready', 'w').close()\nwhile not os.path.exists('{}'): time.sleep(0.02)\n",
            p.display()
        )
    });
    let code = format!(
        "import os, subprocess, time\n{wait}for i in range({FILES}):\n    open('{w}/{tag}%d' % i, 'w').close()\nfor i in range({EXECS}):\n    subprocess.run(['/bin/true'])\n"
    );
    Command::new(bin())
        .args(["run", "--strict", "--write"])
        .arg(work.path())
        .arg("--log")
        .arg(log)
        .args(["--", "python3", "-c", &code])
        .current_dir(work.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tartaros")
}

/// Waits for a run and checks that its log verifies and holds exactly one
/// `create` record of each of its files and none of another root, and one
/// `exec` record of each of its programs.
fn logged_exactly_its_own(child: Child, work: &Dir, log: &Path, tag: &str) -> String {
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let verify = tartaros(
        &["log", "verify", &log.display().to_string()],
        Path::new("/"),
    );
    assert_eq!(verify.status.code(), Some(0), "{}", stderr(&verify));
    let creates: Vec<String> = records(log)
        .iter()
        .filter(|r| r["kind"] == "create")
        .filter_map(|r| r["target"]["path"].as_str().map(str::to_owned))
        .filter(|p| !p.ends_with("/ready"))
        .collect();
    let mut expected: Vec<String> = (0..FILES)
        .map(|i| work.join(&format!("{tag}{i}")).display().to_string())
        .collect();
    expected.sort();
    let mut found = creates.clone();
    found.sort();
    assert_eq!(
        found, expected,
        "the log of run {tag} must name each of its files once and nothing else"
    );
    // A process event is not merged as a syscall's enter and exit are:
    // recorded through another run's link too, it would be there twice.
    let execs = records(log)
        .iter()
        .filter(|r| {
            r["kind"] == "exec"
                && r["target"]["binary"]
                    .as_str()
                    .is_some_and(|b| b.ends_with("/true"))
        })
        .count();
    assert_eq!(execs, EXECS, "run {tag}: one exec record per exec");
    stderr(&out)
}

/// The rings in the cache's `EVENTS` that are not spares (listed in
/// `spares`, for runs to come): those of live runs, or left behind.
fn rings_in_use(dir: &Path) -> Vec<u64> {
    let spares = keys(&obj_get(&dir.join("spares")));
    assert!(spares.len() <= 2, "more spares than kept: {spares:?}");
    keys(&obj_get(&dir.join("map_EVENTS")))
        .into_iter()
        .filter(|k| !spares.contains(k))
        .collect()
}

#[test]
fn logged_runs_share_checked_pins_and_record_only_their_own_effects() {
    if !can_run("log_pin_cache") {
        return;
    }
    drop_cache();
    let logs = Dir::new();

    // 1. The first run verifies every program and pins them.
    let work = Dir::new();
    let log = logs.join("first.jsonl");
    let first = agent(&work, &log, "f", None);
    logged_exactly_its_own(first, &work, &log, "f");
    let dir = cache_dir_of("full_").expect("the first --log run pinned every program");
    for program in ["prog_sys_enter", "prog_sys_exit", "prog_sched_process_exec"] {
        assert!(dir.join(program).exists(), "{program} is not pinned");
    }
    let sys_enter = obj_id(&obj_get(&dir.join("prog_sys_enter")));
    assert!(
        eventually(10, || rings_in_use(&dir).is_empty()),
        "the run's ring stayed in EVENTS"
    );

    // 2. Two runs at once: each attaches the pinned programs itself.
    let (a, b) = (Dir::new(), Dir::new());
    let (log_a, log_b) = (logs.join("a.jsonl"), logs.join("b.jsonl"));
    let go = logs.join("go");
    let run_a = agent(&a, &log_a, "a", Some(&go));
    let run_b = agent(&b, &log_b, "b", Some(&go));
    assert!(
        eventually(20, || a.join("ready").exists() && b.join("ready").exists()),
        "the runs did not start"
    );
    assert_eq!(links_of(sys_enter), 2, "one sys_enter link per run");
    assert_eq!(entries(&dir).len(), 2, "one set of entries per run");
    std::fs::write(&go, "").unwrap();
    let said_a = logged_exactly_its_own(run_a, &a, &log_a, "a");
    let said_b = logged_exactly_its_own(run_b, &b, &log_b, "b");
    for said in [said_a, said_b] {
        assert!(!said.contains("cached"), "{said}");
    }
    assert_eq!(links_of(sys_enter), 0, "a run's links outlived it");
    assert!(entries(&dir).is_empty(), "the runs left entries");
    assert!(
        eventually(10, || rings_in_use(&dir).is_empty()),
        "the runs' rings stayed in EVENTS"
    );

    // 3. A live run's ring listed as a spare (root on the host writing the
    // list) is not handed to the next run: each log stays its own.
    let (b, c) = (Dir::new(), Dir::new());
    let (log_b, log_c) = (logs.join("b2.jsonl"), logs.join("c2.jsonl"));
    let go = logs.join("go2");
    let run_b = agent(&b, &log_b, "b", Some(&go));
    assert!(eventually(20, || b.join("ready").exists()), "no start");
    let live = rings_in_use(&dir);
    assert_eq!(live.len(), 1, "run b has a ring");
    let mut id = [0u8; 4];
    assert!(lookup(&obj_get(&dir.join("map_EVENTS")), live[0], &mut id));
    let mut listed = id.to_vec();
    listed.extend_from_slice(&(8u32 << 20).to_le_bytes());
    let spares = obj_get(&dir.join("spares"));
    let events = obj_get(&dir.join("map_EVENTS"));
    // Only the live ring on the list: the real spares are taken out.
    for key in keys(&spares) {
        delete(&spares, key);
        delete(&events, key);
    }
    update(&spares, live[0], &listed);
    let run_c = agent(&c, &log_c, "c", None);
    logged_exactly_its_own(run_c, &c, &log_c, "c");
    std::fs::write(&go, "").unwrap();
    logged_exactly_its_own(run_b, &b, &log_b, "b");
    assert!(
        eventually(10, || rings_in_use(&dir).is_empty()),
        "the runs' rings stayed in EVENTS"
    );

    // 3b. A SIGKILLed supervisor: its janitor takes its ring out, the next
    // run removes its entries.
    let work = Dir::new();
    let never = work.join("never");
    let log = logs.join("killed.jsonl");
    let mut killed = agent(&work, &log, "k", Some(&never));
    assert!(eventually(20, || work.join("ready").exists()), "no start");
    let cgroup = run_cgroup(killed.id());
    assert_eq!(rings_in_use(&dir).len(), 1, "the run has a ring");
    killed.kill().unwrap();
    let _ = killed.wait();
    assert!(
        eventually(30, || !cgroup.exists()),
        "the killed run's cgroup stayed"
    );
    assert!(
        eventually(10, || rings_in_use(&dir).is_empty()),
        "the killed run's ring stayed in EVENTS"
    );
    assert_eq!(links_of(sys_enter), 0, "the killed run's links stayed");
    let work = Dir::new();
    let log = logs.join("after.jsonl");
    let next = agent(&work, &log, "n", None);
    logged_exactly_its_own(next, &work, &log, "n");
    assert!(
        entries(&dir).is_empty(),
        "the stale entries were not removed"
    );

    // 4. A run refused after it took a spare (an unknown --user): its
    // janitor takes the ring out (it was announced before it was taken).
    let refused = Command::new(bin())
        .args(["run", "--log"])
        .arg(logs.join("refused.jsonl"))
        .args(["--user", "tartaros-no-such-user", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(78), "{}", stderr(&refused));
    assert!(
        eventually(10, || rings_in_use(&dir).is_empty()),
        "the refused run's ring stayed in EVENTS"
    );

    // 5. A changed map (the level) is detected: warned, replaced, and the
    // run still logs everything.
    set_u32(&obj_get(&dir.join("map_RUN_LEVEL")), 77);
    let work = Dir::new();
    let log = logs.join("tampered.jsonl");
    let run = agent(&work, &log, "t", None);
    let said = logged_exactly_its_own(run, &work, &log, "t");
    assert!(
        said.contains("failed to reuse the cached programs") && said.contains("RUN_LEVEL is 77"),
        "{said}"
    );
    let dir = cache_dir_of("full_").expect("pinned again");
    assert_ne!(obj_id(&obj_get(&dir.join("prog_sys_enter"))), sys_enter);

    // 6. `cache drop` leaves nothing mounted and nothing behind.
    drop_cache();
    assert!(!mounted(), "the bpffs is still mounted");
    assert!(!Path::new(PIN_ROOT).exists() && !Path::new(PIN_LOCK).exists());
}
