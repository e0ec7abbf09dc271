//! Changes to a file that are not write(2): copy_file_range, sendfile,
//! splice, fallocate (punching a hole), pwritev2 with RWF_APPEND, and the
//! writes to an O_TMPFILE that is then linked into the tree. Each must be
//! a `write` record naming the file it changed, with the seal's hash of
//! what the host reads; kernel AIO is refused and recorded. Needs root and
//! gcc (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/sendfile.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (chdir(argv[1])) return 9;
    int src = open("src", O_RDONLY);
    int a = open("cfr", O_WRONLY);
    loff_t off = 0;
    if (copy_file_range(src, &off, a, NULL, 4, 0) != 4) return 10;
    int b = open("sendfile", O_WRONLY);
    off_t o = 0;
    if (sendfile(b, src, &o, 4) != 4) return 11;
    int c = open("splice", O_WRONLY);
    int p[2];
    if (pipe(p) || write(p[1], "SPLC", 4) != 4) return 12;
    if (splice(p[0], NULL, c, NULL, 4, 0) != 4) return 12;
    int d = open("punch", O_WRONLY);
    if (fallocate(d, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096)) return 13;
    int e = open("append", O_WRONLY);
    struct iovec iov = {"APND", 4};
    if (pwritev2(e, &iov, 1, 0, RWF_APPEND) != 4) return 14;
    unsigned long ctx = 0;
    if (syscall(SYS_io_setup, 4, &ctx) == 0) return 15;
    /* Written while nameless, linked, written again. */
    int t = open(".", O_TMPFILE | O_WRONLY, 0644);
    if (t < 0 || write(t, "TMP1", 4) != 4) return 16;
    char pp[64];
    snprintf(pp, sizeof pp, "/proc/self/fd/%d", t);
    char linked[] = "linked";
    if (linkat(AT_FDCWD, pp, AT_FDCWD, linked, AT_SYMLINK_FOLLOW)) return 17;
    if (write(t, "TMP2", 4) != 4) return 18;
    /* Linked under a staging name, renamed at once (atomic creation). */
    int u = open(".", O_TMPFILE | O_WRONLY, 0644);
    if (u < 0 || write(u, "STG1", 4) != 4) return 19;
    snprintf(pp, sizeof pp, "/proc/self/fd/%d", u);
    char stage[] = "stage", final[] = "final";
    if (linkat(AT_FDCWD, pp, AT_FDCWD, stage, AT_SYMLINK_FOLLOW) || rename(stage, final)) return 20;
    if (write(u, "STG2", 4) != 4) return 21;
    return 0;
}
"#;

const CHANGED: [&str; 5] = ["cfr", "sendfile", "splice", "punch", "append"];

