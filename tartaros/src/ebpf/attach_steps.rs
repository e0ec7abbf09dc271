//! The steps of an attach: what the kernel must have, the run's cgroup,
//! loading and attaching the programs a set of parts needs, and the run's
//! handle at the end (used by [`super::attach_with`] and [`super::shared`]).

use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aya::maps::RingBuf;
use aya::util::KernelVersion;

use super::original_dst::{OriginalDstMap, OwnerMap};
use super::{
    AttachOptions, CgroupPrograms, EbpfError, FILTER_PROGRAMS, SOCK_OPS, SOCK_OPS_PROGRAM,
    TP_BTF_PROGRAMS, UNIX_KERNEL, UNIX_PROGRAMS, check_kernel, kbtf, load, rawprog, register,
};

/// The run's handle once its entries are written and its programs run.
pub(super) fn finish(
    object: load::Object,
    run: register::Registered,
    ring: Option<RingBuf<aya::maps::MapData>>,
    Attached {
        links,
        tags,
        tracing,
    }: Attached,
    cgroup_dir: &Path,
    options: &AttachOptions,
    started: Instant,
) -> Result<CgroupPrograms, EbpfError> {
    let mut programs = CgroupPrograms {
        links,
        transparent: None,
        owners: None,
        object,
        run,
        ring,
        cgroup: cgroup_dir.to_path_buf(),
        capture: options.capture,
        tags,
        attach_time: Duration::ZERO,
        skipped_at_start: tracing.as_deref().and_then(skipped),
        tracing,
        events_pin: None,
        ring_bytes: options.ring_bytes,
    };
    let id = programs.run.id;
    if options.transparent_port.is_some() {
        let lookup = OriginalDstMap::open(&programs.object, id)
            .map_err(|e| EbpfError::Transparent(Box::new(e)))?;
        programs.transparent = Some(Arc::new(lookup));
    }
    if options.capture {
        programs.owners = Some(Arc::new(OwnerMap::open(&programs.object, id)?));
    }
    programs.attach_time = started.elapsed();
    Ok(programs)
}

/// Attaches what was prepared (a run's own object, or the pin cache's)
/// to the cgroup `cgroup_dir` of level `level` and registers the run.
pub(super) fn attach_prepared(
    prepared: super::preload::Prepared,
    cgroup_dir: &Path,
    options: &AttachOptions,
    level: u32,
) -> Result<CgroupPrograms, EbpfError> {
    use super::pin_cache::{self, Pins};
    let super::preload::Prepared {
        layout,
        mut object,
        loaded,
        started,
        pins,
    } = prepared;
    let (cgroup, cgroup_id) = open_cgroup(cgroup_dir)?;
    let mut cookie = 0;
    let mut loaded = loaded;
    if let Pins::Reused { profile, .. } = pins {
        // Shared with other runs: its level was checked; entries of runs
        // whose cgroup is gone are removed.
        pin_cache::sweep(&mut object, cgroup.as_fd(), profile);
        if profile == pin_cache::Profile::Full {
            // Every program is cached: this run attaches those of its
            // parts, its tracing links marked as its own.
            loaded = only(loaded, &program_names(options.features(), layout.as_ref()));
            cookie = cgroup_id;
        }
    } else {
        load::set_run_level(&mut object, level)?;
    }
    // Attached before the run is registered, while the prepared ring is
    // mapped. The init already works in the cgroup, but makes no socket
    // (which the programs would refuse until the run is registered) before
    // the late part of its plan, which comes after this (init.rs).
    let transparent = options.transparent_port.is_some();
    let attached = link_programs(&loaded, (&cgroup, cgroup_dir), transparent, cookie)?;
    if let Pins::Populate { level } = pins {
        // Best effort: without a cache the next run loads afresh too.
        let _ = pin_cache::populate(&object, &loaded, level);
    }
    drop(loaded);
    // On a failure the links, dropped, detach the programs.
    let (run, ring) = register::register(&mut object, cgroup_id, options, layout.as_ref())?;
    let mut programs = finish(object, run, ring, attached, cgroup_dir, options, started)?;
    if let Pins::Reused {
        profile: pin_cache::Profile::Full,
        level,
    } = pins
    {
        programs.events_pin = pin_cache::dir_of(pin_cache::Profile::Full, level, layout.as_ref())
            .map(|dir| dir.join(format!("map_{}", tartaros_common::MAP_EVENTS)));
    }
    Ok(programs)
}

/// How often the kernel skipped any of `tracing` (`recursion_misses`);
/// `None` when a counter cannot be read.
pub(super) fn skipped(tracing: &[OwnedFd]) -> Option<u64> {
    tracing.iter().try_fold(0u64, |sum, prog| {
        Some(sum.saturating_add(rawprog::recursion_misses(prog.as_fd())?))
    })
}

