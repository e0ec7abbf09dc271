use std::collections::HashMap;

use super::*;

/// A host of directories, each with its entries; any other path fails to
/// list as a permission error would.
fn host(dirs: &[(&str, &[(&str, Kind)])]) -> HashMap<PathBuf, Vec<Entry>> {
    dirs.iter()
        .map(|(dir, entries)| {
            (
                PathBuf::from(dir),
                entries.iter().map(|(n, k)| Entry::new(*n, *k)).collect(),
            )
        })
        .collect()
}

fn rules_on(
    host: &HashMap<PathBuf, Vec<Entry>>,
    grants: &[&str],
    denies: &[&str],
) -> Vec<(String, Reach)> {
    let list = |path: &Path| {
        host.get(path)
            .cloned()
            .ok_or_else(|| io::Error::from(io::ErrorKind::PermissionDenied))
    };
    let grants: Vec<PathBuf> = grants.iter().map(PathBuf::from).collect();
    let denies: Vec<PathBuf> = denies.iter().map(PathBuf::from).collect();
    let mut rules: Vec<(String, Reach)> = sibling_grants(&grants, &denies, &list)
        .into_iter()
        .map(|r| (r.path.display().to_string(), r.reach))
        .collect();
    rules.sort_by(|a, b| a.0.cmp(&b.0));
    rules
}

fn rule(path: &str, reach: Reach) -> (String, Reach) {
    (path.to_string(), reach)
}

use Kind::{Dir, Other, Symlink};
use Reach::{Grant, ListOnly, Sibling};

fn home() -> HashMap<PathBuf, Vec<Entry>> {
    host(&[
        ("/", &[("home", Dir), ("usr", Dir), ("lib", Symlink)]),
        ("/home", &[("u", Dir), ("v", Dir)]),
        (
            "/home/u",
            &[(".aws", Dir), (".bashrc", Other), ("proj", Dir)],
        ),
        (
            "/home/u/.aws",
            &[("credentials", Other), ("config", Other), ("cli", Dir)],
        ),
    ])
}

#[test]
fn siblings_are_granted_and_ancestors_only_listed() {
    let rules = rules_on(&home(), &["/"], &["/home/u/.aws/credentials"]);
    assert_eq!(
        rules,
        vec![
            rule("/", ListOnly),
            rule("/home", ListOnly),
            rule("/home/u", ListOnly),
            rule("/home/u/.aws", ListOnly),
            rule("/home/u/.aws/cli", Sibling),
            rule("/home/u/.aws/config", Sibling),
            rule("/home/u/.bashrc", Sibling),
            rule("/home/u/proj", Sibling),
            rule("/home/v", Sibling),
            rule("/usr", Sibling),
        ]
    );
}

#[test]
fn symlinks_get_no_rule() {
    // `/lib -> usr/lib` is reached through /usr's rule; a rule opened
    // through a link could land on the denied file itself.
    let mut host = home();
    host.get_mut(Path::new("/home/u/.aws"))
        .unwrap()
        .push(Entry::new("alias", Symlink));
    let rules = rules_on(&host, &["/"], &["/home/u/.aws/credentials"]);
    assert!(
        !rules
            .iter()
            .any(|(p, _)| p == "/lib" || p.ends_with("alias"))
    );
}

#[test]
fn several_denies_in_one_directory_are_all_left_out() {
    let rules = rules_on(
        &home(),
        &["/home/u"],
        &["/home/u/.aws/credentials", "/home/u/.aws/config"],
    );
    assert_eq!(
        rules,
        vec![
            rule("/home/u", ListOnly),
            rule("/home/u/.aws", ListOnly),
            rule("/home/u/.aws/cli", Sibling),
            rule("/home/u/.bashrc", Sibling),
            rule("/home/u/proj", Sibling),
        ]
    );
}

