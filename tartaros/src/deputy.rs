//! Root as a deputy: what the supervisor (or the service's worker) creates,
//! chowns or removes on an agent's or a caller's behalf, in places that
//! agent or caller can change too. A path names its place again at every
//! call, so a directory on it swapped for a symlink between two calls
//! (`renameat2(RENAME_EXCHANGE)` is atomic) sends the second call wherever
//! the link points, e.g. into /etc. Here every such operation goes through
//! descriptors instead: a walk from a directory reached without following
//! any symlink, one entry at a time, each directory made with `mkdirat` in
//! the one above it and chowned through a descriptor of its own; a file
//! created in a directory held open, and removed later from that same
//! directory, and only while its name there is still that inode. Callers
//! run these with the service caller's file access when there is one
//! (`caller::as_caller`), so the kernel's own checks apply at every step.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;

use crate::credentials::Identity;
use crate::mount_tree::{open_beneath, open_dir_path_no_symlinks};

#[derive(Debug, thiserror::Error)]
pub enum DeputyError {
    #[error("failed to create {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl DeputyError {
    /// The path that could not be made, and why.
    pub fn into_parts(self) -> (PathBuf, std::io::Error) {
        match self {
            Self::Create { path, source } => (path, source),
        }
    }
}

/// What [`make_dirs`] did: the directories it made, outermost first, and
/// the last directory of the walk, open.
pub struct Walked {
    pub created: Vec<PathBuf>,
    pub last: OwnedFd,
}

/// Walks from the directory `root` (reached without following a symlink)
/// down `names`, one plain component at a time and never through a
/// symlink, making each missing directory with `mkdirat` in the one above
/// it and, with `owner`, giving it to `owner` through a descriptor of the
/// new directory. Nothing is made or chowned outside `root`, whatever is
/// swapped in meanwhile: a symlink met on the way fails the walk (ELOOP).
/// On failure what it made is removed again.
pub fn make_dirs(
    root: &Path,
    names: &[&OsStr],
    owner: Option<Identity>,
) -> Result<Walked, DeputyError> {
    let failed = |path: &Path, e: nix::Error| DeputyError::Create {
        path: path.to_path_buf(),
        source: e.into(),
    };
    let mut dir = open_dir_path_no_symlinks(root).map_err(|e| failed(root, e))?;
    let mut here = root.to_path_buf();
    // Where each new directory was made, to take it back on failure.
    let mut made: Vec<(OwnedFd, OsString)> = Vec::new();
    let mut created = Vec::new();
    for name in names {
        here.push(name);
        let stepped = if plain(name) {
            step(&dir, name, owner)
        } else {
            Err(nix::Error::EINVAL)
        };
        match stepped {
            Ok((next, new)) => {
                let above = std::mem::replace(&mut dir, next);
                if new {
                    made.push((above, name.to_os_string()));
                    created.push(here.clone());
                }
            }
            Err(e) => {
                for (above, name) in made.iter().rev() {
                    let _ = remove_dir_at(above, name);
                }
                return Err(failed(&here, e));
            }
        }
    }
    Ok(Walked { created, last: dir })
}

/// Makes the missing mount point `path` (a directory, or an empty file
/// when not `dir`) and its missing parents, walking from / as
/// [`make_dirs`] does, so that a link swapped into its parents cannot
/// send the creation elsewhere.
pub fn make_mount_point(path: &Path, dir: bool) -> Result<(), DeputyError> {
    let mut names: Vec<&OsStr> = path
        .components()
        .filter(|c| *c != Component::RootDir)
        .map(Component::as_os_str)
        .collect();
    let file = if dir { None } else { names.pop() };
    let walked = make_dirs(Path::new("/"), &names, None)?;
    if let Some(name) = file {
        let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_NOCTTY | libc::O_NONBLOCK;
        open_beneath(&walked.last, name, flags, 0o644).map_err(|e| DeputyError::Create {
            path: path.to_path_buf(),
            source: e.into(),
        })?;
    }
    Ok(())
}

/// A single plain name: the walk never goes up or stays put.
fn plain(name: &OsStr) -> bool {
    let mut parts = Path::new(name).components();
    matches!(parts.next(), Some(Component::Normal(n)) if n == name) && parts.next().is_none()
}

