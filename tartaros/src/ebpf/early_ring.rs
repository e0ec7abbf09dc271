//! The capture's ring buffer, made ready on a thread of its own at the
//! start of a `--log` run, while the rest of the run is set up:
//! - allocating and zeroing 8 MiB (1.1–1.6 ms) and mapping it twice into
//!   the supervisor (~0.9 ms) were the largest part of `--log` start-up
//!   besides the verifier;
//! - putting it into `EVENTS`, a map of maps, waits for an RCU grace
//!   period (the kernel's `maybe_wait_bpf_programs`; 4–12 ms on this VM, a
//!   wall-clock wait, not CPU).
//!
//! For a run of its own object the thread also creates that object's
//! `EVENTS` ([`take_outer`]); in a service worker it puts the ring into the
//! service's `EVENTS` ([`super::shared`]) under a key of its own.

use std::os::fd::{AsFd as _, OwnedFd};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use aya::maps::{HashOfMaps, Map, MapData, RingBuf};

use super::rawprog::{self, MapSpec, RawError};

/// `BPF_MAP_TYPE_RINGBUF` (Linux 5.8).
pub(super) const MAP_TYPE_RINGBUF: u32 = 27;
/// `BPF_MAP_TYPE_HASH_OF_MAPS` (Linux 4.12; ring buffers inside, 5.10).
pub(super) const MAP_TYPE_HASH_OF_MAPS: u32 = 13;
/// The key of the ring in the `EVENTS` of an object of its own.
pub(super) const OWN_KEY: u64 = 1;

/// A ring buffer in place: its reader, and where it is.
pub(super) struct Placed {
    pub reader: RingBuf<MapData>,
    /// Its key in `EVENTS`.
    pub key: u64,
    /// The id of the `EVENTS` map it is in.
    pub outer_id: u32,
}

struct Pending {
    bytes: u32,
    /// The `EVENTS` the thread created, sent before the slow insert.
    outer: Option<Receiver<OwnedFd>>,
    placed: JoinHandle<Option<Placed>>,
}

static PENDING: Mutex<Option<Pending>> = Mutex::new(None);

/// Starts making a ring buffer of `bytes` (a power of two, at least one
/// page) ready, in `shared_events` (a service's `EVENTS`) when given, else
/// in a new `EVENTS` for this run's object. Optional: without it, or when
/// it fails, the attach makes the ring itself.
pub fn prepare(bytes: u32, shared_events: Option<OwnedFd>) {
    let (sender, receiver) = sync_channel(1);
    let own = shared_events.is_none();
    let Ok(placed) = std::thread::Builder::new()
        .name("ebpf-ring".into())
        .spawn(move || make(bytes, shared_events, sender).ok())
    else {
        return;
    };
    if let Ok(mut pending) = PENDING.lock() {
        *pending = Some(Pending {
            bytes,
            outer: own.then_some(receiver),
            placed,
        });
    }
}

fn make(
    bytes: u32,
    shared_events: Option<OwnedFd>,
    outer_sender: SyncSender<OwnedFd>,
) -> Result<Placed, RawError> {
    let ring = create(bytes)?;
    let (outer, key) = match shared_events {
        Some(events) => (events, unique_key()),
        None => {
            let outer = create_outer(ring.as_fd())?;
            // The object may be loaded (relocated against it) meanwhile.
            let copy = dup(&outer)?;
            let _ = outer_sender.send(copy);
            (outer, OWN_KEY)
        }
    };
    place(ring, outer, key)
}

/// Creates a ring of `bytes` now and puts it into the map of maps `outer`
/// under `key` (the slow path: the grace period is waited for here).
pub(super) fn create_and_place(bytes: u32, outer: OwnedFd, key: u64) -> Result<Placed, RawError> {
    place(create(bytes)?, outer, key)
}

fn place(ring: OwnedFd, outer: OwnedFd, key: u64) -> Result<Placed, RawError> {
    let wrap = |source| RawError::Wrap {
        map: tartaros_common::MAP_EVENTS.to_owned(),
        source: Box::new(source),
    };
    let outer = MapData::from_fd(outer).map_err(wrap)?;
    let outer_id = outer.info().map_err(wrap)?.id();
    let inner = MapData::from_fd(ring).map_err(wrap)?;
    let mut events =
        HashOfMaps::<_, u64, MapData>::try_from(Map::HashOfMaps(outer)).map_err(wrap)?;
    events.insert(key, &inner, 0).map_err(wrap)?;
    let reader = RingBuf::try_from(Map::RingBuf(inner)).map_err(wrap)?;
    Ok(Placed {
        reader,
        key,
        outer_id,
    })
}

fn create(bytes: u32) -> Result<OwnedFd, RawError> {
    rawprog::create_map(MapSpec {
        name: tartaros_common::MAP_EVENTS,
        map_type: MAP_TYPE_RINGBUF,
        key_size: 0,
        value_size: 0,
        max_entries: bytes,
        flags: 0,
        inner_map: None,
    })
}

/// An `EVENTS` map of maps holding rings like `template`.
pub(super) fn create_outer(template: std::os::fd::BorrowedFd<'_>) -> Result<OwnedFd, RawError> {
    rawprog::create_map(MapSpec {
        name: tartaros_common::MAP_EVENTS,
        map_type: MAP_TYPE_HASH_OF_MAPS,
        key_size: 8,
        value_size: 4,
        max_entries: tartaros_common::MAX_RUNS,
        flags: 0,
        inner_map: Some(template),
    })
}

fn dup(fd: &OwnedFd) -> Result<OwnedFd, RawError> {
    fd.as_fd()
        .try_clone_to_owned()
        .map_err(|source| RawError::Map {
            map: tartaros_common::MAP_EVENTS.to_owned(),
            source,
        })
}

/// A key no other live run of the same `EVENTS` has: this process's pid
/// and the clock's nanoseconds.
pub(super) fn unique_key() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (u64::from(std::process::id()) << 32) | u64::from(nanos) | 2
}

/// The `EVENTS` the preparing thread created for this run's object, if
/// it did (waiting until it exists, not until the ring is in it).
pub(super) fn take_outer() -> Option<OwnedFd> {
    let mut pending = PENDING.lock().ok()?;
    let receiver = pending.as_mut()?.outer.take()?;
    receiver.recv().ok()
}

/// The prepared ring if there is one of `bytes` in the `EVENTS` whose map
/// id is `outer_id`, waiting until it is in place. Anything else prepared
/// is discarded.
pub(super) fn take(bytes: u32, outer_id: u32) -> Option<Placed> {
    let pending = PENDING.lock().ok()?.take()?;
    if pending.bytes != bytes {
        return None;
    }
    let placed = pending.placed.join().ok()??;
    (placed.outer_id == outer_id).then_some(placed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prepared_ring_is_taken_once_and_only_at_its_size_and_place() {
        if !nix::unistd::geteuid().is_root() {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "needs root");
            eprintln!("skipping: creating a ring buffer needs root");
            return;
        }
        prepare(1 << 16, None);
        let outer = take_outer().expect("the prepared EVENTS");
        let id = MapData::from_fd(outer).unwrap().info().unwrap().id();
        let ring = take(1 << 16, id).expect("the prepared ring");
        assert_eq!(ring.key, OWN_KEY);
        assert!(take(1 << 16, id).is_none(), "taken twice");
        prepare(1 << 16, None);
        assert!(take(1 << 17, id).is_none(), "a ring of another size");
        assert!(take(1 << 16, id).is_none(), "the mismatched ring was kept");
        prepare(1 << 16, None);
        assert!(take(1 << 16, id).is_none(), "a ring in another EVENTS");
    }
}
