//! Where the `--status-fd` descriptor leads, checked against the files the
//! agent can write, so that no agent can add lines the harness reads as
//! ours (adversarial round 20).
//!
//! Two records outlive the moment they can be taken: what the standard
//! streams were before the relay (stdio_relay.rs) put pipes in their place
//! (a second open of the file behind `>> out.txt`, `9>> out.txt`, is the
//! same file as stdout, yet after the relay only this record says so), and,
//! in a service worker, what the caller's status descriptor was before a
//! pipe to a copying process took its place.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::status::StatusError;
use crate::status_socket::{self, SocketFacts, UnixSocket};

/// A file's identity: `(st_dev, st_ino)`.
pub type FileId = (u64, u64);

static ORIGINAL_STREAMS: OnceLock<[Option<FileId>; 3]> = OnceLock::new();
static CALLER_STATUS: OnceLock<Origin> = OnceLock::new();

/// Remembers stdin, stdout and stderr as they are now; called first in
/// `main`, before the relay replaces any of them.
pub fn remember_standard_streams() {
    let _ = ORIGINAL_STREAMS.set([0, 1, 2].map(id_of));
}

/// The standard streams as `main` found them (none where not recorded).
pub fn original_streams() -> [Option<FileId>; 3] {
    ORIGINAL_STREAMS.get().copied().unwrap_or([None; 3])
}

/// The identity of the file behind `fd`; none for the null device, which
/// is no channel to forge, and for a closed descriptor.
pub fn id_of(fd: RawFd) -> Option<FileId> {
    nix::sys::stat::fstat(fd)
        .ok()
        .filter(|st| !is_null_device(st))
        .map(|st| identity(fd, &st))
}

/// `st_dev` of a device's identity: no filesystem has it.
const DEVICE: u64 = u64::MAX;
/// `TIOCGDEV` (`_IOR('T', 0x32, unsigned int)`): the device number of the
/// terminal behind a descriptor, through `/dev/tty` and `/dev/console`.
const TIOCGDEV: libc::c_ulong = 0x8004_5432;

/// A file is its inode; a character device is its device number, whatever
/// node opened it: `9>/dev/tty` with stdout `/dev/pts/3` is one terminal
/// behind two inodes (adversarial round 24b: the agent printed a forged
/// `exited` line into the status stream), and so is a second devpts
/// mount's or a copied node's name of it.
fn identity(fd: RawFd, st: &libc::stat) -> FileId {
    if st.st_mode & libc::S_IFMT != libc::S_IFCHR {
        return (st.st_dev, st.st_ino);
    }
    let mut dev: libc::c_uint = 0;
    // SAFETY: the kernel writes one unsigned int into `dev`, which
    // outlives the call; `fd` is open. Not a terminal: ENOTTY, `dev` unread.
    let tty = unsafe { libc::ioctl(fd, TIOCGDEV, &mut dev) } == 0;
    (DEVICE, if tty { u64::from(dev) } else { st.st_rdev })
}

fn is_null_device(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == libc::makedev(1, 3)
}

fn id_of_path(path: &Path) -> Option<FileId> {
    nix::sys::stat::stat(path)
        .ok()
        .map(|st| (st.st_dev, st.st_ino))
}

/// What the status descriptor is on the host: enough to tell whether a
/// writable root holds a name of it.
#[derive(Debug, Clone)]
pub struct Origin {
    id: FileId,
    links: u64,
    /// A regular file or a named FIFO: something with a name the agent
    /// could open. Anonymous pipes, sockets and devices have none.
    named: bool,
    /// The name `/proc/self/fd/N` gives, when it still leads to this file.
    path: Option<PathBuf>,
    /// A unix socket's own and peer names, or a TCP socket's ports
    /// (status_socket.rs): a socket has no name to open, but the agent
    /// may reach its peer by name, or through a `--port` relay.
    socket: Option<SocketFacts>,
}

impl Origin {
    pub fn of(fd: RawFd) -> Option<Self> {
        let st = nix::sys::stat::fstat(fd).ok()?;
        let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok();
        let id = identity(fd, &st);
        let kind = st.st_mode & libc::S_IFMT;
        let anonymous = link
            .as_ref()
            .is_none_or(|l| l.to_string_lossy().starts_with("pipe:"));
        let named = kind == libc::S_IFREG || (kind == libc::S_IFIFO && !anonymous);
        // A renamed or deleted file, or one opened in another mount
        // namespace, has no name here that still leads to it.
        let path = link.filter(|p| p.is_absolute() && id_of_path(p) == Some(id));
        let socket = (kind == libc::S_IFSOCK)
            .then(|| crate::status_socket::socket_of(fd))
            .flatten();
        Some(Self {
            id,
            links: st.st_nlink,
            named,
            path,
            socket,
        })
    }
}