/// One level of [`make_dirs`]: the directory `name` of `dir`, made (and
/// given to `owner`) if missing; whether it is new.
fn step(
    dir: &OwnedFd,
    name: &OsStr,
    owner: Option<Identity>,
) -> Result<(OwnedFd, bool), nix::Error> {
    match open_beneath(dir, name, libc::O_PATH | libc::O_DIRECTORY, 0) {
        Ok(next) => return Ok((next, false)),
        Err(nix::Error::ENOENT) => {}
        Err(e) => return Err(e),
    }
    nix::sys::stat::mkdirat(Some(dir.as_raw_fd()), name, Mode::from_bits_truncate(0o777))?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    let opened = open_beneath(dir, name, flags, 0).and_then(|new| {
        if let Some(who) = owner {
            give(&new, who)?;
        }
        Ok(new)
    });
    opened.map(|new| (new, true)).inspect_err(|_| {
        let _ = remove_dir_at(dir, name);
    })
}

/// Gives the directory `new` just made to `who`, through its descriptor,
/// if it is still the one made: owned by whom this thread creates files
/// as, and empty. Another directory exchanged in for it between the
/// `mkdirat` and the open keeps its owner (EEXIST).
fn give(new: &OwnedFd, who: Identity) -> Result<(), nix::Error> {
    let stat = nix::sys::stat::fstat(new.as_raw_fd())?;
    if stat.st_uid != creator() || !is_empty(new)? {
        return Err(nix::Error::EEXIST);
    }
    nix::unistd::fchown(
        new.as_raw_fd(),
        Some(nix::unistd::Uid::from_raw(who.uid)),
        Some(nix::unistd::Gid::from_raw(who.gid)),
    )
}

/// The uid this thread creates files as (its fsuid).
fn creator() -> u32 {
    // SAFETY: setfsuid with an invalid uid (-1) changes nothing and
    // returns the thread's fsuid.
    unsafe { libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32 }
}

fn is_empty(dir: &OwnedFd) -> Result<bool, nix::Error> {
    let copy = dir
        .try_clone()
        .map_err(|e| nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    let mut listing = nix::dir::Dir::from(copy)?;
    for entry in listing.iter() {
        let name = entry?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            return Ok(false);
        }
    }
    Ok(true)
}

fn remove_dir_at(dir: &OwnedFd, name: &OsStr) -> Result<(), nix::Error> {
    nix::unistd::unlinkat(Some(dir.as_raw_fd()), name, UnlinkatFlags::RemoveDir)
}

/// A file this process created, as what removes it again safely: the
/// directory it was created in (held open), its name there and its inode.
pub struct CreatedFile {
    dir: OwnedFd,
    name: OsString,
    dev: u64,
    ino: u64,
    /// The file itself: an effect log is append-only while it lives
    /// (`append_only.rs`), which refuses its unlink until cleared.
    file: File,
}

/// Creates the file `path` exclusively (`O_CREAT | O_EXCL`: an existing
/// file or symlink there is refused) with `flags` and `mode`, in its
/// directory opened first and kept for [`CreatedFile::remove`]. The
/// directory is reached as the path says, symlinks and all (it is the
/// launcher's or the caller's own choice, checked with their file access);
/// what is pinned is the file's own place.
pub fn create_file(
    path: &Path,
    flags: libc::c_int,
    mode: u32,
) -> std::io::Result<(File, CreatedFile)> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let dir = OwnedFd::from(
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(parent)?,
    );
    let file = File::from(open_beneath(
        &dir,
        name,
        flags | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        mode,
    )?);
    let stat = nix::sys::stat::fstat(file.as_raw_fd())?;
    let created = CreatedFile {
        dir,
        name: name.to_os_string(),
        dev: stat.st_dev,
        ino: stat.st_ino,
        file: file.try_clone()?,
    };
    Ok((file, created))
}

impl CreatedFile {
    /// Unlinks the file from the directory it was created in, if the name
    /// there is still that file (same device and inode); never through a
    /// symlink, wherever the directory's own path leads now. Whether it
    /// did. (A file renamed over the name after the check is one its mover
    /// could write that directory for, and could remove itself.)
    pub fn remove(self) -> bool {
        let now = nix::sys::stat::fstatat(
            Some(self.dir.as_raw_fd()),
            self.name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        );
        match now {
            Ok(stat) if stat.st_dev == self.dev && stat.st_ino == self.ino => {
                let _ = crate::append_only::set(&self.file, false);
                nix::unistd::unlinkat(
                    Some(self.dir.as_raw_fd()),
                    self.name.as_os_str(),
                    UnlinkatFlags::NoRemoveDir,
                )
                .is_ok()
            }
            _ => false,
        }
    }
}

#[cfg(test)]
#[path = "deputy_tests.rs"]
mod tests;
