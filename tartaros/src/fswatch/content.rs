//! The seal's `files`: size and SHA-256 of every regular file the run
//! created or modified in the writable roots that still exists, so a
//! reviewer can check the tree against the log. Hashing is bounded.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::Read as _;
use std::os::fd::IntoRawFd as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::effectlog::runs_on_host;

/// Files larger than this are listed with their size but not hashed.
pub const MAX_FILE_BYTES: u64 = 64 << 20;
/// At most this many bytes are hashed per run (~1-2 s of SHA-256 on one
/// core); later files are listed with their size only.
pub const MAX_TOTAL_BYTES: u64 = 1 << 30;
/// At most this many files, and about this many bytes of them, are
/// listed; the rest are counted in `files_omitted` (the seal is one line,
/// and a line may not exceed 16 MiB).
pub const MAX_FILES: usize = 50_000;
pub const MAX_LIST_BYTES: usize = 8 << 20;
/// Files the reviewer's own `git` runs or obeys (hooks, a repository's
/// `config`) take the hash budget and the list's places first, up to this
/// many: in path order, an agent that made 50,000 files named to sort
/// before its repository had its hook listed with neither size nor hash.
const MAX_FIRST: usize = 10_000;

/// The `files` list (sorted by path as shown) and how many files were
/// left out.
pub fn seal_files<'a>(
    touched: impl Iterator<Item = &'a Path>,
    roots: &[PathBuf],
) -> (Vec<Value>, u64) {
    let touched: Vec<&Path> = touched
        .filter(|path| roots.iter().any(|root| is_under(path, root)))
        .collect();
    let listings = Listings::of(&touched);
    let mut first = 0usize;
    let (git_runs, rest): (Vec<&Path>, Vec<&Path>) = touched.into_iter().partition(|path| {
        let goes_first = first < MAX_FIRST && runs_on_host(&path.to_string_lossy());
        first += usize::from(goes_first);
        goes_first
    });
    let mut files = Vec::new();
    let mut omitted = 0u64;
    let mut budget = MAX_TOTAL_BYTES;
    let mut bytes = 0usize;
    for path in git_runs.into_iter().chain(rest) {
        if listings.absent(path) {
            continue;
        }
        let entry = match entry(path, &mut budget) {
            Ok(Some(entry)) => entry,
            Ok(None) => continue,
            // There, but not to be opened by its name (longer than
            // PATH_MAX, say): counted, not dropped.
            Err(Unopenable) => {
                omitted += 1;
                continue;
            }
        };
        // The JSON of an entry: the escaped path and at most ~120 bytes
        // of keys, size and hash.
        bytes += entry["path"].to_string().len() + 120;
        if files.len() >= MAX_FILES || bytes > MAX_LIST_BYTES {
            omitted += 1;
            continue;
        }
        files.push(entry);
    }
    files.sort_by(|a, b| a["path"].as_str().cmp(&b["path"].as_str()));
    (files, omitted)
}

/// At most this many directory entries are read looking for files known
/// only by inode ([`find_inodes`]), and as many in all for directories
/// moved in from where they could not be named ([`files_under`]); ~0.3 s
/// on ext4 here.
pub const MAX_INODE_SEARCH: usize = 1 << 20;

/// The regular files under `dir` (symlinks not followed), and whether
/// the walk saw all of it within `budget` entries (what it read is
/// taken from `budget`).
pub fn files_under(dir: &Path, budget: &mut usize) -> (Vec<PathBuf>, bool) {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if *budget == 0 {
                return (files, false);
            }
            *budget -= 1;
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => stack.push(entry.path()),
                Ok(kind) if kind.is_file() => files.push(entry.path()),
                _ => {}
            }
        }
    }
    (files, true)
}

/// The paths under `roots` of the files `(dev, ino)` in `wanted`, which
/// maps each to how many links it has: files changed through a name that
/// is gone or that the kernel walk could not give (a tree deeper than
/// it), and files with other links (a change through `.tmp` is a change
/// of `config` when both are one file). Symlinks are not followed; the
/// walk is bounded, and ends once every link is found.
pub fn find_inodes(
    roots: &[PathBuf],
    wanted: &HashMap<(u64, u64), u32>,
) -> Vec<((u64, u64), PathBuf)> {
    use std::os::unix::fs::{DirEntryExt as _, MetadataExt as _};
    let inos: HashSet<u64> = wanted.keys().map(|&(_, ino)| ino).collect();
    let mut left: u64 = wanted.values().map(|&n| u64::from(n.max(1))).sum();
    let mut found = Vec::new();
    let mut stack: Vec<PathBuf> = roots.to_vec();
    let mut budget = MAX_INODE_SEARCH;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if budget == 0 || left == 0 {
                return found;
            }
            budget -= 1;
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file()
                && inos.contains(&entry.ino())
                && let Ok(meta) = std::fs::symlink_metadata(entry.path())
                && wanted.contains_key(&(meta.dev(), meta.ino()))
            {
                left = left.saturating_sub(1);
                found.push(((meta.dev(), meta.ino()), entry.path()));
            }
        }
    }
    found
}

