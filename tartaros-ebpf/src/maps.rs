//! Maps and helpers shared by every program.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_uid_gid, bpf_probe_read_kernel,
        generated::{
            bpf_get_current_ancestor_cgroup_id, bpf_get_current_cgroup_id, bpf_get_current_task,
            bpf_ktime_get_ns,
        },
    },
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use tartaros_common::{
    ALLOW_MAX_ENTRIES, AllowKey, EVENTS_BYTES, FILTER_ENTRIES, SavedDst, TPROXY_MAX_ENTRIES,
    TransparentKey,
    capture::{CaptureConfig, EventHeader, LEVEL_UNKNOWN, LOST_SLOTS, UnixAllow, flag},
};

#[map(name = "ALLOW")]
pub static ALLOW: HashMap<AllowKey, u32> = HashMap::with_max_entries(ALLOW_MAX_ENTRIES, 0);

#[map(name = "FILTER")]
pub static FILTER: Array<u32> = Array::with_max_entries(FILTER_ENTRIES, 0);

/// Original destinations of intercepted connects, by socket cookie
/// (written by `connect4` / `connect6`, moved by `sock_ops`).
#[map(name = "TPROXY_COOKIE")]
pub static TPROXY_COOKIE: LruHashMap<u64, SavedDst> =
    LruHashMap::with_max_entries(TPROXY_MAX_ENTRIES, 0);

/// The same, by the client's local port (read and deleted by the proxy).
#[map(name = "TPROXY_PORT")]
pub static TPROXY_PORT: LruHashMap<TransparentKey, SavedDst> =
    LruHashMap::with_max_entries(TPROXY_MAX_ENTRIES, 0);

/// Who opened each TCP connection the connect programs let through:
/// socket cookie to thread-group id (written by `connect4` / `connect6` in
/// the caller's context, moved by `sock_ops`).
#[map(name = "OWNER_COOKIE")]
pub static OWNER_COOKIE: LruHashMap<u64, u32> = LruHashMap::with_max_entries(TPROXY_MAX_ENTRIES, 0);

/// The same by the client's local port (and family), which the relays,
/// the proxy and the broker see as the peer of an accepted connection.
#[map(name = "OWNER_PORT")]
pub static OWNER_PORT: LruHashMap<TransparentKey, u32> =
    LruHashMap::with_max_entries(TPROXY_MAX_ENTRIES, 0);

/// One ring buffer for every record (Linux 5.8); resized at load time.
#[map(name = "EVENTS")]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// Failed reservations per effect kind: the kernel keeps no drop counter
/// for ring buffers. One per-CPU slot array, so user space reads every
/// kind of every CPU with one lookup.
#[map(name = "EVENTS_LOST")]
pub static EVENTS_LOST: PerCpuArray<[u64; LOST_SLOTS]> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "CONFIG")]
pub static CONFIG: Array<CaptureConfig> = Array::with_max_entries(1, 0);

#[map(name = "UNIX_ALLOW")]
pub static UNIX_ALLOW: Array<UnixAllow> = Array::with_max_entries(1, 0);

/// Counts one event of `effect` that found no room in the ring buffer.
#[inline(always)]
pub fn count_lost(effect: u16) {
    let i = effect as usize;
    if i >= LOST_SLOTS {
        return;
    }
    if let Some(slots) = EVENTS_LOST.get_ptr_mut(0) {
        // SAFETY: this CPU's slot array; a program is not migrated while it
        // runs, so nothing else writes it concurrently. `i` is in bounds.
        unsafe { (*slots)[i] += 1 };
    }
}

/// The run-time configuration (array lookups with a constant key are
/// inlined by the verifier).
#[inline(always)]
pub fn config() -> Option<&'static CaptureConfig> {
    CONFIG.get(0)
}

/// Whether the current task is in the sandbox cgroup or below it.
#[inline(always)]
pub fn in_sandbox(cfg: &CaptureConfig) -> bool {
    if cfg.cgroup_id == 0 {
        return false;
    }
    // SAFETY: helpers without pointer arguments.
    let id = unsafe {
        if cfg.cgroup_level == LEVEL_UNKNOWN {
            bpf_get_current_cgroup_id()
        } else {
            bpf_get_current_ancestor_cgroup_id(cfg.cgroup_level as i32)
        }
    };
    id == cfg.cgroup_id
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
pub fn current_ppid(cfg: &CaptureConfig) -> Option<u32> {
    // SAFETY: helper without arguments; the result is only used as an
    // address for bpf_probe_read_kernel.
    let task = unsafe { bpf_get_current_task() };
    let parent: u64 = read_kernel(task + cfg.task_real_parent as u64)?;
    read_kernel(parent + cfg.task_tgid as u64)
}

/// Fills the header of a record written by the current task.
#[inline(always)]
pub fn fill_header(h: *mut EventHeader, cfg: &CaptureConfig, record: u16, effect: u16) {
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
pub fn wake_flags(cfg: &CaptureConfig, size: usize) -> u64 {
    if cfg.wake_bytes == 0 {
        return 0;
    }
    let waiting = EVENTS.query(BPF_RB_AVAIL_DATA);
    let wake = cfg.wake_bytes as u64;
    // Each record takes an 8-byte header in the ring.
    if waiting >= wake && waiting < wake + size as u64 + 8 {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}
