//! `--materialize`: an absent denied path inside a writable root is created
//! as an empty directory (one placeholder kind serves files like `.env` and
//! directories like `.git/hooks`: nothing can be created at or under it), so
//! the deny has something to hold on to; placeholders still empty at the
//! end are removed, so the tree is handed back as it was.
//!
//! Runs can share a tree. Removing a directory that another mount namespace
//! has a mount on detaches that mount, so the first run to finish would
//! lift a later run's deny. Every placeholder therefore has a marker file in
//! a registry outside the tree (`/run/tartaros/placeholders` for root, the
//! user's runtime directory otherwise) that each run using it holds a
//! shared `flock` on for its whole life, materialized by it or not; only a
//! run (or janitor) that can take the exclusive lock removes it. A global
//! registry lock orders creation against removal. Locks die with their
//! process, so a crashed run never blocks removal for good: the next run
//! that uses the path adopts the marker and removes it at its end.
//!
//! Placeholders are owned by the agent's user, so its ordinary tools can
//! create what they need around a denied path (`git init` beside a
//! write-denied `.git/hooks`). The agent (or the service's caller) can
//! change the tree while root makes them, so they are made by descriptor
//! from the writable root down, never through a symlink, with the caller's
//! file access (deputy.rs), and never outside the root ([`anchor`]).

use std::ffi::OsStr;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::credentials::Identity;
use crate::policy::Policy;

#[derive(Debug, thiserror::Error)]
pub enum MaterializeError {
    #[error("failed to materialize {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to use the placeholder registry {path}: {why}")]
    Registry { path: PathBuf, why: String },
}

impl MaterializeError {
    /// The exit status: 78 where the caller of the service may not create
    /// the placeholder, 125 for our own failure.
    pub fn code(&self) -> i32 {
        match self {
            Self::Create { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                crate::exit::REFUSED
            }
            _ => crate::exit::START_FAILURE,
        }
    }
}

/// The registry directory for a launcher with effective uid `uid`: root's
/// is under /run; an ordinary user's under `$XDG_RUNTIME_DIR`, else /tmp.
pub fn registry_dir(uid: u32, runtime_dir: Option<&str>) -> PathBuf {
    if uid == 0 {
        return PathBuf::from("/run/tartaros/placeholders");
    }
    match runtime_dir.filter(|d| d.starts_with('/')) {
        Some(dir) => Path::new(dir).join("tartaros/placeholders"),
        None => PathBuf::from(format!("/tmp/tartaros-{uid}/placeholders")),
    }
}

/// Makes the launcher's registry if it is missing and returns it when it is
/// a directory only this user can write: the run hides it from its agent
/// (decide.rs), made first so a concurrent agent cannot plant it later.
pub fn ensure_registry() -> Option<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let dir = this_registry();
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir);
    let meta = std::fs::symlink_metadata(&dir).ok()?;
    (meta.is_dir() && meta.uid() == nix::unistd::geteuid().as_raw()).then_some(dir)
}

fn this_registry() -> PathBuf {
    let runtime = std::env::var("XDG_RUNTIME_DIR").ok();
    registry_dir(nix::unistd::geteuid().as_raw(), runtime.as_deref())
}

/// The marker's file name for a placeholder path: its SHA-256, so any path
/// fits a file name.
pub fn marker_name(path: &Path) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(path.as_os_str().as_bytes());
    let mut name: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    name.push_str(".placeholder");
    name
}

/// Marker contents: the directories the placeholder's creator made,
/// outermost first, one hex-encoded path per line.
pub fn encode_created(created: &[PathBuf]) -> String {
    created
        .iter()
        .map(|p| {
            let mut line: String = p
                .as_os_str()
                .as_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            line.push('\n');
            line
        })
        .collect()
}

pub fn decode_created(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let bytes: Option<Vec<u8>> = (0..line.len())
                .step_by(2)
                .map(|i| {
                    line.get(i..i + 2)
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                })
                .collect();
            bytes.map(|b| PathBuf::from(std::ffi::OsStr::from_bytes(&b)))
        })
        .collect()
}

/// The registry, locked for the caller while it lives.
struct Registry {
    dir: PathBuf,
    _lock: File,
}

