//! Maps and helpers shared by every program.

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext as _,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_uid_gid, bpf_probe_read_kernel,
        generated::{
            bpf_get_attach_cookie, bpf_get_current_ancestor_cgroup_id, bpf_get_current_cgroup_id,
            bpf_get_current_task, bpf_ktime_get_ns, bpf_map_lookup_elem, bpf_ringbuf_output,
            bpf_ringbuf_query, bpf_ringbuf_reserve, bpf_ringbuf_submit,
        },
    },
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuHashMap, RingBuf},
    programs::BtfTracePointContext,
};
use tartaros_common::{
    ALLOW_MAX_ENTRIES, AllowKey, CONN_MAX_ENTRIES, CONN_QUOTA_USERS, ConnOwner, MAP_NO_PREALLOC,
    MAX_RUNS, SavedDst, TPROXY_MAX_ENTRIES, TransparentKey,
    capture::{EventHeader, LEVEL_UNKNOWN, LOST_SLOTS, RunConfig, UnixAllow, feature, flag},
};

/// Every run's granted destinations (the key names the run).
#[map(name = "ALLOW")]
pub static ALLOW: HashMap<AllowKey, u32> =
    HashMap::with_max_entries(ALLOW_MAX_ENTRIES, MAP_NO_PREALLOC);

/// Original destinations of intercepted connects, by socket cookie
/// (written by `connect4` / `connect6`, moved by `sock_ops`).
#[map(name = "TPROXY_COOKIE")]
pub static TPROXY_COOKIE: LruHashMap<u64, SavedDst> =
    LruHashMap::with_max_entries(TPROXY_MAX_ENTRIES, 0);

/// The same, by run and connection (`TransparentKey`; read and deleted by the
/// proxy, deleted by `sock_ops` when the client socket closes). A plain
/// hash, like every map by connection: in the service's object all runs
/// share it, and an LRU let one user's flood evict another's entries
/// (adversarial round 22b). What bounds it is the per-user quota
/// ([`CONN_QUOTA`]).
#[map(name = "TPROXY_PORT")]
pub static TPROXY_PORT: HashMap<TransparentKey, SavedDst> =
    HashMap::with_max_entries(CONN_MAX_ENTRIES, MAP_NO_PREALLOC);

/// Who opened each TCP connection the connect programs let through:
/// socket cookie to run and thread-group id (written by `connect4` /
/// `connect6` in the caller's context, moved by `sock_ops`).
#[map(name = "OWNER_COOKIE")]
pub static OWNER_COOKIE: LruHashMap<u64, ConnOwner> =
    LruHashMap::with_max_entries(TPROXY_MAX_ENTRIES, 0);

/// The same by run and connection (`TransparentKey`), which the
/// relays, the proxy and the broker see as the peer of an accepted
/// connection (a plain hash, see [`TPROXY_PORT`]).
#[map(name = "OWNER_PORT")]
pub static OWNER_PORT: HashMap<TransparentKey, u32> =
    HashMap::with_max_entries(CONN_MAX_ENTRIES, MAP_NO_PREALLOC);

/// Every live gateway connection that has entries in the maps by
/// connection, by socket cookie: made by `sock_ops` with them, removed
/// when the socket closes (its state callback), so every entry counted in
/// [`CONN_QUOTA`] is given back exactly once, whatever evicts nothing.
#[map(name = "CONN_LIVE")]
pub static CONN_LIVE: HashMap<u64, ConnOwner> =
    HashMap::with_max_entries(CONN_MAX_ENTRIES, MAP_NO_PREALLOC);

/// Live gateway connections per user (uid on the host), added to and
/// taken from atomically by `sock_ops`; a user at
/// `CONN_QUOTA_PER_USER` gets no new entry.
#[map(name = "CONN_QUOTA")]
pub static CONN_QUOTA: HashMap<u32, i64> =
    HashMap::with_max_entries(CONN_QUOTA_USERS, MAP_NO_PREALLOC);

