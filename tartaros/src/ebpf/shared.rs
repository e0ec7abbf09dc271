//! The programs of `tartaros service`, loaded, verified and attached once
//! at service start, for every run it supervises.
//!
//! - The cgroup programs are attached to one parent cgroup, under which
//!   every run's cgroup is created (attachments are inherited by the
//!   cgroups below; a task below the parent whose run is not registered is
//!   refused); the tracing programs run host-wide.
//! - A run's configuration, grants, unix policy, ring buffer and loss
//!   counters are its entries in the maps (`register.rs`), keyed by its
//!   cgroup id. So a run's start costs a cgroup and a few map updates, not a
//!   verifier pass.
//! - Workers are fresh processes: the service hands each the maps' file
//!   descriptors (inherited across its exec) and a manifest in
//!   [`MANIFEST_ENV`] naming them ([`adopt_from_env`]). The worker registers
//!   its one run and removes it when the run ends; the service's keeper
//!   thread forgets runs whose cgroup is gone (a worker that was killed)
//!   within 50 ms ([`SharedPrograms::sweep`]).
//! - Program descriptors and links stay in the service: when it exits, the
//!   programs are detached, and its runs, whose workers die with it, end
//!   unsealed.

use std::os::fd::{FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use tartaros_common::capture::{LEVEL_UNKNOWN, feature};

use super::{AttachOptions, CgroupPrograms, EbpfError, kbtf, load, register};

/// The variable that carries the manifest to a worker.
pub const MANIFEST_ENV: &str = "__TARTAROS_SHARED_EBPF";

/// What a worker is told about the service's programs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// The cgroup the programs are attached to; runs are created in it.
    pub parent: PathBuf,
    /// The `capture::feature` bits the service could install.
    pub features: u32,
    /// `name:tag` of every attached program.
    pub tags: Vec<String>,
    /// The maps, by name, and the descriptor each is inherited on.
    pub maps: Vec<(String, RawFd)>,
    /// A ring buffer already in `EVENTS` for this worker's run: its key,
    /// the descriptor it is inherited on, and its size.
    #[serde(default)]
    pub spare: Option<(u64, RawFd, u32)>,
    /// The ids of the tracing programs, whose skip counters a run reads
    /// (opened by id: program descriptors never leave the service).
    #[serde(default)]
    pub tracing_ids: Vec<u32>,
}

/// A ring buffer the service put into `EVENTS` for a run yet to come, so
/// that the grace period such an insert waits for is nobody's start-up.
#[derive(Debug)]
pub struct Spare {
    pub key: u64,
    pub bytes: u32,
    pub fd: OwnedFd,
}

/// Makes a [`Spare`] of `bytes` in the `EVENTS` behind `events` (a
/// descriptor of it); waits for a grace period.
pub fn make_spare(events: &OwnedFd, bytes: u32) -> Result<Spare, EbpfError> {
    let outer = events.try_clone().map_err(|source| {
        EbpfError::LoadObject(super::rawprog::RawError::Map {
            map: tartaros_common::MAP_EVENTS.to_owned(),
            source,
        })
    })?;
    let (key, fd) = super::early_ring::place_spare(bytes, outer).map_err(EbpfError::LoadObject)?;
    Ok(Spare { key, bytes, fd })
}

/// Takes the ring under `key` out of the `EVENTS` behind `events`; waits
/// for a grace period. A key that is not there is no error.
pub fn remove_ring(events: &OwnedFd, key: u64) {
    let Ok(fd) = events.try_clone() else { return };
    let Ok(data) = aya::maps::MapData::from_fd(fd) else {
        return;
    };
    if let Ok(mut rings) = aya::maps::HashOfMaps::<_, u64, aya::maps::MapData>::try_from(
        aya::maps::Map::HashOfMaps(data),
    ) {
        let _ = rings.remove(&key);
    }
}

/// The service's programs and maps.
pub struct SharedPrograms {
    // Links first: they are dropped (detached) before the maps.
    _links: Vec<(&'static str, OwnedFd)>,
    object: load::Object,
    manifest: Manifest,
}

impl std::fmt::Debug for SharedPrograms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPrograms")
            .field("manifest", &self.manifest)
            .finish_non_exhaustive()
    }
}