/// Remembers the service caller's status descriptor before a pipe hides
/// it (service/worker.rs); the status channel then checks this one.
pub fn remember_caller_status(fd: RawFd) {
    if let Some(origin) = Origin::of(fd) {
        let _ = CALLER_STATUS.set(origin);
    }
}

/// The caller's status descriptor, in a service worker.
pub fn caller_status() -> Option<Origin> {
    CALLER_STATUS.get().cloned()
}

/// Refuses a status file or FIFO the agent could open for writing: one
/// with a name under a writable root, or one tartaros cannot place
/// outside them (fails closed): its name no longer leads to it, it has
/// other hard links, or a mount under a root shows its filesystem, and a
/// root shares that filesystem. Refuses as well a unix socket whose own
/// or peer name the agent can reach, and a TCP socket on a port that
/// `--port` relays to (status_socket.rs).
pub fn check_outside_roots(
    origin: &Origin,
    fd: RawFd,
    roots: &[PathBuf],
    local_ports: &[u16],
) -> Result<(), StatusError> {
    if let Some(SocketFacts::Tcp(ports)) = &origin.socket {
        return status_socket::judge_tcp(*ports, local_ports).map_err(|r| r.into_error(fd));
    }
    let unix = match &origin.socket {
        Some(SocketFacts::Unix(socket)) => Some(socket),
        _ => None,
    };
    // Pipes (the usual channel) cost no look-up of the roots.
    if roots.is_empty() || (unix.is_none() && (!origin.named || origin.links == 0)) {
        return Ok(());
    }
    let resolved: Vec<(PathBuf, Option<FileId>)> = roots
        .iter()
        .map(|r| {
            let r = std::fs::canonicalize(r).unwrap_or_else(|_| r.clone());
            let id = id_of_path(&r);
            (r, id)
        })
        .collect();
    if let Some(socket) = unix {
        return check_socket(socket, fd, roots, &resolved);
    }
    check_file(
        origin.id,
        origin.links,
        origin.path.as_deref(),
        fd,
        &resolved,
    )
}

/// The names of a unix socket, by name ([`status_socket::judge`]) and then
/// by inode, as a status file.
fn check_socket(
    socket: &UnixSocket,
    fd: RawFd,
    roots: &[PathBuf],
    resolved: &[(PathBuf, Option<FileId>)],
) -> Result<(), StatusError> {
    let spellings: Vec<PathBuf> = roots
        .iter()
        .cloned()
        .chain(resolved.iter().map(|(r, _)| r.clone()))
        .collect();
    let names = status_socket::judge(socket, &spellings).map_err(|r| r.into_error(fd))?;
    for (side, name) in names {
        let (id, links, path) = status_socket::file_at(&name);
        check_file(id, links, path.as_deref(), fd, resolved).map_err(|e| match e {
            StatusError::InRoot { root, .. } => StatusError::SocketInRoot {
                fd,
                side: side.words(),
                path: name.display().to_string(),
                root,
            },
            StatusError::MaybeInRoot { root, .. } => StatusError::SocketUnplaced {
                fd,
                side: side.words(),
                path: name.display().to_string(),
                why: format!(
                    "another hard link, a mount under the root {root}, or a name that no longer leads to it, on that root's filesystem"
                ),
            },
            other => other,
        })?;
    }
    Ok(())
}

