//! The pure decisions of the pin cache (`pin_cache.rs`): the cache's
//! name, what its pinned programs and maps must be, its manifest, and which
//! runs' entries are stale. Unit-tested without root.

use std::collections::{BTreeMap, BTreeSet};

use sha2::Digest as _;

use super::pin_sys::{self, MapShape};
use super::{elf, load};

/// The manifest's version and size (version, level, two program tags).
pub(super) const MANIFEST_VERSION: u32 = 1;
pub(super) const MANIFEST_BYTES: usize = 24;
/// The name of the cache directory: pure.
pub(super) fn dir_name(kernel: &str, level: u32, object_digest: &str) -> String {
    let mut hash = sha2::Sha256::new();
    for part in [b"tartaros-unix-pins-v1".as_slice(), kernel.as_bytes()] {
        hash.update(part);
        hash.update([0]);
    }
    hash.update(level.to_le_bytes());
    hash.update(object_digest.as_bytes());
    format!("unix_{}", &hex::encode(hash.finalize())[..24])
}

/// What the pinned maps must be, from the embedded object.
pub(super) struct Expected {
    /// By the name the object gives each map (`.rodata` included).
    pub maps: BTreeMap<String, MapShape>,
    pub rodata: Vec<u8>,
}

/// A map as `load::load_object` creates it for a run of its own with no
/// ring: `EVENTS` with one entry, the others as declared or sized by
/// `own_entries`. Pure.
pub(super) fn created_shape(def: &elf::MapDef, own_entries: Option<u32>) -> MapShape {
    let max_entries = if def.name == tartaros_common::MAP_EVENTS {
        1
    } else {
        own_entries.unwrap_or(def.max_entries)
    };
    MapShape {
        map_type: def.map_type,
        key_size: def.key_size,
        value_size: def.value_size,
        max_entries,
        flags: def.flags,
    }
}

/// The manifest's value: version, level, then each unix program's tag.
pub(super) fn manifest_bytes(level: u32, tags: &[[u8; 8]; 2]) -> [u8; MANIFEST_BYTES] {
    let mut out = [0u8; MANIFEST_BYTES];
    out[0..4].copy_from_slice(&MANIFEST_VERSION.to_le_bytes());
    out[4..8].copy_from_slice(&level.to_le_bytes());
    out[8..16].copy_from_slice(&tags[0]);
    out[16..24].copy_from_slice(&tags[1]);
    out
}

/// The tags a manifest records, if it is one of this version for `level`.
pub(super) fn manifest_tags(
    bytes: &[u8; MANIFEST_BYTES],
    level: u32,
) -> Result<[[u8; 8]; 2], String> {
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
    let mut tags = [[0u8; 8]; 2];
    tags[0].copy_from_slice(&bytes[8..16]);
    tags[1].copy_from_slice(&bytes[16..24]);
    Ok(tags)
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