/// Every run's ring buffer (Linux 5.8), by `RunConfig::ring`. Declared as a hash map
/// of `u32` because the toolchain has no map-in-map type: the loader
/// creates it as `BPF_MAP_TYPE_HASH_OF_MAPS` of ring buffers (Linux 5.10),
/// so a lookup gives the inner ring (see [`Ring`]).
#[map(name = "EVENTS")]
pub static EVENTS: HashMap<u64, u32> = HashMap::with_max_entries(MAX_RUNS, 0);

/// The ring buffer of the one run of an object loaded for that run alone
/// (a root run without the service): no map of maps, whose every update
/// waits for an RCU grace period. Resized at load time.
#[map(name = "RING")]
pub static RING: RingBuf = RingBuf::with_byte_size(4096, 0);

/// Non-zero in an object shared by many runs (the service's): each run's
/// ring is then in [`EVENTS`]; zero in a run's own object, whose ring is
/// [`RING`]. Set by the loader in the frozen `.rodata`, so the verifier
/// knows it and walks one branch only.
#[unsafe(no_mangle)]
static RINGS_SHARED: u32 = 0;

/// Non-zero in the pin cache's object, whose tracing programs every root
/// run attaches itself with its run id as the link's BPF cookie: an
/// invocation through another run's link is not this run's (or each of
/// two runs would record the other's events too). Zero in a run's own
/// object and the service's (attached once for every run). In the frozen
/// `.rodata`, so the verifier walks one branch: an object with zero never
/// calls `bpf_get_attach_cookie`, which tracing programs of a raw
/// tracepoint only have since Linux 6.10.
#[unsafe(no_mangle)]
static ATTACH_COOKIES: u32 = 0;

/// Failed reservations per run and effect kind: the kernel keeps no drop
/// counter for ring buffers. Per-CPU slot arrays, so user space reads
/// every kind of every CPU with one lookup; the loader inserts a run's
/// zeroed entry before the run starts.
#[map(name = "EVENTS_LOST")]
pub static EVENTS_LOST: PerCpuHashMap<u64, [u64; LOST_SLOTS]> =
    PerCpuHashMap::with_max_entries(MAX_RUNS, MAP_NO_PREALLOC);

/// Every run's configuration, by run id.
#[map(name = "RUNS")]
pub static RUNS: HashMap<u64, RunConfig> = HashMap::with_max_entries(MAX_RUNS, MAP_NO_PREALLOC);

/// The level of every run's cgroup in the v2 hierarchy, or
/// `LEVEL_UNKNOWN` (a run is then the task's own cgroup).
#[map(name = "RUN_LEVEL")]
pub static RUN_LEVEL: Array<u32> = Array::with_max_entries(1, 0);

/// Every run's unix socket policy, by run id.
#[map(name = "UNIX_ALLOW")]
pub static UNIX_ALLOW: HashMap<u64, UnixAllow> =
    HashMap::with_max_entries(MAX_RUNS, MAP_NO_PREALLOC);

/// The run the current task belongs to: its id and configuration.
#[derive(Clone, Copy)]
pub struct Run {
    pub id: u64,
    pub cfg: &'static RunConfig,
}

impl Run {
    /// Whether `feature` (a `capture::feature` bit) is installed.
    #[inline(always)]
    pub fn has(&self, feature: u32) -> bool {
        self.cfg.features & feature != 0
    }

    /// Reserves a record of `effect` in this run's ring; counted as lost
    /// when there is no room (or no ring).
    #[inline(always)]
    pub fn reserve<T>(&self, effect: u16) -> Option<(Ring, Entry<T>)> {
        let Some(ring) = Ring::of_run(self.cfg) else {
            count_lost(self.id, effect);
            return None;
        };
        match ring.reserve::<T>() {
            Some(entry) => Some((ring, entry)),
            None => {
                count_lost(self.id, effect);
                None
            }
        }
    }

    /// Copies `value` into this run's ring as one record of `effect`;
    /// counted as lost when there is no room (or no ring). One helper call
    /// where a reservation is a write per field: the verifier walks it once
    /// per state that reaches it, nine in `connect6`.
    #[inline(always)]
    pub fn output<T>(&self, effect: u16, value: &T) {
        let written = Ring::of_run(self.cfg).is_some_and(|ring| ring.output(value));
        if !written {
            count_lost(self.id, effect);
        }
    }
}