impl SharedPrograms {
    /// Loads the object and attaches every program the kernel takes to
    /// `parent`, an empty cgroup v2 directory whose level in the hierarchy
    /// is known. A part the kernel cannot take (the unix hooks, capture,
    /// `sock_ops`) is left out and named in the returned warnings; the runs
    /// that ask for it get the same error a run loading its own object
    /// would, and degrade (or refuse) as such a run does.
    pub fn start(parent: &Path) -> Result<(Self, Vec<String>), EbpfError> {
        let level = load::cgroup_level(parent);
        if level == LEVEL_UNKNOWN {
            return Err(EbpfError::OpenCgroup {
                path: parent.to_path_buf(),
                source: std::io::Error::other(
                    "its level in the cgroup v2 hierarchy is unknown (a cgroup namespace?)",
                ),
            });
        }
        let (cgroup, _) = super::attach_steps::open_cgroup(parent)?;
        let mut warnings = Vec::new();
        let mut wanted = AttachOptions {
            filter: true,
            capture: true,
            unix_policy: true,
            transparent_port: Some(1),
            ..AttachOptions::default()
        };
        let layout = loop {
            match super::attach_steps::check(&wanted) {
                Ok(layout) => break layout,
                Err(e) => drop_part(&mut wanted, e, &mut warnings)?,
            }
        };
        let mut object = load::load_object(load::Serves::Service, None)?;
        load::set_run_level(&mut object, level + 1)?;
        load::set_file_layout(&mut object, layout.as_ref())?;
        let attached = loop {
            let features = wanted.features();
            let transparent = wanted.transparent_port.is_some();
            match super::attach_steps::attach_programs(
                &object,
                (&cgroup, parent),
                (features, transparent),
                layout.as_ref(),
            ) {
                Ok(attached) => break attached,
                Err(e) => drop_part(&mut wanted, e, &mut warnings)?,
            }
        };
        let manifest = Manifest {
            parent: parent.to_path_buf(),
            features: wanted.features(),
            tags: attached.tags,
            maps: object
                .map_fds()
                .map(|(name, fd)| (name.to_owned(), fd))
                .collect(),
            spare: None,
            // All or none: a worker given none reads no counter and says
            // its log is incomplete.
            tracing_ids: attached
                .tracing
                .iter()
                .flatten()
                .map(|prog| super::rawprog::prog_id(std::os::fd::AsFd::as_fd(prog)))
                .collect::<Option<Vec<u32>>>()
                .unwrap_or_default(),
        };
        Ok((
            Self {
                _links: attached.links,
                object,
                manifest,
            },
            warnings,
        ))
    }

    /// What a worker is given.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// A descriptor of `EVENTS`, for [`make_spare`] and [`remove_ring`]
    /// (which wait for grace periods, so are called without a lock on
    /// this).
    pub fn events(&self) -> Option<OwnedFd> {
        let data = load::map_data(&self.object, tartaros_common::MAP_EVENTS)?;
        std::os::fd::AsFd::as_fd(data.fd())
            .try_clone_to_owned()
            .ok()
    }

    /// Forgets the runs whose ring is the spare under `key` (their worker
    /// has exited); the ring itself is for [`remove_ring`].
    pub fn forget_runs_of(&mut self, key: u64) {
        for id in register::runs_with_ring(&mut self.object, key) {
            register::forget(&mut self.object, id, false);
        }
    }

    /// Forgets every registered run whose cgroup is gone (its worker was
    /// killed before it could leave). The ids are read before the
    /// directory, so a run registered meanwhile is not mistaken for gone.
    pub fn sweep(&mut self) -> usize {
        let ids = register::registered_ids(&mut self.object);
        if ids.is_empty() {
            return 0;
        }
        let live: Vec<u64> = match std::fs::read_dir(&self.manifest.parent) {
            Ok(dir) => dir
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_dir())
                .map(|m| m.ino())
                .collect(),
            Err(_) => return 0,
        };
        let gone: Vec<u64> = ids.into_iter().filter(|id| !live.contains(id)).collect();
        for id in &gone {
            register::forget(&mut self.object, *id, true);
        }
        gone.len()
    }
}

/// Leaves out the part `error` is about, or gives the error back when it
/// is about none (then nothing can be shared).
fn drop_part(
    wanted: &mut AttachOptions,
    error: EbpfError,
    warnings: &mut Vec<String>,
) -> Result<(), EbpfError> {
    let part = match &error {
        EbpfError::UnixHooksUnsupported { .. } if wanted.unix_policy => {
            wanted.unix_policy = false;
            "the unix socket policy"
        }
        EbpfError::CaptureUnsupported(_) | EbpfError::AttachTracing { .. } if wanted.capture => {
            wanted.capture = false;
            "capture"
        }
        EbpfError::Transparent(_) if wanted.transparent_port.is_some() => {
            wanted.transparent_port = None;
            "transparent interception"
        }
        _ => return Err(error),
    };
    warnings.push(format!("{part} is not shared: {error}"));
    Ok(())
}

/// The service's maps, adopted by a worker for its one run.
struct Adopted {
    object: load::Object,
    manifest: Manifest,
    /// The ring the service placed for this run, until it is taken.
    spare: Option<(u64, OwnedFd, u32)>,
}