/// A file `id` with `links` names, one of them `path` when known, against
/// the resolved roots.
fn check_file(
    id: FileId,
    links: u64,
    path: Option<&Path>,
    fd: RawFd,
    roots: &[(PathBuf, Option<FileId>)],
) -> Result<(), StatusError> {
    let unsure = |root: &Path| StatusError::MaybeInRoot {
        fd,
        root: root.display().to_string(),
    };
    let mounted = mounts_under(roots, id.0);
    let same_fs = roots
        .iter()
        .find(|(_, rid)| rid.is_some_and(|(dev, _)| dev == id.0))
        .map(|(r, _)| r.as_path())
        .or(mounted.as_deref());
    let Some(path) = path else {
        return same_fs.map_or(Ok(()), |root| Err(unsure(root)));
    };
    // By name, and by inode: a bind mount shows a root's directory at a
    // second path too. The file itself counts: a root may be a file
    // (`--write status.jsonl`, adversarial round 22).
    for dir in path.ancestors() {
        let dir_id = id_of_path(dir);
        if let Some((root, _)) = roots
            .iter()
            .find(|(r, rid)| dir == r || (rid.is_some() && *rid == dir_id))
        {
            return Err(StatusError::InRoot {
                fd,
                path: path.display().to_string(),
                root: root.display().to_string(),
            });
        }
    }
    match (same_fs, &mounted) {
        (_, Some(root)) => Err(unsure(root)),
        (Some(root), None) if links > 1 => Err(unsure(root)),
        _ => Ok(()),
    }
}

/// A root under which the mount table shows a mount of the filesystem
/// `dev`: through it the agent may reach a file that has no name under
/// the root on the host.
fn mounts_under(roots: &[(PathBuf, Option<FileId>)], dev: u64) -> Option<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let wanted = format!("{}:{}", libc::major(dev), libc::minor(dev));
    table.lines().find_map(|line| {
        let mut fields = line.split(' ');
        let device = fields.nth(2)?;
        let point = unescape(fields.nth(1)?);
        if device != wanted {
            return None;
        }
        roots
            .iter()
            .find(|(r, _)| point.starts_with(r) && point != *r)
            .map(|(r, _)| r.clone())
    })
}

/// A mount point as the table writes it: space, tab, newline and
/// backslash as `\ooo`.
fn unescape(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            let text = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(unescape(r"/mnt/a\040b"), PathBuf::from("/mnt/a b"));
        assert_eq!(unescape(r"/x\\y"), PathBuf::from(r"/x\\y"));
        assert_eq!(unescape(r"/x\134y"), PathBuf::from(r"/x\y"));
    }

    #[test]
    fn a_file_under_a_root_is_refused_beside_it_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        let inside = std::fs::File::create(root.join("sub/status")).unwrap();
        let beside = std::fs::File::create(dir.path().join("status")).unwrap();
        let roots = [root.clone()];
        let check = |f: &std::fs::File| {
            let origin = Origin::of(f.as_raw_fd()).unwrap();
            check_outside_roots(&origin, f.as_raw_fd(), &roots, &[])
        };
        assert!(matches!(check(&inside), Err(StatusError::InRoot { .. })));
        assert!(check(&beside).is_ok());
        // A root that is the status file itself.
        let file_root = [dir.path().join("status")];
        let origin = Origin::of(beside.as_raw_fd()).unwrap();
        assert!(matches!(
            check_outside_roots(&origin, beside.as_raw_fd(), &file_root, &[]),
            Err(StatusError::InRoot { .. })
        ));
        // A second name of the outside file: it may be one under the root.
        std::fs::hard_link(dir.path().join("status"), dir.path().join("again")).unwrap();
        assert!(matches!(
            check(&beside),
            Err(StatusError::MaybeInRoot { .. })
        ));
        // A pipe has no name to open.
        let (r, _w) = nix::unistd::pipe().unwrap();
        let origin = Origin::of(r.as_raw_fd()).unwrap();
        assert!(check_outside_roots(&origin, r.as_raw_fd(), &roots, &[]).is_ok());
    }

    #[test]
    fn a_socket_whose_peer_is_under_a_root_is_refused_beside_it_accepted() {
        use std::os::unix::net::UnixDatagram;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let roots = [root.clone()];
        let check = |peer: &Path| {
            let writer = UnixDatagram::unbound().unwrap();
            writer.connect(peer).unwrap();
            let origin = Origin::of(writer.as_raw_fd()).unwrap();
            check_outside_roots(&origin, writer.as_raw_fd(), &roots, &[])
        };
        let _inside = UnixDatagram::bind(root.join("s.sock")).unwrap();
        assert!(matches!(
            check(&root.join("s.sock")),
            Err(StatusError::SocketInRoot { .. })
        ));
        let beside = dir.path().join("s.sock");
        let _reader = UnixDatagram::bind(&beside).unwrap();
        assert!(check(&beside).is_ok());
        // Another name of it, on the root's filesystem: maybe in the root.
        std::fs::hard_link(&beside, dir.path().join("again.sock")).unwrap();
        assert!(matches!(
            check(&beside),
            Err(StatusError::SocketUnplaced { .. })
        ));
    }
}