impl Registry {
    fn open(dir: &Path) -> Result<Self, MaterializeError> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        let broken = |why: String| MaterializeError::Registry {
            path: dir.to_path_buf(),
            why,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| broken(e.to_string()))?;
        // Another user must not be able to plant or remove our markers.
        let meta = std::fs::symlink_metadata(dir).map_err(|e| broken(e.to_string()))?;
        if !meta.is_dir()
            || meta.uid() != nix::unistd::geteuid().as_raw()
            || meta.mode() & 0o022 != 0
        {
            return Err(broken(
                "it is not a directory that only this user can write; remove it".into(),
            ));
        }
        let lock = File::create(dir.join("registry.lock")).map_err(|e| broken(e.to_string()))?;
        flock(&lock, libc::LOCK_EX).map_err(|e| broken(e.to_string()))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    fn marker(&self, path: &Path) -> PathBuf {
        self.dir.join(marker_name(path))
    }
}

fn flock(file: &File, how: libc::c_int) -> std::io::Result<()> {
    // SAFETY: flock on a descriptor we own only changes its lock.
    if unsafe { libc::flock(file.as_raw_fd(), how) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// One placeholder this run uses, with the shared lock that says so.
struct Held {
    path: PathBuf,
    marker: File,
}

/// The placeholders this run uses; [`Placeholders::release`] removes those
/// no other run uses any more.
#[derive(Default)]
pub struct Placeholders {
    held: Vec<Held>,
    registry: Option<PathBuf>,
}

impl Placeholders {
    /// The placeholder paths, for the janitor.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.held.iter().map(|h| h.path.clone()).collect()
    }

    /// Gives up this run's use of each placeholder, removing those no other
    /// live run holds and that are still empty. Idempotent.
    pub fn release(&mut self) {
        let held = std::mem::take(&mut self.held);
        let Some(dir) = self.registry.take() else {
            return;
        };
        if held.is_empty() {
            return;
        }
        let Ok(registry) = Registry::open(&dir) else {
            return;
        };
        for Held { path, marker } in held {
            // Fails while another run holds it shared: it removes it later.
            if flock(&marker, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
                remove(&registry, &path);
            }
        }
    }
}

impl Drop for Placeholders {
    fn drop(&mut self) {
        self.release();
    }
}

/// Removes the directories the marker lists (if still empty) and the
/// marker. The caller holds the registry lock and the marker's exclusive
/// lock.
fn remove(registry: &Registry, path: &Path) {
    let marker = registry.marker(path);
    let created = std::fs::read_to_string(&marker)
        .map(|text| decode_created(&text))
        .unwrap_or_default();
    for dir in created.iter().rev() {
        remove_placeholder(dir);
    }
    let _ = std::fs::remove_file(&marker);
}

/// Removes the placeholder `dir` if it is still an empty directory,
/// reaching it without following a symlink: the agent had the tree until
/// now, and a parent it swapped for a link to a host directory must not
/// make root remove a directory there. Through the service it is removed
/// with the caller's rights (`caller::as_caller`): the marker names a
/// path, and the caller may have put another user's empty directory
/// there meanwhile (its own placeholder removed, the name taken in a
/// sticky /var/tmp), which root removed and the caller could not.
fn remove_placeholder(dir: &Path) {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return;
    };
    crate::caller::as_caller(|| {
        if let Ok(at) = crate::mount_tree::open_no_symlinks(parent) {
            let _ = nix::unistd::unlinkat(
                Some(at.as_raw_fd()),
                name,
                nix::unistd::UnlinkatFlags::RemoveDir,
            );
        }
    });
}

/// The janitor's cleanup after a supervisor that died: removes each
/// placeholder no live run holds.
pub fn cleanup_placeholders(paths: &[PathBuf]) {
    if paths.is_empty() {
        return;
    }
    let Ok(registry) = Registry::open(&this_registry()) else {
        return;
    };
    for path in paths {
        // Markers are written under the registry lock we hold: a staged
        // one is a dead writer's.
        let _ = std::fs::remove_file(staged(&registry.marker(path)));
        let Ok(marker) = File::open(registry.marker(path)) else {
            continue;
        };
        if flock(&marker, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
            remove(&registry, path);
        }
    }
}

