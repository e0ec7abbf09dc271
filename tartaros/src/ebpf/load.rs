//! Loading the object, filling its maps, attaching programs (the steps of
//! `attach_with`).

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use aya::maps::{Array, Map, MapData, RingBuf};
use tartaros_common::capture::{KFUNC_CAST_TO_KERN_CTX, KFUNC_SET_SUN_PATH, LEVEL_UNKNOWN};

use super::AttachOptions;
use super::kbtf::KernelLayout;
use super::rawprog::{self, ProgSpec, RawError};
use super::{EBPF_OBJECT, EbpfError, early_ring, elf};

/// The maps of the embedded object, created by us (see `elf.rs` for why
/// not through aya's loader), each wrapped in aya's typed handle. Shared by
/// every run registered in it (`register.rs`).
pub(super) struct Object {
    maps: Vec<ObjectMap>,
    /// The frozen `.rodata` array, referenced by the programs that use it.
    rodata: Option<OwnedFd>,
    /// Made for many runs (the service's): each run's ring is in `EVENTS`.
    /// Otherwise for one run, whose ring is `RING`.
    shared: bool,
    /// With one run: `RING`'s reader, mapped on a thread.
    own_reader: Option<std::thread::JoinHandle<Option<RingBuf<MapData>>>>,
}

struct ObjectMap {
    name: String,
    /// The map's descriptor, owned by `map`, for relocating programs and
    /// for handing the map to a service worker.
    fd: RawFd,
    map: Map,
}

impl Object {
    pub(super) fn map_mut(&mut self, name: &str) -> Option<&mut Map> {
        self.maps
            .iter_mut()
            .find(|m| m.name == name)
            .map(|m| &mut m.map)
    }

    pub(super) fn map(&self, name: &str) -> Option<&Map> {
        self.maps.iter().find(|m| m.name == name).map(|m| &m.map)
    }

    /// Whether the object serves many runs ([`load_object`]).
    pub(super) fn is_shared(&self) -> bool {
        self.shared
    }

    /// With one run: the reader of its `RING`, once.
    pub(super) fn take_own_reader(&mut self) -> Option<RingBuf<MapData>> {
        if let Some(thread) = self.own_reader.take() {
            return thread.join().ok()?;
        }
        let data = map_data(self, RING)?;
        let fd = std::os::fd::AsFd::as_fd(data.fd())
            .try_clone_to_owned()
            .ok()?;
        RingBuf::try_from(Map::RingBuf(MapData::from_fd(fd).ok()?)).ok()
    }

    /// Descriptor of map `name` ([`elf::RODATA`] for the read-only data).
    fn map_fd(&self, name: &str) -> Option<RawFd> {
        if name == elf::RODATA {
            return self.rodata.as_ref().map(|fd| fd.as_raw_fd());
        }
        self.maps.iter().find(|m| m.name == name).map(|m| m.fd)
    }

    /// The frozen `.rodata`'s descriptor (what the pin cache pins).
    pub(super) fn rodata_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.rodata.as_ref().map(|fd| fd.as_fd())
    }

    /// Every map's name and descriptor (what a service worker is given).
    pub(super) fn map_fds(&self) -> impl Iterator<Item = (&str, RawFd)> {
        self.maps.iter().map(|m| (m.name.as_str(), m.fd))
    }

    /// The maps of an object loaded by another process, from their
    /// descriptors (each checked to be a map of that name).
    pub(super) fn from_fds(fds: Vec<(String, OwnedFd)>) -> Result<Self, EbpfError> {
        let mut maps = Vec::with_capacity(fds.len());
        for (name, fd) in fds {
            let raw = fd.as_raw_fd();
            let wrap = |source| {
                EbpfError::LoadObject(RawError::Wrap {
                    map: name.clone(),
                    source: Box::new(source),
                })
            };
            let data = MapData::from_fd(fd).map_err(wrap)?;
            // The raw name: aya's `name_as_str` first probes the kernel's
            // features (a dozen BTF and program loads, ~2 ms per worker).
            let info = data.info().map_err(wrap)?;
            let actual = String::from_utf8_lossy(info.name())
                .trim_end_matches('\0')
                .to_owned();
            if actual != short_name(&name) {
                return Err(missing(format!(
                    "map {name} (the descriptor is {actual:?})"
                )));
            }
            let map = Map::from_map_data(data).map_err(wrap)?;
            maps.push(ObjectMap { name, fd: raw, map });
        }
        Ok(Self {
            maps,
            rodata: None,
            shared: true,
            own_reader: None,
        })
    }

    /// The code of program `name`, its map references pointing at our
    /// maps.
    pub(super) fn relocated(&self, name: &str) -> Result<elf::Relocated, RawError> {
        elf::relocated(EBPF_OBJECT, name, &|map| self.map_fd(map))
    }
}

