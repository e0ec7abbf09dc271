//! The programs of root runs, verified once and reused.
//!
//! Loading and verifying the programs (with the maps they use) was most of
//! a root run's eBPF start-up: the two unix-socket programs of a plain run,
//! ~25 ms of verifier CPU for a `--log` run's tracing programs. The first
//! run pins what it loaded in a bpffs the supervisor mounts privately at
//! [`PIN_ROOT`] (mode 0700, root only): the programs, their maps and a
//! frozen manifest (the level and each program's tag). Later runs open the
//! pins, check them, and attach the same programs themselves: the cgroup
//! programs to their own cgroup, the tracing programs host-wide with the
//! run's id as the links' BPF cookie, which the programs compare with the
//! task's run (two runs each attaching them would otherwise record each
//! other's events twice). Each run keeps its entries (keyed by its cgroup
//! id) in the shared maps and removes them at its end; entries of a run
//! that was killed are removed by the next run that finds its cgroup gone.
//!
//! Two caches (`pin_checks::Profile`): the unix programs alone, from an
//! object loaded for a plain run (pinned after that run attached them),
//! and every program, from an object loaded for many runs, as the
//! service's is (made by the first other root run before it attaches;
//! `pin_full.rs`).
//!
//! A directory is named by a hash of its profile, the kernel (release,
//! build and, for every program, the structure layout read from its BTF),
//! the cgroup level the programs are configured for, and the embedded
//! object (its SHA-256, which covers the code, the map definitions and the
//! `.rodata`). It is made under a temporary name and renamed into place
//! under a lock file, so readers only ever see a whole one.
//!
//! Fail closed: a pinned object is used only if every check holds
//! (program type and tag, the set of maps the programs reference, each
//! map's type and sizes, the `.rodata` contents and the run level);
//! otherwise one warning, the directory is removed and the run loads
//! afresh. `tartaros cache drop` unmounts it all.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

pub(super) use super::pin_checks::Profile;
use super::pin_checks::{
    Expected, FULL_FEATURES, check_map, check_map_ids, check_program, created_shape, dir_name,
    manifest_bytes, manifest_size, manifest_tags, profile_for, stale_ids,
};
use super::pin_sys::{self, Kind, MapShape};
use super::{
    AttachOptions, EBPF_DIGEST, EBPF_OBJECT, UNIX_PROGRAMS, attach_steps, elf, kbtf, load, rawprog,
    register,
};

/// Where the bpffs of the cache is mounted.
pub const PIN_ROOT: &str = "/run/tartaros/bpf";
/// The lock file of every change to [`PIN_ROOT`].
pub const PIN_LOCK: &str = "/run/tartaros/bpf.lock";
/// The frozen array with the level and the programs' tags.
const MANIFEST: &str = "MANIFEST";
/// bpffs refuses names with a dot: `.rodata` is pinned as this.
const RODATA_PIN: &str = "map_rodata";

/// Errors of the cache; none fails a run (it loads afresh instead).
#[derive(Debug, thiserror::Error)]
pub enum PinCacheError {
    #[error("failed to reuse the cached programs in {}: {what}", dir.display())]
    Mismatch { dir: PathBuf, what: String },
    #[error("failed to {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to read the embedded eBPF object: {0}")]
    Object(String),
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PinCacheError {
    let path = path.to_path_buf();
    move |source| PinCacheError::Io { what, path, source }
}

/// What a run's programs came from, for the attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pins {
    /// Not a run the cache serves.
    Off,
    /// Opened from the cache of `profile` made for this level.
    Reused { level: u32, profile: Profile },
    /// The unix programs loaded afresh; to be pinned for this level once
    /// attached.
    Populate { level: u32 },
}

impl Pins {
    pub(super) fn level(self) -> Option<u32> {
        match self {
            Pins::Off => None,
            Pins::Reused { level, .. } | Pins::Populate { level } => Some(level),
        }
    }
}