/// The current task's run, if it is in one that is captured.
#[inline(always)]
pub fn captured_run() -> Option<Run> {
    run().filter(|r| r.has(feature::CAPTURE))
}

/// [`captured_run`] for a tracing program: `None` also when it was invoked
/// through the link of another run (see [`ATTACH_COOKIES`]).
#[inline(always)]
pub fn captured_run_of(ctx: &BtfTracePointContext) -> Option<Run> {
    let run = captured_run()?;
    // SAFETY: a plain u32 of the frozen `.rodata`.
    let cookies = unsafe { core::ptr::read_volatile(&raw const ATTACH_COOKIES) };
    // SAFETY: the helper only reads the link's cookie through the context.
    if cookies != 0 && unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } != run.id {
        return None;
    }
    Some(run)
}

/// The id of the current task's run: its ancestor cgroup at the runs'
/// level (the cgroup itself when the level is unknown). 0 when unreadable.
#[inline(always)]
pub fn run_id() -> u64 {
    let level = RUN_LEVEL.get(0).copied().unwrap_or(LEVEL_UNKNOWN);
    // SAFETY: helpers without pointer arguments.
    unsafe {
        if level == LEVEL_UNKNOWN {
            bpf_get_current_cgroup_id()
        } else {
            bpf_get_current_ancestor_cgroup_id(level as i32)
        }
    }
}

/// The current task's run, if it is in one.
#[inline(always)]
pub fn run() -> Option<Run> {
    let id = run_id();
    if id == 0 {
        return None;
    }
    // SAFETY: the value is plain data the program only reads; user space
    // replaces whole entries.
    let cfg = unsafe { RUNS.get(&id) }?;
    Some(Run { id, cfg })
}

/// Counts one event of `effect` of run `run` that found no room in its
/// ring buffer.
#[inline(always)]
pub fn count_lost(run: u64, effect: u16) {
    let i = effect as usize;
    if i >= LOST_SLOTS {
        return;
    }
    if let Some(slots) = EVENTS_LOST.get_ptr_mut(&run) {
        // SAFETY: this CPU's slot array; a program is not migrated while it
        // runs, so nothing else writes it concurrently. `i` is in bounds.
        unsafe { (*slots)[i] += 1 };
    }
}

/// A run's ring buffer (the inner map of [`EVENTS`]).
#[derive(Clone, Copy)]
pub struct Ring(*mut c_void);

/// A reserved record of a [`Ring`]: submitted with [`Entry::submit`]
/// (the verifier makes sure every path does).
pub struct Entry<T>(*mut T);

impl Ring {
    /// The ring of the run configured by `cfg` (none when its `ring` is 0).
    #[inline(always)]
    pub fn of_run(cfg: &RunConfig) -> Option<Ring> {
        // SAFETY: a plain u32 of the frozen `.rodata`.
        let shared = unsafe { core::ptr::read_volatile(&raw const RINGS_SHARED) };
        if shared != 0 {
            Ring::of(cfg.ring)
        } else if cfg.ring != 0 {
            Some(Ring((&raw const RING).cast_mut().cast::<c_void>()))
        } else {
            None
        }
    }

    /// The ring under key `key` (`RunConfig::ring`) of [`EVENTS`].
    #[inline(always)]
    fn of(key: u64) -> Option<Ring> {
        // SAFETY: the outer map's definition, whose address the loader
        // relocates to the map; the key is a live u64 on the stack.
        let inner = unsafe {
            bpf_map_lookup_elem(
                (&raw const EVENTS).cast_mut().cast::<c_void>(),
                (&raw const key).cast::<c_void>(),
            )
        };
        (!inner.is_null()).then_some(Ring(inner))
    }

    /// Reserves room for one `T`.
    #[inline(always)]
    pub fn reserve<T>(&self) -> Option<Entry<T>> {
        // SAFETY: `self.0` is a ring buffer map pointer from the lookup.
        let p = unsafe { bpf_ringbuf_reserve(self.0, size_of::<T>() as u64, 0) };
        (!p.is_null()).then_some(Entry(p.cast::<T>()))
    }

