//! Cgroup eBPF programs: the network filter (the second wall of DESIGN.md
//! section 4), the unix-socket path policy, and event capture for the
//! effect log (DESIGN.md sections 5 and 6).
//!
//! [`attach_with`] loads the embedded eBPF object (built by `build.rs` from
//! the `tartaros-ebpf` crate, or taken from `TARTAROS_EBPF_OBJECT`), fills
//! its maps and attaches:
//! - `sock_create`, `connect4`, `connect6`, `sendmsg4`, `sendmsg6` to the
//!   run's cgroup v2 directory (always);
//! - `unix_connect`, `unix_sendmsg` to the cgroup (`unix_policy`);
//! - `sock_ops` to the cgroup (`transparent_port`): with it, `connect4` /
//!   `connect6` rewrite a TCP connect to a destination that is not granted
//!   to the transparent proxy on loopback instead of refusing it, and
//!   [`CgroupPrograms::original_dst`] gives the proxy the destination;
//! - `sched_process_exec` / `_fork` / `_exit` (tp_btf) and `sys_exit`
//!   (raw_tracepoint), which run host-wide and filter on the cgroup id
//!   (`capture`).
//!
//! Every program is attached with a BPF link. A link lives as long as its
//! file descriptor: dropping [`CgroupPrograms`], or the supervisor dying,
//! detaches the programs; no link is pinned. (A plain root run's unix
//! programs and their maps are pinned, unattached, in the pin cache:
//! `pin_cache.rs`.)
//!
//! Attach the programs *before* any process joins the cgroup: they are
//! attached one after another, and a process already inside could use the
//! short window between them.
//!
//! Records arrive on one ring buffer: [`CgroupPrograms::take_events`] for
//! the raw records ([`ConnectEvent`] only, unless capture is on), or
//! [`CgroupPrograms::take_event_source`] and [`forward_events`] to turn
//! them into effect-log records.

mod decode;
pub use error::EbpfError;
mod early_ring;
mod elf;
mod error;
mod options;
pub use options::{AttachOptions, ConnectGrant, OWN_ALLOW_ENTRIES, UNUSED_MAP_ENTRIES};
mod attach_steps;
mod kbtf;
mod layout_cache;
mod load;
mod original_dst;
mod pin_cache;
mod pin_checks;
mod pin_full;
mod pin_sys;
pub use pin_cache::{PIN_LOCK, PIN_ROOT, PinCacheError, drop_cache};
mod preload;
pub use preload::{Preload, preload};
mod program_types;
mod rawprog;
mod register;
mod ring_reader;
pub mod shared;
mod targets;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aya::maps::{PerCpuHashMap, RingBuf};
use aya::util::KernelVersion;

use original_dst::{OriginalDstMap, OwnerMap};
pub use program_types::probe_program_types;
pub use ring_reader::{CaptureStats, EventSource, forward, forward_events};
pub use tartaros_common::{AllowKey, ConnectEvent, SavedDst, TransparentKey, kind, verdict};

/// The eBPF object, embedded at build time.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tartaros"));
/// Its SHA-256 (hex), written by `build.rs`: names the pin cache.
static EBPF_DIGEST: &str = include_str!(concat!(env!("OUT_DIR"), "/tartaros.sha256"));

