//! A root run's programs, loaded and verified before its cgroup exists.
//! None of it needs the cgroup (only the attach and the run's entries do),
//! and it is the longest step of a root run's start (~3.5 ms on the 2-core
//! VM: the object's maps, then the verifier), so it runs on a thread while
//! the supervisor creates the host objects and spawns the init.

use std::thread::JoinHandle;
use std::time::Instant;

use super::pin_cache::{self, Pins, Profile};
use super::pin_full;
use super::{AttachOptions, EbpfError, attach_steps, kbtf, load, shared};

/// Programs being loaded for a run of some [`AttachOptions`]
/// ([`preload`]); handed to [`super::attach_preloaded`].
pub struct Preload {
    options: AttachOptions,
    thread: JoinHandle<Result<Prepared, EbpfError>>,
}

/// The object with its maps, the layout it was filled with, and the
/// verified programs.
pub(super) struct Prepared {
    pub layout: Option<kbtf::KernelLayout>,
    pub object: load::Object,
    pub loaded: load::Loaded,
    pub started: Instant,
    /// Whether the programs came from the pin cache, or are to be pinned.
    pub pins: Pins,
}

/// Starts loading what `options` asks for, on a thread. `None` when this
/// process was handed the service's programs (a run then only registers)
/// or no thread can be made; the attach then does all the work itself.
pub fn preload(options: &AttachOptions) -> Option<Preload> {
    if shared::adopted() {
        return None;
    }
    let wanted = options.clone();
    let thread = std::thread::Builder::new()
        .name("ebpf-preload".into())
        .spawn(move || {
            // The cache is per level: the run's cgroup will be one below
            // ours (the attach checks, and starts afresh if not).
            let level = pin_cache::eligible(&wanted).and_then(|_| pin_cache::predicted_level());
            prepare(&wanted, level)
        })
        .ok()?;
    Some(Preload {
        options: options.clone(),
        thread,
    })
}

impl Preload {
    /// What was prepared, if it was prepared for `options` (a stage may
    /// have dropped a part since: the attach then starts afresh).
    pub(super) fn take(self, options: &AttachOptions) -> Option<Result<Prepared, EbpfError>> {
        let same = self.options.features() == options.features()
            && self.options.ring_bytes == options.ring_bytes
            && self.options.sizing() == options.sizing();
        // Not waited for when unused: the thread drops what it made.
        same.then(|| {
            self.thread
                .join()
                .unwrap_or(Err(EbpfError::Preload("the thread panicked")))
        })
    }
}

/// Everything of an attach that needs no cgroup, in the attach's order.
/// With `level` (that of the run's cgroup), a plain root run's programs
/// come from the pin cache when it holds them (`pin_cache.rs`).
pub(super) fn prepare(options: &AttachOptions, level: Option<u32>) -> Result<Prepared, EbpfError> {
    let started = Instant::now();
    let layout = attach_steps::check(options)?;
    let mut pins = Pins::Off;
    let profile = level.and_then(|level| Some((level, pin_cache::eligible(options)?)));
    let cached = match profile {
        Some((level, Profile::Unix)) => {
            let (cached, state) = pin_cache::take(Profile::Unix, options, level, layout.as_ref());
            pins = state;
            cached
        }
        Some((level, Profile::Full)) => {
            let cached = pin_full::take_or_make(options, level, layout.as_ref());
            if cached.is_some() {
                pins = Pins::Reused {
                    level,
                    profile: Profile::Full,
                };
            }
            cached
        }
        None => None,
    };
    if let Some((object, loaded)) = cached {
        return Ok(Prepared {
            layout,
            object,
            loaded,
            started,
            pins,
        });
    }
    let programs = attach_steps::program_names(options.features(), layout.as_ref());
    let maps = load::maps_used(&programs)?;
    let mut object = load::load_object(load::Serves::Run(options), Some(&maps))?;
    if options.capture {
        load::set_file_layout(&mut object, layout.as_ref())?;
    }
    let loaded = attach_steps::verify_programs(&object, options.features(), layout.as_ref())?;
    Ok(Prepared {
        layout,
        object,
        loaded,
        started,
        pins,
    })
}
