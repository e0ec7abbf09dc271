//! A reviewer is handed `effects.jsonl` by someone who wants it to say
//! something it does not. Each test builds a genuine log with `LogWriter`
//! and a forged one, hands them to the real `tartaros log` commands, and
//! checks that no command vouches for bytes it did not verify and that no
//! two different files are shown alike.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tartaros::effectlog::{Decision, ExitStatus, Genesis, LogWriter, Record, Seal};

const TARTAROS: &str = env!("CARGO_BIN_EXE_tartaros");

fn effect(kind: &'static str, i: u64, target: Value) -> Record {
    let target: Map<String, Value> = target.as_object().cloned().unwrap_or_default();
    Record {
        kind,
        pid: 20,
        ppid: 10,
        uid: 1000,
        mono_ns: 5_000_000_000 + i * 1_000_000,
        wall_ns: 1_760_000_000_000_000_000 + i * 1_000_000,
        target: target.into(),
        decision: Decision::Allowed,
        errno: 0,
    }
}

/// A sealed log whose records create `paths`; returns its bytes and head.
fn sealed_log(path: &Path, paths: &[&str]) -> (Vec<u8>, String) {
    let mut w = LogWriter::create(path).expect("create");
    w.genesis(Genesis {
        version: "0.1.0".into(),
        kernel: "6.18.0".into(),
        policy: json!({"writable_roots": ["/w"]}),
        installed: vec!["landlock".into(), "ebpf-capture".into()],
        degraded: vec![],
        programs: vec!["a1b2c3d4e5f60718".into()],
        started_wall_ns: 1_760_000_000_000_000_000,
        started_mono_ns: 5_000_000_000,
    })
    .expect("genesis");
    for (i, p) in paths.iter().enumerate() {
        w.record(&mut effect(
            "create",
            i as u64 + 1,
            json!({"path": p, "flags": "O_WRONLY|O_CREAT|O_EXCL"}),
        ))
        .expect("record");
    }
    let head = w
        .seal(Seal {
            exit_status: ExitStatus::Code(0),
            cgroup_empty: true,
        })
        .expect("seal");
    (std::fs::read(path).expect("read log"), head)
}

fn tartaros(args: &[&str]) -> Output {
    Command::new(TARTAROS)
        .args(args)
        .output()
        .expect("run tartaros")
}

/// A named pipe that serves `first` to the first reader and `second` to
/// every later one: what a file on a hostile FUSE mount, a socket-backed
/// path or a rewritten file can do to a reader that opens its input more
/// than once. Serves until no reader comes for two seconds.
fn two_faced_fifo(dir: &Path, first: Vec<u8>, second: Vec<u8>) -> PathBuf {
    let fifo = dir.join("effects.jsonl");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let path = fifo.clone();
    std::thread::spawn(move || {
        for n in 0.. {
            if n > 0 {
                // Let the last reader see the end of the file and close.
                std::thread::sleep(Duration::from_millis(300));
            }
            let bytes = if n == 0 { &first } else { &second };
            let deadline = Instant::now() + Duration::from_secs(2);
            // A non-blocking open fails with ENXIO until a reader opens.
            let mut f = loop {
                match std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&path)
                {
                    Ok(f) => break f,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(_) => return,
                }
            };
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                match f.write(rest) {
                    Ok(k) => rest = &rest[k..],
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                    Err(_) => break,
                }
            }
        }
    });
    fifo
}