/// Names of the filter programs in the object.
pub const SOCK_ADDR_PROGRAMS: [&str; 4] = ["connect4", "connect6", "sendmsg4", "sendmsg6"];
/// Name of the socket-creation program in the object.
pub const SOCK_CREATE_PROGRAM: &str = "sock_create";
/// Name of the sock_ops program (transparent interception).
pub const SOCK_OPS_PROGRAM: &str = "sock_ops";
/// The cgroup programs of the network filter, in attach order after
/// `sock_ops`: socket creation first, then the destination checks.
const FILTER_PROGRAMS: [load::CgroupProgram; 5] = [
    cgroup_program(
        SOCK_CREATE_PROGRAM,
        rawprog::PROG_TYPE_CGROUP_SOCK,
        rawprog::ATTACH_INET_SOCK_CREATE,
    ),
    cgroup_program(
        SOCK_ADDR_PROGRAMS[0],
        rawprog::PROG_TYPE_CGROUP_SOCK_ADDR,
        rawprog::ATTACH_INET4_CONNECT,
    ),
    cgroup_program(
        SOCK_ADDR_PROGRAMS[1],
        rawprog::PROG_TYPE_CGROUP_SOCK_ADDR,
        rawprog::ATTACH_INET6_CONNECT,
    ),
    cgroup_program(
        SOCK_ADDR_PROGRAMS[2],
        rawprog::PROG_TYPE_CGROUP_SOCK_ADDR,
        rawprog::ATTACH_UDP4_SENDMSG,
    ),
    cgroup_program(
        SOCK_ADDR_PROGRAMS[3],
        rawprog::PROG_TYPE_CGROUP_SOCK_ADDR,
        rawprog::ATTACH_UDP6_SENDMSG,
    ),
];
const SOCK_OPS: load::CgroupProgram = cgroup_program(
    SOCK_OPS_PROGRAM,
    rawprog::PROG_TYPE_SOCK_OPS,
    rawprog::ATTACH_SOCK_OPS,
);

const fn cgroup_program(
    name: &'static str,
    prog_type: u32,
    attach_type: u32,
) -> load::CgroupProgram {
    load::CgroupProgram {
        name,
        prog_type,
        attach_type,
    }
}
/// The capture programs, `tp_btf` all, named after their tracepoint.
pub const TP_BTF_PROGRAMS: [&str; 5] = kbtf::TP_BTF;
/// The unix policy programs and their attach types.
const UNIX_PROGRAMS: [load::CgroupProgram; 2] = [
    cgroup_program(
        "unix_connect",
        rawprog::PROG_TYPE_CGROUP_SOCK_ADDR,
        rawprog::ATTACH_UNIX_CONNECT,
    ),
    cgroup_program(
        "unix_sendmsg",
        rawprog::PROG_TYPE_CGROUP_SOCK_ADDR,
        rawprog::ATTACH_UNIX_SENDMSG,
    ),
];

/// Ring buffer size of [`AttachOptions::default`]: 8 MiB holds ~24,000
/// file records (352 bytes each) while the reader is descheduled.
pub const DEFAULT_RING_BYTES: u32 = 8 << 20;

/// Oldest kernel with everything [`attach`] relies on: BPF links for cgroup
/// programs (5.7; without them a legacy attachment would outlive the
/// supervisor) and ring buffers (5.8).
const MIN_KERNEL: (u8, u8) = (5, 8);
/// First kernel with the unix sock_addr hooks.
const UNIX_KERNEL: (u8, u8) = (6, 7);

/// Where a connection the transparent proxy accepted was originally going
/// (see [`CgroupPrograms::original_dst`]); `None` refuses the connection.
pub type OriginalDst = Arc<dyn Fn(&tokio::net::TcpStream) -> Option<SocketAddr> + Send + Sync>;

/// One run's programs: its entries in the maps, and (for a run that loaded
/// its own object) the programs attached to its cgroup. Dropping it
/// detaches them and removes the entries.
pub struct CgroupPrograms {
    /// BPF link descriptors: closing one detaches its program. Empty for a
    /// run registered with programs another process attached
    /// ([`shared`]).
    links: Vec<(&'static str, OwnedFd)>,
    /// The port-keyed map of intercepted connects (own fd), with
    /// `transparent_port`.
    transparent: Option<Arc<OriginalDstMap>>,
    /// Who opened each accepted TCP connection (own fd), with capture.
    owners: Option<Arc<OwnerMap>>,
    object: load::Object,
    run: register::Registered,
    /// The run's ring buffer until it is taken.
    ring: Option<RingBuf<aya::maps::MapData>>,
    cgroup: PathBuf,
    capture: bool,
    tags: Vec<String>,
    attach_time: Duration,
    /// The tracing programs (capture), and how often the kernel had skipped
    /// them when the run started.
    tracing: Option<Vec<OwnedFd>>,
    skipped_at_start: Option<u64>,
    /// The pin of the shared `EVENTS`, for a run of the pin cache's object
    /// ([`CgroupPrograms::leave_ring`]).
    events_pin: Option<PathBuf>,
    /// The size of the run's ring (0: none).
    ring_bytes: u32,
}

/// A run's ring left in the pin cache's `EVENTS` for its janitor
/// ([`CgroupPrograms::leave_ring`], [`retire_pinned_ring`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftRing {
    /// The pin of that `EVENTS`.
    pub pin: PathBuf,
    pub key: u64,
    pub bytes: u32,
}

