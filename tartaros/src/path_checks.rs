//! Checks on the paths a policy names, before anything is resolved: glob
//! metacharacters (not enforced yet, so refused rather than taken as a
//! literal name) and symlinks (a root or deny must keep meaning the name the
//! user gave, so a path that is or passes through a symlink is refused).
//!
//! Pure: the filesystem is asked through a closure, so every refusal is
//! unit-tested. The host's closure asks it with the service caller's file
//! access ([`host_read_link`]).

use std::path::{Component, Path, PathBuf};

/// Characters that make a path a glob pattern in shells and in other
/// sandboxes' policies.
const GLOB_METACHARACTERS: &[char] = &['*', '?', '['];

/// The glob metacharacter in `path`, if any.
pub fn glob_metacharacter(path: &Path) -> Option<char> {
    let text = path.to_string_lossy();
    GLOB_METACHARACTERS
        .iter()
        .copied()
        .find(|c| text.contains(*c))
}

/// Whether `path` is relative and starts with `~`: a tilde no shell
/// expanded (quoted, or an argument list a harness passed without a shell).
/// Taken as a name under the working directory it named nothing there, so
/// `--read-deny "~/.ssh"` guarded an absent `./~/.ssh` while the agent read
/// the key. A config file's `~` is expanded before this (config.rs).
pub fn unexpanded_tilde(path: &Path) -> bool {
    matches!(
        path.components().next(),
        Some(Component::Normal(first)) if first.as_encoded_bytes().starts_with(b"~")
    )
}

/// `path` made absolute against `cwd` with `.` and `..` folded lexically,
/// without following anything: the name the user gave.
pub fn lexical(path: &Path, cwd: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    };
    let mut out = PathBuf::from("/");
    for component in joined.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// A symlink met on the way to a path: where it is and where it points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymlinkOnPath {
    pub link: PathBuf,
    pub target: PathBuf,
}

/// The first component of the absolute, lexical `path` that is a symlink.
/// `read_link` answers `Some(target)` for a symlink and `None` for anything
/// else, including a name that does not exist (an absent deny has nothing
/// to follow).
pub fn first_symlink(
    path: &Path,
    read_link: &dyn Fn(&Path) -> Option<PathBuf>,
) -> Option<SymlinkOnPath> {
    let mut prefix = PathBuf::from("/");
    for component in path.components() {
        let Component::Normal(part) = component else {
            continue;
        };
        prefix.push(part);
        if let Some(target) = read_link(&prefix) {
            return Some(SymlinkOnPath {
                link: prefix,
                target,
            });
        }
    }
    None
}

/// The host's answer for [`first_symlink`]; run by the service, with the
/// caller's file access: a link the caller cannot reach (a directory on the
/// way it may not search) is not read, nor named in a refusal.
pub fn host_read_link(path: &Path) -> Option<PathBuf> {
    crate::caller::as_caller(|| {
        let meta = std::fs::symlink_metadata(path).ok()?;
        if !meta.file_type().is_symlink() {
            return None;
        }
        std::fs::read_link(path).ok()
    })
}

/// The one-line refusal for `flag path` passing through `found`, naming
/// the fully resolved path to pass instead.
pub fn symlink_refusal(flag: &str, given: &Path, found: &SymlinkOnPath, resolved: &Path) -> String {
    let through = if found.link == given {
        "is a symlink".to_string()
    } else {
        format!("passes through the symlink {}", found.link.display())
    };
    format!(
        "{flag} {} {through} (-> {}), which the agent or an earlier run may have planted; pass the resolved path {} instead, or remove the link",
        given.display(),
        found.target.display(),
        resolved.display()
    )
}

