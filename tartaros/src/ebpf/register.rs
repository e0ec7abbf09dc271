//! A run's entries in the maps of a loaded object: its configuration, its
//! grants, its unix policy, its ring buffer and loss counters, all keyed
//! by the run id (its cgroup's id). The programs treat a task as part of a
//! run only while that run's `RUNS` entry exists, so registering is
//! writing the other entries first and `RUNS` last, and leaving is the
//! reverse.

use std::path::PathBuf;

use std::os::fd::AsFd as _;

use aya::maps::{HashMap, HashOfMaps, MapData, PerCpuHashMap, PerCpuValues, RingBuf};
use tartaros_common::capture::{LOST_SLOTS, RunConfig, UNIX_PREFIXES, UnixAllow, UnixPrefix};

use super::kbtf::KernelLayout;
use super::load::{Object, map_data, missing};
use super::{AttachOptions, ConnectGrant, EbpfError, early_ring};

/// What a registered run put in the maps, to take it out again.
#[derive(Debug)]
pub(super) struct Registered {
    pub id: u64,
    grants: Vec<tartaros_common::AllowKey>,
    config: RunConfig,
    /// The loss counters are read after the programs are gone (the last
    /// drain), so whoever reads them last removes them
    /// ([`super::ring_reader::LostCounters`]), not [`unregister`].
    pub lost_taken: bool,
    /// Whether the object is shared with other runs: then the run's ring
    /// is taken out of `EVENTS` at the end (a grace period's wait), unless
    /// the service placed it (it takes it out itself). An object of its
    /// own goes with its `EVENTS` and rings.
    pub shared: bool,
    /// Taken out of `EVENTS` by someone else: the service (its spare) or
    /// the run's janitor ([`Registered::leave_ring`]).
    spare_ring: bool,
}

impl Registered {
    /// The key of the run's ring in a shared `EVENTS`, which the run will
    /// not take out itself (the caller has it done after the run).
    pub(super) fn leave_ring(&mut self) -> Option<u64> {
        if !self.shared || self.spare_ring || self.config.ring == 0 {
            return None;
        }
        self.spare_ring = true;
        Some(self.config.ring)
    }
}

/// Registers run `id` with `options` in `object`, with a ring buffer of
/// `options.ring_bytes` (none for 0): the object's own `RING` when it was
/// made for this run, else one in its `EVENTS` (taken from [`early_ring`]
/// if one was prepared). Returns the ring's reader. On failure, whatever
/// was written is removed.
pub(super) fn register(
    object: &mut Object,
    id: u64,
    options: &AttachOptions,
    layout: Option<&KernelLayout>,
) -> Result<(Registered, Option<RingBuf<MapData>>), EbpfError> {
    let shared = object.is_shared();
    let unix = if options.unix_policy {
        unix_prefixes(&options.unix_allowed)?
    } else {
        Vec::new()
    };
    let mut run = Registered {
        id,
        grants: Vec::new(),
        config: config_for(id, options, layout),
        shared,
        spare_ring: false,
        lost_taken: false,
    };
    match fill(object, &mut run, options, &unix) {
        Ok(ring) => Ok((run, ring)),
        Err(e) => {
            unregister(object, &run);
            Err(e)
        }
    }
}

fn fill(
    object: &mut Object,
    run: &mut Registered,
    options: &AttachOptions,
    unix: &[UnixPrefix],
) -> Result<Option<RingBuf<MapData>>, EbpfError> {
    // Only the connect filter reads the grants (and without it a root
    // run's object has no `ALLOW`).
    if options.features() & tartaros_common::capture::feature::FILTER != 0 {
        for grant in &options.grants {
            insert_grant(object, run, *grant)?;
        }
        if options.attribution {
            for port in &options.gateway_ports {
                insert_key(
                    object,
                    run,
                    tartaros_common::AllowKey::gateway(run.id, *port),
                )?;
            }
        }
    }
    if options.unix_policy {
        let name = tartaros_common::MAP_UNIX_ALLOW;
        let mut allow = UnixAllow::NONE;
        for (slot, p) in allow.prefixes.iter_mut().zip(unix) {
            *slot = *p;
        }
        hash::<UnixAllow>(object, name)?
            .insert(run.id, allow, 0)
            .map_err(|source| EbpfError::Map { map: name, source })?;
    }
    let name = tartaros_common::MAP_EVENTS_LOST;
    let err = |source| EbpfError::Map { map: name, source };
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| EbpfError::Map {
        map: name,
        source: aya::maps::MapError::from(e),
    })?;
    let zeros =
        PerCpuValues::try_from(vec![[0u64; LOST_SLOTS]; cpus]).map_err(|e| EbpfError::Map {
            map: name,
            source: aya::maps::MapError::from(e),
        })?;
    PerCpuHashMap::<_, u64, [u64; LOST_SLOTS]>::try_from(
        object
            .map_mut(name)
            .ok_or_else(|| missing(format!("map {name}")))?,
    )
    .map_err(err)?
    .insert(run.id, zeros, 0)
    .map_err(err)?;
    let reader = match options.ring_bytes {
        0 => None,
        _ if !run.shared => {
            let reader = object.take_own_reader().ok_or_else(|| {
                missing(format!("the ring buffer {}", tartaros_common::MAP_EVENTS))
            })?;
            run.config.ring = early_ring::OWN_KEY;
            Some(reader)
        }
        bytes => {
            let placed = place_ring(object, bytes)?;
            run.config.ring = placed.key;
            run.spare_ring = placed.spare;
            Some(placed.reader)
        }
    };
    set_config(object, run.id, run.config)?;
    Ok(reader)
}