impl Drop for CgroupPrograms {
    fn drop(&mut self) {
        // Programs first, then the entries they read.
        self.links.clear();
        register::unregister(&mut self.object, &self.run);
    }
}

impl std::fmt::Debug for CgroupPrograms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CgroupPrograms")
            .field("cgroup", &self.cgroup)
            .field("programs", &self.programs().collect::<Vec<_>>())
            .field("capture", &self.capture)
            .field("attach_time", &self.attach_time)
            .finish_non_exhaustive()
    }
}

/// Loads the filter, allows exactly `grants`, and attaches the network
/// filter to the cgroup v2 directory `cgroup_dir` (no capture, no unix
/// policy, a 256 KiB ring buffer).
pub fn attach(cgroup_dir: &Path, grants: &[ConnectGrant]) -> Result<CgroupPrograms, EbpfError> {
    attach_with(
        cgroup_dir,
        &AttachOptions {
            grants: grants.to_vec(),
            ring_bytes: tartaros_common::EVENTS_BYTES,
            ..AttachOptions::default()
        },
    )
}

/// Installs what `options` asks for for the run whose cgroup v2 directory
/// is `cgroup_dir`: registered with the programs the service keeps
/// attached, when this process was handed them ([`shared::adopt_from_env`]);
/// otherwise the object is loaded and its programs attached to the
/// cgroup. Fails (installing nothing) if any part cannot be installed;
/// [`EbpfError::UnixHooksUnsupported`] and [`EbpfError::CaptureUnsupported`]
/// / [`EbpfError::AttachTracing`] let the caller retry without that part
/// and report it as degraded.
pub fn attach_with(
    cgroup_dir: &Path,
    options: &AttachOptions,
) -> Result<CgroupPrograms, EbpfError> {
    attach_preloaded(cgroup_dir, options, None)
}

/// [`attach_with`], taking what [`preload`] prepared when it was prepared
/// for the same parts.
pub fn attach_preloaded(
    cgroup_dir: &Path,
    options: &AttachOptions,
    preload: Option<Preload>,
) -> Result<CgroupPrograms, EbpfError> {
    let started = Instant::now();
    if let Some(result) = shared::register_adopted(cgroup_dir, options, started) {
        return result;
    }
    let level = load::cgroup_level(cgroup_dir);
    let mut prepared = match preload.and_then(|p| p.take(options)) {
        Some(prepared) => prepared?,
        None => preload::prepare(options, Some(level))?,
    };
    if prepared.pins.level().is_some_and(|l| l != level) {
        // The cache was opened for another level than the cgroup has.
        drop(prepared);
        prepared = preload::prepare(options, Some(level))?;
    }
    let reused = matches!(prepared.pins, pin_cache::Pins::Reused { .. });
    match attach_steps::attach_prepared(prepared, cgroup_dir, options, level) {
        // The shared maps of the cache are full (`MAX_RUNS` runs at once)
        // or refused this run: it gets programs and maps of its own.
        Err(_) if reused => {
            let fresh = preload::prepare(options, None)?;
            attach_steps::attach_prepared(fresh, cgroup_dir, options, level)
        }
        attached => attached,
    }
}

/// Takes the ring under `key` out of the pinned `EVENTS` at `pin`; waits
/// for a grace period. A pin or key that is not there is no error.
fn remove_pinned_ring(pin: &Path, key: u64) {
    if let Ok(events) = pin_sys::get(pin) {
        shared::remove_ring(&events, key);
    }
}

/// After a run, in its janitor: takes the ring the run left out of the
/// pin cache's `EVENTS` and puts a fresh spare of its size in for a run
/// to come (`pin_full.rs`). Waits for two grace periods.
pub fn retire_pinned_ring(left: &LeftRing) {
    remove_pinned_ring(&left.pin, left.key);
    if left.bytes != 0 {
        pin_full::add_spare(&left.pin, left.bytes);
    }
}

