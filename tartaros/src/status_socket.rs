//! A `--status-fd` that is a unix socket, checked against the socket names
//! the agent can reach (adversarial round 21).
//!
//! A socket has no name of its own to open, yet its peer may have one: a
//! harness that binds its reader at `<root>/status.sock` and passes a
//! socket connected to it got the agent's `sendto("<root>/status.sock")`
//! (a forged `exited` line) before ours. The agent reaches a pathname
//! socket only by a name under a writable root: the eBPF unix policy
//! (tartaros-ebpf/src/unix.rs, `kernel_watch::options`) admits names under
//! the writable roots, the private `/tmp` and the `--tmpfs` directories,
//! and the last two are fresh mounts that hold no host socket; without
//! the policy, the host's bound sockets outside the roots are hidden
//! (`mounts::host_sockets`). So a socket whose own or peer name lies under
//! a root is refused, by name here and by inode as a status file is
//! (`status_guard::check_outside_roots`). An unnamed socket (a
//! socketpair) has no name to reach; an abstract one lives in the host's
//! network namespace, and the agent has one of its own (always, see
//! `launch.rs`) besides Landlock's abstract-socket scope, so it reaches
//! neither.

use std::os::fd::RawFd;
use std::path::{Component, Path, PathBuf};

use nix::sys::socket::{SockaddrLike, SockaddrStorage};

use crate::status::StatusError;

/// A unix socket's address, as `getsockname` / `getpeername` give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnixName {
    /// Never bound (a socketpair, or a client that did not bind).
    Unnamed,
    /// In the abstract namespace of the host's network namespace.
    Abstract,
    /// A pathname, as the binder spelled it (maybe relative, maybe with
    /// symlinks), and the same with its directory resolved on the host,
    /// when that directory still exists.
    Path {
        bound: PathBuf,
        resolved: Option<PathBuf>,
    },
}

/// Which end of the status socket a name belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Own,
    Peer,
}

impl Side {
    pub fn words(self) -> &'static str {
        match self {
            Side::Own => "own address",
            Side::Peer => "peer's address",
        }
    }
}

/// A TCP socket's own and peer ports (IPv4 or IPv6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpPorts {
    pub own: u16,
    /// None when it is not connected.
    pub peer: Option<u16>,
}

/// A status descriptor that is a socket the agent might reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketFacts {
    Unix(UnixSocket),
    Tcp(TcpPorts),
}

/// What the status descriptor is, when it is a unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixSocket {
    pub own: UnixName,
    /// None when it is not connected.
    pub peer: Option<UnixName>,
}

/// Why a socket name is refused, before any file is looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    InRoot {
        side: Side,
        path: PathBuf,
        root: PathBuf,
    },
    /// A TCP port that `--port` relays the agent's connections to (the
    /// relay connects to the host's 127.0.0.1 or ::1 at that port, where
    /// the harness's reader may listen).
    Relayed { side: Side, port: u16 },
    /// A name that depends on a directory tartaros cannot know (relative)
    /// or that cannot be resolved and goes through `..`.
    Unplaced {
        side: Side,
        path: PathBuf,
        why: &'static str,
    },
}

/// Decides from the names alone: refuses a name under one of `roots` (as
/// given and as resolved: pass both spellings of each root), a relative
/// name (the binder's directory is unknown here; the unix policy refuses
/// the agent's relative names for the same reason) and an unresolved one
/// with `..`. Returns the absolute names that pass, for the check by
/// inode that a name cannot give (a bind mount of a root elsewhere,
/// another hard link).
pub fn judge(socket: &UnixSocket, roots: &[PathBuf]) -> Result<Vec<(Side, PathBuf)>, Refusal> {
    let mut to_check = Vec::new();
    let names = [
        (Side::Own, Some(&socket.own)),
        (Side::Peer, socket.peer.as_ref()),
    ];
    for (side, name) in names {
        let Some(UnixName::Path { bound, resolved }) = name else {
            continue;
        };
        if !bound.is_absolute() {
            return Err(Refusal::Unplaced {
                side,
                path: bound.clone(),
                why: "a relative name",
            });
        }
        for path in [Some(bound), resolved.as_ref()].into_iter().flatten() {
            if let Some(root) = roots.iter().find(|r| path.starts_with(r)) {
                return Err(Refusal::InRoot {
                    side,
                    path: path.clone(),
                    root: root.clone(),
                });
            }
        }
        match resolved {
            Some(path) => to_check.push((side, path.clone())),
            None if bound.components().any(|c| c == Component::ParentDir) => {
                return Err(Refusal::Unplaced {
                    side,
                    path: bound.clone(),
                    why: "a name through `..` whose directory no longer exists",
                });
            }
            None => to_check.push((side, bound.clone())),
        }
    }
    Ok(to_check)
}

