//! The pin cache of every program (`pin_checks::Profile::Full`): made by
//! the first root run that needs more than the unix programs, before it
//! attaches, from an object loaded as the service's is (rings in
//! `EVENTS`, maps as declared) with the tracing programs comparing their
//! link's cookie with their run. That run pays the whole verifier pass
//! (~25 ms of CPU on the 2-core VM) once; every later one opens the pins.
//!
//! A run's ring goes into the cache's `EVENTS`, and every insert into or
//! removal from a map of maps waits for an RCU grace period (8-12 ms on
//! the VM): longer than the rest of a run's start. So a run's janitor,
//! after the run, takes its ring out and puts a fresh one in as a spare
//! (at most [`MAX_SPARES`], listed in the pinned [`SPARES_PIN`]),
//! which the next run takes without a wait; both waits are nobody's.

use std::os::fd::{AsFd as _, OwnedFd};
use std::path::Path;

use aya::maps::{HashMap, Map, MapData};

use super::pin_cache::{self, PinCacheError, Profile};
use super::pin_checks::FULL_FEATURES;
use super::{AttachOptions, attach_steps, kbtf, load};

/// The suffix of the directory that says the kernel refused the object of
/// a cache that `make` tried to fill: no later run tries again (each
/// would pay the verifier twice) until `tartaros cache drop`.
const REFUSED: &str = "_refused";
/// The pin of the cache's list of spare rings: key in `EVENTS` -> (map
/// id, size).
pub(super) const SPARES_PIN: &str = "spares";
/// Spare rings kept at most, of any size (each is its size of kernel
/// memory until a run takes it, or `tartaros cache drop`).
const MAX_SPARES: usize = 2;
/// The largest ring kept as a spare (twice the default): a run with a
/// larger `--log-buffer` leaves none, and the next such run waits for its
/// insert.
const MAX_SPARE_BYTES: u32 = 2 * super::DEFAULT_RING_BYTES;
/// Entries of the list (spares of every size).
const SPARES_ENTRIES: u32 = 16;

/// The cache of every program for `level`: opened when it is there, else
/// made (loaded, verified and pinned under the lock). `None` when it
/// cannot be had (a run then loads its own programs); a kernel refusing
/// the object is remembered.
pub(super) fn take_or_make(
    options: &AttachOptions,
    level: u32,
    layout: Option<&kbtf::KernelLayout>,
) -> Option<(load::Object, load::Loaded)> {
    let dir = pin_cache::dir_of(Profile::Full, level, layout)?;
    if refused(&dir).exists() {
        return None;
    }
    if let (Some(cached), _) = pin_cache::take(Profile::Full, options, level, layout) {
        return Some(cached);
    }
    match make(options, level, layout, &dir) {
        Ok(made) => Some(made),
        Err(e) => {
            crate::tt_warn!("{e}; loading the programs for this run alone");
            None
        }
    }
}

fn refused(dir: &Path) -> std::path::PathBuf {
    let mut name = dir.as_os_str().to_owned();
    name.push(REFUSED);
    name.into()
}

fn make(
    options: &AttachOptions,
    level: u32,
    layout: Option<&kbtf::KernelLayout>,
    dir: &Path,
) -> Result<(load::Object, load::Loaded), PinCacheError> {
    let _lock = pin_cache::lock()?;
    pin_cache::mount_root()?;
    if dir.exists() {
        // Made by another run while this one waited for the lock.
        return pin_cache::open_checked(Profile::Full, options, dir, level, layout);
    }
    let object = |e: super::EbpfError| PinCacheError::Object(e.to_string());
    let loaded = load::load_object(load::Serves::PinCache, None)
        .and_then(|mut object| {
            load::set_run_level(&mut object, level)?;
            load::set_file_layout(&mut object, layout)?;
            let loaded = attach_steps::verify_programs(&object, FULL_FEATURES, layout)?;
            Ok((object, loaded))
        })
        .map_err(object);
    let (made, loaded) = match loaded {
        Ok(made) => made,
        Err(e) => {
            // Remembered (an empty directory in the bpffs), so the next
            // run does not verify everything again to be refused again.
            let _ = std::fs::create_dir(refused(dir));
            return Err(e);
        }
    };
    // Best effort from here: the run has its verified programs either way.
    if pin_cache::pin_into(&made, &loaded, level, dir).is_ok() {
        let _ = pin_spares(dir);
    }
    Ok((made, loaded))
}

/// Pins the (empty) list of spare rings into the cache's directory.
fn pin_spares(dir: &Path) -> Result<(), PinCacheError> {
    let spares = super::rawprog::create_map(super::rawprog::MapSpec {
        name: "SPARES",
        map_type: super::pin_sys::MAP_TYPE_HASH,
        key_size: 8,
        value_size: 8,
        max_entries: SPARES_ENTRIES,
        flags: 0,
        inner_map: None,
    })
    .map_err(|e| PinCacheError::Object(e.to_string()))?;
    let path = dir.join(SPARES_PIN);
    super::pin_sys::pin(spares.as_fd(), &path).map_err(|source| PinCacheError::Io {
        what: "pin",
        path,
        source,
    })
}

