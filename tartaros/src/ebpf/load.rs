//! Loading the object, filling its maps, attaching programs (the steps of
//! `attach_with`).

use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use aya::maps::{Array, HashMap, Map, MapData, RingBuf};
use tartaros_common::capture::{
    CaptureConfig, KFUNC_CAST_TO_KERN_CTX, KFUNC_SET_SUN_PATH, LEVEL_UNKNOWN, UNIX_PREFIXES,
    UnixAllow, UnixPrefix,
};

use super::kbtf::KernelLayout;
use super::rawprog::{self, ProgSpec, RawError};
use super::{ConnectGrant, EBPF_OBJECT, EbpfError, early_ring, elf};

/// The maps of the embedded object, created by us (see `elf.rs` for why
/// not through aya's loader), each wrapped in aya's typed handle.
pub(super) struct Object {
    maps: Vec<ObjectMap>,
    /// The frozen `.rodata` array, referenced by the programs that use it.
    rodata: Option<OwnedFd>,
    /// The ring buffer's reader, when it is mapped ahead of the attach
    /// ([`early_ring`]).
    events_reader: Option<early_ring::Reader>,
}

struct ObjectMap {
    name: String,
    /// The map's descriptor, owned by `map` (or by whoever took it), for
    /// relocating programs before anything is taken.
    fd: RawFd,
    map: Option<Map>,
}

impl Object {
    pub(super) fn map(&self, name: &str) -> Option<&Map> {
        self.maps.iter().find(|m| m.name == name)?.map.as_ref()
    }

    pub(super) fn map_mut(&mut self, name: &str) -> Option<&mut Map> {
        self.maps.iter_mut().find(|m| m.name == name)?.map.as_mut()
    }

    /// The reader of the ring buffer mapped ahead of the attach, if it
    /// was (waiting for the mapping to finish).
    pub(super) fn take_events_reader(&mut self) -> Option<RingBuf<MapData>> {
        self.events_reader.take()?.join().ok()?
    }

    pub(super) fn take_map(&mut self, name: &str) -> Option<Map> {
        self.maps.iter_mut().find(|m| m.name == name)?.map.take()
    }

    /// Descriptor of map `name` ([`elf::RODATA`] for the read-only data)
    /// while the map is still held here.
    fn map_fd(&self, name: &str) -> Option<RawFd> {
        if name == elf::RODATA {
            return self.rodata.as_ref().map(|fd| fd.as_raw_fd());
        }
        self.maps
            .iter()
            .find(|m| m.name == name && m.map.is_some())
            .map(|m| m.fd)
    }

    /// The code of program `name`, its map references pointing at our
    /// maps.
    pub(super) fn relocated(&self, name: &str) -> Result<elf::Relocated, RawError> {
        elf::relocated(EBPF_OBJECT, name, &|map| self.map_fd(map))
    }
}

/// Creates the maps the embedded object declares, the ring buffer sized
/// `ring_bytes`, and the frozen `.rodata`.
pub(super) fn load_object(ring_bytes: u32) -> Result<Object, EbpfError> {
    let elf = elf::Elf::parse(EBPF_OBJECT).map_err(EbpfError::LoadObject)?;
    let defs = elf.map_defs().map_err(EbpfError::LoadObject)?;
    let mut maps = Vec::with_capacity(defs.len());
    let mut events_reader = None;
    for def in &defs {
        let events = def.name == tartaros_common::MAP_EVENTS;
        let max_entries = if events { ring_bytes } else { def.max_entries };
        let spec = rawprog::MapSpec {
            name: &def.name,
            map_type: def.map_type,
            key_size: def.key_size,
            value_size: def.value_size,
            max_entries,
            flags: def.flags,
        };
        let early = (events
            && (def.map_type, def.key_size, def.value_size, def.flags)
                == (early_ring::MAP_TYPE_RINGBUF, 0, 0, 0))
            .then(|| early_ring::take(ring_bytes))
            .flatten();
        let fd = match early {
            Some(ring) => {
                events_reader = Some(ring.reader);
                ring.fd
            }
            None => rawprog::create_map(spec).map_err(EbpfError::LoadObject)?,
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
            map: Some(map),
        });
    }
    let rodata = match elf.rodata().map_err(EbpfError::LoadObject)? {
        Some(bytes) if !bytes.is_empty() => {
            let value_size = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
            let fd = rawprog::create_map(rawprog::MapSpec {
                name: elf::RODATA,
                map_type: MAP_TYPE_ARRAY,
                key_size: 4,
                value_size,
                max_entries: 1,
                flags: rawprog::MAP_F_RDONLY_PROG,
            })
            .map_err(EbpfError::LoadObject)?;
            rawprog::fill_and_freeze(elf::RODATA, fd.as_fd(), bytes)
                .map_err(EbpfError::LoadObject)?;
            Some(fd)
        }
        _ => None,
    };
    Ok(Object {
        maps,
        rodata,
        events_reader,
    })
}

/// `BPF_MAP_TYPE_ARRAY`.
const MAP_TYPE_ARRAY: u32 = 2;

pub(super) use super::layout_cache::{kernel_layout, kernel_layout_ready};

fn missing(what: String) -> EbpfError {
    EbpfError::MissingInObject { what }
}