/// Refuses a path that the sandbox would enforce differently from what it
/// says: a glob (taken today as a literal name, so the deny would guard
/// nothing), and, for roots and denies, a symlink anywhere on the path (it
/// would be followed now, and an agent that can write where the link lives
/// could point it elsewhere for the next run). Read allows only grant, and
/// may pass through the host's own links (`/lib -> usr/lib`). `label` is
/// the flag or config field; `resolve` gives the fully resolved path to
/// suggest instead.
pub fn check_given(
    label: &str,
    given: &Path,
    cwd: &Path,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<(), String> {
    if unexpanded_tilde(given) {
        return Err(format!(
            "{label} {} starts with ~, which only a shell expands (unquoted); write the absolute path",
            given.display()
        ));
    }
    if let Some(c) = glob_metacharacter(given) {
        return Err(format!(
            "{label} {} contains the glob character {c:?}; globs are not enforced yet, so list each path literally",
            given.display()
        ));
    }
    if matches!(label, "--read-allow" | "read_allows") {
        return Ok(());
    }
    let named = lexical(given, cwd);
    if let Some(found) = first_symlink(&named, &host_read_link) {
        return Err(symlink_refusal(label, &named, &found, &resolve(&named)));
    }
    match host_lookup(&named) {
        Some(e) => Err(format!(
            "{label} {}: failed to look it up ({e}); name a path you can reach yourself",
            named.display()
        )),
        None => Ok(()),
    }
}

/// Run by the service: why its caller cannot look `path` up, if it cannot,
/// other than by its being absent. Behind a directory the caller may not
/// search, the walk for symlinks sees none, whatever is there, and what
/// the run did next would tell (a deny of a symlink fails at the mount):
/// such a root or deny is refused the same way whether or not it exists
/// (a deny there guards nothing the caller can reach today). A direct run
/// looks with its own access, and tells its user nothing new.
fn host_lookup(path: &Path) -> Option<std::io::Error> {
    crate::caller::caller()?;
    match crate::caller::as_caller(|| std::fs::symlink_metadata(path)) {
        Ok(_) => None,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => None,
        Err(e) => Some(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leading_tilde_no_shell_expanded_is_found() {
        for given in ["~", "~/.ssh", "~bob/.ssh", "~x"] {
            assert!(unexpanded_tilde(Path::new(given)), "{given}");
        }
        for given in ["/home/a/~/x", "a/~", "./~/.ssh", "/~", ".ssh"] {
            assert!(!unexpanded_tilde(Path::new(given)), "{given}");
        }
        let err = check_given("--read-deny", Path::new("~/.ssh"), Path::new("/w"), &|p| {
            p.to_path_buf()
        })
        .unwrap_err();
        assert!(err.contains("starts with ~"), "{err}");
    }

    #[test]
    fn globs_are_found_anywhere_in_the_path() {
        assert_eq!(glob_metacharacter(Path::new("/etc/*.conf")), Some('*'));
        assert_eq!(glob_metacharacter(Path::new("/w/file?.txt")), Some('?'));
        assert_eq!(glob_metacharacter(Path::new("/w/[ab]/x")), Some('['));
        assert_eq!(glob_metacharacter(Path::new("/w/plain-name.d")), None);
    }

    #[test]
    fn lexical_folds_dots_without_following() {
        assert_eq!(
            lexical(Path::new("cache/../x/./y"), Path::new("/w")),
            PathBuf::from("/w/x/y")
        );
        assert_eq!(
            lexical(Path::new("/../a"), Path::new("/w")),
            PathBuf::from("/a")
        );
    }

    #[test]
    fn the_first_symlink_on_the_path_is_reported() {
        let fake = |p: &Path| match p.to_str() {
            Some("/w/cache") => Some(PathBuf::from("/outside")),
            Some("/w/cache/inner") => Some(PathBuf::from("/elsewhere")),
            _ => None,
        };
        let found = first_symlink(Path::new("/w/cache/inner/x"), &fake).unwrap();
        assert_eq!(found.link, PathBuf::from("/w/cache"));
        assert_eq!(found.target, PathBuf::from("/outside"));
        assert_eq!(first_symlink(Path::new("/w/real/x"), &fake), None);
        let message = symlink_refusal(
            "--write",
            Path::new("/w/cache"),
            &first_symlink(Path::new("/w/cache"), &fake).unwrap(),
            Path::new("/outside"),
        );
        assert!(
            message.contains("--write /w/cache is a symlink"),
            "{message}"
        );
        assert!(message.contains("resolved path /outside"), "{message}");
    }
}