/// The run's ring, in `object`'s `EVENTS`: the one prepared for it, or a
/// new one (waiting for the grace period here).
fn place_ring(object: &Object, bytes: u32) -> Result<early_ring::Placed, EbpfError> {
    let name = tartaros_common::MAP_EVENTS;
    let err = |source| EbpfError::Map { map: name, source };
    let events = map_data(object, name).ok_or_else(|| missing(format!("map {name}")))?;
    let outer_id = events.info().map_err(err)?.id();
    if let Some(placed) = early_ring::take(bytes, outer_id) {
        return Ok(placed);
    }
    let outer = events.fd().as_fd().try_clone_to_owned().map_err(|source| {
        EbpfError::LoadObject(super::rawprog::RawError::Map {
            map: name.to_owned(),
            source,
        })
    })?;
    early_ring::create_and_place(bytes, outer, early_ring::unique_key())
        .map_err(EbpfError::LoadObject)
}

/// Removes every entry of `run` (what is not there is skipped).
pub(super) fn unregister(object: &mut Object, run: &Registered) {
    if let Ok(mut runs) = hash::<RunConfig>(object, tartaros_common::MAP_RUNS) {
        let _ = runs.remove(&run.id);
    }
    if run.shared
        && !run.spare_ring
        && run.config.ring != 0
        && let Some(map) = object.map_mut(tartaros_common::MAP_EVENTS)
        && let Ok(mut rings) = HashOfMaps::<_, u64, MapData>::try_from(map)
    {
        let _ = rings.remove(&run.config.ring);
    }
    if !run.lost_taken
        && let Some(map) = object.map_mut(tartaros_common::MAP_EVENTS_LOST)
        && let Ok(mut lost) = PerCpuHashMap::<_, u64, [u64; LOST_SLOTS]>::try_from(map)
    {
        let _ = lost.remove(&run.id);
    }
    if let Ok(mut unix) = hash::<UnixAllow>(object, tartaros_common::MAP_UNIX_ALLOW) {
        let _ = unix.remove(&run.id);
    }
    // Connections of the run that were established but never accepted
    // (their client closed while they waited in a gateway's backlog)
    // keep their entries for the gateway; at the run's end nothing will
    // take them, and the maps by connection are plain hashes, shared by
    // the service's runs: no LRU ages them out (round 22b).
    if let Some(map) = object.map_mut(tartaros_common::MAP_TPROXY_PORT) {
        remove_connections::<super::SavedDst>(map, run.id);
    }
    if let Some(map) = object.map_mut(tartaros_common::MAP_OWNER_PORT) {
        remove_connections::<u32>(map, run.id);
    }
    if let Some(map) = object.map_mut(tartaros_common::MAP_ALLOW)
        && let Ok(mut allow) = HashMap::<_, tartaros_common::AllowKey, u32>::try_from(map)
    {
        for key in &run.grants {
            let _ = allow.remove(key);
        }
    }
}

/// Removes every entry of run `run` from a map by connection (values of
/// type `V`).
fn remove_connections<V: aya::Pod>(map: &mut aya::maps::Map, run: u64) {
    let keys: Vec<super::TransparentKey> =
        match HashMap::<_, super::TransparentKey, V>::try_from(&*map) {
            Ok(m) => m
                .keys()
                .filter_map(Result::ok)
                .filter(|k| k.run == run)
                .collect(),
            Err(_) => return,
        };
    if keys.is_empty() {
        return;
    }
    if let Ok(mut m) = HashMap::<_, super::TransparentKey, V>::try_from(map) {
        for key in &keys {
            let _ = m.remove(key);
        }
    }
}