/// Which cache serves a run of `options` (`profile_for`): root, not a
/// run of the service.
pub(super) fn eligible(options: &AttachOptions) -> Option<Profile> {
    use super::pin_checks::COOKIE_KERNEL;
    let (major, minor) = COOKIE_KERNEL;
    let cookies = aya::util::KernelVersion::current()
        .is_ok_and(|v| v >= aya::util::KernelVersion::new(major, minor, 0));
    profile_for(
        options.features(),
        options.ring_bytes,
        (nix::unistd::geteuid().is_root(), super::shared::adopted()),
        cookies,
    )
}

/// The level a run's cgroup will have (one below this process's own), to
/// open the cache before the cgroup exists.
pub(super) fn predicted_level() -> Option<u32> {
    let own = crate::cgroup::own_v2_dir()?;
    let level = load::cgroup_level(&own);
    (level != tartaros_common::capture::LEVEL_UNKNOWN).then_some(level + 1)
}

/// What names the kernel in a directory's name: its release and build,
/// and for [`Profile::Full`] the structure layout its programs were
/// filled with (`None`: unknown, then there is no such cache).
fn kernel_id(profile: Profile, layout: Option<&kbtf::KernelLayout>) -> Option<String> {
    let uts = nix::sys::utsname::uname().ok()?;
    let mut id = format!(
        "{}\0{}",
        uts.release().to_string_lossy(),
        uts.version().to_string_lossy()
    );
    if profile == Profile::Full {
        id.push('\0');
        id.push_str(&serde_json::to_string(layout?).ok()?);
    }
    Some(id)
}

/// The directory of the cache of `profile` for `level`.
pub(super) fn dir_of(
    profile: Profile,
    level: u32,
    layout: Option<&kbtf::KernelLayout>,
) -> Option<PathBuf> {
    let kernel = kernel_id(profile, layout)?;
    Some(Path::new(PIN_ROOT).join(dir_name(profile, &kernel, level, EBPF_DIGEST)))
}

/// The programs a cache of `profile` holds, in attach order.
pub(super) fn cached_programs(
    profile: Profile,
    layout: Option<&kbtf::KernelLayout>,
) -> (Vec<load::CgroupProgram>, Vec<load::TracingProgram>) {
    match profile {
        Profile::Unix => (UNIX_PROGRAMS.to_vec(), Vec::new()),
        Profile::Full => attach_steps::programs_for(FULL_FEATURES, layout),
    }
}

fn expected(
    profile: Profile,
    options: &AttachOptions,
    dir: &Path,
) -> Result<Expected, PinCacheError> {
    let object = |e: rawprog::RawError| PinCacheError::Object(e.to_string());
    let elf = elf::Elf::parse(EBPF_OBJECT).map_err(object)?;
    let own = |name: &str| match profile {
        Profile::Unix => options.own_map_entries(name),
        Profile::Full => None,
    };
    let mut maps: BTreeMap<String, MapShape> = elf
        .map_defs()
        .map_err(object)?
        .iter()
        .map(|def| {
            let shape = created_shape(profile, def, own(&def.name));
            (def.name.clone(), shape)
        })
        .collect();
    let serves = match profile {
        Profile::Unix => load::Serves::Run(options),
        Profile::Full => load::Serves::PinCache,
    };
    let rodata =
        load::rodata_for(&elf, serves).map_err(|e| mismatch(dir, format!("the object: {e}")))?;
    maps.insert(
        elf::RODATA.to_owned(),
        MapShape {
            map_type: pin_sys::MAP_TYPE_ARRAY,
            key_size: 4,
            value_size: u32::try_from(rodata.len()).unwrap_or(u32::MAX),
            max_entries: 1,
            flags: rawprog::MAP_F_RDONLY_PROG,
        },
    );
    Ok(Expected { maps, rodata })
}

/// The programs and maps of the cache of `profile` for `level`, checked;
/// `Pins` says what the attach does next. A mismatch is warned about (one
/// line) and the directory removed.
pub(super) fn take(
    profile: Profile,
    options: &AttachOptions,
    level: u32,
    layout: Option<&kbtf::KernelLayout>,
) -> (Option<(load::Object, load::Loaded)>, Pins) {
    let absent = match profile {
        Profile::Unix => Pins::Populate { level },
        // Made before the attach, by `pin_full::make`.
        Profile::Full => Pins::Off,
    };
    let Some(dir) = dir_of(profile, level, layout) else {
        return (None, Pins::Off);
    };
    match open(profile, options, &dir, level, layout) {
        Ok(Some(cached)) => (Some(cached), Pins::Reused { level, profile }),
        Ok(None) => (None, absent),
        Err(e) => {
            crate::tt_warn!("{e}; removed the cache, loading the programs afresh");
            let _lock = lock();
            let _ = std::fs::remove_dir_all(&dir);
            (None, absent)
        }
    }
}