/// The name the kernel keeps for a map (see `rawprog::create_map`).
pub(super) fn short_name(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
        .take(15)
        .collect()
}

/// The ring of an object made for one run.
const RING: &str = "RING";
/// The `.rodata` global that tells the programs which ring to use.
const RINGS_SHARED: &str = "RINGS_SHARED";
/// The `.rodata` global that tells the tracing programs to compare the
/// link's cookie with the run.
const ATTACH_COOKIES: &str = "ATTACH_COOKIES";

/// The maps that `programs` reference. A run that loads some programs
/// only needs their maps: creating the others (a preallocated 2.4 MB
/// `PENDING`, four LRU maps) cost about as much CPU as verifying the unix
/// programs of a plain root run.
pub(super) fn maps_used(programs: &[&str]) -> Result<BTreeSet<String>, EbpfError> {
    let used = RefCell::new(BTreeSet::new());
    for program in programs {
        // Relocated against a placeholder descriptor, only to see the names.
        elf::relocated(EBPF_OBJECT, program, &|map| {
            used.borrow_mut().insert(map.to_owned());
            Some(0)
        })
        .map_err(EbpfError::LoadObject)?;
    }
    Ok(used.into_inner())
}

/// Whom an object's maps and programs serve.
#[derive(Clone, Copy, Debug)]
pub(super) enum Serves<'a> {
    /// The one run of these options: its ring of `ring_bytes` (0: none) is
    /// `RING`, taken from [`early_ring`] when it was prepared, and its maps
    /// are sized to it ([`AttachOptions::own_map_entries`]).
    Run(&'a AttachOptions),
    /// Every run of the service, which attaches the programs once.
    Service,
    /// Every root run that takes it from the pin cache; each run attaches
    /// the tracing programs itself, with its id as the links' cookie.
    PinCache,
}

/// The `.rodata` globals the loader sets, by whom the object serves:
/// `RINGS_SHARED` (rings in `EVENTS`) and `ATTACH_COOKIES`. Pure.
pub(super) fn rodata_globals(serves: Serves<'_>) -> [(&'static str, u32); 2] {
    let (shared, cookies) = match serves {
        Serves::Run(_) => (0, 0),
        Serves::Service => (1, 0),
        Serves::PinCache => (1, 1),
    };
    [(RINGS_SHARED, shared), (ATTACH_COOKIES, cookies)]
}

/// The object's `.rodata` with the globals of [`rodata_globals`] set.
pub(super) fn rodata_for(elf: &elf::Elf<'_>, serves: Serves<'_>) -> Result<Vec<u8>, EbpfError> {
    let mut bytes = elf
        .rodata()
        .map_err(EbpfError::LoadObject)?
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    for (global, value) in rodata_globals(serves) {
        let at = elf
            .rodata_offset(global)
            .map_err(EbpfError::LoadObject)?
            .ok_or_else(|| missing(format!("the global {global}")))?;
        let slot = bytes
            .get_mut(at..at + 4)
            .ok_or_else(|| missing(format!("the global {global} in .rodata")))?;
        slot.copy_from_slice(&value.to_le_bytes());
    }
    Ok(bytes)
}

