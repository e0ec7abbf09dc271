//! The reviewers' tools on real and hostile logs: `log summary`, `log show`,
//! `log report` (in headless Chromium) and the JSON Schema of the records.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use serde_json::{Value, json};
use sha2::Digest;
use tartaros::effectlog::{Decision, ExitStatus, Genesis, LogWriter, Record, Seal};

fn log(args: &[&str]) -> Output {
    let mut all = vec!["log"];
    all.extend_from_slice(args);
    tartaros(&all, Path::new("/"))
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// No byte that could drive a terminal: ESC, C0 controls other than
/// newline, C1 controls (UTF-8 `c2 80..9f`), bidi overrides; valid UTF-8.
#[track_caller]
fn assert_inert(bytes: &[u8], what: &str) {
    let text = std::str::from_utf8(bytes).unwrap_or_else(|e| panic!("{what}: not UTF-8: {e}"));
    for c in text.chars() {
        let bad = (c.is_control() && c != '\n')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}');
        assert!(
            !bad,
            "{what}: raw {:?} in output:\n{}",
            c,
            &text[..text.len().min(2000)]
        );
    }
}

fn genesis() -> Genesis {
    Genesis {
        version: "0.1.0".into(),
        kernel: "6.18.0-test".into(),
        policy: json!({"writable_roots": ["/work"]}),
        installed: vec!["landlock".into()],
        degraded: vec![],
        programs: vec![],
        started_wall_ns: 1_700_000_000_000_000_000,
        started_mono_ns: 1_000_000_000,
    }
}

fn effect(kind: &'static str, pid: u32, ppid: u32, at: u64, target: Value, errno: u64) -> Record {
    Record {
        kind,
        pid,
        ppid,
        uid: 65534,
        mono_ns: 1_000_000_000 + at * 1000,
        wall_ns: 1_700_000_000_000_000_000 + at * 1000,
        target: target.as_object().cloned().unwrap_or_default().into(),
        decision: if errno == 0 {
            Decision::Allowed
        } else {
            Decision::Denied
        },
        errno,
    }
}

fn sealed(w: &mut LogWriter) {
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
}

fn sha256_hex(path: &Path) -> String {
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", stdout(out), stderr(out)))
}

// ---------------------------------------------------------------- a real run

struct RealRun {
    work: Dir,
    _secret: Dir,
    _outside: Dir,
    log: PathBuf,
    secret_file: PathBuf,
    outside_file: PathBuf,
}