/// `path.starts_with(root)`, decided on the bytes when they already show
/// it (`root`, then a `/` or the end): `Path::starts_with` parses both
/// into components, for each of the (say) 20,000 files a run made and
/// deleted, while the run's end waits for the seal. A path that is not
/// under `root` by its bytes is still compared by components.
fn is_under(path: &Path, root: &Path) -> bool {
    let (p, r) = (path.as_os_str().as_bytes(), root.as_os_str().as_bytes());
    let bytes = p.starts_with(r) && (p.len() == r.len() || r.ends_with(b"/") || p[r.len()] == b'/');
    bytes || path.starts_with(root)
}

/// Touched directories with many touched entries, read once: most
/// files of a build or a test run are gone by the seal, and a failed open
/// per gone file (a path walk each) cost ~1.5 us apiece, 30 ms for 20,000.
/// Only a name missing from its directory's listing is skipped; the rest
/// are opened as before, without following symlinks.
/// Keyed by the directory's bytes: hashing a `Path` parses its
/// components, twice for each touched file.
struct Listings(HashMap<Vec<u8>, HashSet<OsString>>);

/// A directory is listed when at least this many touched files are in it
/// (a listing of a big directory costs more than a few opens).
const LIST_AT: usize = 32;

impl Listings {
    fn of(touched: &[&Path]) -> Self {
        let mut per_dir: HashMap<&[u8], usize> = HashMap::new();
        for path in touched {
            if let Some(parent) = path.parent() {
                *per_dir.entry(parent.as_os_str().as_bytes()).or_default() += 1;
            }
        }
        let listed = per_dir
            .into_iter()
            .filter(|(_, n)| *n >= LIST_AT)
            .filter_map(|(dir, _)| Some((dir.to_vec(), list(Path::new(OsStr::from_bytes(dir)))?)))
            .collect();
        Self(listed)
    }

    /// Whether `path` is known not to exist.
    fn absent(&self, path: &Path) -> bool {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return false;
        };
        self.0
            .get(dir.as_os_str().as_bytes())
            .is_some_and(|names| !names.contains(name))
    }
}

/// The names in `dir`, reached without a symlink; `None` when it cannot
/// be read or does not compare names byte for byte (then each file is
/// opened: on a case-insensitive directory a file the kernel named `FOO`
/// is listed as `Foo`).
fn list(dir: &Path) -> Option<HashSet<OsString>> {
    let fd = crate::mount_tree::open_dir_no_symlinks(dir).ok()?;
    if !crate::mount_tree::names_are_exact(&fd) {
        return None;
    }
    let mut listing = nix::dir::Dir::from_fd(fd.into_raw_fd()).ok()?;
    listing
        .iter()
        .map(|e| {
            e.ok()
                .map(|e| OsStr::from_bytes(e.file_name().to_bytes()).to_os_string())
        })
        .collect()
}

/// Cuts the seal's `files` (in `extra`) to about `max_bytes` of JSON,
/// adding what it cut to `files_omitted`: the seal must fit what is left
/// of a full filesystem (the log's reserve), or the log ends unsealed.
/// What git runs is kept first, wherever it sorts (a disk the agent
/// filled would otherwise cut its hook from a list kept in path order);
/// then a prefix of the rest. The list stays sorted.
pub fn trim(extra: &mut serde_json::Map<String, Value>, max_bytes: usize) {
    let Some(Value::Array(files)) = extra.get_mut("files") else {
        return;
    };
    let size = |f: &Value| f.to_string().len() + 1;
    let git_runs = |f: &Value| f["path"].as_str().is_some_and(runs_on_host);
    let mut bytes = 0usize;
    let first: Vec<bool> = files
        .iter()
        .map(|f| {
            let keep = git_runs(f) && bytes + size(f) <= max_bytes;
            bytes += if keep { size(f) } else { 0 };
            keep
        })
        .collect();
    let mut full = false;
    let keep: Vec<bool> = files
        .iter()
        .zip(&first)
        .map(|(f, &first)| {
            if first {
                return true;
            }
            full = full || bytes + size(f) > max_bytes;
            bytes += if full { 0 } else { size(f) };
            !full
        })
        .collect();
    let before = files.len();
    let mut kept = keep.iter();
    files.retain(|_| kept.next().copied().unwrap_or(false));
    let cut = (before - files.len()) as u64;
    if cut > 0 {
        let omitted = extra
            .get("files_omitted")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        extra.insert("files_omitted".into(), (omitted + cut).into());
    }
}