fn mismatch(dir: &Path, what: impl Into<String>) -> PinCacheError {
    PinCacheError::Mismatch {
        dir: dir.to_path_buf(),
        what: what.into(),
    }
}

/// Opens a pin of the expected kind.
fn get(dir: &Path, pin: &str, want: Kind) -> Result<OwnedFd, PinCacheError> {
    let fd = pin_sys::get(&dir.join(pin))
        .map_err(|e| mismatch(dir, format!("cannot open {pin}: {e}")))?;
    if pin_sys::kind(fd.as_fd()) != want {
        return Err(mismatch(dir, format!("{pin} is not a {want:?}")));
    }
    Ok(fd)
}

fn open(
    profile: Profile,
    options: &AttachOptions,
    dir: &Path,
    level: u32,
    layout: Option<&kbtf::KernelLayout>,
) -> Result<Option<(load::Object, load::Loaded)>, PinCacheError> {
    if !dir.exists() || !pin_sys::is_bpffs(Path::new(PIN_ROOT)) {
        return Ok(None);
    }
    let opened = open_checked(profile, options, dir, level, layout);
    // Removed while being read (a `cache drop`, another run's removal):
    // simply not there.
    if opened.is_err() && !dir.exists() {
        return Ok(None);
    }
    opened.map(Some)
}

pub(super) fn open_checked(
    profile: Profile,
    options: &AttachOptions,
    dir: &Path,
    level: u32,
    layout: Option<&kbtf::KernelLayout>,
) -> Result<(load::Object, load::Loaded), PinCacheError> {
    let (cgroup_programs, tracing_programs) = cached_programs(profile, layout);
    let count = cgroup_programs.len() + tracing_programs.len();
    let manifest = get(dir, MANIFEST, Kind::Map)?;
    let mut value = vec![0u8; manifest_size(count)];
    pin_sys::array_value(manifest.as_fd(), 0, &mut value)
        .map_err(|e| mismatch(dir, format!("cannot read {MANIFEST}: {e}")))?;
    let tags = manifest_tags(&value, level, count).map_err(|what| mismatch(dir, what))?;
    let expected = expected(profile, options, dir)?;
    let mut referenced = BTreeSet::new();
    let mut open_program = |name: &str, prog_type: u32, tag: &[u8; 8]| {
        let fd = get(dir, &format!("prog_{name}"), Kind::Program)?;
        let facts = pin_sys::prog_facts(fd.as_fd())
            .map_err(|e| mismatch(dir, format!("cannot read {name}: {e}")))?;
        check_program(name, prog_type, tag, &facts).map_err(|what| mismatch(dir, what))?;
        referenced.extend(facts.map_ids);
        Ok::<_, PinCacheError>(fd)
    };
    let mut tags = tags.iter();
    let mut next_tag = || tags.next().ok_or_else(|| mismatch(dir, "too few tags"));
    let mut programs = Vec::with_capacity(cgroup_programs.len());
    for program in cgroup_programs {
        let fd = open_program(program.name, program.prog_type, next_tag()?)?;
        programs.push((program, fd));
    }
    let mut tracing = Vec::with_capacity(tracing_programs.len());
    for program in tracing_programs {
        let fd = open_program(program.spec.name, program.spec.prog_type, next_tag()?)?;
        tracing.push((program, fd));
    }
    let mut pinned = BTreeMap::new();
    let mut maps = Vec::new();
    let mut rodata = None;
    let entries =
        std::fs::read_dir(dir).map_err(|e| mismatch(dir, format!("cannot list it: {e}")))?;
    for entry in entries {
        let entry = entry.map_err(|e| mismatch(dir, format!("cannot list it: {e}")))?;
        let file = entry.file_name().to_string_lossy().into_owned();
        let name = match file.strip_prefix("map_") {
            Some(_) if file == RODATA_PIN => elf::RODATA.to_owned(),
            Some(name) => name.to_owned(),
            None if file == MANIFEST
                || file == super::pin_full::SPARES_PIN
                || file.starts_with("prog_") =>
            {
                continue;
            }
            None => return Err(mismatch(dir, format!("unexpected pin {file}"))),
        };
        let fd = get(dir, &file, Kind::Map)?;
        let facts = pin_sys::map_facts(fd.as_fd())
            .map_err(|e| mismatch(dir, format!("cannot read map {name}: {e}")))?;
        check_map(&name, expected.maps.get(&name), &facts).map_err(|what| mismatch(dir, what))?;
        pinned.insert(facts.id, name.clone());
        if name == elf::RODATA {
            rodata = Some(fd);
        } else {
            maps.push((name, fd));
        }
    }
    check_map_ids(&referenced, &pinned).map_err(|what| mismatch(dir, what))?;
    let rodata = rodata.ok_or_else(|| mismatch(dir, "no .rodata pinned"))?;
    let mut bytes = vec![0u8; expected.rodata.len()];
    pin_sys::array_value(rodata.as_fd(), 0, &mut bytes)
        .map_err(|e| mismatch(dir, format!("cannot read .rodata: {e}")))?;
    if bytes != expected.rodata {
        return Err(mismatch(dir, ".rodata differs from the object's"));
    }
    let run_level = maps
        .iter()
        .find(|(name, _)| name == tartaros_common::MAP_RUN_LEVEL)
        .ok_or_else(|| mismatch(dir, "no RUN_LEVEL pinned"))?;
    let mut word = [0u8; 4];
    pin_sys::array_value(run_level.1.as_fd(), 0, &mut word)
        .map_err(|e| mismatch(dir, format!("cannot read RUN_LEVEL: {e}")))?;
    if u32::from_le_bytes(word) != level {
        return Err(mismatch(
            dir,
            format!(
                "RUN_LEVEL is {} (expected {level})",
                u32::from_le_bytes(word)
            ),
        ));
    }
    let object = load::Object::from_fds(maps).map_err(|e| mismatch(dir, e.to_string()))?;
    let loaded = load::Loaded {
        cgroup: programs,
        tracing,
    };
    Ok((object, loaded))
}

