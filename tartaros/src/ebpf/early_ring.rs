//! The capture's ring buffer, created and mapped on a thread of its own at
//! the start of a run. Allocating and zeroing 8 MiB (1.1–1.6 ms) and
//! mapping it twice into the supervisor (~0.9 ms) were the largest part
//! of `--log` start-up besides the verifier, and everything before the
//! verifier runs on one core.

use std::os::fd::{AsFd as _, OwnedFd};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use aya::maps::{Map, MapData, RingBuf};

use super::rawprog::{self, MapSpec};

/// `BPF_MAP_TYPE_RINGBUF` (Linux 5.8).
pub(super) const MAP_TYPE_RINGBUF: u32 = 27;

/// A ring buffer for the object: a descriptor for the object's map table
/// and the relocations, and the reader, mapped on a second descriptor
/// while the programs are verified.
pub(super) struct EarlyRing {
    pub fd: OwnedFd,
    pub reader: Reader,
}

/// The thread that maps the reader; `None` if mapping failed.
pub(super) type Reader = JoinHandle<Option<RingBuf<MapData>>>;

struct Pending {
    bytes: u32,
    created: Receiver<OwnedFd>,
    reader: Reader,
}

static PENDING: Mutex<Option<Pending>> = Mutex::new(None);

/// Starts creating a ring buffer of `bytes` (a power of two, at least one
/// page). Optional: without it, or when it fails, the attach creates the
/// ring itself.
pub fn prepare(bytes: u32) {
    let (created, receiver) = sync_channel(1);
    let Ok(reader) = std::thread::Builder::new()
        .name("ebpf-ring".into())
        .spawn(move || create(bytes, created))
    else {
        return;
    };
    if let Ok(mut pending) = PENDING.lock() {
        *pending = Some(Pending {
            bytes,
            created: receiver,
            reader,
        });
    }
}

fn create(bytes: u32, created: SyncSender<OwnedFd>) -> Option<RingBuf<MapData>> {
    let fd = rawprog::create_map(MapSpec {
        name: tartaros_common::MAP_EVENTS,
        map_type: MAP_TYPE_RINGBUF,
        key_size: 0,
        value_size: 0,
        max_entries: bytes,
        flags: 0,
        inner_map: None,
    })
    .ok()?;
    let second = fd.as_fd().try_clone_to_owned().ok()?;
    created.send(fd).ok()?;
    let data = MapData::from_fd(second).ok()?;
    RingBuf::try_from(Map::RingBuf(data)).ok()
}

/// A run's ring buffer of `bytes`: the prepared one if it has that size,
/// else one made now (mapped on this thread).
pub(super) fn take_or_create(bytes: u32) -> Result<(OwnedFd, RingBuf<MapData>), rawprog::RawError> {
    if let Some(ring) = take(bytes)
        && let Ok(Some(reader)) = ring.reader.join()
    {
        return Ok((ring.fd, reader));
    }
    let fd = rawprog::create_map(MapSpec {
        name: tartaros_common::MAP_EVENTS,
        map_type: MAP_TYPE_RINGBUF,
        key_size: 0,
        value_size: 0,
        max_entries: bytes,
        flags: 0,
        inner_map: None,
    })?;
    let wrap = |source| rawprog::RawError::Wrap {
        map: tartaros_common::MAP_EVENTS.to_owned(),
        source: Box::new(source),
    };
    let second = fd
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| rawprog::RawError::Map {
            map: tartaros_common::MAP_EVENTS.to_owned(),
            source,
        })?;
    let data = MapData::from_fd(second).map_err(wrap)?;
    let reader = RingBuf::try_from(Map::RingBuf(data)).map_err(wrap)?;
    Ok((fd, reader))
}

/// The prepared ring buffer if there is one of `bytes`, waiting until it
/// exists (not until it is mapped). A ring of another size is discarded.
pub(super) fn take(bytes: u32) -> Option<EarlyRing> {
    let pending = PENDING.lock().ok()?.take()?;
    if pending.bytes != bytes {
        return None;
    }
    let fd = pending.created.recv().ok()?;
    Some(EarlyRing {
        fd,
        reader: pending.reader,
    })
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
        prepare(1 << 16);
        let ring = take(1 << 16).expect("the prepared ring");
        assert!(ring.reader.join().unwrap().is_some(), "not mapped");
        assert!(take(1 << 16).is_none(), "taken twice");
        prepare(1 << 16);
        assert!(take(1 << 17).is_none(), "a ring of another size");
        assert!(take(1 << 16).is_none(), "the mismatched ring was kept");
    }
}