/// The size of the regular file at `raw`, reached without a symlink.
pub fn size_of(raw: &Path) -> Option<u64> {
    let meta = crate::mount_tree::open_file_no_symlinks(raw)
        .ok()?
        .metadata()
        .ok()?;
    meta.is_file().then_some(meta.len())
}

/// Whether nothing is at `raw` now (reached without a symlink).
pub fn absent(raw: &Path) -> bool {
    matches!(
        crate::mount_tree::open_file_no_symlinks(raw),
        Err(nix::errno::Errno::ENOENT)
    )
}

/// The entry of one path, `None` when it is not a regular file (any
/// more): no symlink is followed in any component (the agent may have put
/// one where a directory was), and nothing else is hashed.
/// A file that exists but cannot be opened by its name.
#[derive(Debug)]
struct Unopenable;

fn entry(raw: &Path, budget: &mut u64) -> Result<Option<Value>, Unopenable> {
    let path = crate::effectlog::names::display_path(raw);
    let path = path.as_str();
    let mut file = match crate::mount_tree::open_file_no_symlinks(raw) {
        Ok(file) => file,
        // Gone, a symlink or a file where the path had a directory, or a
        // socket or device: no regular file holds this name.
        Err(
            nix::Error::ENOENT
            | nix::Error::ENOTDIR
            | nix::Error::ELOOP
            | nix::Error::ENXIO
            | nix::Error::ENODEV
            | nix::Error::EISDIR,
        ) => return Ok(None),
        Err(_) => return Err(Unopenable),
    };
    let Ok(meta) = file.metadata() else {
        return Err(Unopenable);
    };
    if !meta.is_file() {
        return Ok(None);
    }
    let size = meta.len();
    let skipped = if size > MAX_FILE_BYTES {
        Some("too large")
    } else if size > *budget {
        Some("hash budget spent")
    } else {
        None
    };
    if let Some(why) = skipped {
        return Ok(Some(
            json!({"path": path, "size": size, "sha256": null, "skipped": why}),
        ));
    }
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut read = 0u64;
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buf[..n]);
                read += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => {
                return Ok(Some(
                    json!({"path": path, "size": size, "sha256": null, "skipped": "unreadable"}),
                ));
            }
        }
        if read > MAX_FILE_BYTES {
            // It grew while being read (a host process): hash no further.
            return Ok(Some(
                json!({"path": path, "size": read, "sha256": null, "skipped": "too large"}),
            ));
        }
    }
    *budget = budget.saturating_sub(read);
    let digest = hasher.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Ok(Some(json!({"path": path, "size": read, "sha256": hex})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_under_agrees_with_path_starts_with() {
        let roots = ["/r", "/r/", "/", "/r/./s", "/r//s", ""];
        let paths = [
            "/r", "/r/", "/r/x", "/rx", "/r/x/y", "/", "/s", "/r/s/x", "/r//s/x", "/r/./s", "r/x",
            "",
        ];
        for root in roots {
            for path in paths {
                let (p, r) = (Path::new(path), Path::new(root));
                assert_eq!(is_under(p, r), p.starts_with(r), "{path} under {root}");
            }
        }
    }

    #[test]
    fn a_directory_swapped_for_a_link_is_not_followed() {
        // The agent made d/secret, removed it and put a link to a host
        // directory where d was: the seal must not hash the host's file.
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let (root, host) = (base.join("root"), base.join("host"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&host).unwrap();
        std::fs::write(host.join("secret"), b"host only").unwrap();
        std::os::unix::fs::symlink(&host, root.join("d")).unwrap();
        let touched = [root.join("d/secret")];
        let (files, omitted) = seal_files(
            touched.iter().map(PathBuf::as_path),
            std::slice::from_ref(&root),
        );
        assert!(files.is_empty(), "{files:?}");
        assert_eq!(omitted, 0);
        assert_eq!(size_of(&root.join("d/secret")), None);
        assert_eq!(size_of(&host.join("secret")), Some(9));
    }

    #[test]
    fn files_in_the_roots_are_hashed_and_the_rest_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::write(root.join("a"), b"abc").unwrap();
        std::fs::create_dir(root.join("d")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("l")).unwrap();
        let p = |n: &str| root.join(n).to_string_lossy().into_owned();
        let touched: Vec<PathBuf> = ["a", "d", "l", "gone"]
            .into_iter()
            .map(|n| root.join(n))
            .chain([PathBuf::from("/etc/hostname")])
            .collect();
        let (files, omitted) = seal_files(
            touched.iter().map(PathBuf::as_path),
            std::slice::from_ref(&root),
        );
        assert_eq!(omitted, 0);
        assert_eq!(
            files,
            vec![json!({
                "path": p("a"),
                "size": 3,
                "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
            })]
        );
    }

    #[test]
    fn a_listed_directory_skips_the_gone_and_still_checks_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::write(root.join("f7"), b"x").unwrap();
        std::fs::write(root.join("f9"), b"y").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("f8")).unwrap();
        let touched: Vec<PathBuf> = (0..LIST_AT as u32 + 8)
            .map(|i| root.join(format!("f{i}")))
            .collect();
        let refs: Vec<&Path> = touched.iter().map(PathBuf::as_path).collect();
        let listings = Listings::of(&refs);
        assert!(listings.absent(&root.join("f0")));
        assert!(!listings.absent(&root.join("f8")), "listed, then opened");
        let (files, omitted) = seal_files(refs.into_iter(), std::slice::from_ref(&root));
        let paths: Vec<&str> = files.iter().filter_map(|f| f["path"].as_str()).collect();
        let p = |n: &str| root.join(n).to_string_lossy().into_owned();
        assert_eq!(paths, vec![p("f7"), p("f9")]);
        assert_eq!(omitted, 0);
    }

    #[test]
    fn only_directories_that_compare_names_as_bytes_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            list(dir.path()).is_some(),
            "{} is ext4 or tmpfs here",
            dir.path().display()
        );
        // procfs is none of the filesystems known to compare bytes.
        assert!(list(Path::new("/proc/1")).is_none());
    }

    #[test]
    fn trimming_keeps_a_prefix_and_counts_the_rest() {
        let files: Vec<Value> = (0..100)
            .map(|i| json!({"path": format!("/w/{i:03}"), "size": 0, "sha256": "ab".repeat(32)}))
            .collect();
        let one = files[0].to_string().len() + 1;
        let mut extra = serde_json::Map::new();
        extra.insert("files".into(), Value::Array(files));
        extra.insert("files_omitted".into(), 5.into());
        trim(&mut extra, one * 10);
        assert_eq!(extra["files"].as_array().unwrap().len(), 10);
        assert_eq!(extra["files_omitted"], 95);
        assert_eq!(extra["files"][9]["path"], "/w/009");
    }

    #[test]
    fn trimming_keeps_what_git_runs_wherever_it_sorts() {
        let mut files: Vec<Value> = (0..100)
            .map(|i| json!({"path": format!("/w/a{i:03}"), "size": 0, "sha256": "ab".repeat(32)}))
            .collect();
        files.push(
            json!({"path": "/w/r/.git/hooks/pre-commit", "size": 9, "sha256": "cd".repeat(32)}),
        );
        let one = files[0].to_string().len() + 1;
        let mut extra = serde_json::Map::new();
        extra.insert("files".into(), Value::Array(files));
        trim(&mut extra, one * 10);
        let kept = extra["files"].as_array().unwrap();
        assert_eq!(kept.last().unwrap()["path"], "/w/r/.git/hooks/pre-commit");
        assert_eq!(
            kept.len() as u64 + extra["files_omitted"].as_u64().unwrap(),
            101
        );
        assert!(kept.iter().map(|f| f.to_string().len() + 1).sum::<usize>() <= one * 10);
    }

    #[test]
    fn the_budget_bounds_what_is_hashed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![0u8; 10]).unwrap();
        let mut budget = 5;
        let e = entry(&path, &mut budget).unwrap().unwrap();
        assert_eq!(e["sha256"], Value::Null);
        assert_eq!(e["skipped"], "hash budget spent");
        assert_eq!(e["size"], 10);
    }
}
