//! Unix-socket path policy: `cgroup/connect_unix` and `cgroup/sendmsg_unix`
//! (`BPF_PROG_TYPE_CGROUP_SOCK_ADDR`, attach types `BPF_CGROUP_UNIX_CONNECT`
//! / `BPF_CGROUP_UNIX_SENDMSG`, Linux 6.7).
//!
//! Pathname sockets pass only under an allowed prefix (`UNIX_ALLOW`, the
//! writable roots, each ending in `/`); abstract names pass (Landlock scopes
//! them); relative names and names with a `..` component are refused, as is
//! anything that cannot be read (fail closed). The comparison is textual,
//! on the kernel's copy of what the caller passed, and the hook runs before
//! the kernel looks the name up, so a symlink planted under a root could
//! still lead that lookup outside: an allowed name is therefore rewritten
//! (`bpf_sock_addr_set_sun_path`) to the same place under the root's
//! mirror, a mount that follows no symlink (`UNIX_MIRROR`, docs/ebpf.md).
//!
//! Prefixes are compared 8 bytes at a time against precomputed words and
//! masks (`UnixPrefix`), all slots in one map value. The `..` scan (per
//! word) and the prefix comparison (per slot) run as `bpf_loop` callbacks
//! (Linux 5.17): the verifier walks a callback until its state repeats
//! (twice here), where it walks a bounded loop once per iteration (14 and
//! 8 times), which made these programs cost 2,094 instructions to verify
//! instead of 634.
//!
//! aya 0.14 does not know these attach types, so the programs sit in
//! `cgroup/connect4/<name>` sections (which aya parses, and never loads)
//! and the supervisor loads them itself with the right expected attach
//! type (`rawprog.rs`, which also gives the callbacks the BTF `func_info`
//! the kernel wants). Copies are done with `bpf_probe_read_kernel` and
//! buffers are `MaybeUninit`, so that the compiler emits no `memset` or
//! `memcpy` calls.

use core::{ffi::c_void, mem::MaybeUninit};

use aya_ebpf::{
    bindings::bpf_sock_addr,
    helpers::generated::{bpf_loop, bpf_probe_read_kernel_str},
};
use tartaros_common::capture::{
    KFUNC_CAST_TO_KERN_CTX, KFUNC_SET_SUN_PATH, SUN_PATH_MAX, UNIX_MIRROR, UNIX_MIRROR_LEN,
    UNIX_PATH_BYTES, UNIX_PREFIXES, UNIX_WORDS, UnixAllow, UnixEvent, effect, feature, record,
    unix_hook, unix_verdict,
};

use crate::filter::{PASS, REFUSE};
use crate::maps::{Run, UNIX_ALLOW, copy_kernel, fill_header, read_kernel, run};

/// `offsetof(struct bpf_sock_addr_kern, uaddr)`, the same since 4.17.
const KERN_UADDR: u64 = 8;
/// `offsetof(struct bpf_sock_addr_kern, uaddrlen)` (added in 6.7 with the
/// unix hooks; the supervisor checks both offsets against the kernel BTF).
const KERN_UADDRLEN: u64 = 32;

#[unsafe(no_mangle)]
#[unsafe(link_section = "cgroup/connect4/unix_connect")]
pub fn unix_connect(ctx: *mut bpf_sock_addr) -> i32 {
    decide(ctx, unix_hook::CONNECT)
}

#[unsafe(no_mangle)]
#[unsafe(link_section = "cgroup/connect4/unix_sendmsg")]
pub fn unix_sendmsg(ctx: *mut bpf_sock_addr) -> i32 {
    decide(ctx, unix_hook::SENDMSG)
}

#[inline(always)]
fn decide(ctx: *mut bpf_sock_addr, hook: u16) -> i32 {
    // Attached only above run cgroups: a task of no registered run is
    // refused; a run without the policy passes (as if not attached).
    let Some(run) = run() else {
        return REFUSE;
    };
    if !run.has(feature::UNIX) {
        return PASS;
    }
    let mut scan = MaybeUninit::<Scan>::uninit();
    let (mut verdict, addr_len) = judge(ctx as u64, run.id, scan.as_mut_ptr());
    if verdict == unix_verdict::ALLOW && !pin(ctx, scan.as_mut_ptr()) {
        verdict = unix_verdict::DENY_UNPINNED;
    }
    let denied = verdict >= unix_verdict::DENY;
    let quiet = run.cfg.policy_quiet != 0;
    // Without syscall capture a refusal is reported here, and nothing
    // else. With it (`policy_quiet`) the `connect` / `sendto` record
    // reports the attempt, and every judged name is a note of the path
    // the kernel copied: the agent's sockaddr, read at `sys_enter`, may
    // have been rewritten by a second thread before that copy.
    if denied || quiet {
        let verdict = if quiet {
            verdict | unix_verdict::DESTINATION_NOTE
        } else {
            verdict
        };
        // SAFETY: `judge` zeroes the path words before anything can fail.
        let path = unsafe { (&raw mut (*scan.as_mut_ptr()).words).cast::<u8>() };
        report(&run, hook, verdict, addr_len, path);
    }
    if denied { REFUSE } else { PASS }
}

