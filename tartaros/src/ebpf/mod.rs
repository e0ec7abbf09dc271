//! Cgroup eBPF network filter: the second wall of DESIGN.md section 4.
//!
//! [`attach`] loads the embedded eBPF object (built by `build.rs` from the
//! `tartaros-ebpf` crate, or taken from `TARTAROS_EBPF_OBJECT`), fills the
//! allow map with the run's grants and attaches `connect4`, `connect6`,
//! `sendmsg4`, `sendmsg6` and `sock_create` to the run's cgroup v2 directory
//! with BPF links. A link lives as long as its file descriptor: dropping
//! [`CgroupPrograms`], or the supervisor dying, detaches the programs; nothing
//! is pinned.
//!
//! Attach the programs *before* any process joins the cgroup: they are
//! attached one after another, and a process already inside could use the
//! short window between them.
//!
//! Each decision is a [`ConnectEvent`] on the ring buffer returned by
//! [`CgroupPrograms::take_events`]; [`CgroupPrograms::lost_events`] counts
//! the events the kernel could not reserve space for.

mod probe;

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use aya::maps::{Array, HashMap, MapData, MapError, PerCpuArray, RingBuf};
use aya::programs::cgroup_sock::CgroupSockLink;
use aya::programs::cgroup_sock_addr::CgroupSockAddrLink;
use aya::programs::links::Link as _;
use aya::programs::{CgroupAttachMode, CgroupSock, CgroupSockAddr, ProgramError};
use aya::util::KernelVersion;
use aya::{Ebpf, EbpfLoader};

pub use probe::probe_program_types;
pub use tartaros_common::{AllowKey, ConnectEvent, kind, verdict};

/// The eBPF object, embedded at build time.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tartaros"));

/// Names of the filter programs in the object.
pub const SOCK_ADDR_PROGRAMS: [&str; 4] = ["connect4", "connect6", "sendmsg4", "sendmsg6"];
/// Name of the socket-creation program in the object.
pub const SOCK_CREATE_PROGRAM: &str = "sock_create";

/// Oldest kernel with everything [`attach`] relies on: BPF links for cgroup
/// programs (5.7; without them a legacy attachment would outlive the
/// supervisor) and ring buffers (5.8).
const MIN_KERNEL: (u8, u8) = (5, 8);

/// Errors of the eBPF filter.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error(
        "failed to open the cgroup directory {path}: {source}; pass an existing cgroup v2 directory (e.g. under /sys/fs/cgroup/unified on hybrid hosts)"
    )]
    OpenCgroup {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to determine the kernel version: {0}; is /proc/sys/kernel/osrelease readable?")]
    KernelVersion(String),
    #[error(
        "failed to attach the network filter: kernel {found} is older than {}.{}, which cgroup BPF links and ring buffers need; upgrade the kernel or run without the eBPF filter",
        MIN_KERNEL.0, MIN_KERNEL.1
    )]
    KernelTooOld { found: String },
    #[error(
        "failed to parse the embedded eBPF object: {source}; rebuild tartaros (or check TARTAROS_EBPF_OBJECT points to an object built from this tree)"
    )]
    LoadObject {
        #[source]
        source: Box<aya::EbpfError>,
    },
    #[error(
        "failed to find {what} in the eBPF object; it was built from another version of tartaros-ebpf: rebuild, or fix TARTAROS_EBPF_OBJECT"
    )]
    MissingInObject { what: String },
    #[error(
        "failed to use the eBPF map {map}: {source}; rebuild tartaros so the object and the supervisor agree"
    )]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error(
        "failed to load the eBPF program {program} into the kernel: {source}; run as root (or with CAP_BPF and CAP_NET_ADMIN) and check `tartaros doctor`"
    )]
    LoadProgram {
        program: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error(
        "failed to attach the eBPF program {program} to the cgroup {path}: {source}; the directory must be a cgroup v2 directory and the process needs CAP_NET_ADMIN"
    )]
    AttachProgram {
        program: &'static str,
        path: PathBuf,
        #[source]
        source: ProgramError,
    },
    #[error(
        "failed to detach the eBPF program {program} from the cgroup {path}: {source}; it is detached anyway when the supervisor exits"
    )]
    Detach {
        program: &'static str,
        path: PathBuf,
        #[source]
        source: ProgramError,
    },
}

/// A destination the sandboxed processes may connect or send to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnectGrant {
    pub addr: IpAddr,
    pub port: u16,
}