#[test]
fn changes_that_are_not_write_calls_are_write_records_of_the_file() {
    if !usable("not_write_calls") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let dir = root.path().to_str().unwrap();
    root.file("src", "SRC!");
    for name in CHANGED {
        std::fs::write(root.join(name), vec![b'.'; 8192]).unwrap();
        chown(&root.join(name), NOBODY);
    }
    chown(root.path(), NOBODY);
    let (out, records) = run_logged(&root, &logs, &[agent.to_str().unwrap(), dir]);
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let writes_of = |path: &str| -> Vec<&Value> {
        records
            .iter()
            .filter(|r| r["kind"] == "write" && field(r, "path") == Some(path))
            .collect()
    };
    let files = seal(&records)["target"]
        .get("files")
        .or_else(|| seal(&records).get("files"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let sealed = |path: &str| {
        files
            .iter()
            .find(|f| f["path"] == path)
            .and_then(|f| f["sha256"].as_str())
            .map(str::to_string)
    };
    for name in CHANGED.iter().copied().chain(["linked", "final"]) {
        let path = format!("{dir}/{name}");
        let w = writes_of(&path);
        assert_eq!(w.len(), 1, "{path}: {records:#?}");
        assert!(w[0]["target"].get("deleted").is_none(), "{}", w[0]);
        let on_host = std::fs::read(&path).unwrap();
        assert_eq!(sealed(&path), Some(sha256_hex(&on_host)), "{path}");
    }
    assert_eq!(std::fs::read(root.join("linked")).unwrap(), b"TMP1TMP2");
    assert_eq!(std::fs::read(root.join("final")).unwrap(), b"STG1STG2");
    // The tmpfile's writes: named where the file is, the kernel's
    // nameless name kept, and no record says they went to a deleted file.
    let linked = writes_of(&format!("{dir}/linked"))[0];
    let written_as = field(linked, "written_as").unwrap_or_default();
    assert!(written_as.starts_with(&format!("{dir}/#")), "{linked}");
    assert!(writes_of(written_as).is_empty(), "{records:#?}");
    let aio = records
        .iter()
        .find(|r| r["kind"] == "syscall" && field(r, "syscall") == Some("io_setup"))
        .unwrap_or_else(|| panic!("no io_setup record: {records:#?}"));
    assert_eq!(aio["decision"], "denied", "{aio}");
    let log = logs.join("effects.jsonl");
    let summary = stdout(&tartaros(
        &["log", "summary", log.to_str().unwrap()],
        root.path(),
    ));
    // The tmpfile is one entry, at its link, with its writes; neither
    // deleted nor a nameless file of the tree.
    assert!(
        !summary
            .lines()
            .any(|l| l.trim_start().starts_with("deleted") || l.contains(&format!("{dir}/#"))),
        "{summary}"
    );
    let line = summary
        .lines()
        .find(|l| l.contains(&format!("{dir}/linked ")))
        .unwrap_or_else(|| panic!("no line for the link:\n{summary}"));
    assert!(line.contains("write"), "{line}");
}

const MOVER: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
    char d[] = "d", e[] = "e", f[] = "d/f", g[] = "d/g";
    if (chdir(argv[1]) || mkdir(d, 0755)) return 9;
    int a = open(f, O_CREAT | O_WRONLY | O_EXCL, 0644);
    int b = open(g, O_CREAT | O_WRONLY | O_EXCL, 0644);
    if (write(a, "one", 3) != 3 || write(b, "two", 3) != 3) return 10;
    /* Let the supervisor read the writes under the old place. */
    usleep(300000);
    if (rename(d, e)) return 11;
    return write(a, "more", 4) == 4 ? 0 : 12;
}
"#;

/// Files written in a directory that is then renamed: their `write`
/// records named the old place with `deleted: true`, and the summary
/// showed them deleted there (and one as `seal-only` at the new place).
#[test]
fn writes_in_a_renamed_directory_are_named_where_the_files_are() {
    if !usable("renamed_dir_writes") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "mover", MOVER);
    let dir = root.path().to_str().unwrap();
    chown(root.path(), NOBODY);
    let (out, records) = run_logged(&root, &logs, &[agent.to_str().unwrap(), dir]);
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let writes: Vec<&Value> = records.iter().filter(|r| r["kind"] == "write").collect();
    for name in ["f", "g"] {
        let path = format!("{dir}/e/{name}");
        let w: Vec<&&Value> = writes
            .iter()
            .filter(|r| field(r, "path") == Some(path.as_str()))
            .collect();
        assert_eq!(w.len(), 1, "{path}: {writes:#?}");
        assert!(w[0]["target"].get("deleted").is_none(), "{}", w[0]);
    }
    assert!(
        writes
            .iter()
            .all(|r| !field(r, "path").unwrap_or_default().contains("/d/")),
        "{writes:#?}"
    );
    let log = logs.join("effects.jsonl");
    let summary = stdout(&tartaros(
        &["log", "summary", log.to_str().unwrap()],
        root.path(),
    ));
    for name in ["f", "g"] {
        let line = summary
            .lines()
            .find(|l| l.contains(&format!("{dir}/e/{name} ")))
            .unwrap_or_else(|| panic!("no line for e/{name}:\n{summary}"));
        assert!(line.trim_start().starts_with("created"), "{line}");
    }
    assert!(
        !summary
            .lines()
            .any(|l| l.contains(&format!("{dir}/d/")) || l.contains("seal-only")),
        "{summary}"
    );
}