/// What the `bpf_loop` callbacks read and write: the verifier walks a
/// callback with an unknown index until its state repeats (a few times),
/// where a bounded loop is walked once per iteration.
#[repr(C)]
struct Scan {
    words: [u64; BUF_WORDS],
    /// 0x80 in each byte that starts a `..` component.
    dotdot: u64,
    /// The matching slot plus one; 0 while none matched.
    allowed: u64,
    allow: *const UnixAllow,
    /// The kernel's copy of the address (`sockaddr_un`).
    uaddr: u64,
    /// Bytes of the name the caller passed (at most `SUN_PATH_MAX`).
    plen: u64,
    /// The name rewritten under the slot's mirror.
    pinned: [u64; UNIX_WORDS],
}

/// The most bytes a name keeps after its prefix once it is rewritten under
/// its mirror (`/dev/.u/N/` + rest must fit in `sun_path`).
const MAX_REST: u64 = (SUN_PATH_MAX - UNIX_MIRROR_LEN) as u64;

/// The path buffer: the 112 compared bytes plus one zero word, so that the
/// look-ahead of the `..` scan needs no bounds branch.
const BUF_WORDS: usize = UNIX_WORDS + 1;
const ONES: u64 = 0x0101_0101_0101_0101;
const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// 0x80 in every byte of `v` that is zero, 0 elsewhere (exact, no carries
/// between bytes).
#[inline(always)]
fn zero_bytes(v: u64) -> u64 {
    !(((v & LOW7).wrapping_add(LOW7)) | v | LOW7)
}

/// 0x80 in every byte of `v` equal to `c`.
#[inline(always)]
fn bytes_eq(v: u64, c: u8) -> u64 {
    zero_bytes(v ^ (c as u64).wrapping_mul(ONES))
}

/// Flags of the bytes `k` positions further on (`next` is the following
/// word), aligned with the bytes of the current word. 1 <= k <= 7.
#[inline(always)]
fn ahead(cur: u64, next: u64, k: u32) -> u64 {
    (cur >> (8 * k)) | (next << (64 - 8 * k))
}