static ADOPTED: Mutex<Option<Adopted>> = Mutex::new(None);

/// In a worker: takes the maps the service handed over, if it did, and
/// removes [`MANIFEST_ENV`] from the environment. Call it first, while
/// single-threaded. The descriptors are made close-on-exec again, so no
/// process the worker starts inherits them.
pub fn adopt_from_env() -> Result<(), EbpfError> {
    let Some(text) = std::env::var_os(MANIFEST_ENV) else {
        return Ok(());
    };
    // SAFETY: called while the worker is single-threaded.
    unsafe { std::env::remove_var(MANIFEST_ENV) };
    let bad = |what: String| EbpfError::MissingInObject { what };
    let manifest: Manifest = serde_json::from_str(&text.to_string_lossy())
        .map_err(|e| bad(format!("a readable manifest from the service ({e})")))?;
    // Close-on-exec first, all of them, so none leaks into what this
    // process starts even if one below is refused.
    let spare_fd = manifest.spare.map(|(_, fd, _)| fd);
    for fd in manifest.maps.iter().map(|(_, fd)| *fd).chain(spare_fd) {
        // SAFETY: F_SETFD changes only the flags of the descriptor.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    let spare = match manifest.spare {
        // SAFETY: F_GETFD checks the descriptor is open; the service
        // placed this ring on it for us alone, owned from here on.
        Some((key, fd, bytes)) if unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0 => {
            Some((key, unsafe { OwnedFd::from_raw_fd(fd) }, bytes))
        }
        _ => None,
    };
    let mut fds = Vec::with_capacity(manifest.maps.len());
    for (name, fd) in &manifest.maps {
        // SAFETY: F_SETFD changes only the flags of the descriptor, and
        // F_GETFD first checks that it is open.
        let open = unsafe {
            libc::fcntl(*fd, libc::F_GETFD) >= 0
                && libc::fcntl(*fd, libc::F_SETFD, libc::FD_CLOEXEC) == 0
        };
        if !open {
            return Err(bad(format!("map {name} on descriptor {fd}")));
        }
        // SAFETY: the service placed this map on this descriptor for us
        // alone; it is open (checked above) and owned from here on.
        fds.push((name.clone(), unsafe { OwnedFd::from_raw_fd(*fd) }));
    }
    let object = load::Object::from_fds(fds)?;
    if let Ok(mut adopted) = ADOPTED.lock() {
        *adopted = Some(Adopted {
            object,
            manifest,
            spare,
        });
    }
    Ok(())
}

/// Starts making the run's ring of `bytes` ready: the service's spare if
/// it is of that size, else one placed into the adopted `EVENTS`, else
/// (no service) one placed into the pin cache's `EVENTS`, else one of the
/// run's own object.
pub(super) fn prepare_ring(bytes: u32, announce: &mut dyn FnMut(&super::LeftRing)) {
    let Ok(mut guard) = ADOPTED.lock() else {
        return;
    };
    let Some(adopted) = guard.as_mut() else {
        drop(guard);
        // A spare of the pin cache when there is one, else one put into
        // its `EVENTS` (the run will most likely take its programs from
        // there), else one for an object of the run's own. A ring in the
        // cache's `EVENTS` is announced before it is this run's, so that
        // it is taken out after the run whatever happens to the run
        // before it registers (refused, killed, or loading its own
        // programs after all).
        if let Some(pin) = super::pin_full::events_pin() {
            if let Some((key, ring, outer_id)) = super::pin_full::take_spare(bytes, &pin, announce)
            {
                return super::early_ring::prepare_spare(bytes, ring, key, outer_id, false);
            }
            if let Ok(events) = super::pin_sys::get(&pin) {
                let key = super::early_ring::unique_key();
                announce(&super::LeftRing { pin, key, bytes });
                return super::early_ring::prepare_keyed(bytes, Some((events, key)));
            }
        }
        return super::early_ring::prepare(bytes, None);
    };
    let Some(data) = load::map_data(&adopted.object, tartaros_common::MAP_EVENTS) else {
        return;
    };
    let Ok(outer_id) = data.info().map(|i| i.id()) else {
        return;
    };
    match adopted.spare.take() {
        Some((key, ring, size)) if size == bytes => {
            super::early_ring::prepare_spare(bytes, ring, key, outer_id, true);
        }
        _ => {
            let events = std::os::fd::AsFd::as_fd(data.fd())
                .try_clone_to_owned()
                .ok();
            if events.is_some() {
                super::early_ring::prepare(bytes, events);
            }
        }
    }
}