impl ConnectGrant {
    /// The allow-map key for this grant. An IPv4-mapped IPv6 address is
    /// stored as the IPv4 address it maps to, matching how the programs
    /// judge `::ffff:a.b.c.d`.
    pub fn key(&self) -> AllowKey {
        match self.addr {
            IpAddr::V4(a) => AllowKey::v4(a.octets(), self.port),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => AllowKey::v4(v4.octets(), self.port),
                None => AllowKey::v6(a.octets(), self.port),
            },
        }
    }
}

/// One attached link. Dropping it detaches the program from the cgroup.
enum Attached {
    SockAddr(CgroupSockAddrLink),
    Sock(CgroupSockLink),
}

impl Attached {
    fn detach(self) -> Result<(), ProgramError> {
        match self {
            Self::SockAddr(link) => link.detach(),
            Self::Sock(link) => link.detach(),
        }
    }
}

/// The filter programs attached to one cgroup. Dropping it detaches them.
pub struct CgroupPrograms {
    // Field order matters: links are dropped (detached) before the object.
    links: Vec<(&'static str, Attached)>,
    ebpf: Ebpf,
    cgroup: PathBuf,
    attach_time: Duration,
}

impl std::fmt::Debug for CgroupPrograms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CgroupPrograms")
            .field("cgroup", &self.cgroup)
            .field(
                "programs",
                &self.links.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            )
            .field("attach_time", &self.attach_time)
            .finish_non_exhaustive()
    }
}

/// Loads the filter, allows exactly `grants`, and attaches every program to
/// the cgroup v2 directory `cgroup_dir` with BPF links.
pub fn attach(cgroup_dir: &Path, grants: &[ConnectGrant]) -> Result<CgroupPrograms, EbpfError> {
    let started = Instant::now();
    check_kernel()?;
    let cgroup = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(cgroup_dir)
        .map_err(|source| EbpfError::OpenCgroup {
            path: cgroup_dir.to_path_buf(),
            source,
        })?;

    let mut ebpf = load_object()?;
    fill_maps(&mut ebpf, grants)?;

    let mut links = Vec::with_capacity(SOCK_ADDR_PROGRAMS.len() + 1);
    // Socket creation first, then the destination checks.
    links.push((
        SOCK_CREATE_PROGRAM,
        attach_sock(&mut ebpf, SOCK_CREATE_PROGRAM, &cgroup, cgroup_dir)?,
    ));
    for name in SOCK_ADDR_PROGRAMS {
        links.push((
            name,
            attach_sock_addr(&mut ebpf, name, &cgroup, cgroup_dir)?,
        ));
    }
    Ok(CgroupPrograms {
        links,
        ebpf,
        cgroup: cgroup_dir.to_path_buf(),
        attach_time: started.elapsed(),
    })
}

impl CgroupPrograms {
    /// The cgroup directory the programs are attached to.
    pub fn cgroup(&self) -> &Path {
        &self.cgroup
    }

    /// How long [`attach`] took (object load, verification, attachment).
    pub fn attach_time(&self) -> Duration {
        self.attach_time
    }

    /// Names of the attached programs.
    pub fn programs(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.links.iter().map(|(n, _)| *n)
    }

    /// Allows one more destination, effective for the next connect / send.
    pub fn allow(&mut self, grant: ConnectGrant) -> Result<(), EbpfError> {
        insert_grants(&mut self.ebpf, &[grant])
    }

    /// Switches between enforcing (the default after [`attach`]) and
    /// monitoring, where every destination passes but events are still
    /// emitted with the verdict `ALLOW_MONITOR`.
    pub fn set_enforcing(&mut self, enforcing: bool) -> Result<(), EbpfError> {
        let mode = if enforcing {
            tartaros_common::FILTER_ENFORCE
        } else {
            tartaros_common::FILTER_MONITOR
        };
        set_filter_mode(&mut self.ebpf, mode)
    }

    /// Takes the event ring buffer (records are [`ConnectEvent`]; decode
    /// them with [`parse_event`]). `None` when it was taken already.
    pub fn take_events(&mut self) -> Option<RingBuf<MapData>> {
        let map = self.ebpf.take_map(tartaros_common::MAP_EVENTS)?;
        RingBuf::try_from(map).ok()
    }

    /// Total number of events dropped because the ring buffer was full,
    /// summed over CPUs. Monotonic over the life of the programs.
    pub fn lost_events(&self) -> Result<u64, EbpfError> {
        let name = tartaros_common::MAP_EVENTS_LOST;
        let map = self
            .ebpf
            .map(name)
            .ok_or_else(|| EbpfError::MissingInObject {
                what: format!("map {name}"),
            })?;
        let counters = PerCpuArray::<_, u64>::try_from(map)
            .map_err(|source| EbpfError::Map { map: name, source })?;
        let values = counters
            .get(&0, 0)
            .map_err(|source| EbpfError::Map { map: name, source })?;
        Ok(values.iter().sum())
    }