/// Materializes the policy's absent denies inside the writable roots, owned
/// by `owner` (the agent, when we run as root), and takes this run's share
/// of every placeholder its denies use, also those another run made.
/// Without `--materialize` an absent deny is left alone (the planner
/// refused or degraded the run).
///
/// `announce` hears of each placeholder path before anything is made for
/// it: the janitor, which cleans up after a supervisor killed half-way
/// (placeholders made before it heard of them outlived the run).
pub fn materialize(
    policy: &Policy,
    owner: Option<Identity>,
    announce: &mut dyn FnMut(&Path),
) -> Result<Placeholders, MaterializeError> {
    let mut denies: Vec<&PathBuf> = policy
        .read_denies
        .iter()
        .chain(&policy.write_denies)
        .filter(|p| anchor(policy, p).is_some())
        .collect();
    denies.sort();
    denies.dedup();
    let mut placeholders = Placeholders::default();
    if denies.is_empty() {
        return Ok(placeholders);
    }
    let dir = this_registry();
    let registry = Registry::open(&dir)?;
    placeholders.registry = Some(dir);
    for path in denies {
        announce(path);
        let marker_path = registry.marker(path);
        if crate::caller::as_caller(|| std::fs::symlink_metadata(path).is_ok()) {
            // Someone's placeholder (or a crashed run's): share it.
            if let Ok(marker) = File::open(&marker_path) {
                flock(&marker, libc::LOCK_SH).map_err(|e| MaterializeError::Registry {
                    path: marker_path.clone(),
                    why: e.to_string(),
                })?;
                placeholders.held.push(Held {
                    path: path.clone(),
                    marker,
                });
            }
            continue;
        }
        // Without --materialize the deny cannot hold: the planner already
        // refused the run (--strict) or marked it degraded.
        if !policy.materialize_absent_handoff {
            continue;
        }
        let Some((root, names)) = anchor(policy, path) else {
            continue;
        };
        let failed = |source| MaterializeError::Create {
            path: path.clone(),
            source,
        };
        // The marker first, naming what is about to be made, so that a
        // supervisor killed during `create` leaves its janitor (or the next
        // run) a list to remove; rewritten below if the tree changed.
        let missing = missing_below(root, &names, |p| {
            crate::caller::as_caller(|| std::fs::symlink_metadata(p).is_ok())
        });
        write_marker(&marker_path, &missing).map_err(failed)?;
        let created = create(root, &names, owner).inspect_err(|_| {
            let _ = std::fs::remove_file(&marker_path);
        })?;
        let rewritten = if created == missing {
            Ok(())
        } else {
            write_marker(&marker_path, &created)
        };
        let held = rewritten
            .and_then(|()| File::open(&marker_path))
            .and_then(|marker| {
                flock(&marker, libc::LOCK_SH)?;
                Ok(marker)
            })
            .map_err(|e| {
                for dir in created.iter().rev() {
                    remove_placeholder(dir);
                }
                failed(e)
            })?;
        placeholders.held.push(Held {
            path: path.clone(),
            marker: held,
        });
    }
    Ok(placeholders)
}

/// The directories `create` would make for `names` below `root`: every
/// one from the first that does not `exist`, outermost first.
fn missing_below(root: &Path, names: &[&OsStr], exist: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut path = root.to_path_buf();
    let mut missing = Vec::new();
    for name in names {
        path.push(name);
        if !missing.is_empty() || !exist(&path) {
            missing.push(path.clone());
        }
    }
    missing
}

/// Replaces the marker at `path` whole (a new file renamed over it): a
/// process killed half-way leaves the old list or the new one, never a
/// truncated one.
fn write_marker(path: &Path, created: &[PathBuf]) -> std::io::Result<()> {
    let staged = staged(path);
    let mut file = File::create(&staged)?;
    file.write_all(encode_created(created).as_bytes())?;
    std::fs::rename(&staged, path)
}

/// Where [`write_marker`] writes before renaming: one name per marker, so
/// the cleanup can remove one a killed writer left.
fn staged(marker: &Path) -> PathBuf {
    let mut staged = marker.as_os_str().to_owned();
    staged.push(".new");
    staged.into()
}

