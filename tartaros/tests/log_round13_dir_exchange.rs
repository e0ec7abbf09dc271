//! Adversarial round 13 on the log: `renameat2(RENAME_EXCHANGE)` of a
//! directory the agent wrote in with one it did not. The kernel reports
//! two renames (`mine` to `host`, `host` to `mine`); applied one after the
//! other, the second moved the written file's counts back, so the log
//! said `write mine/f.txt`, a file holding the host's untouched content,
//! while the agent's file was `host/f.txt` (3 of 3 runs, `verify` ok).
//! Needs root and gcc.

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (chdir(argv[1]) || mkdir("mine", 0755)) return 9;
    int fd = open("mine/f.txt", O_CREAT | O_WRONLY, 0644);
    if (fd < 0 || write(fd, "agent\n", 6) != 6 || close(fd)) return 10;
    return renameat2(AT_FDCWD, "mine", AT_FDCWD, "host", RENAME_EXCHANGE) ? 11 : 0;
}
"#;

#[test]
fn a_directory_exchange_leaves_the_write_at_the_file_s_new_name() {
    if !usable("round13_dir_exchange") {
        return;
    }
    for run in 0..3 {
        let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
        let agent = compile(&bin, "exchange", AGENT);
        let dir = root.path().to_str().unwrap();
        std::fs::create_dir(root.join("host")).unwrap();
        chown(&root.join("host"), NOBODY);
        let host = root.file("host/f.txt", "host\n");
        chown(&host, NOBODY);
        let (out, records, code, line) =
            run_logged_verdict(&root, &logs, &[agent.to_str().unwrap(), dir]);
        assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
        assert_eq!(
            std::fs::read_to_string(root.join("host/f.txt")).unwrap(),
            "agent\n"
        );
        let writes: Vec<&Value> = records.iter().filter(|r| r["kind"] == "write").collect();
        assert_eq!(writes.len(), 1, "run {run}: {writes:#?}");
        assert_eq!(
            field(writes[0], "path"),
            Some(format!("{dir}/host/f.txt").as_str()),
            "run {run}: {}",
            writes[0]
        );
        assert_eq!(code, Some(0), "run {run}: verify {line}");
    }
}
