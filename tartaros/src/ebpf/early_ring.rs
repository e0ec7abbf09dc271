//! The capture's ring buffer, made ready on a thread of its own at the
//! start of a `--log` run, while the rest of the run is set up:
//! - allocating and zeroing 8 MiB (1.1–1.6 ms) and mapping it twice into
//!   the supervisor (~0.9 ms) were the largest part of `--log` start-up
//!   besides the verifier;
//! - putting it into `EVENTS`, a map of maps, waits for an RCU grace
//!   period (the kernel's `maybe_wait_bpf_programs`; 4–12 ms on this VM, a
//!   wall-clock wait, not CPU).
//!
//! A run of its own object takes the ring as that object's `RING`
//! ([`take_own`]), no map of maps involved; in a service worker the
//! thread puts the ring into the service's `EVENTS` ([`super::shared`])
//! under a key of its own, unless the service had one ready.

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
/// `RunConfig::ring` of a run with a ring in an object of its own.
pub(super) const OWN_KEY: u64 = 1;

/// A ring buffer in place: its reader, and where it is.
pub(super) struct Placed {
    pub reader: RingBuf<MapData>,
    /// Its key in `EVENTS`.
    pub key: u64,
    /// The id of the `EVENTS` map it is in.
    pub outer_id: u32,
    /// Put there by the service ahead of the run: the service takes it
    /// out again when the run's worker has exited.
    pub spare: bool,
}

struct Pending {
    bytes: u32,
    made: Made,
}

enum Made {
    /// Put into a shared `EVENTS`.
    Placed(JoinHandle<Option<Placed>>),
    /// For an object of its own: the ring (sent as soon as it exists) and
    /// its reader (once mapped).
    Own(Receiver<OwnedFd>, JoinHandle<Option<RingBuf<MapData>>>),
}

static PENDING: Mutex<Option<Pending>> = Mutex::new(None);

/// Starts making a ring buffer of `bytes` (a power of two, at least one
/// page) ready: put into `shared_events` (a service's `EVENTS`) when given,
/// else for the run's own object. Optional: without it, or when it fails,
/// the attach makes the ring itself.
pub fn prepare(bytes: u32, shared_events: Option<OwnedFd>) {
    prepare_keyed(bytes, shared_events.map(|events| (events, unique_key())));
}

/// [`prepare`], the ring put into the shared `EVENTS` under the key given
/// with it (told to whoever takes it out after the run before it is in).
pub fn prepare_keyed(bytes: u32, shared_events: Option<(OwnedFd, u64)>) {
    let made = match shared_events {
        Some((events, key)) => std::thread::Builder::new()
            .name("ebpf-ring".into())
            .spawn(move || create(bytes).and_then(|r| place(r, events, key)).ok())
            .map(Made::Placed),
        None => {
            let (sender, receiver) = sync_channel(1);
            std::thread::Builder::new()
                .name("ebpf-ring".into())
                .spawn(move || make_own(bytes, sender))
                .map(|reader| Made::Own(receiver, reader))
        }
    };
    let Ok(made) = made else { return };
    if let Ok(mut pending) = PENDING.lock() {
        *pending = Some(Pending { bytes, made });
    }
}

fn make_own(bytes: u32, created: SyncSender<OwnedFd>) -> Option<RingBuf<MapData>> {
    let fd = create(bytes).ok()?;
    let second = dup(&fd).ok()?;
    created.send(fd).ok()?;
    let data = MapData::from_fd(second).ok()?;
    RingBuf::try_from(Map::RingBuf(data)).ok()
}

/// The ring prepared for the run's own object if it has `bytes`: the
/// descriptor (waiting until it exists) and the thread mapping its reader.
pub(super) fn take_own(bytes: u32) -> Option<(OwnedFd, JoinHandle<Option<RingBuf<MapData>>>)> {
    let pending = PENDING.lock().ok()?.take()?;
    match pending.made {
        Made::Own(fd, reader) if pending.bytes == bytes => Some((fd.recv().ok()?, reader)),
        _ => None,
    }
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
        spare: false,
    })
}

