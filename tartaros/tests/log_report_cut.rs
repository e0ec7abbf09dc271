//! `log report` keeps at most 20,000 timeline rows (a browser slows down
//! with more). It kept the first 20,000: an agent that made 20,000 files
//! first had every later refusal and gap out of the page's timeline, so a
//! reviewer's `report.html#outcome=refused` showed none of them. Refusals,
//! gaps and the seal past the cut are kept (up to a second bound).
//! Needs root and python3; skips with a reason otherwise (fails under
//! CI=true).

mod common;

use std::path::Path;

use common::logged::*;
use common::*;

#[test]
fn refusals_after_twenty_thousand_records_stay_on_the_report_timeline() {
    if !can_run("report_refusals_past_the_cut") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let secret = secret_dir();
    let log = logs.join("effects.jsonl");
    let r = root.path().to_str().unwrap();
    let key = secret.join("key");
    let code = format!(
        "import os\n\
         for i in range(20100):\n\
         \x20   os.close(os.open('{r}/f%05d' % i, os.O_CREAT | os.O_EXCL | os.O_WRONLY))\n\
         try:\n\
         \x20   open('{}')\n\
         except OSError as e:\n\
         \x20   print('refused', e.errno)\n",
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
            "python3",
            "-c",
            &code,
        ],
        Path::new("/"),
    );
    assert!(
        stdout(&out).contains("refused 13"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let html = logs.join("report.html");
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
    let refused_row = page
        .lines()
        .filter(|l| l.contains("data-outcome=\"refused\""))
        .any(|l| l.contains(&key.display().to_string()));
    assert!(refused_row, "the refused read is not on the timeline");
    assert!(
        page.lines().any(|l| l.contains("data-kind=\"seal\"")),
        "the seal is not on the timeline"
    );
}