/// What the kernel must have for `options`, and the kernel layout they
/// need (read from the BTF, or its cache).
pub(super) fn check(options: &AttachOptions) -> Result<Option<kbtf::KernelLayout>, EbpfError> {
    let kernel = check_kernel()?;
    let ring = options.ring_bytes;
    if ring != 0 && (!ring.is_power_of_two() || ring < 4096) {
        return Err(EbpfError::RingSize(ring));
    }
    if options.transparent_port == Some(0) {
        return Err(EbpfError::Transparent(Box::new(
            EbpfError::MissingInObject {
                what: "a transparent port (0 given)".into(),
            },
        )));
    }
    if options.unix_policy {
        if kernel < KernelVersion::new(UNIX_KERNEL.0, UNIX_KERNEL.1, 0) {
            return Err(EbpfError::UnixHooksUnsupported {
                reason: format!("kernel {kernel:?}"),
            });
        }
        register::unix_prefixes(&options.unix_allowed)?;
    }
    if options.capture && !cfg!(target_arch = "x86_64") {
        return Err(EbpfError::CaptureUnsupported(
            "the syscall capture decodes x86_64 registers and syscall numbers".into(),
        ));
    }
    let layout = if options.capture || options.unix_policy {
        Some(load::kernel_layout().map_err(EbpfError::CaptureUnsupported)?)
    } else {
        None
    };
    if options.unix_policy {
        unix_layout_fits(layout.as_ref())?;
    }
    Ok(layout)
}

/// The unix programs read `struct bpf_sock_addr_kern` at fixed offsets
/// (see tartaros-ebpf/src/unix.rs) and pin every allowed name with two
/// kfuncs.
fn unix_layout_fits(layout: Option<&kbtf::KernelLayout>) -> Result<(), EbpfError> {
    let found = layout.and_then(|l| l.sock_addr_kern);
    if found != Some((8, 32)) {
        return Err(EbpfError::UnixHooksUnsupported {
            reason: format!(
                "struct bpf_sock_addr_kern has (uaddr, uaddrlen) at {found:?}, expected (8, 32)"
            ),
        });
    }
    if let Some(kfunc) = load::kfuncs(layout)
        .into_iter()
        .find(|k| k.btf_id.is_none())
    {
        return Err(EbpfError::UnixHooksUnsupported {
            reason: format!("the kernel BTF has no {}", kfunc.name),
        });
    }
    Ok(())
}

/// The cgroup directory, opened, and its id (the inode number).
pub(super) fn open_cgroup(cgroup_dir: &Path) -> Result<(std::fs::File, u64), EbpfError> {
    let fail = |source| EbpfError::OpenCgroup {
        path: cgroup_dir.to_path_buf(),
        source,
    };
    let cgroup = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(cgroup_dir)
        .map_err(fail)?;
    let id = cgroup.metadata().map_err(fail)?.ino();
    Ok((cgroup, id))
}

/// Loads the programs that `features` need and attaches them: the cgroup
/// programs to `cgroup` (a run's cgroup, or the parent of every run's),
/// the tracing programs host-wide. Returns the links and `name:tag` of
/// each program.
pub(super) fn attach_programs(
    object: &load::Object,
    cgroup: (&std::fs::File, &Path),
    (features, transparent): (u32, bool),
    layout: Option<&kbtf::KernelLayout>,
) -> Result<Attached, EbpfError> {
    let loaded = verify_programs(object, features, layout)?;
    link_programs(&loaded, cgroup, transparent, 0)
}

/// The programs of `loaded` named in `names` (the others are dropped).
fn only(loaded: load::Loaded, names: &[&str]) -> load::Loaded {
    let load::Loaded { cgroup, tracing } = loaded;
    load::Loaded {
        cgroup: cgroup
            .into_iter()
            .filter(|(p, _)| names.contains(&p.name))
            .collect(),
        tracing: tracing
            .into_iter()
            .filter(|(p, _)| names.contains(&p.spec.name))
            .collect(),
    }
}

/// Loads (and so verifies) the programs of the parts in `features`. Needs
/// no cgroup, so a root run does it before its cgroup exists
/// (`super::preload`).
pub(super) fn verify_programs(
    object: &load::Object,
    features: u32,
    layout: Option<&kbtf::KernelLayout>,
) -> Result<load::Loaded, EbpfError> {
    let (cgroup_programs, tracing_programs) = programs_for(features, layout);
    let kfuncs = load::kfuncs(layout);
    load::load_programs(object, &cgroup_programs, &tracing_programs, &kfuncs)
        .map_err(|(name, source)| load_error(name, source))
}

/// The names of the programs [`verify_programs`] loads for `features`.
pub(super) fn program_names(
    features: u32,
    layout: Option<&kbtf::KernelLayout>,
) -> Vec<&'static str> {
    let (cgroup, tracing) = programs_for(features, layout);
    cgroup
        .iter()
        .map(|p| p.name)
        .chain(tracing.iter().map(|p| p.spec.name))
        .collect()
}