/// A ring of `bytes` put into the map of maps `outer` now, under a new
/// key, for a run yet to come (the service's spares): its key and
/// descriptor.
pub(super) fn place_spare(bytes: u32, outer: OwnedFd) -> Result<(u64, OwnedFd), RawError> {
    let ring = create(bytes)?;
    let key = unique_key();
    let keep = dup(&ring)?;
    place(ring, outer, key)?;
    Ok((key, keep))
}

/// Takes a ring placed for this run ahead of it (`ring`, under `key` in
/// the `EVENTS` with map id `outer_id`), mapping its reader on a thread:
/// by the service, which then takes it out itself (`by_service`), or by
/// an earlier run's janitor into the pin cache's `EVENTS`.
pub(super) fn prepare_spare(bytes: u32, ring: OwnedFd, key: u64, outer_id: u32, by_service: bool) {
    let map = move || -> Option<Placed> {
        let inner = MapData::from_fd(ring).ok()?;
        let reader = RingBuf::try_from(Map::RingBuf(inner)).ok()?;
        Some(Placed {
            reader,
            key,
            outer_id,
            spare: by_service,
        })
    };
    let Ok(placed) = std::thread::Builder::new()
        .name("ebpf-ring".into())
        .spawn(map)
    else {
        return;
    };
    if let Ok(mut pending) = PENDING.lock() {
        *pending = Some(Pending {
            bytes,
            made: Made::Placed(placed),
        });
    }
}

/// An `EVENTS` map of maps for `max_entries` rings like `template`.
pub(super) fn create_outer(
    template: std::os::fd::BorrowedFd<'_>,
    max_entries: u32,
) -> Result<OwnedFd, RawError> {
    rawprog::create_map(MapSpec {
        name: tartaros_common::MAP_EVENTS,
        map_type: MAP_TYPE_HASH_OF_MAPS,
        key_size: 8,
        value_size: 4,
        max_entries,
        flags: 0,
        inner_map: Some(template),
    })
}

/// A ring buffer map of `bytes`.
pub(super) fn create(bytes: u32) -> Result<OwnedFd, RawError> {
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

fn dup(fd: &OwnedFd) -> Result<OwnedFd, RawError> {
    fd.as_fd()
        .try_clone_to_owned()
        .map_err(|source| RawError::Map {
            map: tartaros_common::MAP_EVENTS.to_owned(),
            source,
        })
}

/// A key no other live run of the same `EVENTS` has: this process's pid,
/// a counter and the clock's nanoseconds.
pub(super) fn unique_key() -> u64 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    (u64::from(std::process::id()) << 32) ^ (u64::from(n) << 30) ^ u64::from(nanos) | 2
}

/// The prepared ring if there is one of `bytes` in the `EVENTS` whose map
/// id is `outer_id`, waiting until it is in place. Anything else prepared
/// is discarded.
pub(super) fn take(bytes: u32, outer_id: u32) -> Option<Placed> {
    let pending = PENDING.lock().ok()?.take()?;
    let Made::Placed(placed) = pending.made else {
        return None;
    };
    if pending.bytes != bytes {
        return None;
    }
    let placed = placed.join().ok()??;
    (placed.outer_id == outer_id).then_some(placed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prepared_ring_is_taken_once_and_only_at_its_size() {
        if !nix::unistd::geteuid().is_root() {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "needs root");
            eprintln!("skipping: creating a ring buffer needs root");
            return;
        }
        prepare(1 << 16, None);
        let (_, reader) = take_own(1 << 16).expect("the prepared ring");
        assert!(reader.join().unwrap().is_some(), "not mapped");
        assert!(take_own(1 << 16).is_none(), "taken twice");
        prepare(1 << 16, None);
        assert!(take_own(1 << 17).is_none(), "a ring of another size");
        assert!(take_own(1 << 16).is_none(), "the mismatched ring was kept");
        // Into a map of maps, found only there.
        let template = create(4096).unwrap();
        let outer = create_outer(template.as_fd(), 4).unwrap();
        let id = MapData::from_fd(dup(&outer).unwrap())
            .unwrap()
            .info()
            .unwrap()
            .id();
        prepare(1 << 16, Some(outer));
        assert!(take_own(1 << 16).is_none(), "placed, not own");
        prepare(1 << 16, Some(create_outer(template.as_fd(), 4).unwrap()));
        assert!(take(1 << 16, id).is_none(), "in another EVENTS");
    }
}