/// Starts making the capture's ring buffer of `bytes` ready on a thread,
/// in the service's maps when this process adopted them. Optional; call
/// it early in a `--log` run. A ring put into the pin cache's `EVENTS` is
/// given to `announce` first: the caller has it taken out after the run
/// ([`retire_pinned_ring`], the janitor), also when the run never gets
/// to use it.
pub fn prepare_ring(bytes: u32, announce: &mut dyn FnMut(&LeftRing)) {
    shared::prepare_ring(bytes, announce);
}

/// Starts reading the structure offsets and tracepoint ids that capture
/// and the unix policy need (the kernel BTF pass, ~9 ms when not cached) on
/// a background thread, so a later [`attach_with`] does not wait for it.
/// Cached (every run after the first since boot), they are read here: a
/// file of under 1 KiB costs less than starting a thread, which on a busy
/// host may wait milliseconds for a CPU while the preload waits for it.
/// Optional; call it early at start-up. If the thread cannot be spawned,
/// attach does the work itself.
pub fn warm_up_capture() {
    if load::kernel_layout_ready() || load::kernel_layout_from_cache() {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("ebpf-warm-up-btf".into())
        .spawn(load::kernel_layout);
}

impl CgroupPrograms {
    /// For a run of the pin cache's programs: the pin of their `EVENTS`
    /// and the key of this run's ring in it, which this handle will then
    /// not take out of it (that waits for an RCU grace period, 8-12 ms on
    /// the 2-core VM, on the way out of every `--log` run): the caller has
    /// the janitor do it once the run is over ([`remove_pinned_ring`]).
    pub fn leave_ring(&mut self) -> Option<LeftRing> {
        let pin = self.events_pin.clone()?;
        Some(LeftRing {
            pin,
            key: self.run.leave_ring()?,
            bytes: self.ring_bytes,
        })
    }

    /// The cgroup directory the programs are attached to.
    pub fn cgroup(&self) -> &Path {
        &self.cgroup
    }

    /// The cgroup's id (inode of its directory), as events carry it.
    pub fn cgroup_id(&self) -> u64 {
        self.run.id
    }

    /// How long the attach took (object load, verification, attachment).
    pub fn attach_time(&self) -> Duration {
        self.attach_time
    }

    /// Names of the attached programs.
    pub fn programs(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.links.iter().map(|(n, _)| *n)
    }

    /// `name:tag` of every attached program (the kernel's tag, a hash of
    /// the loaded instructions), for the effect log's genesis record.
    pub fn program_tags(&self) -> Vec<String> {
        self.tags.clone()
    }

    /// Whether the capture programs are attached.
    pub fn captures(&self) -> bool {
        self.capture
    }

    /// With capture: how often since the run started the kernel skipped a
    /// capture program because it was already running on that CPU (its
    /// `recursion_misses`). Each skip is an event no record holds. The
    /// probes run with preemption disabled (the syscall tracepoints, made
    /// faultable in Linux 6.14, disable it around BPF), so none is
    /// expected: this is what says so if a kernel ever does otherwise.
    /// Counted for the programs, not the run: through the service, another
    /// run's skips count too. `None`: without capture, or a counter cannot
    /// be read.
    pub fn skipped_events(&self) -> Option<u64> {
        if !self.capture {
            return None;
        }
        let now = attach_steps::skipped(self.tracing.as_ref()?)?;
        Some(now.saturating_sub(self.skipped_at_start?))
    }

    /// With `transparent_port`: the lookup the transparent proxy
    /// (`crate::proxy::serve_transparent`) calls on each accepted
    /// connection. It takes the connection's peer port (the client's local
    /// port), removes the entry saved for it and returns the destination the
    /// client asked for; `None` (no entry: not an intercepted connect, or
    /// the entry aged out) makes the proxy refuse the connection. The
    /// closure keeps its own handle on the map, so it stays usable after
    /// the programs are detached (it then finds nothing new).
    pub fn original_dst(&self) -> Option<OriginalDst> {
        let map = self.transparent.clone()?;
        Some(Arc::new(move |stream: &tokio::net::TcpStream| {
            map.take(crate::events::ConnectionEnds::of(stream)?)
        }))
    }

    /// With capture: the host pid of the process that opened the TCP
    /// connection whose client (the accepted connection's peer) is at the
    /// given address, as `connect4` / `connect6` saw it in the connecting
    /// task. `None` when unknown (the entry aged out, or not a sandbox
    /// connection).
    pub fn connection_owner(&self) -> Option<crate::events::ConnectionOwner> {
        let map = self.owners.clone()?;
        Some(Arc::new(move |ends| map.owner(ends)))
    }

    /// Allows one more destination, effective for the next connect / send.
    pub fn allow(&mut self, grant: ConnectGrant) -> Result<(), EbpfError> {
        register::insert_grant(&mut self.object, &mut self.run, grant)
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
        register::set_filter_mode(&mut self.object, &mut self.run, mode)
    }

    /// Takes the event ring buffer (records are [`ConnectEvent`] when
    /// capture is off; decode them with [`parse_event`]). `None` when it was
    /// taken already.
    pub fn take_events(&mut self) -> Option<RingBuf<aya::maps::MapData>> {
        self.ring.take()
    }

    /// Takes the ring buffer together with a handle on the loss counters,
    /// for [`forward_events`]. Fails when the ring buffer was taken already.
    pub fn take_event_source(&mut self) -> Result<EventSource, EbpfError> {
        let mut lost = self.lost_counters()?;
        // The source reads the counters last, after this is dropped.
        lost.remove_when_done = self.run.shared;
        self.run.lost_taken = true;
        let ring = self
            .take_events()
            .ok_or_else(|| EbpfError::MissingInObject {
                what: "the ring buffer (already taken)".into(),
            })?;
        Ok(EventSource::new(ring, lost, self.capture))
    }

    /// A second handle (own fd) on the run's loss counters.
    fn lost_counters(&self) -> Result<ring_reader::LostCounters, EbpfError> {
        let name = tartaros_common::MAP_EVENTS_LOST;
        let err = |source| EbpfError::Map { map: name, source };
        let data =
            load::map_data(&self.object, name).ok_or_else(|| EbpfError::MissingInObject {
                what: format!("map {name}"),
            })?;
        let id = data.info().map_err(err)?.id();
        let data = aya::maps::MapData::from_id(id).map_err(err)?;
        let map = PerCpuHashMap::try_from(aya::maps::Map::PerCpuHashMap(data)).map_err(err)?;
        Ok(ring_reader::LostCounters {
            map,
            run: self.run.id,
            remove_when_done: false,
        })
    }

    /// Total number of events dropped because the ring buffer was full,
    /// summed over kinds and CPUs. Monotonic over the life of the programs.
    pub fn lost_events(&self) -> Result<u64, EbpfError> {
        let counters = self.lost_counters()?;
        let by_kind = ring_reader::read_lost(&counters).map_err(|source| EbpfError::Map {
            map: tartaros_common::MAP_EVENTS_LOST,
            source,
        })?;
        Ok(by_kind.iter().sum())
    }

    /// Detaches every program and removes the run's entries now (dropping
    /// does the same).
    pub fn detach(self) {
        drop(self);
    }
}

/// Decodes one connect-filter record. `None` if it is too short or is not
/// a [`ConnectEvent`] (capture records share the ring buffer).
pub fn parse_event(bytes: &[u8]) -> Option<ConnectEvent> {
    if bytes.len() < size_of::<ConnectEvent>() {
        return None;
    }
    // SAFETY: the slice holds at least size_of::<ConnectEvent>() bytes,
    // `read_unaligned` needs no alignment, and `ConnectEvent` is plain data
    // (integers and a byte array) for which every bit pattern is valid.
    let ev = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<ConnectEvent>()) };
    (!tartaros_common::capture::record::is_capture(ev.kind)).then_some(ev)
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

fn check_kernel() -> Result<KernelVersion, EbpfError> {
    let current = KernelVersion::current().map_err(|e| EbpfError::KernelVersion(e.to_string()))?;
    if current < KernelVersion::new(MIN_KERNEL.0, MIN_KERNEL.1, 0) {
        return Err(EbpfError::KernelTooOld {
            found: format!("{current:?}"),
        });
    }
    Ok(current)
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
