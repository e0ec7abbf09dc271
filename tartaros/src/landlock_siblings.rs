//! The Landlock layer of a read deny (adversarial round 13).
//!
//! A read deny is first a mount over the denied name (`mounts.rs`), and the
//! kernel detaches that mount when the host removes or renames over the
//! name (`mv creds.tmp creds`, as aws, gh and editors save), in every mount
//! namespace: the agent then read the new file through the read grant of a
//! tree above it. Landlock rules attach to inodes, but a file's rights are
//! those of the rules on the directories along its path at access time. So
//! a grant that holds a deny is not given whole: the directories on the way
//! from the grant down to the deny may only be listed, and every other
//! entry of those directories is granted whole. Whatever inode later takes
//! the denied name lies under no rule granting more than listing.
//!
//! [`sibling_grants`] decides the rules from the host's listings, which it
//! is given (pure, unit-tested in `landlock_siblings_tests.rs`);
//! `landlock::prepare` lists and opens, in the sandbox's own view.

use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

/// What a directory entry is, as its listing says (symlinks not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    Symlink,
    Other,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: OsString,
    pub kind: Kind,
}

impl Entry {
    pub fn new(name: impl Into<OsString>, kind: Kind) -> Self {
        Self {
            name: name.into(),
            kind,
        }
    }
}

/// How far a rule reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// A grant no deny lies under: the grant's rights on its hierarchy, as
    /// before this layer.
    Grant,
    /// A directory on the way from a grant to a deny: listing only, so
    /// that a name filled later below it reads nothing.
    ListOnly,
    /// Another entry of such a directory: the grant's rights on it whole
    /// (the file subset on a non-directory).
    Sibling,
}

/// One Landlock rule to add, with the grant's rights cut to its reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub path: PathBuf,
    pub reach: Reach,
}

impl Rule {
    /// A grant as given.
    pub fn whole(path: PathBuf) -> Self {
        Self {
            path,
            reach: Reach::Grant,
        }
    }
}

/// Lists a directory: the host fact the expansion needs.
pub type Lister<'a> = &'a dyn Fn(&Path) -> io::Result<Vec<Entry>>;

/// The rules that give each of `grants` (absolute, resolved paths) its
/// rights everywhere except at and under each of `denies`.
///
/// A grant equal to a deny gives nothing. A directory whose listing fails
/// keeps only its listing right: failing closed loses the agent some reads
/// but never grants a denied name, so it is not an error, strict or not.
/// Symlinks get no rule: Landlock checks the path a link resolves to, and a
/// rule opened through one could land on the denied file itself.
pub fn sibling_grants(grants: &[PathBuf], denies: &[PathBuf], list: Lister) -> Vec<Rule> {
    let mut rules = Vec::new();
    for grant in grants {
        expand(grant, Reach::Grant, denies, list, &mut rules);
    }
    rules
}

fn expand(path: &Path, whole: Reach, denies: &[PathBuf], list: Lister, rules: &mut Vec<Rule>) {
    if denies.iter().any(|d| d == path) {
        return;
    }
    if !denies.iter().any(|d| d.starts_with(path)) {
        rules.push(Rule {
            path: path.to_path_buf(),
            reach: whole,
        });
        return;
    }
    rules.push(Rule {
        path: path.to_path_buf(),
        reach: Reach::ListOnly,
    });
    let Ok(entries) = list(path) else {
        return;
    };
    for entry in entries {
        if entry.kind == Kind::Symlink || !is_one_name(&entry.name) {
            continue;
        }
        let child = path.join(&entry.name);
        // Only a directory can be on the way to a deny; anything else there
        // (a file the host swapped in) is left without a rule.
        let on_the_way = denies.iter().any(|d| d != &child && d.starts_with(&child));
        if on_the_way && entry.kind != Kind::Dir {
            continue;
        }
        expand(&child, Reach::Sibling, denies, list, rules);
    }
}

/// Whether `name` is a single ordinary component: a listing never holds
/// `.`, `..` or a slash, and a join must not climb out of the directory.
fn is_one_name(name: &std::ffi::OsStr) -> bool {
    let mut components = Path::new(name).components();
    matches!(
        (components.next(), components.next()),
        (Some(Component::Normal(_)), None)
    )
}

#[cfg(test)]
#[path = "landlock_siblings_tests.rs"]
mod tests;
