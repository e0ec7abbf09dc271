//! The pure decisions of the pin cache (`pin_cache.rs`): the cache's
//! name, what its pinned programs and maps must be, its manifest, and which
//! runs' entries are stale. Unit-tested without root.

use std::collections::{BTreeMap, BTreeSet};

use sha2::Digest as _;

use super::pin_sys::{self, MapShape};
use super::{elf, load};

/// The manifest's version: its value is the version, the level, then
/// each cached program's tag.
pub(super) const MANIFEST_VERSION: u32 = 1;

/// What a cache directory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Profile {
    /// The two unix programs of a plain root run, from an object loaded
    /// for that run (`RING` unused, maps of the run's size).
    Unix,
    /// Every program, from an object loaded for many runs (rings in
    /// `EVENTS`, maps as declared), its tracing programs comparing the
    /// link's cookie with their run: for every other root run.
    Full,
}

/// `BPF_MAP_TYPE_HASH_OF_MAPS`.
const MAP_TYPE_HASH_OF_MAPS: u32 = 13;

/// Every part the [`Profile::Full`] cache holds the programs of.
pub(super) const FULL_FEATURES: u32 = tartaros_common::capture::feature::FILTER
    | tartaros_common::capture::feature::SOCK_OPS
    | tartaros_common::capture::feature::UNIX
    | tartaros_common::capture::feature::CAPTURE;

/// First kernel whose raw tracepoint links take a BPF cookie (and whose
/// `tp_btf` programs can read it), which [`Profile::Full`] needs.
pub(super) const COOKIE_KERNEL: (u8, u8) = (6, 10);

/// Which cache serves a run of `features` with a ring of `ring_bytes`:
/// only root runs that load their own programs (not a service's worker);
/// the unix programs alone for a plain run, else every program on a kernel
/// with tracing link cookies (`cookies`, [`COOKIE_KERNEL`]). Pure.
pub(super) fn profile_for(
    features: u32,
    ring_bytes: u32,
    (root, adopted): (bool, bool),
    cookies: bool,
) -> Option<Profile> {
    use tartaros_common::capture::feature;
    if !root || adopted {
        return None;
    }
    if features == feature::UNIX && ring_bytes == 0 {
        return Some(Profile::Unix);
    }
    let fits = features & !FULL_FEATURES == 0 && features != 0;
    (fits && cookies).then_some(Profile::Full)
}

/// The name of the cache directory: pure.
pub(super) fn dir_name(profile: Profile, kernel: &str, level: u32, object_digest: &str) -> String {
    let (domain, prefix) = match profile {
        Profile::Unix => (b"tartaros-unix-pins-v1".as_slice(), "unix"),
        Profile::Full => (b"tartaros-full-pins-v1".as_slice(), "full"),
    };
    let mut hash = sha2::Sha256::new();
    for part in [domain, kernel.as_bytes()] {
        hash.update(part);
        hash.update([0]);
    }
    hash.update(level.to_le_bytes());
    hash.update(object_digest.as_bytes());
    format!("{prefix}_{}", &hex::encode(hash.finalize())[..24])
}

/// What the pinned maps must be, from the embedded object.
pub(super) struct Expected {
    /// By the name the object gives each map (`.rodata` included).
    pub maps: BTreeMap<String, MapShape>,
    pub rodata: Vec<u8>,
}

/// A map as `load::load_object` creates it for `profile`: for a run of
/// its own with no ring ([`Profile::Unix`]), `EVENTS` with one entry and
/// the others as declared or sized by `own_entries`; for many runs, as
/// declared. Pure.
pub(super) fn created_shape(
    profile: Profile,
    def: &elf::MapDef,
    own_entries: Option<u32>,
) -> MapShape {
    // Many runs' `EVENTS` holds their rings: a map of maps, where the
    // object declares a plain hash (of `u32` placeholders).
    let map_type = match profile {
        Profile::Full if def.name == tartaros_common::MAP_EVENTS => MAP_TYPE_HASH_OF_MAPS,
        _ => def.map_type,
    };
    let max_entries = match profile {
        Profile::Full => def.max_entries,
        Profile::Unix if def.name == tartaros_common::MAP_EVENTS => 1,
        Profile::Unix => own_entries.unwrap_or(def.max_entries),
    };
    MapShape {
        map_type,
        key_size: def.key_size,
        value_size: def.value_size,
        max_entries,
        flags: def.flags,
    }
}