    /// Detaches every program now and reports the first failure (dropping
    /// detaches too, silently).
    pub fn detach(mut self) -> Result<(), EbpfError> {
        let mut first_error = None;
        for (program, link) in self.links.drain(..) {
            if let Err(source) = link.detach()
                && first_error.is_none()
            {
                first_error = Some(EbpfError::Detach {
                    program,
                    path: self.cgroup.clone(),
                    source,
                });
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Decodes one ring-buffer record. `None` if it is too short.
pub fn parse_event(bytes: &[u8]) -> Option<ConnectEvent> {
    if bytes.len() < size_of::<ConnectEvent>() {
        return None;
    }
    // SAFETY: the slice holds at least size_of::<ConnectEvent>() bytes,
    // `read_unaligned` needs no alignment, and `ConnectEvent` is plain data
    // (integers and a byte array) for which every bit pattern is valid.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<ConnectEvent>()) })
}

/// Destination of a connect / sendmsg event. `None` for socket-creation
/// events and for families other than IPv4 / IPv6.
pub fn event_destination(ev: &ConnectEvent) -> Option<SocketAddr> {
    if ev.kind == kind::SOCK_CREATE {
        return None;
    }
    let ip = match ev.family {
        tartaros_common::AF_INET => IpAddr::V4(Ipv4Addr::new(
            ev.addr[0], ev.addr[1], ev.addr[2], ev.addr[3],
        )),
        tartaros_common::AF_INET6 => IpAddr::V6(Ipv6Addr::from(ev.addr)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, ev.port))
}

fn check_kernel() -> Result<(), EbpfError> {
    let current = KernelVersion::current().map_err(|e| EbpfError::KernelVersion(e.to_string()))?;
    if current < KernelVersion::new(MIN_KERNEL.0, MIN_KERNEL.1, 0) {
        return Err(EbpfError::KernelTooOld {
            found: format!("{current:?}"),
        });
    }
    Ok(())
}

/// The loader, shared by every [`attach`] of this process.
///
/// `EbpfLoader::new()` always parses the kernel's BTF (/sys/kernel/btf/vmlinux,
/// 8-20 ms, most of the attach time), although the cgroup programs need no
/// CO-RE relocations. Creating the loader once per process, optionally
/// ahead of time on another thread ([`warm_up`]), takes that off the
/// start-up path. The parsed BTF is dropped right away (`btf(None)`).
static LOADER: OnceLock<Mutex<EbpfLoader<'static>>> = OnceLock::new();

fn loader() -> &'static Mutex<EbpfLoader<'static>> {
    LOADER.get_or_init(|| {
        let mut loader = EbpfLoader::new();
        loader.btf(None);
        Mutex::new(loader)
    })
}

/// Starts preparing the eBPF loader on a background thread so a later
/// [`attach`] does not pay for it. Optional; call it early at start-up.
pub fn warm_up() {
    if LOADER.get().is_none() {
        // If the thread cannot be spawned, `attach` does the work itself.
        let _ = std::thread::Builder::new()
            .name("ebpf-warm-up".into())
            .spawn(|| {
                loader();
            });
    }
}

/// Parses the embedded object and creates its maps.
fn load_object() -> Result<Ebpf, EbpfError> {
    // A poisoned lock only means another attach panicked; the loader holds
    // no state that a panic could leave inconsistent.
    let mut loader = loader().lock().unwrap_or_else(PoisonError::into_inner);
    loader.load(EBPF_OBJECT).map_err(|e| EbpfError::LoadObject {
        source: Box::new(e),
    })
}

fn fill_maps(ebpf: &mut Ebpf, grants: &[ConnectGrant]) -> Result<(), EbpfError> {
    insert_grants(ebpf, grants)?;
    set_filter_mode(ebpf, tartaros_common::FILTER_ENFORCE)
}

fn insert_grants(ebpf: &mut Ebpf, grants: &[ConnectGrant]) -> Result<(), EbpfError> {
    let name = tartaros_common::MAP_ALLOW;
    let map = ebpf
        .map_mut(name)
        .ok_or_else(|| EbpfError::MissingInObject {
            what: format!("map {name}"),
        })?;
    let mut allow = HashMap::<_, AllowKey, u32>::try_from(map)
        .map_err(|source| EbpfError::Map { map: name, source })?;
    for grant in grants {
        allow
            .insert(grant.key(), tartaros_common::ALLOW_VALUE, 0)
            .map_err(|source| EbpfError::Map { map: name, source })?;
    }
    Ok(())
}

fn set_filter_mode(ebpf: &mut Ebpf, mode: u32) -> Result<(), EbpfError> {
    let name = tartaros_common::MAP_FILTER;
    let map = ebpf
        .map_mut(name)
        .ok_or_else(|| EbpfError::MissingInObject {
            what: format!("map {name}"),
        })?;
    let mut filter =
        Array::<_, u32>::try_from(map).map_err(|source| EbpfError::Map { map: name, source })?;
    filter
        .set(tartaros_common::FILTER_MODE_INDEX, mode, 0)
        .map_err(|source| EbpfError::Map { map: name, source })
}

fn attach_sock_addr(
    ebpf: &mut Ebpf,
    name: &'static str,
    cgroup: &File,
    path: &Path,
) -> Result<Attached, EbpfError> {
    let prog: &mut CgroupSockAddr = ebpf
        .program_mut(name)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| EbpfError::MissingInObject {
            what: format!("cgroup_sock_addr program {name}"),
        })?;
    prog.load().map_err(|source| EbpfError::LoadProgram {
        program: name,
        source,
    })?;
    let attach_err = |source| EbpfError::AttachProgram {
        program: name,
        path: path.to_path_buf(),
        source,
    };
    let id = prog
        .attach(cgroup, CgroupAttachMode::Single)
        .map_err(attach_err)?;
    let link = prog.take_link(id).map_err(attach_err)?;
    Ok(Attached::SockAddr(link))
}

fn attach_sock(
    ebpf: &mut Ebpf,
    name: &'static str,
    cgroup: &File,
    path: &Path,
) -> Result<Attached, EbpfError> {
    let prog: &mut CgroupSock = ebpf
        .program_mut(name)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| EbpfError::MissingInObject {
            what: format!("cgroup_sock program {name}"),
        })?;
    prog.load().map_err(|source| EbpfError::LoadProgram {
        program: name,
        source,
    })?;
    let attach_err = |source| EbpfError::AttachProgram {
        program: name,
        path: path.to_path_buf(),
        source,
    };
    let id = prog
        .attach(cgroup, CgroupAttachMode::Single)
        .map_err(attach_err)?;
    let link = prog.take_link(id).map_err(attach_err)?;
    Ok(Attached::Sock(link))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_v6_grant_is_an_ipv4_key() {
        let g = ConnectGrant {
            addr: "::ffff:127.0.0.1".parse().unwrap(),
            port: 80,
        };
        assert_eq!(g.key(), AllowKey::v4([127, 0, 0, 1], 80));
        let g = ConnectGrant {
            addr: "::1".parse().unwrap(),
            port: 80,
        };
        assert_eq!(g.key().family, tartaros_common::AF_INET6);
    }

    #[test]
    fn parse_event_roundtrip() {
        let mut ev = ConnectEvent::ZERO;
        ev.kind = kind::CONNECT4;
        ev.family = tartaros_common::AF_INET;
        ev.port = 8080;
        ev.addr[..4].copy_from_slice(&[127, 0, 0, 1]);
        // SAFETY: ConnectEvent is plain data without padding.
        let bytes = unsafe {
            std::slice::from_raw_parts((&raw const ev).cast::<u8>(), size_of::<ConnectEvent>())
        };
        let back = parse_event(bytes).unwrap();
        assert_eq!(back, ev);
        assert_eq!(
            event_destination(&back),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        assert!(parse_event(&bytes[..10]).is_none());
    }

    #[test]
    fn embedded_object_has_all_programs() {
        let obj = aya_obj_names();
        for name in SOCK_ADDR_PROGRAMS.iter().chain([&SOCK_CREATE_PROGRAM]) {
            assert!(obj.iter().any(|n| n == name), "{name} missing from {obj:?}");
        }
    }

    /// Program names in the embedded object (parsing needs no privileges).
    fn aya_obj_names() -> Vec<String> {
        // Ebpf::load needs privileges to create maps; look for the ELF
        // section names instead.
        let text = String::from_utf8_lossy(EBPF_OBJECT);
        SOCK_ADDR_PROGRAMS
            .iter()
            .chain([&SOCK_CREATE_PROGRAM])
            .filter(|n| text.contains(&format!("cgroup/{n}")))
            .map(|n| (*n).to_owned())
            .collect()
    }
}