/// Where the placeholder for the deny `path` may be made: the writable root
/// it lies in (the innermost, when roots nest) and the names below it, each
/// a plain component. None when no root the sandbox shows holds it (a deny
/// only under a private /tmp or a `--tmpfs`, where the sandbox never sees
/// the host's path) or when it names `.` or `..`: a placeholder is never
/// made outside the root it belongs to.
pub fn anchor<'a>(policy: &'a Policy, path: &'a Path) -> Option<(&'a Path, Vec<&'a OsStr>)> {
    let root = policy
        .writable_roots
        .iter()
        .filter(|root| root.is_absolute() && path.starts_with(root))
        .filter(|root| !(policy.private_tmp && root.as_path() == Path::new("/tmp")))
        .max_by_key(|root| root.components().count())?;
    let names = path
        .strip_prefix(root)
        .ok()?
        .components()
        .map(|c| match c {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect::<Option<Vec<&OsStr>>>()?;
    Some((root.as_path(), names))
}

/// Creates the missing directories of `names` below `root`, by descriptor
/// and with the service caller's file access (see deputy.rs): a link
/// swapped into the tree meanwhile fails the run instead of sending root's
/// `mkdir` and `chown` outside. Returns them outermost first.
fn create(
    root: &Path,
    names: &[&OsStr],
    owner: Option<Identity>,
) -> Result<Vec<PathBuf>, MaterializeError> {
    crate::caller::as_caller(|| crate::deputy::make_dirs(root, names, owner))
        .map(|walked| walked.created)
        .map_err(|e| {
            let (path, source) = e.into_parts();
            MaterializeError::Create { path, source }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_names_what_is_missing_before_anything_is_made() {
        let names = [OsStr::new("a"), OsStr::new("b"), OsStr::new("c")];
        let exist = |p: &Path| p == Path::new("/w/a");
        let missing = missing_below(Path::new("/w"), &names, exist);
        assert_eq!(
            missing,
            [PathBuf::from("/w/a/b"), PathBuf::from("/w/a/b/c")]
        );
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("m.placeholder");
        write_marker(&marker, &missing).unwrap();
        write_marker(&marker, &missing[1..]).unwrap();
        let text = std::fs::read_to_string(&marker).unwrap();
        assert_eq!(decode_created(&text), missing[1..]);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_placeholder_behind_a_link_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(base.join("host/hooks")).unwrap();
        std::fs::create_dir_all(base.join("tree/real/hooks")).unwrap();
        std::os::unix::fs::symlink(base.join("host"), base.join("tree/.git")).unwrap();
        remove_placeholder(&base.join("tree/.git/hooks"));
        assert!(base.join("host/hooks").is_dir(), "removed through a link");
        remove_placeholder(&base.join("tree/real/hooks"));
        assert!(!base.join("tree/real/hooks").exists());
    }

    #[test]
    fn a_placeholder_is_anchored_in_its_innermost_root_only() {
        let policy = Policy {
            writable_roots: vec!["/w".into(), "/w/sub".into(), "/tmp".into()],
            ..Policy::default()
        };
        fn names(list: &[&'static str]) -> Vec<&'static OsStr> {
            list.iter().map(|s| OsStr::new(*s)).collect()
        }
        assert_eq!(
            anchor(&policy, Path::new("/w/.git/hooks")),
            Some((Path::new("/w"), names(&[".git", "hooks"])))
        );
        assert_eq!(
            anchor(&policy, Path::new("/w/sub/a")),
            Some((Path::new("/w/sub"), names(&["a"])))
        );
        assert_eq!(anchor(&policy, Path::new("/wx/a")), None);
        assert_eq!(anchor(&policy, Path::new("/w/../etc/x")), None);
        assert_eq!(anchor(&policy, Path::new("/elsewhere")), None);
        // A private /tmp hides the host's: no root there to anchor in.
        let private = Policy {
            private_tmp: true,
            ..policy.clone()
        };
        assert_eq!(anchor(&private, Path::new("/tmp/x")), None);
        assert_eq!(
            anchor(&policy, Path::new("/tmp/x")),
            Some((Path::new("/tmp"), names(&["x"])))
        );
        let relative = Policy {
            writable_roots: vec!["w".into()],
            ..Policy::default()
        };
        assert_eq!(anchor(&relative, Path::new("w/x")), None);
    }

    #[test]
    fn registry_lives_outside_any_tree_per_user() {
        assert_eq!(
            registry_dir(0, Some("/run/user/0")),
            PathBuf::from("/run/tartaros/placeholders")
        );
        assert_eq!(
            registry_dir(1000, Some("/run/user/1000")),
            PathBuf::from("/run/user/1000/tartaros/placeholders")
        );
        assert_eq!(
            registry_dir(1000, Some("relative")),
            PathBuf::from("/tmp/tartaros-1000/placeholders")
        );
    }

    #[test]
    fn markers_round_trip_any_path() {
        let created = vec![PathBuf::from("/w/.git"), PathBuf::from("/w/.git/ho\nks")];
        assert_eq!(decode_created(&encode_created(&created)), created);
        assert_ne!(
            marker_name(Path::new("/w/a")),
            marker_name(Path::new("/w/b"))
        );
        assert!(marker_name(Path::new("/w/a")).len() < 100);
    }
}