/// Removes the entries of runs whose cgroup is gone (killed before they
/// could remove them), asking through the open cgroup2 directory
/// `cgroup`. Returns how many runs were removed.
/// In the cache of every program, their rings are taken out of `EVENTS`
/// too (a grace period's wait, only when there are such runs).
pub(super) fn sweep(object: &mut load::Object, cgroup: BorrowedFd<'_>, profile: Profile) -> usize {
    let ids = register::entry_ids(object);
    let stale = stale_ids(&ids, |id| pin_sys::cgroup_alive(cgroup, id));
    for id in &stale {
        register::forget(object, *id, profile == Profile::Full);
    }
    stale.len()
}

/// The lock of every change under [`PIN_ROOT`] (held until dropped).
pub(super) fn lock() -> Result<File, PinCacheError> {
    let path = Path::new(PIN_LOCK);
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(io("create", parent))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
        .map_err(io("open", path))?;
    file.lock().map_err(io("lock", path))?;
    Ok(file)
}

/// Mounts the cache's bpffs unless it is there (under the lock).
pub(super) fn mount_root() -> Result<(), PinCacheError> {
    let root = Path::new(PIN_ROOT);
    if pin_sys::is_bpffs(root) {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(root)
        .or_else(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                Ok(())
            } else {
                Err(e)
            }
        })
        .map_err(io("create", root))?;
    pin_sys::mount_bpffs(root).map_err(io("mount a bpffs on", root))
}

