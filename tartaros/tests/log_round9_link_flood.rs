//! Adversarial round 9: the supervisor's link tables under a flood. The
//! writes to an `O_TMPFILE` linked into the tree, and to a name removed
//! after a link (`link x k; unlink x`), are named by the link (rounds 7
//! and 8) through tables of the links the run made, bounded at 65,536
//! and emptied at once when full. An agent that made that many links
//! between its link and its next write had the writes logged at the
//! kernel's old name, `deleted: true`, and the log verified `ok`. Needs
//! root and gcc (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long flood = atol(argv[2]);
    char a[] = "a", b[] = "b", c[] = "c";
    if (chdir(argv[1]) || mkdir(a, 0755) || mkdir(b, 0755) || mkdir(c, 0755)) return 9;
    /* A tmpfile of `a`, linked into `b`. */
    int t = open(a, O_TMPFILE | O_WRONLY, 0644);
    if (t < 0 || write(t, "ONE;", 4) != 4) return 10;
    char pp[64];
    snprintf(pp, sizeof pp, "/proc/self/fd/%d", t);
    if (linkat(AT_FDCWD, pp, AT_FDCWD, "b/linked", AT_SYMLINK_FOLLOW)) return 11;
    /* A file given a second name; the first goes after the flood. */
    int x = open("x", O_CREAT | O_WRONLY | O_EXCL, 0644);
    if (x < 0 || write(x, "before;", 7) != 7 || link("x", "b/kept")) return 12;
    /* The flood: links of distinct files from distinct names. */
    char f[64], g[64];
    for (long i = 0; i < flood; i++) {
        snprintf(f, sizeof f, "c/f%ld", i);
        snprintf(g, sizeof g, "c/g%ld", i);
        int fd = open(f, O_CREAT | O_WRONLY | O_EXCL, 0644);
        if (fd < 0 || close(fd) || link(f, g)) return 13;
        /* Paced so that the capture's ring loses nothing. */
        if (i % 100 == 99) usleep(10000);
    }
    if (unlink("x") || write(x, "after;", 6) != 6) return 14;
    if (write(t, "TWO;", 4) != 4) return 15;
    return 0;
}
"#;

#[test]
fn writes_named_by_a_link_stay_named_or_the_log_is_incomplete_after_a_link_flood() {
    if !usable("round9_link_flood") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let dir = root.path().to_str().unwrap();
    let (out, records, code, line) =
        run_logged_verdict(&root, &logs, &[agent.to_str().unwrap(), dir, "66000"]);
    // Events lost (a loaded host): the log says it is incomplete, and the
    // flood did not reach the tables whole, so there is no more to check.
    if seal(&records)["lost"] != 0 {
        assert_eq!(code, Some(3), "{line}");
        assert_eq!(out.status.code(), Some(122), "{}", stderr(&out));
        eprintln!("events were lost ({line}): the link tables were not tested");
        return;
    }
    // The run's status says what `verify` does (122: the log is
    // incomplete, the agent succeeded); it used to exit 0 on a log
    // `verify` called incomplete.
    let expected = if code == Some(3) { 122 } else { 0 };
    assert_eq!(out.status.code(), Some(expected), "{}", stderr(&out));
    assert_eq!(std::fs::read(root.join("b/linked")).unwrap(), b"ONE;TWO;");
    assert_eq!(
        std::fs::read(root.join("b/kept")).unwrap(),
        b"before;after;"
    );
    let writes: Vec<&Value> = records.iter().filter(|r| r["kind"] == "write").collect();
    for (kept, old) in [
        ("b/linked", format!("{dir}/a/#")),
        ("b/kept", format!("{dir}/x")),
    ] {
        let kept = format!("{dir}/{kept}");
        let named = writes.iter().any(|w| {
            field(w, "path") == Some(kept.as_str()) && w["target"].get("deleted").is_none()
        });
        let said_deleted: Vec<&&Value> = writes
            .iter()
            .filter(|w| field(w, "path").is_some_and(|p| p.starts_with(&old)))
            .filter(|w| w["target"]["deleted"] == true)
            .collect();
        // Named where the file is, or the log says it cannot tell.
        assert!(
            named || code == Some(3),
            "{kept}: verify {code:?} {line}; writes said to a deleted file: {said_deleted:#?}"
        );
        assert!(said_deleted.is_empty(), "{said_deleted:#?}");
    }
}
