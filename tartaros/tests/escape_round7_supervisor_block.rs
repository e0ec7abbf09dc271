//! The supervisor never blocks on a file the agent controls (adversarial
//! round 7). To name the target of a `pidfd_send_signal`, the decoder
//! reopened `/proc/<pid>/fd/<n>` with a plain open; an agent that put a
//! FIFO (open for reading, no writer) at the number right after the call
//! made that open wait for a writer forever. The supervisor runs on one
//! thread, so everything stopped with it: `--timeout 8s` did not fire, the
//! agent's processes ran on, and the log was sealed only when the
//! launcher was killed 60 s later. Checked from the host: the run ends at
//! its timeout with 124 and a sealed log.

mod common;
use std::time::{Duration, Instant};

use common::*;

/// Signals its own child through fresh pidfds, each replaced by a FIFO
/// (read end, no writer) as soon as the call returns, then waits for
/// the timeout.
const SWAP: &str = r#"
import ctypes, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
W = sys.argv[1]
os.mkfifo(W + '/ff')
ff = os.open(W + '/ff', os.O_RDONLY | os.O_NONBLOCK)
child = os.fork()
if child == 0:
    time.sleep(120)
    os._exit(0)
for _ in range(20):
    pidfd = libc.syscall(434, child, 0)
    libc.syscall(424, pidfd, signal.SIGCONT, None, 0)
    os.dup2(ff, pidfd)
print('swapped', flush=True)
time.sleep(120)
"#;

#[test]
fn a_fifo_swapped_in_for_a_pidfd_does_not_stop_the_supervisor() {
    if !can_run("a_fifo_swapped_in_for_a_pidfd_does_not_stop_the_supervisor") {
        return;
    }
    let work = Dir::new();
    let logs = Dir::new();
    let log = logs.join("effects.jsonl");
    let w = work.path().to_str().unwrap();
    let started = Instant::now();
    let mut run = KillOnDrop(Some(
        std::process::Command::new(bin())
            .args(["run", "-q", "--timeout", "4s", "--kill-after", "1s"])
            .args(["--write", w, "--log", log.to_str().unwrap()])
            .args(["--", "python3", "-c", SWAP, w])
            .current_dir(work.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("tartaros"),
    ));
    let ended = eventually(40, || {
        run.0
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_some())
    });
    let took = started.elapsed();
    let out = run.take().wait_with_output().unwrap();
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        ended,
        "the run did not end within 40 s of a 4 s timeout: {said}"
    );
    assert!(stdout(&out).contains("swapped"), "{said}");
    assert!(took < Duration::from_secs(20), "{took:?}: {said}");
    assert_eq!(out.status.code(), Some(124), "{said}");
    let records = records(&log);
    assert_eq!(records.last().unwrap()["kind"], "seal", "{said}");
}