/// Refuses a TCP status socket whose own or peer port is one of
/// `local_ports`: the agent's connections to that port on its loopback are
/// relayed to the host's (docs/architecture.md, `--port`), so it could
/// connect to the listener the status socket came from. (A client's own
/// port is ephemeral and seldom one of them; refused all the same, since
/// nothing tells it from a listener's.) UDP is not relayed.
pub fn judge_tcp(ports: TcpPorts, local_ports: &[u16]) -> Result<(), Refusal> {
    let sides = [(Side::Own, Some(ports.own)), (Side::Peer, ports.peer)];
    match sides
        .into_iter()
        .find_map(|(side, port)| port.filter(|p| local_ports.contains(p)).map(|p| (side, p)))
    {
        Some((side, port)) => Err(Refusal::Relayed { side, port }),
        None => Ok(()),
    }
}

impl Refusal {
    pub fn into_error(self, fd: RawFd) -> StatusError {
        match self {
            Refusal::InRoot { side, path, root } => StatusError::SocketInRoot {
                fd,
                side: side.words(),
                path: path.display().to_string(),
                root: root.display().to_string(),
            },
            Refusal::Relayed { side, port } => StatusError::SocketRelayed {
                fd,
                side: side.words(),
                port,
            },
            Refusal::Unplaced { side, path, why } => StatusError::SocketUnplaced {
                fd,
                side: side.words(),
                path: path.display().to_string(),
                why: why.to_string(),
            },
        }
    }
}

/// The unix or TCP socket behind `fd`; none for anything else.
pub fn socket_of(fd: RawFd) -> Option<SocketFacts> {
    use nix::sys::socket::{AddressFamily, SockType, getsockopt, sockopt};
    let own = nix::sys::socket::getsockname::<SockaddrStorage>(fd).ok()?;
    match own.family()? {
        AddressFamily::Unix => Some(SocketFacts::Unix(unix_socket_named(fd, &own))),
        AddressFamily::Inet | AddressFamily::Inet6 => {
            // SAFETY: `fd` is open for the whole call; the borrow ends
            // with it.
            let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            let kind = getsockopt(&borrowed, sockopt::SockType).ok()?;
            let peer = nix::sys::socket::getpeername::<SockaddrStorage>(fd).ok();
            (kind == SockType::Stream).then(|| {
                SocketFacts::Tcp(TcpPorts {
                    own: port_of(&own),
                    peer: peer.as_ref().map(port_of),
                })
            })
        }
        _ => None,
    }
}

fn port_of(addr: &SockaddrStorage) -> u16 {
    addr.as_sockaddr_in()
        .map(|a| a.port())
        .or_else(|| addr.as_sockaddr_in6().map(|a| a.port()))
        .unwrap_or(0)
}

/// The unix socket behind `fd`; none for anything else.
pub fn unix_socket_of(fd: RawFd) -> Option<UnixSocket> {
    let own = nix::sys::socket::getsockname::<SockaddrStorage>(fd).ok()?;
    if own.family() != Some(nix::sys::socket::AddressFamily::Unix) {
        return None;
    }
    Some(unix_socket_named(fd, &own))
}

/// The unix socket `fd`, whose own address `getsockname` gave as `own`.
fn unix_socket_named(fd: RawFd, own: &SockaddrStorage) -> UnixSocket {
    // ENOTCONN: an unconnected socket has no peer (nothing reads what the
    // agent could send to it, but its own name still counts).
    let peer = nix::sys::socket::getpeername::<SockaddrStorage>(fd).ok();
    UnixSocket {
        own: name_of(own),
        peer: peer.as_ref().map(name_of),
    }
}

fn name_of(addr: &SockaddrStorage) -> UnixName {
    let Some(unix) = addr.as_unix_addr() else {
        return UnixName::Unnamed;
    };
    if unix.as_abstract().is_some() {
        return UnixName::Abstract;
    }
    match unix.path() {
        Some(path) if !path.as_os_str().is_empty() => UnixName::Path {
            bound: path.to_path_buf(),
            resolved: resolve(path),
        },
        _ => UnixName::Unnamed,
    }
}

/// The name with its directory resolved (symlinks, `..`); the last
/// component stays as it is, since `bind` does not follow it.
fn resolve(path: &Path) -> Option<PathBuf> {
    if !path.is_absolute() {
        return None;
    }
    let dir = std::fs::canonicalize(path.parent()?).ok()?;
    Some(dir.join(path.file_name()?))
}