/// Creates the maps the embedded object declares (only those in `only`,
/// when given) and the frozen `.rodata`, for whom `serves` says: many
/// runs' rings go into `EVENTS` (a map of maps), one run's is `RING`.
pub(super) fn load_object(
    serves: Serves<'_>,
    only: Option<&BTreeSet<String>>,
) -> Result<Object, EbpfError> {
    let own = match serves {
        Serves::Run(options) => Some(options),
        Serves::Service | Serves::PinCache => None,
    };
    let shared = own.is_none();
    let ring_bytes = own.map_or(0, |o| o.ring_bytes);
    let elf = elf::Elf::parse(EBPF_OBJECT).map_err(EbpfError::LoadObject)?;
    let defs = elf.map_defs().map_err(EbpfError::LoadObject)?;
    let mut maps = Vec::with_capacity(defs.len());
    let mut own_reader = None;
    let wanted = |name: &str| only.is_none_or(|only| only.contains(name));
    for def in defs.iter().filter(|def| wanted(&def.name)) {
        let fd = if def.name == tartaros_common::MAP_EVENTS {
            if (def.key_size, def.value_size) != (8, 4) {
                return Err(missing(format!("map {} of u64 -> u32", def.name)));
            }
            match own {
                None => events_map(def.max_entries).map_err(EbpfError::LoadObject)?,
                // A run of its own reads `RING`: the programs' branch that
                // looks a ring up in `EVENTS` is dead (`RINGS_SHARED` is 0
                // in the frozen `.rodata`), which the verifier sees and
                // skips, so the map only has to exist, as declared.
                Some(_) => rawprog::create_map(rawprog::MapSpec {
                    name: &def.name,
                    map_type: def.map_type,
                    key_size: def.key_size,
                    value_size: def.value_size,
                    max_entries: 1,
                    flags: def.flags,
                    inner_map: None,
                })
                .map_err(EbpfError::LoadObject)?,
            }
        } else if def.name == RING && !shared && ring_bytes > 0 {
            match early_ring::take_own(ring_bytes) {
                Some((fd, reader)) => {
                    own_reader = Some(reader);
                    fd
                }
                None => early_ring::create(ring_bytes).map_err(EbpfError::LoadObject)?,
            }
        } else {
            rawprog::create_map(rawprog::MapSpec {
                name: &def.name,
                map_type: def.map_type,
                key_size: def.key_size,
                value_size: def.value_size,
                max_entries: own
                    .and_then(|o| o.own_map_entries(&def.name))
                    .unwrap_or(def.max_entries),
                flags: def.flags,
                inner_map: None,
            })
            .map_err(EbpfError::LoadObject)?
        };
        let raw = fd.as_raw_fd();
        let wrap = |source| {
            EbpfError::LoadObject(RawError::Wrap {
                map: def.name.clone(),
                source: Box::new(source),
            })
        };
        let map = Map::from_map_data(MapData::from_fd(fd).map_err(wrap)?).map_err(wrap)?;
        maps.push(ObjectMap {
            name: def.name.clone(),
            fd: raw,
            map,
        });
    }
    let rodata_bytes = rodata_for(&elf, serves)?;
    let rodata = if rodata_bytes.is_empty() {
        None
    } else {
        let value_size = u32::try_from(rodata_bytes.len()).unwrap_or(u32::MAX);
        let fd = rawprog::create_map(rawprog::MapSpec {
            name: elf::RODATA,
            map_type: MAP_TYPE_ARRAY,
            key_size: 4,
            value_size,
            max_entries: 1,
            flags: rawprog::MAP_F_RDONLY_PROG,
            inner_map: None,
        })
        .map_err(EbpfError::LoadObject)?;
        rawprog::fill_and_freeze(elf::RODATA, fd.as_fd(), &rodata_bytes)
            .map_err(EbpfError::LoadObject)?;
        Some(fd)
    };
    Ok(Object {
        maps,
        rodata,
        shared,
        own_reader,
    })
}

/// `BPF_MAP_TYPE_ARRAY`.
const MAP_TYPE_ARRAY: u32 = 2;

/// `EVENTS`, for `max_entries` rings.
fn events_map(max_entries: u32) -> Result<OwnedFd, RawError> {
    // What the rings inside are like (any size will do).
    let template = rawprog::create_map(rawprog::MapSpec {
        name: "EVENTS_INNER",
        map_type: early_ring::MAP_TYPE_RINGBUF,
        key_size: 0,
        value_size: 0,
        max_entries: 4096,
        flags: 0,
        inner_map: None,
    })?;
    early_ring::create_outer(template.as_fd(), max_entries)
}

pub(super) use super::layout_cache::{
    kernel_layout, kernel_layout_from_cache, kernel_layout_ready,
};