#[test]
fn nested_denies_leave_out_the_outer_one_whole() {
    // The inner deny lies inside the outer: nothing under the outer is
    // granted, and the inner needs nothing more.
    let rules = rules_on(
        &home(),
        &["/home"],
        &["/home/u/.aws", "/home/u/.aws/credentials"],
    );
    assert_eq!(
        rules,
        vec![
            rule("/home", ListOnly),
            rule("/home/u", ListOnly),
            rule("/home/u/.bashrc", Sibling),
            rule("/home/u/proj", Sibling),
            rule("/home/v", Sibling),
        ]
    );
}

#[test]
fn denies_in_two_branches_are_both_expanded() {
    let mut host = home();
    host.insert(
        PathBuf::from("/home/v"),
        vec![Entry::new("key", Other), Entry::new("notes", Other)],
    );
    let rules = rules_on(&host, &["/home"], &["/home/u/.aws", "/home/v/key"]);
    assert_eq!(
        rules,
        vec![
            rule("/home", ListOnly),
            rule("/home/u", ListOnly),
            rule("/home/u/.bashrc", Sibling),
            rule("/home/u/proj", Sibling),
            rule("/home/v", ListOnly),
            rule("/home/v/notes", Sibling),
        ]
    );
}

#[test]
fn a_deny_equal_to_a_grant_root_grants_nothing() {
    let rules = rules_on(&home(), &["/home/u/.aws"], &["/home/u/.aws"]);
    assert!(rules.is_empty(), "{rules:?}");
}

#[test]
fn grants_that_hold_no_deny_are_untouched() {
    // Beside the deny, and inside it (the cover mount hides the latter).
    let rules = rules_on(
        &home(),
        &["/usr", "/home/u/proj", "/home/u/.aws/cli"],
        &["/home/u/.aws"],
    );
    assert_eq!(
        rules,
        vec![
            rule("/home/u/.aws/cli", Grant),
            rule("/home/u/proj", Grant),
            rule("/usr", Grant),
        ]
    );
}

#[test]
fn a_directory_that_cannot_be_listed_keeps_only_its_listing_right() {
    // Failing closed: /home/u's entries are not known, so none is granted.
    let mut host = home();
    host.remove(Path::new("/home/u"));
    let rules = rules_on(&host, &["/home"], &["/home/u/.aws/credentials"]);
    assert_eq!(
        rules,
        vec![
            rule("/home", ListOnly),
            rule("/home/u", ListOnly),
            rule("/home/v", Sibling),
        ]
    );
}

#[test]
fn an_absent_deny_is_held_by_its_nearest_existing_ancestor() {
    // `--read-deny ~/.config/gh` before the first `gh auth login`: the
    // name the host creates later is under listing rights only.
    let rules = rules_on(&home(), &["/home/u"], &["/home/u/.config/gh"]);
    assert_eq!(
        rules,
        vec![
            rule("/home/u", ListOnly),
            rule("/home/u/.aws", Sibling),
            rule("/home/u/.bashrc", Sibling),
            rule("/home/u/proj", Sibling),
        ]
    );
}

#[test]
fn a_non_directory_on_the_way_to_a_deny_gets_no_rule() {
    // The host swapped a file in where the deny's parent was.
    let mut host = home();
    host.insert(
        PathBuf::from("/home/u"),
        vec![Entry::new(".aws", Other), Entry::new("proj", Dir)],
    );
    let rules = rules_on(&host, &["/home/u"], &["/home/u/.aws/credentials"]);
    assert_eq!(
        rules,
        vec![rule("/home/u", ListOnly), rule("/home/u/proj", Sibling)]
    );
}

#[test]
fn names_that_would_climb_out_are_skipped() {
    let host = host(&[("/d", &[("..", Dir), (".", Dir), ("ok", Other)])]);
    let rules = rules_on(&host, &["/d"], &["/d/secret"]);
    assert_eq!(rules, vec![rule("/d", ListOnly), rule("/d/ok", Sibling)]);
}