/// The ids of the runs whose ring is under `key`.
pub(super) fn runs_with_ring(object: &mut Object, key: u64) -> Vec<u64> {
    match hash::<RunConfig>(object, tartaros_common::MAP_RUNS) {
        Ok(runs) => runs
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, c)| c.ring == key)
            .map(|(id, _)| id)
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The ids of every run with an entry in `RUNS`.
pub(super) fn registered_ids(object: &mut Object) -> Vec<u64> {
    match hash::<RunConfig>(object, tartaros_common::MAP_RUNS) {
        Ok(runs) => runs.keys().filter_map(Result::ok).collect(),
        Err(_) => Vec::new(),
    }
}

/// The ids of every run with an entry in `RUNS`, `UNIX_ALLOW` or
/// `EVENTS_LOST` (a run killed while registering may have some alone).
pub(super) fn entry_ids(object: &mut Object) -> std::collections::BTreeSet<u64> {
    let mut ids: std::collections::BTreeSet<u64> = registered_ids(object).into_iter().collect();
    if let Ok(unix) = hash::<UnixAllow>(object, tartaros_common::MAP_UNIX_ALLOW) {
        ids.extend(unix.keys().filter_map(Result::ok));
    }
    if let Some(map) = object.map_mut(tartaros_common::MAP_EVENTS_LOST)
        && let Ok(lost) = PerCpuHashMap::<_, u64, [u64; LOST_SLOTS]>::try_from(map)
    {
        ids.extend(lost.keys().filter_map(Result::ok));
    }
    ids
}

/// Removes run `id`'s entries, whatever they are: for a run whose
/// supervisor died without leaving. Its grants are found by their key;
/// its ring is taken out of `EVENTS` too with `ring` (a grace period).
pub(super) fn forget(object: &mut Object, id: u64, ring: bool) {
    let grants = match object.map_mut(tartaros_common::MAP_ALLOW) {
        Some(map) => match HashMap::<_, tartaros_common::AllowKey, u32>::try_from(map) {
            Ok(allow) => allow
                .keys()
                .filter_map(Result::ok)
                .filter(|k| k.run == id)
                .collect(),
            Err(_) => Vec::new(),
        },
        None => Vec::new(),
    };
    let config = hash::<RunConfig>(object, tartaros_common::MAP_RUNS)
        .ok()
        .and_then(|runs| runs.get(&id, 0).ok())
        .unwrap_or_default();
    let run = Registered {
        id,
        grants,
        config,
        shared: true,
        spare_ring: !ring,
        lost_taken: false,
    };
    unregister(object, &run);
}

/// Grants one more destination to `run`.
pub(super) fn insert_grant(
    object: &mut Object,
    run: &mut Registered,
    grant: ConnectGrant,
) -> Result<(), EbpfError> {
    insert_key(object, run, grant.key(run.id))
}

/// Puts `key` in `run`'s part of the allow map (a grant, or a gateway's
/// port), to be taken out when the run leaves.
fn insert_key(
    object: &mut Object,
    run: &mut Registered,
    key: tartaros_common::AllowKey,
) -> Result<(), EbpfError> {
    let name = tartaros_common::MAP_ALLOW;
    let map = object
        .map_mut(name)
        .ok_or_else(|| missing(format!("map {name}")))?;
    HashMap::<_, tartaros_common::AllowKey, u32>::try_from(map)
        .map_err(|source| EbpfError::Map { map: name, source })?
        .insert(key, tartaros_common::ALLOW_VALUE, 0)
        .map_err(|source| EbpfError::Map { map: name, source })?;
    run.grants.push(key);
    Ok(())
}

/// Switches `run` between enforcing and monitoring.
pub(super) fn set_filter_mode(
    object: &mut Object,
    run: &mut Registered,
    mode: u32,
) -> Result<(), EbpfError> {
    run.config.filter_mode = mode;
    set_config(object, run.id, run.config)
}

fn set_config(object: &mut Object, id: u64, config: RunConfig) -> Result<(), EbpfError> {
    let name = tartaros_common::MAP_RUNS;
    hash::<RunConfig>(object, name)?
        .insert(id, config, 0)
        .map_err(|source| EbpfError::Map { map: name, source })
}

fn hash<'a, V: aya::Pod>(
    object: &'a mut Object,
    name: &'static str,
) -> Result<HashMap<&'a mut MapData, u64, V>, EbpfError> {
    let map = object
        .map_mut(name)
        .ok_or_else(|| missing(format!("map {name}")))?;
    HashMap::try_from(map).map_err(|source| EbpfError::Map { map: name, source })
}