    /// Copies `value` in as one record; `false` when there is no room.
    #[inline(always)]
    pub fn output<T>(&self, value: &T) -> bool {
        // SAFETY: `self.0` is a ring buffer map pointer from the lookup;
        // `value` is a live `T` of the size given.
        unsafe {
            bpf_ringbuf_output(
                self.0,
                core::ptr::from_ref(value).cast_mut().cast::<c_void>(),
                size_of::<T>() as u64,
                0,
            ) == 0
        }
    }

    /// Bytes not yet consumed.
    #[inline(always)]
    fn waiting(&self) -> u64 {
        // SAFETY: as in `reserve`.
        unsafe { bpf_ringbuf_query(self.0, BPF_RB_AVAIL_DATA) }
    }
}

impl<T> Entry<T> {
    #[inline(always)]
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.0
    }

    #[inline(always)]
    pub fn submit(self, flags: u64) {
        // SAFETY: a record reserved by `Ring::reserve`, submitted once.
        unsafe { bpf_ringbuf_submit(self.0.cast::<c_void>(), flags) }
    }
}

/// Reads a `T` at kernel address `addr`.
#[inline(always)]
pub fn read_kernel<T>(addr: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel checks the address and fails cleanly.
    unsafe { bpf_probe_read_kernel(addr as *const T) }.ok()
}

/// Copies `len` bytes from kernel address `src` to `dst` (which must have
/// room for them); returns the helper's result.
#[inline(always)]
pub fn copy_kernel(dst: *mut u8, len: u32, src: u64) -> i64 {
    // SAFETY: the helper checks `src`; callers pass a `dst` with `len` bytes.
    unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_kernel(
            dst as *mut c_void,
            len,
            src as *const c_void,
        )
    }
}

/// Thread-group id of the current task's real parent.
#[inline(always)]
pub fn current_ppid(cfg: &RunConfig) -> Option<u32> {
    // SAFETY: helper without arguments; the result is only used as an
    // address for bpf_probe_read_kernel.
    let task = unsafe { bpf_get_current_task() };
    let parent: u64 = read_kernel(task + cfg.task_real_parent as u64)?;
    read_kernel(parent + cfg.task_tgid as u64)
}

/// Fills the header of a record written by the current task.
#[inline(always)]
pub fn fill_header(h: *mut EventHeader, cfg: &RunConfig, record: u16, effect: u16) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (ppid, flags) = match current_ppid(cfg) {
        Some(p) => (p, 0),
        None => (0, flag::PPID_UNREADABLE),
    };
    // SAFETY: `h` points to a reserved ring-buffer record; the helpers
    // take no pointers.
    unsafe {
        (*h).ktime_ns = bpf_ktime_get_ns();
        (*h).cgroup_id = bpf_get_current_cgroup_id();
        (*h).pid = pid_tgid as u32;
        (*h).tgid = (pid_tgid >> 32) as u32;
        (*h).uid = bpf_get_current_uid_gid() as u32;
        (*h).record = record;
        (*h).effect = effect;
        (*h).ppid = ppid;
        (*h).flags = flags;
    }
}

/// `bpf_ringbuf_query` flag: bytes not yet consumed.
const BPF_RB_AVAIL_DATA: u64 = 0;
/// `bpf_ringbuf_submit` flags.
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;

/// Submit flags for a capture record of `size` bytes: wake the reader only
/// when this record makes `wake_bytes` wait in the ring (it also polls on
/// a timer, which catches a crossing missed by concurrent producers).
/// Waking it for every event cost a cross-CPU wake-up per syscall, which
/// slowed a syscall-heavy workload by a quarter; waking it for every event
/// once the threshold is passed costs as much when nobody reads.
#[inline(always)]
pub fn wake_flags(ring: &Ring, cfg: &RunConfig, size: usize) -> u64 {
    if cfg.wake_bytes == 0 {
        return 0;
    }
    let waiting = ring.waiting();
    let wake = cfg.wake_bytes as u64;
    // Each record takes an 8-byte header in the ring.
    if waiting >= wake && waiting < wake + size as u64 + 8 {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}