/// The programs of the parts in `features`, in attach order.
pub(super) fn programs_for(
    features: u32,
    layout: Option<&kbtf::KernelLayout>,
) -> (Vec<load::CgroupProgram>, Vec<load::TracingProgram>) {
    use tartaros_common::capture::feature;
    // What to attach, in order: sock_ops before the connect programs, so
    // that no intercepted connect can miss it; then socket creation, the
    // destination checks and the unix policy; then the process events, so
    // that no exec can slip between them and the syscall capture. sock_ops
    // also names the process behind every TCP connection the relays, the
    // proxy and the broker accept (`connection_owner`).
    let mut cgroup_programs = Vec::with_capacity(8);
    if features & feature::SOCK_OPS != 0 {
        cgroup_programs.push(SOCK_OPS);
    }
    if features & feature::FILTER != 0 {
        cgroup_programs.extend(FILTER_PROGRAMS);
    }
    if features & feature::UNIX != 0 {
        cgroup_programs.extend(UNIX_PROGRAMS);
    }
    let tracing_programs: Vec<load::TracingProgram> = match layout {
        Some(layout) if features & feature::CAPTURE != 0 => TP_BTF_PROGRAMS
            .into_iter()
            .zip(layout.tp_btf_ids)
            .map(|(name, btf_id)| load::TracingProgram {
                spec: rawprog::ProgSpec {
                    name,
                    prog_type: rawprog::PROG_TYPE_TRACING,
                    expected_attach_type: rawprog::ATTACH_TRACE_RAW_TP,
                    attach_btf_id: btf_id,
                },
            })
            .collect(),
        _ => Vec::new(),
    };
    (cgroup_programs, tracing_programs)
}

/// Attaches loaded programs to the cgroup and the tracepoints, in the
/// order they were loaded in (see [`verify_programs`]); the tracing links
/// with `cookie` (0: none).
pub(super) fn link_programs(
    loaded: &load::Loaded,
    (cgroup, cgroup_dir): (&std::fs::File, &Path),
    transparent: bool,
    cookie: u64,
) -> Result<Attached, EbpfError> {
    let mut links = Vec::with_capacity(12);
    let mut tags = Vec::with_capacity(12);
    for (program, prog) in &loaded.cgroup {
        let name = program.name;
        let link = rawprog::link_cgroup(name, prog, cgroup.as_fd(), program.attach_type).map_err(
            |source| EbpfError::AttachProgram {
                program: name,
                path: cgroup_dir.to_path_buf(),
                source,
            },
        );
        let link = if name == SOCK_OPS_PROGRAM && transparent {
            link.map_err(|e| EbpfError::Transparent(Box::new(e)))?
        } else {
            link?
        };
        links.push((name, link));
        tags.extend(rawprog::tag(prog.as_fd()).map(|t| format!("{name}:{t}")));
    }
    for (program, prog) in &loaded.tracing {
        let name = program.spec.name;
        let link = rawprog::open_tracepoint(name, prog, cookie).map_err(|source| {
            EbpfError::AttachTracing {
                program: name,
                source,
            }
        })?;
        links.push((name, link));
        tags.extend(rawprog::tag(prog.as_fd()).map(|t| format!("{name}:{t}")));
    }
    // All of them or none: a counter left out would be a skip unseen.
    let tracing = loaded
        .tracing
        .iter()
        .map(|(_, prog)| prog.try_clone().ok())
        .collect();
    Ok(Attached {
        links,
        tags,
        tracing,
    })
}

/// The error for a program the kernel refused to load, by which part of
/// the attach it belongs to (so the caller can degrade just that part).
pub(super) fn load_error(program: &'static str, source: rawprog::RawError) -> EbpfError {
    let unix = UNIX_PROGRAMS.iter().any(|p| p.name == program);
    match source {
        // A kernel without the unix hooks refuses their attach type at load
        // time, before the verifier runs.
        rawprog::RawError::Load { source, log, .. }
            if unix && source.raw_os_error() == Some(libc::EINVAL) && log.is_empty() =>
        {
            EbpfError::UnixHooksUnsupported {
                reason: format!("loading {program}: {source}"),
            }
        }
        source if program == SOCK_OPS_PROGRAM => {
            EbpfError::Transparent(Box::new(EbpfError::LoadProgram { program, source }))
        }
        source if TP_BTF_PROGRAMS.contains(&program) => {
            EbpfError::AttachTracing { program, source }
        }
        source => EbpfError::LoadProgram { program, source },
    }
}

/// Programs attached for one or more runs: their links (closing one
/// detaches its program) and `name:tag` of each.
pub(super) struct Attached {
    pub links: Vec<(&'static str, OwnedFd)>,
    pub tags: Vec<String>,
    /// The tracing programs, whose skip counters the run reads; `None`
    /// when one of them could not be had (its skips would go unseen).
    pub tracing: Option<Vec<OwnedFd>>,
}