/// Whether this process holds the service's programs (a worker).
pub fn adopted() -> bool {
    ADOPTED.lock().is_ok_and(|a| a.is_some())
}

/// The cgroup under which a worker must create its run's cgroup.
pub fn adopted_parent() -> Option<PathBuf> {
    let adopted = ADOPTED.lock().ok()?;
    adopted.as_ref().map(|a| a.manifest.parent.clone())
}

/// Registers the run of `cgroup_dir` with the adopted maps (`None` when
/// none were adopted: the caller loads its own). A part the service could
/// not install fails as it would for a run loading the object itself.
pub(super) fn register_adopted(
    cgroup_dir: &Path,
    options: &AttachOptions,
    started: Instant,
) -> Option<Result<CgroupPrograms, EbpfError>> {
    let mut guard = ADOPTED.lock().ok()?;
    let adopted = guard.as_mut()?;
    // Until the run is registered, a failure keeps the maps for a retry
    // without the part that failed.
    let (run, ring, tags) = match register_in(adopted, cgroup_dir, options) {
        Ok(registered) => registered,
        Err(e) => return Some(Err(e)),
    };
    let adopted = guard.take()?;
    // All of them or none (then the run's skips are unknown: a gap).
    let ids = &adopted.manifest.tracing_ids;
    let tracing = ids
        .iter()
        .map(|id| super::rawprog::prog_by_id(*id))
        .collect::<Option<Vec<_>>>()
        .filter(|progs| !progs.is_empty());
    let object = adopted.object;
    // On a failure here the handle, dropped, removes the entries.
    Some(super::attach_steps::finish(
        object,
        run,
        ring,
        super::attach_steps::Attached {
            links: Vec::new(),
            tags,
            tracing,
        },
        cgroup_dir,
        options,
        started,
    ))
}

type Registration = (
    register::Registered,
    Option<aya::maps::RingBuf<aya::maps::MapData>>,
    Vec<String>,
);

fn register_in(
    adopted: &mut Adopted,
    cgroup_dir: &Path,
    options: &AttachOptions,
) -> Result<Registration, EbpfError> {
    let missing = options.features() & !adopted.manifest.features;
    if let Some(e) = missing_part_error(missing) {
        return Err(e);
    }
    if cgroup_dir.parent() != Some(adopted.manifest.parent.as_path()) {
        return Err(EbpfError::OpenCgroup {
            path: cgroup_dir.to_path_buf(),
            source: std::io::Error::other(format!(
                "not a child of the service's cgroup {}",
                adopted.manifest.parent.display()
            )),
        });
    }
    let layout: Option<kbtf::KernelLayout> = super::attach_steps::check(options)?;
    let (_, id) = super::attach_steps::open_cgroup(cgroup_dir)?;
    let (run, ring) = register::register(&mut adopted.object, id, options, layout.as_ref())?;
    Ok((run, ring, adopted.manifest.tags.clone()))
}

/// The error a run loading its own object would get for the first part
/// in `missing` (`capture::feature` bits).
fn missing_part_error(missing: u32) -> Option<EbpfError> {
    let because = "the service could not install it (see its start-up warnings)";
    if missing & feature::UNIX != 0 {
        return Some(EbpfError::UnixHooksUnsupported {
            reason: because.into(),
        });
    }
    if missing & feature::CAPTURE != 0 {
        return Some(EbpfError::CaptureUnsupported(because.into()));
    }
    if missing & feature::SOCK_OPS != 0 {
        return Some(EbpfError::Transparent(Box::new(
            EbpfError::MissingInObject {
                what: format!("sock_ops: {because}"),
            },
        )));
    }
    (missing != 0).then(|| EbpfError::MissingInObject {
        what: format!("the connect filter: {because}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_the_service_lacks_fails_as_a_run_of_its_own_would() {
        assert!(missing_part_error(0).is_none());
        assert!(matches!(
            missing_part_error(feature::UNIX | feature::CAPTURE),
            Some(EbpfError::UnixHooksUnsupported { .. })
        ));
        assert!(matches!(
            missing_part_error(feature::CAPTURE),
            Some(EbpfError::CaptureUnsupported(_))
        ));
        assert!(matches!(
            missing_part_error(feature::SOCK_OPS),
            Some(EbpfError::Transparent(_))
        ));
    }

    #[test]
    fn the_manifest_round_trips() {
        let m = Manifest {
            parent: PathBuf::from("/sys/fs/cgroup/x/tartaros-1-2"),
            features: 15,
            tags: vec!["connect4:abc".into()],
            maps: vec![("RUNS".into(), 7)],
            spare: Some((99, 8, 1 << 20)),
            tracing_ids: vec![41, 42],
        };
        let text = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<Manifest>(&text).unwrap(), m);
    }
}
