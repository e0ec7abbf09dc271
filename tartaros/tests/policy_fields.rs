//! The lab's neutral policy (`runner/policy.py`) and the Rust `[policy]`
//! table must name the same fields: a field added on one side only would be
//! silently dropped by the lab's TartarOS adapter, or rejected as unknown by
//! `tartaros run --config` (issue 11).
//!
//! The Rust side is read from serde itself: the config parser denies unknown
//! fields, and its error lists every field it expects. That way the test
//! follows the struct, whatever it is called or however it is split.

use std::collections::BTreeSet;
use std::path::Path;

use tartaros::policy::ConfigFile;

/// The names serde lists after "expected one of" for an unknown key.
fn expected_fields(toml: &str) -> BTreeSet<String> {
    let error = match ConfigFile::parse(Path::new("probe.toml"), toml) {
        Ok(_) => panic!("the config parser accepted an unknown field: {toml:?}"),
        Err(e) => e.to_string(),
    };
    let (_, list) = error
        .split_once("expected one of")
        .or_else(|| error.split_once("expected"))
        .unwrap_or_else(|| panic!("no field list in the parser's error: {error}"));
    let names: BTreeSet<String> = list
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert!(!names.is_empty(), "no field names in: {error}");
    names
}

/// The field names of the `Policy` dataclass in runner/policy.py.
fn python_policy_fields() -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runner/policy.py");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let body = text
        .split_once("class Policy:")
        .unwrap_or_else(|| panic!("no `class Policy:` in {}", path.display()))
        .1;
    let mut fields = BTreeSet::new();
    for line in body.lines().skip(1) {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        // The dataclass body ends at its first method (or decorator).
        if !line.starts_with("    ") || line.trim_start().starts_with('@') || line.contains("def ")
        {
            break;
        }
        let Some((name, _)) = line.trim().split_once(':') else {
            continue;
        };
        if name.chars().all(|c| c.is_ascii_lowercase() || c == '_') && !name.is_empty() {
            fields.insert(name.to_owned());
        }
    }
    // Bookkeeping of the runner, not a policy field.
    fields.remove("explicit");
    fields
}

#[test]
fn runner_policy_and_rust_policy_name_the_same_fields() {
    let rust = expected_fields("[policy]\nlab_probe_unknown_field = 1\n");
    let mut python = python_policy_fields();
    // The lab writes its [policy.broker] to the config file's own [broker]
    // table: a top-level table in Rust, not a [policy] field.
    assert!(
        python.remove("broker"),
        "runner/policy.py lost its broker field"
    );
    let top = expected_fields("lab_probe_unknown_table = 1\n");
    assert!(
        top.contains("broker") && top.contains("policy"),
        "the config file has no [broker] or [policy] table: {top:?}"
    );

    let only_rust: Vec<_> = rust.difference(&python).collect();
    let only_python: Vec<_> = python.difference(&rust).collect();
    assert!(
        only_rust.is_empty() && only_python.is_empty(),
        "the policy field lists disagree:\n  only in tartaros' [policy]: {only_rust:?}\n  only in runner/policy.py: {only_python:?}\nadd each field to both (and map it in runner/adapters/tartaros.py)"
    );
}

#[test]
fn the_python_parser_finds_the_known_fields() {
    // Guards the parser above: a broken parse would make the comparison vacuous.
    let python = python_policy_fields();
    for name in [
        "writable_roots",
        "read_denies",
        "max_processes",
        "deny_unix",
    ] {
        assert!(python.contains(name), "{name} not found in {python:?}");
    }
}