pub(super) fn missing(what: String) -> EbpfError {
    EbpfError::MissingInObject { what }
}

/// Sets the level of every run's cgroup (`LEVEL_UNKNOWN`: a run is the
/// task's own cgroup).
pub(super) fn set_run_level(object: &mut Object, level: u32) -> Result<(), EbpfError> {
    let name = tartaros_common::MAP_RUN_LEVEL;
    let map = object
        .map_mut(name)
        .ok_or_else(|| missing(format!("map {name}")))?;
    let mut array =
        Array::<_, u32>::try_from(map).map_err(|source| EbpfError::Map { map: name, source })?;
    array
        .set(0, level, 0)
        .map_err(|source| EbpfError::Map { map: name, source })
}

/// Fills `FILE_LAYOUT` when the kernel BTF had every offset; otherwise the
/// map stays zero and the program reads no file (its records say so).
pub(super) fn set_file_layout(
    object: &mut Object,
    layout: Option<&KernelLayout>,
) -> Result<(), EbpfError> {
    let Some(Ok(file)) = layout.map(|l| &l.file) else {
        return Ok(());
    };
    let name = tartaros_common::capture::MAP_FILE_LAYOUT;
    let map = object
        .map_mut(name)
        .ok_or_else(|| missing(format!("map {name}")))?;
    let mut array = Array::<_, tartaros_common::capture::FileLayout>::try_from(map)
        .map_err(|source| EbpfError::Map { map: name, source })?;
    array
        .set(0, *file, 0)
        .map_err(|source| EbpfError::Map { map: name, source })
}

/// The kernel-side data of a map, for its fd.
pub(super) fn map_data<'a>(object: &'a Object, name: &str) -> Option<&'a MapData> {
    match object.map(name)? {
        Map::Array(d)
        | Map::HashMap(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuHashMap(d)
        | Map::RingBuf(d) => Some(d),
        Map::HashOfMaps(d) => Some(d),
        _ => None,
    }
}

/// Level of `dir` in the cgroup v2 hierarchy (root = 0), counted up to the
/// root of the cgroup2 mount. `LEVEL_UNKNOWN` when that mount root is not
/// the hierarchy's root (inode 1; e.g. inside a cgroup namespace), where
/// the count would not be the kernel's level.
pub(super) fn cgroup_level(dir: &Path) -> u32 {
    let Ok(mut dir) = dir.canonicalize() else {
        return LEVEL_UNKNOWN;
    };
    if !is_cgroup2(&dir) {
        return LEVEL_UNKNOWN;
    }
    let mut level = 0;
    loop {
        let Some(parent) = dir.parent().map(Path::to_path_buf) else {
            return LEVEL_UNKNOWN;
        };
        if !is_cgroup2(&parent) {
            let root_ino = std::fs::metadata(&dir).map(|m| m.ino()).unwrap_or(0);
            return if root_ino == 1 { level } else { LEVEL_UNKNOWN };
        }
        level += 1;
        dir = parent;
    }
}

fn is_cgroup2(path: &Path) -> bool {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a zeroed statfs
    // the kernel fills in.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == CGROUP2_SUPER_MAGIC
    }
}

/// A cgroup program of the object: what it is and where it attaches.
#[derive(Clone, Copy, Debug)]
pub(super) struct CgroupProgram {
    pub name: &'static str,
    pub prog_type: u32,
    pub attach_type: u32,
}

/// A `tp_btf` program of the object (its spec names the BTF target).
#[derive(Clone, Copy, Debug)]
pub(super) struct TracingProgram {
    pub spec: ProgSpec<'static>,
}

/// A kernel function the programs call through a placeholder helper number.
pub(super) struct Kfunc {
    pub name: &'static str,
    pub placeholder: u32,
    pub btf_id: Option<u32>,
}

/// The kfuncs of our programs, with their ids in the running kernel.
pub(super) fn kfuncs(layout: Option<&KernelLayout>) -> [Kfunc; 2] {
    [
        Kfunc {
            name: "bpf_sock_addr_set_sun_path",
            placeholder: KFUNC_SET_SUN_PATH,
            btf_id: layout.and_then(|l| l.set_sun_path),
        },
        Kfunc {
            name: "bpf_cast_to_kern_ctx",
            placeholder: KFUNC_CAST_TO_KERN_CTX,
            btf_id: layout.and_then(|l| l.cast_to_kern_ctx),
        },
    ]
}