/// The manifest's size for `programs` programs.
pub(super) fn manifest_size(programs: usize) -> usize {
    8 + 8 * programs
}

/// The manifest's value: version, level, then each program's tag.
pub(super) fn manifest_bytes(level: u32, tags: &[[u8; 8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(manifest_size(tags.len()));
    out.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
    out.extend_from_slice(&level.to_le_bytes());
    for tag in tags {
        out.extend_from_slice(tag);
    }
    out
}

/// The tags a manifest records, if it is one of this version for `level`
/// with `programs` tags.
pub(super) fn manifest_tags(
    bytes: &[u8],
    level: u32,
    programs: usize,
) -> Result<Vec<[u8; 8]>, String> {
    if bytes.len() != manifest_size(programs) {
        return Err(format!(
            "manifest of {} bytes (expected {})",
            bytes.len(),
            manifest_size(programs)
        ));
    }
    let word =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    if word(0) != MANIFEST_VERSION {
        return Err(format!(
            "manifest version {} (expected {MANIFEST_VERSION})",
            word(0)
        ));
    }
    if word(4) != level {
        return Err(format!(
            "manifest for cgroup level {} (this run: {level})",
            word(4)
        ));
    }
    Ok(bytes[8..]
        .chunks_exact(8)
        .map(|c| {
            let mut tag = [0u8; 8];
            tag.copy_from_slice(c);
            tag
        })
        .collect())
}

/// Checks a pinned program against its expected type and recorded tag.
pub(super) fn check_program(
    name: &str,
    prog_type: u32,
    tag: &[u8; 8],
    found: &pin_sys::ProgFacts,
) -> Result<(), String> {
    if found.prog_type != prog_type {
        return Err(format!(
            "{name} is of program type {} (expected {prog_type})",
            found.prog_type
        ));
    }
    if &found.tag != tag {
        return Err(format!(
            "{name} has tag {} (recorded {})",
            hex::encode(found.tag),
            hex::encode(tag)
        ));
    }
    if found.map_count as usize != found.map_ids.len() {
        return Err(format!("{name} references {} maps", found.map_count));
    }
    Ok(())
}

/// Checks a pinned map's kernel name and shape against what the object
/// makes of it.
pub(super) fn check_map(
    name: &str,
    expected: Option<&MapShape>,
    found: &pin_sys::MapFacts,
) -> Result<(), String> {
    let Some(expected) = expected else {
        return Err(format!("unknown map {name}"));
    };
    if found.name != load::short_name(name) {
        return Err(format!("the pin of {name} is the map {:?}", found.name));
    }
    if &found.shape != expected {
        return Err(format!(
            "map {name} is {:?} (expected {expected:?})",
            found.shape
        ));
    }
    Ok(())
}

/// The maps the programs reference must be exactly the pinned ones.
pub(super) fn check_map_ids(
    referenced: &BTreeSet<u32>,
    pinned: &BTreeMap<u32, String>,
) -> Result<(), String> {
    if let Some(id) = referenced.iter().find(|id| !pinned.contains_key(id)) {
        return Err(format!(
            "the programs reference map id {id}, which is not pinned with them"
        ));
    }
    if let Some((_, name)) = pinned.iter().find(|(id, _)| !referenced.contains(id)) {
        return Err(format!(
            "the pinned map {name} is not the one the programs use"
        ));
    }
    Ok(())
}

/// The ids among `ids` whose cgroup is gone (`alive` says `Some(false)`);
/// an id that cannot be checked is kept. Pure.
pub(super) fn stale_ids(ids: &BTreeSet<u64>, alive: impl Fn(u64) -> Option<bool>) -> Vec<u64> {
    ids.iter()
        .copied()
        .filter(|id| alive(*id) == Some(false))
        .collect()
}

#[cfg(test)]
#[path = "pin_checks_tests.rs"]
mod tests;
