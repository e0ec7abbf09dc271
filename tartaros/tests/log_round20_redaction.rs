//! Adversarial round 20: the agent is handed the broker token, names one
//! file with it and another `note-[REDACTED].txt`. The run said its log was
//! complete while `verify` said tampered (the seal was digested before its
//! redaction), and both files had one name in the log. Checked from the
//! host: the run's exit, `verify`, and the names in the log.

mod common;
use std::process::Command;

use common::*;

#[test]
fn a_file_named_with_the_broker_token_keeps_the_log_true() {
    if !can_run("log_round20_redaction") {
        return;
    }
    let work = Dir::open_to_all();
    let root = work.join("root");
    std::fs::create_dir(&root).unwrap();
    chown(&root, 65534);
    let config = work.join("broker.toml");
    std::fs::write(
        &config,
        "[broker]\nport = 9921\ntoken_env = \"TT_R20_TOKEN\"\nallowed_hosts = [\"api.example.invalid\"]\n\
         [[broker.capability]]\nname = \"api\"\nupstream = \"api.example.invalid\"\nheader = \"Authorization\"\nvalue_env = \"TT_R20_SECRET\"\n",
    )
    .unwrap();
    let token = "tok20r20xyz";
    let log = work.join("effects.jsonl");
    let script = "echo benign > 'note-[REDACTED].txt'; echo payload > \"note-$T.txt\"; echo gone > \"tmp-$T\"; rm \"tmp-$T\"";
    let out = Command::new(bin())
        .args(["run", "--config"])
        .arg(&config)
        .args(["--setenv", &format!("T={token}"), "--write"])
        .arg(&root)
        .arg("--log")
        .arg(&log)
        .args(["--", "sh", "-c", script])
        .current_dir(&root)
        .env("TT_R20_TOKEN", token)
        .env("TT_R20_SECRET", "sec-r20-1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let verify = Command::new(bin())
        .args(["log", "verify"])
        .arg(&log)
        .output()
        .unwrap();
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains(token), "the token reached the log");
    let benign = root.join("note-[REDACTED].txt");
    let benign = benign.to_str().unwrap();
    // Every record or seal entry that names the literal file is about it:
    // the token's file and the removed one have other names.
    let mut literal = 0;
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line).unwrap();
        if value["kind"] == "seal" {
            let named = value["files"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| f["path"] == benign)
                .count();
            assert_eq!(named, 1, "{value}");
            continue;
        }
        if value["target"]["path"] == benign {
            literal += 1;
            assert_ne!(value["kind"], "unlink", "{value}");
        }
    }
    assert!(literal >= 1, "no record names {benign}");
    assert!(
        text.contains("note-[REDACTED ") && text.contains("tmp-[REDACTED "),
        "the token's files are not named by the run's marker"
    );
}