/// The configuration of run `id`, with the offsets of `layout` if given.
pub(super) fn config_for(
    id: u64,
    options: &AttachOptions,
    layout: Option<&KernelLayout>,
) -> RunConfig {
    let capture = options.capture;
    let mut c = RunConfig {
        cgroup_id: id,
        cgroup_level: 0,
        policy_quiet: u32::from(capture),
        task_ti_status: u32::MAX,
        // Capture wakes the reader per quarter ring (at most 1 MiB); the
        // reader's 10 ms timer picks up the rest.
        wake_bytes: if capture {
            (options.ring_bytes / 4).min(1 << 20)
        } else {
            0
        },
        features: options.features(),
        filter_mode: tartaros_common::FILTER_ENFORCE,
        transparent_port: options.transparent_port.map_or(0, u32::from),
        ..RunConfig::default()
    };
    if let Some(l) = layout {
        c.exit_group_dead = u32::from(l.exit_group_dead);
        c.task_pid = l.task_pid;
        c.task_tgid = l.task_tgid;
        c.task_real_parent = l.task_real_parent;
        c.task_mm = l.task_mm;
        c.task_exit_code = l.task_exit_code;
        c.task_fs = l.task_fs;
        c.task_ti_status = l.task_ti_status.unwrap_or(u32::MAX);
        c.mm_arg_start = l.mm_arg_start;
        c.mm_arg_end = l.mm_arg_end;
        c.bprm_filename = l.bprm_filename;
        c.bprm_argc = l.bprm_argc;
    }
    c
}

/// The unix prefix slots for `allowed`: each made absolute-looking and
/// ending in `/`, so `/a/b` admits `/a/b/sock` but not `/a/bc/sock`.
pub(super) fn unix_prefixes(allowed: &[PathBuf]) -> Result<Vec<UnixPrefix>, EbpfError> {
    if allowed.len() > UNIX_PREFIXES as usize {
        return Err(EbpfError::UnixPrefix {
            path: allowed[UNIX_PREFIXES as usize].clone(),
            reason: format!("more than {UNIX_PREFIXES} prefixes"),
        });
    }
    allowed
        .iter()
        .map(|path| {
            let bad = |reason: &str| EbpfError::UnixPrefix {
                path: path.clone(),
                reason: reason.to_owned(),
            };
            let mut bytes = path.as_os_str().as_encoded_bytes().to_vec();
            if bytes.first() != Some(&b'/') {
                return Err(bad("not an absolute path"));
            }
            if path
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                return Err(bad("contains `..`"));
            }
            if bytes.last() != Some(&b'/') {
                bytes.push(b'/');
            }
            UnixPrefix::new(&bytes).ok_or_else(|| {
                bad("longer than a unix socket path can be (107 bytes); no socket under it could be reached by its absolute name")
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_prefixes_end_in_a_slash_and_refuse_what_cannot_match() {
        let p = unix_prefixes(&[PathBuf::from("/tmp/root")]).unwrap();
        assert_eq!(p[0].len, 10, "/tmp/root/");
        assert_eq!(
            p[0].words[1] & 0xffff,
            u64::from(b't') | (u64::from(b'/') << 8)
        );
        let p = unix_prefixes(&[PathBuf::from("/tmp/root/")]).unwrap();
        assert_eq!(p[0].len, 10);
        assert!(unix_prefixes(&[PathBuf::from("relative")]).is_err());
        assert!(unix_prefixes(&[PathBuf::from("/a/../b")]).is_err());
        assert!(unix_prefixes(&[PathBuf::from(format!("/{}", "x".repeat(120)))]).is_err());
        let many: Vec<PathBuf> = (0..9).map(|i| PathBuf::from(format!("/r{i}"))).collect();
        assert!(unix_prefixes(&many).is_err());
    }

    #[test]
    fn a_runs_configuration_says_what_is_installed_and_enforces() {
        use tartaros_common::capture::feature;
        let unix_only = AttachOptions {
            filter: false,
            unix_policy: true,
            ..AttachOptions::default()
        };
        let c = config_for(9, &unix_only, None);
        assert_eq!((c.cgroup_id, c.features), (9, feature::UNIX));
        assert_eq!(c.filter_mode, tartaros_common::FILTER_ENFORCE);
        assert_eq!(
            (c.policy_quiet, c.wake_bytes, c.transparent_port),
            (0, 0, 0)
        );
        let all = AttachOptions {
            capture: true,
            unix_policy: true,
            transparent_port: Some(3129),
            ..AttachOptions::default()
        };
        let c = config_for(9, &all, None);
        assert_eq!(
            c.features,
            feature::FILTER | feature::SOCK_OPS | feature::UNIX | feature::CAPTURE
        );
        assert_eq!((c.policy_quiet, c.transparent_port), (1, 3129));
        assert!(c.wake_bytes > 0);
    }
}