/// What the check by inode needs of a socket file at `path`: the socket
/// itself when the name leads to one, else only the filesystem where it
/// was (its nearest existing directory), so that a root on the same
/// filesystem makes it unsure (a rename may have moved it there).
pub fn file_at(path: &Path) -> (crate::status_guard::FileId, u64, Option<PathBuf>) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            ((m.dev(), m.ino()), m.nlink(), Some(path.to_path_buf()))
        }
        _ => {
            let dev = path
                .ancestors()
                .skip(1)
                .find_map(|dir| std::fs::metadata(dir).ok())
                .map_or(0, |m| m.dev());
            ((dev, 0), 1, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(bound: &str, resolved: Option<&str>) -> UnixName {
        UnixName::Path {
            bound: bound.into(),
            resolved: resolved.map(PathBuf::from),
        }
    }

    fn socket(own: UnixName, peer: Option<UnixName>) -> UnixSocket {
        UnixSocket { own, peer }
    }

    #[test]
    fn a_peer_or_own_name_under_a_root_is_refused() {
        let roots = [PathBuf::from("/w"), PathBuf::from("/real/w")];
        let peer_in = socket(
            UnixName::Unnamed,
            Some(named("/w/status.sock", Some("/real/w/status.sock"))),
        );
        assert!(matches!(
            judge(&peer_in, &roots),
            Err(Refusal::InRoot {
                side: Side::Peer,
                ..
            })
        ));
        let own_in = socket(named("/w/sub/l.sock", None), Some(UnixName::Unnamed));
        assert!(matches!(
            judge(&own_in, &roots),
            Err(Refusal::InRoot {
                side: Side::Own,
                ..
            })
        ));
        // A symlink outside the roots that leads into one: the resolved
        // name says so.
        let through_link = socket(
            UnixName::Unnamed,
            Some(named("/home/link/s.sock", Some("/real/w/s.sock"))),
        );
        assert!(matches!(
            judge(&through_link, &roots),
            Err(Refusal::InRoot { .. })
        ));
    }

    #[test]
    fn names_beside_the_roots_pass_to_the_inode_check() {
        let roots = [PathBuf::from("/w")];
        let beside = socket(
            UnixName::Unnamed,
            Some(named("/wx/status.sock", Some("/wx/status.sock"))),
        );
        assert_eq!(
            judge(&beside, &roots),
            Ok(vec![(Side::Peer, PathBuf::from("/wx/status.sock"))])
        );
        let gone = socket(UnixName::Unnamed, Some(named("/gone/s.sock", None)));
        assert_eq!(
            judge(&gone, &roots),
            Ok(vec![(Side::Peer, PathBuf::from("/gone/s.sock"))])
        );
    }

    #[test]
    fn unnamed_and_abstract_sockets_are_accepted() {
        let roots = [PathBuf::from("/w")];
        let pair = socket(UnixName::Unnamed, Some(UnixName::Unnamed));
        assert_eq!(judge(&pair, &roots), Ok(vec![]));
        let abstract_peer = socket(UnixName::Unnamed, Some(UnixName::Abstract));
        assert_eq!(judge(&abstract_peer, &roots), Ok(vec![]));
        let unconnected = socket(UnixName::Abstract, None);
        assert_eq!(judge(&unconnected, &roots), Ok(vec![]));
    }

    #[test]
    fn relative_names_and_unresolved_dotdot_are_refused() {
        let roots = [PathBuf::from("/w")];
        let relative = socket(UnixName::Unnamed, Some(named("status.sock", None)));
        assert!(matches!(
            judge(&relative, &roots),
            Err(Refusal::Unplaced {
                side: Side::Peer,
                ..
            })
        ));
        let dotdot = socket(named("/gone/../w/s.sock", None), None);
        assert!(matches!(
            judge(&dotdot, &roots),
            Err(Refusal::Unplaced {
                side: Side::Own,
                ..
            })
        ));
    }

    #[test]
    fn a_tcp_port_that_port_relays_is_refused() {
        let client = TcpPorts {
            own: 40_000,
            peer: Some(8080),
        };
        assert_eq!(
            judge_tcp(client, &[8080]),
            Err(Refusal::Relayed {
                side: Side::Peer,
                port: 8080
            })
        );
        assert_eq!(judge_tcp(client, &[]), Ok(()));
        assert_eq!(judge_tcp(client, &[8081]), Ok(()));
        let accepted = TcpPorts {
            own: 8080,
            peer: Some(40_000),
        };
        assert!(matches!(
            judge_tcp(accepted, &[8080]),
            Err(Refusal::Relayed {
                side: Side::Own,
                ..
            })
        ));
    }

    #[test]
    fn the_mechanism_reads_a_socketpair_and_a_bound_peer() {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
        use std::os::fd::AsRawFd;
        let (a, _b) = socketpair(
            AddressFamily::Unix,
            SockType::Datagram,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let pair = unix_socket_of(a.as_raw_fd()).unwrap();
        assert_eq!(pair, socket(UnixName::Unnamed, Some(UnixName::Unnamed)));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.sock");
        let _reader = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let writer = std::os::unix::net::UnixDatagram::unbound().unwrap();
        writer.connect(&path).unwrap();
        let seen = unix_socket_of(writer.as_raw_fd()).unwrap();
        let resolved = std::fs::canonicalize(dir.path()).unwrap().join("r.sock");
        assert_eq!(
            seen.peer,
            Some(named(path.to_str().unwrap(), resolved.to_str()))
        );
        let (id, links, at) = file_at(&resolved);
        assert_eq!((links, at), (1, Some(resolved.clone())));
        assert_ne!(id.1, 0);
        // TCP: the listener's port is the client's peer port.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        match socket_of(client.as_raw_fd()) {
            Some(SocketFacts::Tcp(ports)) => assert_eq!(ports.peer, Some(port)),
            other => panic!("{other:?}"),
        }
        // Not a socket: a pipe.
        let (r, _w) = nix::unistd::pipe().unwrap();
        assert_eq!(unix_socket_of(r.as_raw_fd()), None);
    }
}