#[test]
fn verify_with_a_head_checks_the_seal_of_the_lines_it_verified() {
    let dir = tempfile::tempdir().unwrap();
    let (genuine, head) = sealed_log(&dir.path().join("genuine"), &["/w/exfil.sh"]);
    let (forged, forged_head) = sealed_log(&dir.path().join("forged"), &["/w/notes.txt"]);
    assert_ne!(head, forged_head);
    // verify reads the forged log (which is self-consistent), and the seal
    // it compares with the head must be that log's own.
    let fifo = two_faced_fifo(dir.path(), forged, genuine);
    let out = tartaros(&["log", "verify", "--head", &head, fifo.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a log whose seal is not the expected head verified: {stdout}"
    );
    assert!(stdout.starts_with("tampered"), "{stdout}");
}

#[test]
fn a_reader_never_vouches_for_lines_it_did_not_verify() {
    let dir = tempfile::tempdir().unwrap();
    let (genuine, _) = sealed_log(&dir.path().join("genuine"), &["/w/notes.txt"]);
    // The forged log does not verify (a record swapped in without
    // re-chaining); a reader that verifies one read and shows another
    // prints it under the genuine log's `ok`.
    let text = String::from_utf8(genuine.clone()).unwrap();
    let forged = text.replace("/w/notes.txt", "/w/rootkit.ko").into_bytes();
    for cmd in [&["summary"][..], &["show"][..], &["show", "--json"][..]] {
        let sub = dir.path().join(cmd.join("-"));
        std::fs::create_dir(&sub).unwrap();
        let fifo = two_faced_fifo(&sub, genuine.clone(), forged.clone());
        let mut args = vec!["log"];
        args.extend_from_slice(cmd);
        args.push(fifo.to_str().unwrap());
        let out = tartaros(&args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !(out.status.success() && stdout.contains("rootkit")),
            "{cmd:?} vouched (exit 0) for a record it never verified:\n{stdout}\n{stderr}"
        );
        assert_ne!(out.status.code(), Some(0), "{cmd:?}: {stdout}\n{stderr}");
    }
}

#[test]
fn a_report_shows_the_bytes_it_verified() {
    let dir = tempfile::tempdir().unwrap();
    let (genuine, _) = sealed_log(&dir.path().join("genuine"), &["/w/notes.txt"]);
    let text = String::from_utf8(genuine.clone()).unwrap();
    let forged = text.replace("/w/notes.txt", "/w/rootkit.ko").into_bytes();
    let fifo = two_faced_fifo(dir.path(), genuine, forged);
    let html = dir.path().join("run.html");
    let out = tartaros(&[
        "log",
        "report",
        fifo.to_str().unwrap(),
        "-o",
        html.to_str().unwrap(),
    ]);
    let page = std::fs::read_to_string(&html).unwrap_or_default();
    assert!(
        !(out.status.success() && page.contains("rootkit")),
        "the report said ok over a record it never verified"
    );
    assert_ne!(out.status.code(), Some(0));
}

/// Characters that show as nothing or as an ordinary space on a terminal:
/// a file named with one shows as another file's name.
const LOOKALIKES: [(&str, &str); 8] = [
    ("/w/notes.txt\u{3164}", "hangul filler"),
    ("/w/notes\u{115f}.txt", "hangul choseong filler"),
    ("/w/my\u{a0}notes.txt", "no-break space"),
    ("/w/my\u{2002}notes.txt", "en space"),
    ("/w/my\u{3000}notes.txt", "ideographic space"),
    ("/w/notes.txt\u{fe0f}", "variation selector"),
    ("/w/no\u{34f}tes.txt", "combining grapheme joiner"),
    ("/w/notes.txt\u{1d173}", "musical formatting"),
];

#[test]
fn files_with_invisible_or_space_like_characters_are_not_shown_as_others() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = vec!["/w/notes.txt", "/w/my notes.txt"];
    paths.extend(LOOKALIKES.iter().map(|(p, _)| *p));
    let log = dir.path().join("effects.jsonl");
    sealed_log(&log, &paths);
    let html = dir.path().join("run.html");
    for args in [
        vec!["log", "show", log.to_str().unwrap()],
        vec![
            "log",
            "show",
            "--tree",
            "--kind",
            "file",
            log.to_str().unwrap(),
        ],
        vec!["log", "summary", log.to_str().unwrap()],
        vec!["log", "summary", "--json", log.to_str().unwrap()],
        vec!["log", "show", "--json", log.to_str().unwrap()],
    ] {
        let out = tartaros(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let stdout = String::from_utf8(out.stdout).unwrap();
        for (path, what) in LOOKALIKES {
            let odd = path.chars().find(|c| !c.is_ascii()).unwrap();
            assert!(
                !stdout.contains(odd),
                "{args:?} printed a {what} (U+{:04X}) raw:\n{stdout}",
                odd as u32
            );
        }
    }
    let out = tartaros(&[
        "log",
        "report",
        log.to_str().unwrap(),
        "-o",
        html.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let page = std::fs::read_to_string(&html).unwrap();
    for (path, what) in LOOKALIKES {
        let odd = path.chars().find(|c| !c.is_ascii()).unwrap();
        assert!(!page.contains(odd), "the report holds a {what} raw");
    }
}

/// The reviewer writes the report next to the log it was handed; the
/// bundle can hold a link at that name to a file of the reviewer's.
#[test]
fn a_report_never_writes_through_a_planted_link() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("effects.jsonl");
    sealed_log(&log, &["/w/notes.txt"]);
    let victim = dir.path().join("bashrc");
    std::fs::write(&victim, "precious\n").unwrap();
    let html = dir.path().join("run.html");
    std::os::unix::fs::symlink(&victim, &html).unwrap();
    let out = tartaros(&[
        "log",
        "report",
        log.to_str().unwrap(),
        "-o",
        html.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "precious\n",
        "the report was written through the link"
    );
    // Refused (78), with one line; the link is left as it was.
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not a regular file"),
        "{out:?}"
    );
    assert!(
        std::fs::symlink_metadata(&html)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // A regular file there is replaced, and nothing is left beside it.
    std::fs::remove_file(&html).unwrap();
    std::fs::write(&html, "old").unwrap();
    let out = tartaros(&[
        "log",
        "report",
        log.to_str().unwrap(),
        "-o",
        html.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(std::fs::read_to_string(&html).unwrap().contains("<html"));
    let left = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(left, 3, "a temporary file was left beside the report");
}