/// The list of spares next to the `EVENTS` pinned at `events_pin`.
fn spares_at(events_pin: &Path) -> Option<HashMap<MapData, u64, [u32; 2]>> {
    let fd = super::pin_sys::get(&events_pin.parent()?.join(SPARES_PIN)).ok()?;
    let data = MapData::from_fd(fd).ok()?;
    HashMap::try_from(Map::HashMap(data)).ok()
}

/// The `EVENTS` pin of the cache of every program a run to come would use.
pub(super) fn events_pin() -> Option<std::path::PathBuf> {
    if !load::kernel_layout_ready() {
        return None;
    }
    let layout = load::kernel_layout().ok()?;
    let level = pin_cache::predicted_level()?;
    let dir = pin_cache::dir_of(Profile::Full, level, Some(&layout))?;
    Some(dir.join(format!("map_{}", tartaros_common::MAP_EVENTS)))
}

/// A spare ring of `bytes` for a run to come, taken off the list of the
/// cache whose `EVENTS` is pinned at `events_pin` (given to `announce`
/// first): its key in `EVENTS`, its descriptor and the map id of that
/// `EVENTS`. A listed spare that is not the ring under its key in
/// `EVENTS` (gone, or another map) is dropped from the list.
pub(super) fn take_spare(
    bytes: u32,
    events_pin: &Path,
    announce: &mut dyn FnMut(&super::LeftRing),
) -> Option<(u64, OwnedFd, u32)> {
    let events = super::pin_sys::get(events_pin).ok()?;
    let outer_id = MapData::from_fd(events.try_clone().ok()?)
        .ok()?
        .info()
        .ok()?
        .id();
    let _lock = pin_cache::lock().ok()?;
    let mut spares = spares_at(events_pin)?;
    let keys: Vec<u64> = spares.keys().filter_map(Result::ok).collect();
    for key in keys {
        let Ok([id, size]) = spares.get(&key, 0) else {
            continue;
        };
        if size != bytes {
            continue;
        }
        // Not a spare (gone, another map, or a registered run's ring: the
        // list is only as good as whoever wrote it): dropped from the list,
        // not announced, so no janitor takes a live run's ring out.
        let spare = super::pin_sys::inner_map_id(events.as_fd(), key) == Some(id)
            && !ring_in_use(events_pin, key);
        if !spare {
            let _ = spares.remove(&key);
            continue;
        }
        // Announced before it is off the list, and off the list before it
        // is used: a spare is never lost, nor handed to two runs.
        announce(&super::LeftRing {
            pin: events_pin.to_path_buf(),
            key,
            bytes,
        });
        spares.remove(&key).ok()?;
        let Ok(ring) = MapData::from_id(id) else {
            continue;
        };
        let is_ring = ring.info().is_ok_and(|info| {
            info.map_type().ok() == Some(aya::maps::MapType::RingBuf) && info.max_entries() == bytes
        });
        if let (true, Ok(fd)) = (is_ring, ring.fd().as_fd().try_clone_to_owned()) {
            return Some((key, fd, outer_id));
        }
    }
    None
}

/// Whether a registered run's configuration names the ring under `key`
/// (or `RUNS` cannot be read: then it is taken as used).
fn ring_in_use(events_pin: &Path, key: u64) -> bool {
    let runs = events_pin
        .parent()
        .map(|dir| dir.join(format!("map_{}", tartaros_common::MAP_RUNS)))
        .and_then(|pin| super::pin_sys::get(&pin).ok())
        .and_then(|fd| MapData::from_fd(fd).ok())
        .and_then(|data| {
            HashMap::<_, u64, tartaros_common::capture::RunConfig>::try_from(Map::HashMap(data))
                .ok()
        });
    let Some(runs) = runs else {
        return true;
    };
    runs.iter()
        .any(|entry| entry.map_or(true, |(_, config)| config.ring == key))
}

/// After a run (in its janitor): a fresh spare ring of `bytes` put into
/// the `EVENTS` pinned at `events_pin` and listed, unless the list holds
/// [`MAX_SPARES`] already or `bytes` is over [`MAX_SPARE_BYTES`]: what
/// the host keeps for runs to come stays bounded. Waits for a grace
/// period (two when the list filled meanwhile).
pub fn add_spare(events_pin: &Path, bytes: u32) {
    let full = |spares: &HashMap<MapData, u64, [u32; 2]>| spares.keys().count() >= MAX_SPARES;
    if bytes > MAX_SPARE_BYTES || spares_at(events_pin).is_none_or(|s| full(&s)) {
        return;
    }
    let Ok(events) = super::pin_sys::get(events_pin) else {
        return;
    };
    // Made without the lock (the insert waits for a grace period), so
    // the list is counted again under it.
    let Ok((key, ring)) = super::early_ring::place_spare(bytes, events) else {
        return;
    };
    let id = MapData::from_fd(ring)
        .ok()
        .and_then(|r| r.info().ok())
        .map(|i| i.id());
    let listed = id.and_then(|id| {
        let _lock = pin_cache::lock().ok()?;
        let mut spares = spares_at(events_pin)?;
        if full(&spares) {
            return None;
        }
        spares.insert(key, [id, bytes], 0).ok()
    });
    if listed.is_none() {
        // Full, or the cache was dropped meanwhile: not left unlisted.
        super::remove_pinned_ring(events_pin, key);
    }
}
