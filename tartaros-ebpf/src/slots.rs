//! Per-user slots in the maps by connection (adversarial round 22b).
//!
//! The service's runs share one object and so its maps; as LRU maps of
//! 4,096 entries, one user's ~8,000 intercepted connects in flight evicted
//! another user's entries (its proxy refused its connections, its records
//! lost their owner). The maps by connection are plain hashes now, and a
//! user holds at most `CONN_QUOTA_PER_USER` live gateway connections with
//! entries in them: one more gets none, which only that user's connection
//! feels. A slot is taken by `sock_ops` when the entries are made (in the
//! connecting task, `TCP_CONNECT_CB`) and given back when that socket
//! closes (`TCP_CLOSE` state callback, which every such socket reaches),
//! both in the kernel: no count depends on user space or on an entry that
//! something else could evict.

use core::intrinsics::{AtomicOrdering, atomic_xadd};

use tartaros_common::CONN_QUOTA_PER_USER;

use crate::maps::CONN_QUOTA;

/// `BPF_NOEXIST`: insert only if the key has no entry.
pub const BPF_NOEXIST: u64 = 1;

/// Takes one of `uid`'s slots; `false` when it holds its quota already
/// (or its counter cannot be made). Two CPUs may both pass the check at
/// the quota: a user gets at most one slot more per CPU.
#[inline(always)]
pub fn claim(uid: u32) -> bool {
    let slot = match CONN_QUOTA.get_ptr_mut(&uid) {
        Some(p) => p,
        None => {
            // First connection of this user: a zero count, made once (a
            // concurrent insert of the same zero is as good).
            // A zero on the stack: `&0` would be a constant in
            // `.rodata.cst8`, which the loader's relocation does not take.
            let zero: i64 = 0;
            let _ = CONN_QUOTA.insert(&uid, &zero, BPF_NOEXIST);
            match CONN_QUOTA.get_ptr_mut(&uid) {
                Some(p) => p,
                None => return false,
            }
        }
    };
    // SAFETY: `slot` points to a live, 8-byte-aligned map value; every
    // write to it is atomic (here and in `release`), and counters are
    // never removed while the object lives. `AtomicI64::fetch_add` does not
    // exist for this target (no compare-and-swap); the intrinsic with its
    // result unused is BPF's plain atomic add (`lock xadd`), which every
    // BPF CPU version has. The check reads it with a plain aligned 8-byte
    // load (an atomic load has no instruction on the `generic` CPU).
    unsafe {
        if core::ptr::read_volatile(slot) >= CONN_QUOTA_PER_USER {
            return false;
        }
        atomic_xadd::<i64, i64, { AtomicOrdering::Relaxed }>(slot, 1);
    }
    true
}

/// Gives back one of `uid`'s slots (one taken by [`claim`]).
#[inline(always)]
pub fn release(uid: u32) {
    if let Some(slot) = CONN_QUOTA.get_ptr_mut(&uid) {
        // SAFETY: as in `claim`.
        unsafe { atomic_xadd::<i64, i64, { AtomicOrdering::Relaxed }>(slot, -1) };
    }
}
