//! Adversarial round 24b: a rename moves exactly the entries below the
//! renamed directory, found as one range of the sorted table (a scan of
//! every key per rename made the summary quadratic).

use serde_json::{Value, json};

use super::*;
use crate::effectlog::summary::table::Table;

fn t(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

fn create(files: &mut Files, path: &str) {
    files.effect("create", &t(json!({"path": path, "flags": 0o301})));
}

fn mkdir(files: &mut Files, path: &str) {
    files.effect("mkdir", &t(json!({"path": path})));
}

fn rename(files: &mut Files, from: &str, to: &str) {
    files.effect("rename", &t(json!({"from": from, "to": to})));
}

/// Path, change and `renamed_from` of every entry, in path order.
fn table(files: Files) -> Vec<(String, &'static str, Option<String>)> {
    let (mut out, _) = files.finish(Vec::new());
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out.into_iter()
        .map(|f| (f.path, f.change, f.renamed_from))
        .collect()
}

fn row(
    path: &str,
    change: &'static str,
    from: Option<&str>,
) -> (String, &'static str, Option<String>) {
    (path.to_string(), change, from.map(str::to_string))
}

/// `d`, `d2`, `d.x` and `d/` share the prefix `d`; only `d/...` moves.
#[test]
fn a_directory_rename_moves_its_entries_not_a_prefix_sibling_s() {
    let mut files = Files::default();
    for d in ["/w/d", "/w/d2", "/w/d.x"] {
        mkdir(&mut files, d);
    }
    for f in ["/w/d/a", "/w/d2/a", "/w/d.x/a", "/w/da", "/w/d/"] {
        create(&mut files, f);
    }
    // A file of the tree below `d`: it gets where it came from.
    files.effect("write", &t(json!({"path": "/w/d/old"})));
    rename(&mut files, "/w/d", "/w/e");
    assert_eq!(
        table(files),
        vec![
            row("/w/d.x", "created", None),
            row("/w/d.x/a", "created", None),
            row("/w/d2", "created", None),
            row("/w/d2/a", "created", None),
            row("/w/da", "created", None),
            row("/w/e", "created", None),
            row("/w/e/", "created", None),
            row("/w/e/a", "created", None),
            row("/w/e/old", "renamed", Some("/w/d/old")),
        ]
    );
}

/// A directory renamed back and forth (a loop) ends where it started,
/// its files with it, and a file keeps the first name it had.
#[test]
fn rename_loops_and_nested_directories_keep_every_entry_once() {
    let mut files = Files::default();
    mkdir(&mut files, "/w/d");
    mkdir(&mut files, "/w/d/s");
    create(&mut files, "/w/d/s/c");
    files.effect("write", &t(json!({"path": "/w/d/s/t/old"})));
    for _ in 0..3 {
        rename(&mut files, "/w/d", "/w/e");
        rename(&mut files, "/w/e/s", "/w/e/u");
        rename(&mut files, "/w/e", "/w/d");
        rename(&mut files, "/w/d/u", "/w/d/s");
    }
    // The nested directory out and into a sibling.
    rename(&mut files, "/w/d/s", "/w/x");
    rename(&mut files, "/w/x", "/w/d/s");
    assert_eq!(
        table(files),
        vec![
            row("/w/d", "created", None),
            row("/w/d/s", "created", None),
            row("/w/d/s/c", "created", None),
            row("/w/d/s/t/old", "renamed", Some("/w/d/s/t/old")),
        ]
    );
}

/// A directory renamed over an empty one whose entries were deleted: those
/// stay deleted; one at a place a moved file now has keeps its history.
#[test]
fn entries_below_a_replaced_directory_stay_deleted() {
    let mut files = Files::default();
    mkdir(&mut files, "/w/a");
    create(&mut files, "/w/a/f");
    mkdir(&mut files, "/w/b");
    create(&mut files, "/w/b/f");
    create(&mut files, "/w/b/g");
    files.effect("unlink", &t(json!({"path": "/w/b/f"})));
    files.effect("unlink", &t(json!({"path": "/w/b/g"})));
    rename(&mut files, "/w/a", "/w/b");
    let out = table(files);
    assert_eq!(out.len(), 3);
    assert_eq!(out[1], row("/w/b/f", "created", None));
    assert_eq!(out[2], row("/w/b/g", "deleted", None));
}

/// 20,000 files in a directory renamed 2,000 times, 20,000 files of the
/// tree in another renamed 2,000 times, and 1,000 write-then-rename files
/// (git's pattern): each entry is looked at once at most (a file of the
/// tree, to take its first name), not once per rename (80 million moves
/// here before). Timings are in docs/effect-log.md.
#[test]
fn a_renamed_directory_s_entries_move_at_once() {
    let mut files = Files::default();
    for i in 0..20_000 {
        create(&mut files, &format!("/w/d/f{i}"));
        files.effect("write", &t(json!({"path": format!("/w/t/f{i}")})));
    }
    for i in 0..1_000 {
        rename(&mut files, "/w/d", "/w/e");
        rename(&mut files, "/w/e", "/w/d");
        rename(&mut files, "/w/t", "/w/u");
        rename(&mut files, "/w/u", "/w/t");
        create(&mut files, &format!("/w/obj/tmp{i}"));
        rename(
            &mut files,
            &format!("/w/obj/tmp{i}"),
            &format!("/w/obj/o{i}"),
        );
    }
    // Each of the 40,000 entries once (taken off the list of those that
    // may need a first name), and a few per rename.
    assert!(files.files.work <= 40_000 + 10_000, "{}", files.files.work);
    let out = table(files);
    assert_eq!(out.len(), 40_000 + 1_000 + 2);
    assert!(out.contains(&row("/w/d/f7", "created", None)));
    assert!(out.contains(&row("/w/t/f7", "renamed", Some("/w/t/f7"))));
    assert!(out.contains(&row("/w/obj/o7", "created", None)));
}

/// The table of full paths the tree replaced (a rename scanned it): the
/// reference the tree must agree with, entry for entry.
#[derive(Default)]
struct Flat(BTreeMap<String, FileState>);

impl Flat {
    fn take_under(&mut self, dir: &str) -> Vec<(String, FileState)> {
        let prefix = format!("{}/", dir.trim_end_matches('/'));
        let keys: Vec<String> = self
            .0
            .keys()
            .filter(|k| k.starts_with(&prefix))
            .cloned()
            .collect();
        keys.into_iter()
            .filter_map(|k| self.0.remove(&k).map(|f| (k, f)))
            .collect()
    }

    fn put_under(&mut self, from: &str, to: &str, entries: Vec<(String, FileState)>) {
        let (from, to) = (from.trim_end_matches('/'), to.trim_end_matches('/'));
        for (old, mut f) in entries {
            let new = format!("{to}{}", &old[from.len()..]);
            if !f.created && f.renamed_from.is_none() {
                f.renamed_from = Some(old);
            }
            self.0.insert(new, f);
        }
    }

    fn gone_below(&mut self, entries: Vec<(String, FileState)>) {
        for (path, mut f) in entries {
            match self.0.get_mut(&path) {
                Some(new) => push(
                    &mut new.actions,
                    if f.deleted { "delete" } else { "replaced" },
                ),
                None => {
                    f.deleted = true;
                    self.0.insert(path, f);
                }
            }
        }
    }
}

type Seen = (String, bool, bool, Option<String>, Vec<String>);

fn seen(entries: impl IntoIterator<Item = (String, FileState)>) -> Vec<Seen> {
    entries
        .into_iter()
        .map(|(p, f)| (p, f.deleted, f.created, f.renamed_from, f.actions))
        .collect()
}

/// Random inserts, changes, removals and renames (plain and exchanges) of
/// paths sharing prefixes (`a`, `ab`, `a.b`, empty components, trailing
/// slashes): the tree holds what the flat table holds, after each step.
#[test]
fn the_tree_agrees_with_the_flat_table() {
    let names = ["a", "b", "ab", "a.b", ""];
    for seed in 1..400u64 {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (mut tree, mut flat) = (Table::default(), Flat::default());
        for step in 0..120 {
            let depth = 1 + next(3);
            let mut path: String = (0..depth)
                .map(|_| format!("/{}", names[next(5) as usize]))
                .collect();
            if next(8) == 0 {
                path.push('/');
            }
            let other: String = (0..1 + next(3))
                .map(|_| format!("/{}", names[next(5) as usize]))
                .collect();
            match next(6) {
                0 | 1 => {
                    let (created, deleted) = (next(2) == 0, next(3) == 0);
                    let f = || FileState {
                        created,
                        deleted,
                        actions: vec![format!("s{step}")],
                        ..FileState::default()
                    };
                    tree.insert(&path, f());
                    flat.0.insert(path.clone(), f());
                }
                2 => {
                    let (a, b) = (tree.get_mut(&path), flat.0.get_mut(&path));
                    assert_eq!(a.is_some(), b.is_some(), "seed {seed} step {step}");
                    let live = next(2) == 0;
                    for f in a.into_iter().chain(b) {
                        f.deleted = !live;
                        push(&mut f.actions, &format!("w{step}"));
                    }
                }
                3 => {
                    let (a, b) = (tree.remove(&path), flat.0.remove(&path));
                    assert_eq!(
                        seen(a.map(|f| (path.clone(), f))),
                        seen(b.map(|f| (path.clone(), f)))
                    );
                }
                _ => {
                    let (from, to) = (path.as_str(), other.as_str());
                    let (a, b) = (tree.take_under(from), tree.take_under(to));
                    tree.put_under(from, to, a);
                    let (fa, fb) = (flat.take_under(from), flat.take_under(to));
                    flat.put_under(from, to, fa);
                    if next(4) == 0 {
                        tree.put_under(to, from, b);
                        flat.put_under(to, from, fb);
                    } else {
                        tree.gone_below(to, b);
                        flat.gone_below(fb);
                    }
                }
            }
            assert_eq!(tree.len(), flat.0.len(), "seed {seed} step {step}");
        }
        assert_eq!(seen(tree.into_sorted()), seen(flat.0), "seed {seed}");
    }
}