/// Programs loaded (verified) into the kernel, not attached yet, in the
/// order they were asked for.
pub(super) struct Loaded {
    pub cgroup: Vec<(CgroupProgram, OwnedFd)>,
    pub tracing: Vec<(TracingProgram, OwnedFd)>,
}

/// A program to verify: where its result goes, and its size.
struct Job {
    index: usize,
    spec: ProgSpec<'static>,
    size: usize,
}

type JobResult = (usize, Result<OwnedFd, (&'static str, RawError)>);

/// Loads `cgroup` and `tracing`. The verifier is most of the attach time,
/// so two threads (this one and a helper) take the programs from one
/// queue, largest first: `sys_exit` alone costs about as much as all the
/// others together, and starting it first keeps it off the end of the
/// critical path. Without a helper thread, this one loads everything.
/// `kfuncs`: the kernel's BTF ids of the kfuncs the programs may call (see
/// [`kfuncs`]); a program that calls one the kernel lacks cannot load.
pub(super) fn load_programs(
    object: &Object,
    cgroup: &[CgroupProgram],
    tracing: &[TracingProgram],
    kfuncs: &[Kfunc],
) -> Result<Loaded, (&'static str, RawError)> {
    let specs = cgroup
        .iter()
        .map(|p| ProgSpec {
            name: p.name,
            prog_type: p.prog_type,
            expected_attach_type: p.attach_type,
            attach_btf_id: 0,
        })
        .chain(tracing.iter().map(|p| p.spec));
    let elf = elf::Elf::parse(EBPF_OBJECT).map_err(|e| ("the eBPF object", e))?;
    let mut jobs = Vec::with_capacity(cgroup.len() + tracing.len());
    for (index, spec) in specs.enumerate() {
        let size = elf.program_size(spec.name).map_err(|e| (spec.name, e))?;
        jobs.push(Job { index, spec, size });
    }
    jobs.sort_by_key(|job| std::cmp::Reverse(job.size));
    let next = AtomicUsize::new(0);
    let work = || -> Vec<JobResult> {
        let mut done = Vec::new();
        while let Some(job) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
            let loaded = object
                .relocated(job.spec.name)
                .and_then(|mut code| {
                    for kfunc in kfuncs {
                        let id = kfunc.btf_id.unwrap_or(0);
                        let calls = rawprog::link_kfunc(&mut code.insns, kfunc.placeholder, id);
                        if calls > 0 && kfunc.btf_id.is_none() {
                            return Err(RawError::NoKfunc {
                                program: job.spec.name.to_owned(),
                                kfunc: kfunc.name,
                            });
                        }
                    }
                    rawprog::load(job.spec, &code.insns, &code.functions)
                })
                .map_err(|e| (job.spec.name, e));
            done.push((job.index, loaded));
        }
        done
    };
    let mut results = std::thread::scope(|scope| {
        let helper = std::thread::Builder::new()
            .name("ebpf-verify".into())
            .spawn_scoped(scope, work)
            .ok();
        let mut results = work();
        if let Some(thread) = helper {
            let theirs = thread
                .join()
                .map_err(|_| ("a verifier thread", RawError::Panicked))?;
            results.extend(theirs);
        }
        Ok(results)
    })?;
    // The first failure in the order asked for is the one reported.
    results.sort_by_key(|(index, _)| *index);
    let mut fds = Vec::with_capacity(results.len());
    for (_, loaded) in results {
        fds.push(loaded?);
    }
    if fds.len() != cgroup.len() + tracing.len() {
        return Err(("a verifier thread", RawError::Panicked));
    }
    let tracing_fds = fds.split_off(cgroup.len());
    Ok(Loaded {
        cgroup: cgroup.iter().copied().zip(fds).collect(),
        tracing: tracing.iter().copied().zip(tracing_fds).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_level_of_a_non_cgroup_is_unknown() {
        assert_eq!(cgroup_level(Path::new("/tmp")), LEVEL_UNKNOWN);
    }
}