/// Reads the address the kernel copied from the caller and judges it. The
/// judgement is branch-free word arithmetic (a handful of branches in all):
/// each branch multiplies the verifier's work, which a byte loop with a
/// state machine made cost ~90 ms per program load. `bpf_loop` fails only
/// on bad arguments; should it, the name is refused.
#[inline(always)]
fn judge(ctx: u64, run: u64, scan: *mut Scan) -> (u16, u32) {
    // SAFETY: the caller's buffer; only its words are addressed here.
    let path = unsafe { &raw mut (*scan).words };
    // Zero the buffer first: bytes past the name must not be stale stack.
    // Volatile stores, so the compiler emits no memset call.
    let mut w = 0;
    while w < BUF_WORDS {
        // SAFETY: `w` < BUF_WORDS, inside the caller's buffer.
        unsafe { core::ptr::write_volatile(path.cast::<u64>().add(w), 0) };
        w += 1;
    }
    // The program's context is a `struct bpf_sock_addr_kern`; its `uaddr`
    // (the kernel's copy of the address) is not reachable through the
    // `bpf_sock_addr` fields, so it is read with bpf_probe_read_kernel.
    let Some(uaddr) = read_kernel::<u64>(ctx + KERN_UADDR) else {
        return (unix_verdict::DENY_ERROR, 0);
    };
    // SAFETY: the caller's buffer.
    unsafe { (*scan).uaddr = uaddr };
    let Some(addr_len) = read_kernel::<u32>(ctx + KERN_UADDRLEN) else {
        return (unix_verdict::DENY_ERROR, 0);
    };
    let plen = addr_len.saturating_sub(2);
    let plen = if plen > SUN_PATH_MAX as u32 {
        SUN_PATH_MAX as u32
    } else {
        plen
    };
    if plen == 0 {
        return (unix_verdict::DENY_ERROR, addr_len);
    }
    // SAFETY: the caller's buffer.
    unsafe { (*scan).plen = plen as u64 };
    // sun_path follows the 2-byte family; only the caller's `plen` bytes.
    if copy_kernel(path.cast::<u8>(), plen, uaddr + 2) < 0 {
        return (unix_verdict::DENY_ERROR, addr_len);
    }
    // SAFETY: the buffer is initialised (zeroed, then partly overwritten).
    let words = unsafe { &*path };
    match words[0] & 0xff {
        0 => return (unix_verdict::ALLOW_ABSTRACT, addr_len),
        0x2f => {}
        _ => return (unix_verdict::DENY_RELATIVE, addr_len),
    }
    // A `..` component: `/` `.` `.` then `/` or the end (a zero byte; the
    // kernel stops at the first NUL). Zero bytes after an early NUL can
    // only add false hits, which refuse: fail closed.
    // SAFETY: the words are initialised; the other fields are written
    // before the callbacks read them, and the callbacks only touch `*scan`,
    // which outlives the calls.
    unsafe { (*scan).dotdot = 0 };
    // SAFETY: as above.
    let scanned = unsafe {
        bpf_loop(
            UNIX_WORDS as u32,
            dotdot_word as *mut c_void,
            scan.cast(),
            0,
        )
    };
    if scanned != UNIX_WORDS as i64 {
        return (unix_verdict::DENY_ERROR, addr_len);
    }
    // SAFETY: written by the callback (and before it).
    let dotdot = unsafe { (*scan).dotdot };
    if dotdot & HIGH != 0 {
        return (unix_verdict::DENY_DOTDOT, addr_len);
    }
    // SAFETY: plain data the program only reads.
    let Some(allow) = (unsafe { UNIX_ALLOW.get(&run) }) else {
        return (unix_verdict::DENY_ERROR, addr_len);
    };
    // A map never filled has no mask on byte 0 of slot 0 (every configured
    // slot has one): refuse rather than let the empty masks match.
    if allow.prefixes[0].masks[0] == 0 {
        return (unix_verdict::DENY_ERROR, addr_len);
    }
    // SAFETY: as above.
    unsafe {
        (*scan).allowed = 0;
        (*scan).allow = allow;
    }
    // SAFETY: as above.
    let tried = unsafe { bpf_loop(UNIX_PREFIXES, prefix_matches as *mut c_void, scan.cast(), 0) };
    if tried < 0 {
        return (unix_verdict::DENY_ERROR, addr_len);
    }
    // SAFETY: as above.
    if unsafe { (*scan).allowed } != 0 {
        return (unix_verdict::ALLOW, addr_len);
    }
    (unix_verdict::DENY, addr_len)
}

/// `bpf_loop` callback: flags the `..` components starting in word `index`.
extern "C" fn dotdot_word(index: u64, ctx: *mut c_void) -> i64 {
    let w = index as usize;
    if w >= UNIX_WORDS {
        return 1;
    }
    let scan = ctx.cast::<Scan>();
    // SAFETY: `ctx` is the caller's `Scan`; `w + 1` < BUF_WORDS.
    let (cur, next) = unsafe { ((*scan).words[w], (*scan).words[w + 1]) };
    let (s, s2) = (bytes_eq(cur, b'/'), bytes_eq(next, b'/'));
    let (d, d2) = (bytes_eq(cur, b'.'), bytes_eq(next, b'.'));
    let (z, z2) = (zero_bytes(cur), zero_bytes(next));
    let hit = s & ahead(d, d2, 1) & ahead(d, d2, 2) & (ahead(s, s2, 3) | ahead(z, z2, 3));
    // SAFETY: as above.
    unsafe { (*scan).dotdot |= hit };
    0
}

/// `bpf_loop` callback: whether the path starts with prefix `index`; stops
/// the loop at the first match, the longest (the supervisor stores the
/// prefixes longest first, so a root nested in another gets its own slot).
extern "C" fn prefix_matches(index: u64, ctx: *mut c_void) -> i64 {
    let p = index as usize;
    if p >= UNIX_PREFIXES as usize {
        return 1;
    }
    let scan = ctx.cast::<Scan>();
    // SAFETY: `ctx` is the caller's `Scan`, whose `allow` points into the
    // UNIX_ALLOW map value; `p` is in bounds.
    unsafe {
        let prefix = &(*(*scan).allow).prefixes[p];
        let mut diff = 0u64;
        let mut w = 0;
        while w < UNIX_WORDS {
            diff |= ((*scan).words[w] ^ prefix.words[w]) & prefix.masks[w];
            w += 1;
        }
        if diff == 0 {
            (*scan).allowed = index + 1;
            return 1;
        }
    }
    0
}