/// Clones a local repository, edits files, builds a program, commits, and
/// tries a denied read, a write outside the roots and a refused connect.
fn real_run() -> RealRun {
    let work = Dir::new();
    let secret = Dir::new();
    let outside = Dir::open_to_all();
    let secret_file = secret.file("key.txt", "not for the agent\n");
    let outside_file = outside.join("escape.txt");
    let origin = work.join("origin");
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.org",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(&origin)
            .output()
            .expect("git");
        assert!(out.status.success(), "git {args:?}: {}", stderr(&out));
    };
    std::fs::create_dir(&origin).unwrap();
    git(&["init", "-q"]);
    std::fs::write(origin.join("README"), "hello\n").unwrap();
    std::fs::write(origin.join("main.c"), "int main(void) { return 0; }\n").unwrap();
    git(&["add", "-A"]);
    git(&["commit", "-qm", "start"]);
    let status = Command::new("chown")
        .args(["-R", "65534:65534", origin.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    let log = work.join("effects.jsonl");
    // The compiler's temporary files go to the writable root (the host's
    // /tmp is read-only in the sandbox).
    let script = format!(
        "export HOME=/nonexistent GIT_CONFIG_NOSYSTEM=1 TMPDIR=$PWD/tmp
mkdir -p tmp
G='git -c user.name=agent -c user.email=agent@example.org'
$G clone -q origin repo && cd repo
echo new > new.txt
echo more >> README
cc -o hello main.c
$G add -A && $G commit -qm edit
(cat {secret}) 2>/dev/null
(echo x > {outside}) 2>/dev/null
python3 -c \"import socket; print(socket.socket().connect_ex(('192.0.2.7', 80)))\"
true",
        secret = secret_file.display(),
        outside = outside_file.display(),
    );
    let w = work.path().to_str().unwrap();
    let out = tartaros(
        &[
            "run",
            "--write",
            w,
            "--read-deny",
            secret.path().to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        work.path(),
    );
    assert!(
        out.status.success(),
        "run failed: {}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(
        stdout(&out).trim(),
        "1",
        "EPERM for the connect: {}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(work.join("repo/new.txt")).unwrap(),
        "new\n"
    );
    assert!(
        work.join("repo/hello").exists(),
        "the build did not run: {}",
        stderr(&out)
    );
    assert!(!outside_file.exists());
    RealRun {
        work,
        _secret: secret,
        _outside: outside,
        log,
        secret_file,
        outside_file,
    }
}

#[test]
fn a_real_run_summary_lists_changed_files_destinations_and_refusals() {
    if !can_run("review_real_run") {
        return;
    }
    let run = real_run();
    let l = run.log.to_str().unwrap();
    let out = log(&["summary", "--json", l]);
    let s = json_of(&out);
    assert_eq!(code(&out), 0, "{}", s["verify"]);
    assert_eq!(s["verify_code"], 0);
    let repo = run.work.join("repo");
    let file = |name: &str| -> Value {
        let path = repo.join(name).display().to_string();
        s["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == path.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("{path} not in {:#}", s["files"]))
    };
    for (name, changes) in [
        ("new.txt", &["written", "created"][..]),
        ("README", &["modified", "written", "created"]),
        ("hello", &["written", "created"]),
    ] {
        let f = file(name);
        assert!(
            changes.contains(&f["change"].as_str().unwrap()),
            "{name}: {f}"
        );
        // A root run with capture has kernel-sourced paths: the seal lists
        // every changed file with its hash and size.
        assert_eq!(s["seal_has_files"], true, "the seal has no files list");
        let path = repo.join(name);
        assert_eq!(f["sha256"], sha256_hex(&path), "{name}: {f}");
        assert_eq!(
            f["size"],
            std::fs::metadata(&path).unwrap().len(),
            "{name}: {f}"
        );
    }
    assert!(
        file("README")["actions"]
            .as_array()
            .unwrap()
            .contains(&json!("append"))
    );
    let dest = s["destinations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["dest"] == "192.0.2.7:80")
        .unwrap_or_else(|| panic!("no destination: {:#}", s["destinations"]));
    assert!(dest["refused"].as_u64().unwrap() >= 1, "{dest}");
    let refusals = s["refusals"].as_array().unwrap();
    let refusal = |needle: &str| {
        refusals
            .iter()
            .find(|r| r["target"].as_str().unwrap().contains(needle))
            .unwrap_or_else(|| panic!("no refusal of {needle}: {refusals:#?}"))
    };
    let read = refusal(&run.secret_file.display().to_string());
    assert_eq!(
        (&read["mechanism"], &read["errno"]),
        (&json!("filesystem"), &json!("EACCES"))
    );
    assert!(read["command"].as_str().unwrap().contains("cat"), "{read}");
    assert!(!read["ancestry"].as_array().unwrap().is_empty(), "{read}");
    // Told apart from a file-permission EACCES by the policy's rule.
    let rule = format!("read_denies {}", run._secret.path().display());
    assert_eq!(read["why"], rule.as_str(), "{read}");
    let write = refusal(&run.outside_file.display().to_string());
    assert_eq!(write["mechanism"], "filesystem");
    assert_eq!(write["why"], "outside the writable roots", "{write}");
    let connect = refusal("192.0.2.7");
    assert_eq!(
        (&connect["mechanism"], &connect["errno"]),
        (&json!("network"), &json!("EPERM"))
    );
    assert!(
        connect["command"].as_str().unwrap().contains("python3"),
        "{connect}"
    );

    let text = log(&["summary", l]);
    let t = stdout(&text);
    assert!(t.starts_with("log: ok: "), "{t}");
    assert!(
        t.lines().count() <= 60,
        "not one screen ({} lines):\n{t}",
        t.lines().count()
    );
    assert!(t.contains(&format!("{}/new.txt", repo.display())), "{t}");
    assert!(t.contains("files inside .git directories"), "{t}");
}

#[test]
fn a_real_run_show_tells_refusals_from_failures_and_the_report_has_them() {
    if !can_run("review_real_show") {
        return;
    }
    let run = real_run();
    let l = run.log.to_str().unwrap();
    let denied = log(&["show", "--denied", l]);
    let d = stdout(&denied);
    assert_eq!(code(&denied), 0, "{d}");
    assert!(
        d.lines()
            .all(|line| line.contains("REFUSED") || line.contains("LOST")),
        "{d}"
    );
    for needle in [run.secret_file.display().to_string(), "192.0.2.7".into()] {
        assert!(d.contains(&needle), "{needle} missing:\n{d}");
    }
    let failed = stdout(&log(&["show", "--failed", l]));
    assert!(
        !failed.is_empty() && failed.lines().all(|line| line.contains("failed (")),
        "{failed}"
    );
    assert!(!failed.contains("EACCES"), "{failed}");
    let tree = stdout(&log(&["show", "--tree", "--denied", "--kind", "net", l]));
    assert!(
        tree.contains("python3") && tree.contains("192.0.2.7"),
        "{tree}"
    );
    let secret = run.secret_file.display().to_string();
    assert!(
        !tree
            .lines()
            .any(|l| l.trim_start().starts_with("- ") && l.contains(&secret)),
        "a file refusal under --kind net: {tree}"
    );
    let jsonl = stdout(&log(&[
        "show",
        "--json",
        "--kind",
        "file",
        "--path",
        "**/repo/new.txt",
        l,
    ]));
    let records: Vec<Value> = jsonl
        .lines()
        .map(|x| serde_json::from_str(x).unwrap())
        .collect();
    assert!(!records.is_empty(), "{jsonl}");
    assert!(
        records
            .iter()
            .all(|r| r["target"].to_string().contains("new.txt"))
    );
    let html = run.work.join("report.html");
    let out = log(&["report", l, "-o", html.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains(&run.secret_file.display().to_string()));
    assert!(page.contains("class=\"verdict ok\""));
    if let Some(dom) = chromium_dom(&html, "outcome=refused") {
        let shown = shown_count(&dom);
        assert!(shown >= 3, "{shown} refusals shown");
    }
}

#[path = "review/hostile.rs"]
mod hostile;
#[path = "review/schema.rs"]
mod schema;

fn write_log(dir: &Path, name: &str, f: impl FnOnce(&mut LogWriter)) -> PathBuf {
    let path = dir.join(name);
    let mut w = LogWriter::create(&path).unwrap();
    w.genesis(genesis()).unwrap();
    f(&mut w);
    path
}

// ------------------------------------------------------------ the browser

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser"].into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The DOM of `page#fragment` after its scripts ran, or None (skipped)
/// when Chromium is not installed and this is not CI.
fn chromium_dom(page: &Path, fragment: &str) -> Option<String> {
    let Some(browser) = chromium() else {
        assert!(!ci(), "chromium is missing: cargo xtask deps installs it");
        eprintln!("skipping the browser check: chromium is not installed");
        return None;
    };
    let profile = tempfile::tempdir().unwrap();
    let url = format!("file://{}#{fragment}", page.display());
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(["--dump-dom", &url])
        .output()
        .expect("run chromium");
    assert!(out.status.success(), "chromium: {}", stderr(&out));
    Some(stdout(&out))
}

fn shown_count(dom: &str) -> u64 {
    let at = dom.find("data-shown=\"").expect("the script did not run") + 12;
    dom[at..].split('"').next().unwrap().parse().unwrap()
}

#[test]
fn the_report_filters_in_a_real_browser_and_runs_no_log_text() {
    let dir = tempfile::tempdir().unwrap();
    let evil = "/w/<img src=x onerror=alert(1)><script>document.title='pwned'</script>";
    let path = write_log(dir.path(), "l.jsonl", |w| {
        w.record(&mut effect(
            "exec",
            5,
            1,
            1,
            json!({"path": "/bin/sh", "argv": ["sh", "-c", evil]}),
            0,
        ))
        .unwrap();
        w.record(&mut effect("fork", 5, 1, 2, json!({"child": 6}), 0))
            .unwrap();
        w.record(&mut effect(
            "create",
            6,
            5,
            3,
            json!({"path": evil, "flags": 0o301}),
            0,
        ))
        .unwrap();
        w.record(&mut effect(
            "open",
            6,
            5,
            4,
            json!({"path": "/etc/shadow", "flags": 0}),
            13,
        ))
        .unwrap();
        w.record(&mut effect("mkdir", 6, 5, 5, json!({"path": "/w/d"}), 17))
            .unwrap();
        w.record(&mut effect(
            "connect",
            6,
            5,
            6,
            json!({"family": "inet", "addr": "192.0.2.1", "port": 80}),
            1,
        ))
        .unwrap();
        w.record(&mut effect("exit", 6, 5, 7, json!({"code": 0}), 0))
            .unwrap();
        w.record(&mut effect("exit", 5, 1, 8, json!({"code": 0}), 0))
            .unwrap();
        sealed(w);
    });
    let html = dir.path().join("report.html");
    let out = log(&[
        "report",
        path.to_str().unwrap(),
        "-o",
        html.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let Some(all) = chromium_dom(&html, "") else {
        return;
    };
    assert_eq!(shown_count(&all), 10, "every record");
    assert!(
        all.contains("<title>TartarOS effect log report</title>"),
        "the log's script ran"
    );
    assert!(
        !all.contains("<img src=\"x\""),
        "log text became an element"
    );
    assert!(all.contains("&lt;img src=x onerror=alert(1)&gt;"));
    assert!(all.contains("class=\"verdict ok\""));
    let refused = chromium_dom(&html, "outcome=refused").unwrap();
    assert_eq!(shown_count(&refused), 2);
    let visible: Vec<&str> = refused
        .lines()
        .filter(|l| l.contains("data-kind=") && !l.contains(" hidden"))
        .collect();
    assert!(
        visible.iter().any(|l| l.contains("/etc/shadow")),
        "{visible:?}"
    );
    assert!(
        visible.iter().any(|l| l.contains("192.0.2.1")),
        "{visible:?}"
    );
    assert!(
        !visible.iter().any(|l| l.contains("/w/d")),
        "a failure shown as a refusal"
    );
    assert_eq!(shown_count(&chromium_dom(&html, "group=net").unwrap()), 1);
    assert_eq!(
        shown_count(&chromium_dom(&html, "outcome=failed&q=/w/d").unwrap()),
        1
    );
    assert_eq!(
        shown_count(&chromium_dom(&html, "pid=6&group=proc").unwrap()),
        1
    );
    assert!(
        refused.contains("6: /bin/sh") || refused.contains("5 (parent 1): /bin/sh"),
        "tree"
    );
}