pub(super) fn insert_grants(object: &mut Object, grants: &[ConnectGrant]) -> Result<(), EbpfError> {
    let name = tartaros_common::MAP_ALLOW;
    let map = object
        .map_mut(name)
        .ok_or_else(|| missing(format!("map {name}")))?;
    let mut allow = HashMap::<_, tartaros_common::AllowKey, u32>::try_from(map)
        .map_err(|source| EbpfError::Map { map: name, source })?;
    for grant in grants {
        allow
            .insert(grant.key(), tartaros_common::ALLOW_VALUE, 0)
            .map_err(|source| EbpfError::Map { map: name, source })?;
    }
    Ok(())
}

pub(super) fn set_filter_mode(object: &mut Object, mode: u32) -> Result<(), EbpfError> {
    let name = tartaros_common::MAP_FILTER;
    let map = object
        .map_mut(name)
        .ok_or_else(|| missing(format!("map {name}")))?;
    let mut filter =
        Array::<_, u32>::try_from(map).map_err(|source| EbpfError::Map { map: name, source })?;
    filter
        .set(tartaros_common::FILTER_MODE_INDEX, mode, 0)
        .map_err(|source| EbpfError::Map { map: name, source })
}

pub(super) fn set_config(object: &mut Object, config: CaptureConfig) -> Result<(), EbpfError> {
    let name = tartaros_common::MAP_CONFIG;
    let map = object
        .map_mut(name)
        .ok_or_else(|| missing(format!("map {name}")))?;
    let mut array = Array::<_, CaptureConfig>::try_from(map)
        .map_err(|source| EbpfError::Map { map: name, source })?;
    array
        .set(0, config, 0)
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

/// Fills `SYSCALL_KIND`: the effect kind of every syscall number, from
/// the table the syscall-table test checks (`capture::effect_of`).
pub(super) fn set_syscall_kinds(object: &mut Object) -> Result<(), EbpfError> {
    let name = "SYSCALL_KIND";
    let map = object
        .map_mut(name)
        .ok_or_else(|| missing(format!("map {name}")))?;
    let mut array =
        Array::<_, u32>::try_from(map).map_err(|source| EbpfError::Map { map: name, source })?;
    for nr in 0..tartaros_common::capture::SYSCALL_KINDS {
        let kind = tartaros_common::capture::effect_of(nr);
        if kind != 0 {
            array
                .set(nr, u32::from(kind), 0)
                .map_err(|source| EbpfError::Map { map: name, source })?;
        }
    }
    Ok(())
}

/// The configuration for a cgroup, with the offsets of `layout` if given.
pub(super) fn config_for(
    cgroup_id: u64,
    cgroup_level: u32,
    capture: bool,
    ring_bytes: u32,
    layout: Option<&KernelLayout>,
) -> CaptureConfig {
    let mut c = CaptureConfig {
        cgroup_id,
        cgroup_level,
        policy_quiet: u32::from(capture),
        task_ti_status: u32::MAX,
        // Capture wakes the reader per quarter ring (at most 1 MiB); the
        // reader's 10 ms timer picks up the rest.
        wake_bytes: if capture {
            (ring_bytes / 4).min(1 << 20)
        } else {
            0
        },
        ..CaptureConfig::default()
    };
    if let Some(l) = layout {
        c.exit_group_dead = u32::from(l.exit_group_dead);
        c.task_pid = l.task_pid;
        c.task_tgid = l.task_tgid;
        c.task_real_parent = l.task_real_parent;
        c.task_mm = l.task_mm;
        c.task_exit_code = l.task_exit_code;
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

pub(super) fn set_unix_prefixes(
    object: &mut Object,
    prefixes: &[UnixPrefix],
) -> Result<(), EbpfError> {
    let name = tartaros_common::MAP_UNIX_ALLOW;
    let map = object
        .map_mut(name)
        .ok_or_else(|| missing(format!("map {name}")))?;
    let mut array = Array::<_, UnixAllow>::try_from(map)
        .map_err(|source| EbpfError::Map { map: name, source })?;
    let mut allow = UnixAllow::NONE;
    for (slot, p) in allow.prefixes.iter_mut().zip(prefixes) {
        *slot = *p;
    }
    array
        .set(0, allow, 0)
        .map_err(|source| EbpfError::Map { map: name, source })
}

/// The kernel-side data of a map, for its fd.
pub(super) fn map_data<'a>(object: &'a Object, name: &str) -> Option<&'a MapData> {
    match object.map(name)? {
        Map::Array(d)
        | Map::HashMap(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::RingBuf(d) => Some(d),
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

/// Sets the transparent proxy port the connect programs rewrite refused
/// TCP connects to (0 = off).
pub(super) fn set_transparent_port(object: &mut Object, port: u16) -> Result<(), EbpfError> {
    let name = tartaros_common::MAP_FILTER;
    let map = object
        .map_mut(name)
        .ok_or_else(|| missing(format!("map {name}")))?;
    let mut array =
        Array::<_, u32>::try_from(map).map_err(|source| EbpfError::Map { map: name, source })?;
    array
        .set(
            tartaros_common::FILTER_TRANSPARENT_INDEX,
            u32::from(port),
            0,
        )
        .map_err(|source| EbpfError::Map { map: name, source })
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
    fn cgroup_level_of_a_non_cgroup_is_unknown() {
        assert_eq!(cgroup_level(Path::new("/tmp")), LEVEL_UNKNOWN);
    }
}