/// Rewrites an allowed name `<prefix><rest>` to `/dev/.u/<slot>/<rest>`,
/// the same object seen through a mount that follows no symlink (see
/// `UNIX_MIRROR`): the kernel then looks up a name in which no symlink,
/// planted by the agent or not, can lead outside the root. Whether it fits
/// and was written; a name that does not is refused (fail closed).
#[inline(always)]
fn pin(ctx: *mut bpf_sock_addr, scan: *mut Scan) -> bool {
    // SAFETY: `judge` filled the words, the matching slot and `uaddr`,
    // and `allow` points into the UNIX_ALLOW map value.
    let (slot, prefix_len, uaddr) = unsafe {
        let slot = (*scan).allowed.wrapping_sub(1);
        if slot >= UNIX_PREFIXES as u64 {
            return false;
        }
        let prefix = &(*(*scan).allow).prefixes[slot as usize];
        (slot, prefix.len as u64, (*scan).uaddr)
    };
    // SAFETY: written by `judge` before any prefix could match.
    let plen = unsafe { (*scan).plen };
    // The prefix matched, so the name is at least that long.
    let avail = plen.wrapping_sub(prefix_len);
    if avail > SUN_PATH_MAX as u64 {
        return false;
    }
    // SAFETY: the caller's buffer; the copy is at most `MAX_REST + 1`
    // bytes after the mirror prefix, inside `pinned`, and reads the
    // kernel's own copy of the address, which the caller cannot change
    // any more.
    unsafe {
        let out = &raw mut (*scan).pinned;
        let mut w = 0;
        while w < UNIX_WORDS {
            core::ptr::write_volatile(out.cast::<u64>().add(w), 0);
            w += 1;
        }
        let head = u64::from_le_bytes(*UNIX_MIRROR);
        core::ptr::write_volatile(out.cast::<u64>(), head);
        let tail = (b'0' as u64 + slot) | ((b'/' as u64) << 8);
        core::ptr::write_volatile(out.cast::<u64>().add(1), tail);
        // The rest of the name ends at its first NUL or at the caller's
        // length, as the kernel's lookup will take it; the helper stops
        // at the NUL (a loop here multiplied the verifier's work by 14).
        // One byte more than fits, to tell a name that is too long.
        let size = if avail > MAX_REST {
            MAX_REST + 1
        } else {
            avail
        } + 1;
        let copied = bpf_probe_read_kernel_str(
            out.cast::<u8>().add(UNIX_MIRROR_LEN).cast::<c_void>(),
            size as u32,
            (uaddr + 2 + prefix_len) as *const c_void,
        );
        if copied <= 0 {
            return false;
        }
        let rest = copied as u64 - 1;
        if rest > MAX_REST {
            return false;
        }
        let total = (UNIX_MIRROR_LEN as u64 + rest) as u32;
        // `bpf_sock_addr_set_sun_path(struct bpf_sock_addr_kern *, const
        // u8 *, u32)` on `bpf_cast_to_kern_ctx(ctx)`: compiled as calls to
        // helper numbers the loader replaces with the kfuncs (see
        // `KFUNC_SET_SUN_PATH`).
        let cast_to_kern_ctx: unsafe extern "C" fn(*mut bpf_sock_addr) -> *mut c_void =
            core::mem::transmute(KFUNC_CAST_TO_KERN_CTX as usize);
        let set_sun_path: unsafe extern "C" fn(*mut c_void, *const u8, u32) -> i32 =
            core::mem::transmute(KFUNC_SET_SUN_PATH as usize);
        set_sun_path(cast_to_kern_ctx(ctx), out.cast::<u8>(), total) == 0
    }
}

/// Writes a denial, or a note of an allowed path, to the ring buffer.
#[inline(always)]
fn report(run: &Run, hook: u16, verdict: u16, addr_len: u32, path: *mut u8) {
    let cfg = run.cfg;
    let Some((_, mut entry)) = run.reserve::<UnixEvent>(effect::CONNECT) else {
        return;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved record; the copy stays inside its path
    // buffer (UNIX_PATH_BYTES from a stack buffer of that size).
    unsafe {
        fill_header(&raw mut (*ev).header, cfg, record::UNIX, effect::CONNECT);
        (*ev).hook = hook;
        (*ev).verdict = verdict;
        (*ev).addr_len = addr_len;
        // The buffer is zeroed before anything can fail, so it can always
        // be copied.
        if copy_kernel(
            (&raw mut (*ev).path).cast::<u8>(),
            UNIX_PATH_BYTES as u32,
            path as u64,
        ) < 0
        {
            (*ev).path[0] = 0xff;
        }
    }
    entry.submit(0);
}