/// Pins what a run loaded afresh (`object`, `loaded`: the unix programs)
/// as the cache for `level`, unless another run did meanwhile.
pub(super) fn populate(
    object: &load::Object,
    loaded: &load::Loaded,
    level: u32,
) -> Result<(), PinCacheError> {
    let _lock = lock()?;
    mount_root()?;
    let dir = dir_of(Profile::Unix, level, None)
        .ok_or_else(|| PinCacheError::Object("the kernel has no name".into()))?;
    if dir.exists() {
        return Ok(());
    }
    let names: Vec<&str> = loaded.cgroup.iter().map(|(p, _)| p.name).collect();
    let unix: Vec<&str> = UNIX_PROGRAMS.iter().map(|p| p.name).collect();
    if names != unix || !loaded.tracing.is_empty() {
        return Err(PinCacheError::Object("not the unix programs alone".into()));
    }
    pin_into(object, loaded, level, &dir)
}

/// Pins `object` and `loaded` as the directory `dir`: filled under a
/// temporary name, then renamed into place. Under the lock.
pub(super) fn pin_into(
    object: &load::Object,
    loaded: &load::Loaded,
    level: u32,
    dir: &Path,
) -> Result<(), PinCacheError> {
    let root = Path::new(PIN_ROOT);
    remove_abandoned(root);
    let temporary = root.join(format!("tmp_{}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&temporary)
        .map_err(io("create", &temporary))?;
    let pinned = pin_all(object, loaded, level, &temporary)
        .and_then(|()| std::fs::rename(&temporary, dir).map_err(io("rename into place", dir)));
    if pinned.is_err() {
        let _ = std::fs::remove_dir_all(&temporary);
    }
    pinned
}

/// Removes the temporary directories of supervisors that died while
/// pinning (and this process's own, of an earlier attempt). Under the
/// lock, so none is being filled.
fn remove_abandoned(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("tmp_")) else {
            continue;
        };
        let own = pid == std::process::id().to_string();
        if own || !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn pin_all(
    object: &load::Object,
    loaded: &load::Loaded,
    level: u32,
    dir: &Path,
) -> Result<(), PinCacheError> {
    let pin = |fd: BorrowedFd<'_>, name: &str| {
        let path = dir.join(name);
        pin_sys::pin(fd, &path).map_err(io("pin", &path))
    };
    let programs = loaded
        .cgroup
        .iter()
        .map(|(p, fd)| (p.name, fd))
        .chain(loaded.tracing.iter().map(|(p, fd)| (p.spec.name, fd)));
    let mut tags = Vec::with_capacity(loaded.cgroup.len() + loaded.tracing.len());
    for (name, fd) in programs {
        let pin_name = format!("prog_{name}");
        tags.push(
            pin_sys::prog_facts(fd.as_fd())
                .map_err(io("read the tag of", &dir.join(&pin_name)))?
                .tag,
        );
        pin(fd.as_fd(), &pin_name)?;
    }
    for (name, fd) in object.map_fds() {
        // SAFETY: the descriptor is owned by `object`'s map, which
        // outlives this borrow.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        pin(fd, &format!("map_{name}"))?;
    }
    if let Some(rodata) = object.rodata_fd() {
        pin(rodata, RODATA_PIN)?;
    }
    let manifest = rawprog::create_map(rawprog::MapSpec {
        name: MANIFEST,
        map_type: pin_sys::MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: u32::try_from(manifest_size(tags.len())).unwrap_or(u32::MAX),
        max_entries: 1,
        flags: 0,
        inner_map: None,
    })
    .map_err(|e| PinCacheError::Object(e.to_string()))?;
    rawprog::fill_and_freeze(MANIFEST, manifest.as_fd(), &manifest_bytes(level, &tags))
        .map_err(|e| PinCacheError::Object(e.to_string()))?;
    pin(manifest.as_fd(), MANIFEST)
}

/// `tartaros cache drop`: unmounts the cache's bpffs and removes its
/// directory and lock. Returns whether there was anything to remove.
pub fn drop_cache() -> Result<bool, PinCacheError> {
    let root = Path::new(PIN_ROOT);
    let lock_path = Path::new(PIN_LOCK);
    if !root.exists() && !lock_path.exists() {
        return Ok(false);
    }
    let lock = lock()?;
    if root.exists() {
        pin_sys::unmount(root).map_err(io("unmount", root))?;
    }
    match std::fs::remove_dir(root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("remove", root)(e)),
    }
    let _ = std::fs::remove_file(lock_path);
    drop(lock);
    Ok(true)
}
