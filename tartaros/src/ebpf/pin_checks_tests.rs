use super::super::AttachOptions;
use super::super::pin_cache::eligible;
use super::*;
use pin_sys::{MapFacts, ProgFacts};

fn shape(map_type: u32, max_entries: u32) -> MapShape {
    MapShape {
        map_type,
        key_size: 8,
        value_size: 4,
        max_entries,
        flags: 0,
    }
}

#[test]
fn the_directory_name_changes_with_the_profile_the_kernel_the_level_and_the_object() {
    let base = dir_name(Profile::Unix, "6.18\0#1", 3, "abc");
    assert!(base.starts_with("unix_") && !base.contains('.'), "{base}");
    assert_eq!(base, dir_name(Profile::Unix, "6.18\0#1", 3, "abc"));
    assert_ne!(base, dir_name(Profile::Unix, "6.18\0#2", 3, "abc"));
    assert_ne!(base, dir_name(Profile::Unix, "6.18\0#1", 4, "abc"));
    assert_ne!(base, dir_name(Profile::Unix, "6.18\0#1", 3, "abd"));
    let full = dir_name(Profile::Full, "6.18\0#1", 3, "abc");
    assert!(full.starts_with("full_") && !full.contains('.'), "{full}");
    assert_ne!(base[5..], full[5..]);
}

#[test]
fn a_plain_root_run_takes_the_unix_programs_and_every_other_root_run_all() {
    use tartaros_common::capture::feature;
    let unix_only = AttachOptions {
        filter: false,
        ring_bytes: 0,
        unix_policy: true,
        ..AttachOptions::default()
    };
    let root = nix::unistd::geteuid().is_root();
    assert_eq!(eligible(&unix_only), root.then_some(Profile::Unix));
    let plain = |features, ring| profile_for(features, ring, (true, false), true);
    assert_eq!(plain(feature::UNIX, 0), Some(Profile::Unix));
    assert_eq!(plain(feature::UNIX, 1 << 16), Some(Profile::Full));
    assert_eq!(plain(FULL_FEATURES, 8 << 20), Some(Profile::Full));
    assert_eq!(
        plain(feature::FILTER | feature::UNIX, 0),
        Some(Profile::Full)
    );
    assert_eq!(plain(0, 0), None);
    // Not root, a service's worker, or no tracing link cookies.
    assert_eq!(profile_for(FULL_FEATURES, 0, (false, false), true), None);
    assert_eq!(profile_for(feature::UNIX, 0, (true, true), true), None);
    assert_eq!(profile_for(FULL_FEATURES, 0, (true, false), false), None);
    assert_eq!(
        profile_for(feature::UNIX, 0, (true, false), false),
        Some(Profile::Unix)
    );
    // A part the cache has no programs for.
    assert_eq!(plain(1 << 30, 0), None);
}

#[test]
fn a_manifest_gives_its_tags_back_only_for_its_version_level_and_count() {
    let tags = [[1u8; 8], [2u8; 8]];
    let bytes = manifest_bytes(5, &tags);
    assert_eq!(bytes.len(), 24);
    assert_eq!(manifest_tags(&bytes, 5, 2).unwrap(), tags);
    assert!(manifest_tags(&bytes, 6, 2).unwrap_err().contains("level 5"));
    assert!(manifest_tags(&bytes, 5, 3).unwrap_err().contains("bytes"));
    let mut other = bytes;
    other[0] = 9;
    assert!(manifest_tags(&other, 5, 2).unwrap_err().contains("version"));
}

#[test]
fn a_program_must_have_its_type_and_recorded_tag() {
    let facts = ProgFacts {
        prog_type: 18,
        id: 7,
        tag: [3; 8],
        map_ids: vec![1, 2],
        map_count: 2,
    };
    assert!(check_program("unix_connect", 18, &[3; 8], &facts).is_ok());
    assert!(check_program("unix_connect", 9, &[3; 8], &facts).is_err());
    let err = check_program("unix_connect", 18, &[4; 8], &facts).unwrap_err();
    assert!(err.contains("tag 0303030303030303"), "{err}");
    let too_many = ProgFacts {
        map_count: 40,
        ..facts
    };
    assert!(check_program("unix_connect", 18, &[3; 8], &too_many).is_err());
}

#[test]
fn a_map_must_have_its_name_and_shape() {
    let expected = shape(1, 64);
    let found = MapFacts {
        id: 4,
        shape: expected,
        name: "RUNS".into(),
    };
    assert!(check_map("RUNS", Some(&expected), &found).is_ok());
    assert!(
        check_map("RUNS", None, &found)
            .unwrap_err()
            .contains("unknown")
    );
    assert!(check_map("UNIX_ALLOW", Some(&expected), &found).is_err());
    let bigger = MapFacts {
        shape: shape(1, 65),
        ..found.clone()
    };
    assert!(check_map("RUNS", Some(&expected), &bigger).is_err());
    let rodata = MapFacts {
        name: ".rodata".into(),
        ..found
    };
    assert!(check_map(".rodata", Some(&expected), &rodata).is_ok());
}

#[test]
fn the_programs_maps_must_be_exactly_the_pinned_ones() {
    let pinned: BTreeMap<u32, String> = [(1, "RUNS".into()), (2, "UNIX_ALLOW".into())].into();
    let both: BTreeSet<u32> = [1, 2].into();
    assert!(check_map_ids(&both, &pinned).is_ok());
    let foreign: BTreeSet<u32> = [1, 3].into();
    assert!(
        check_map_ids(&foreign, &pinned)
            .unwrap_err()
            .contains("id 3")
    );
    let fewer: BTreeSet<u32> = [1].into();
    assert!(
        check_map_ids(&fewer, &pinned)
            .unwrap_err()
            .contains("UNIX_ALLOW")
    );
}

#[test]
fn events_is_made_with_one_entry_and_sizes_follow_the_run() {
    let def = |name: &str| elf::MapDef {
        name: name.into(),
        map_type: 1,
        key_size: 8,
        value_size: 4,
        max_entries: 1024,
        flags: 0,
    };
    assert_eq!(
        created_shape(Profile::Unix, &def("EVENTS"), None).max_entries,
        1
    );
    assert_eq!(
        created_shape(Profile::Unix, &def("RUNS"), None).max_entries,
        1024
    );
    assert_eq!(
        created_shape(Profile::Unix, &def("ALLOW"), Some(256)).max_entries,
        256
    );
    // Many runs: as declared, `EVENTS` a map of maps.
    let events = created_shape(Profile::Full, &def("EVENTS"), None);
    assert_eq!((events.map_type, events.max_entries), (13, 1024));
}

#[test]
fn only_runs_whose_cgroup_is_known_gone_are_stale() {
    let ids: BTreeSet<u64> = [10, 11, 12].into();
    let stale = stale_ids(&ids, |id| match id {
        10 => Some(true),
        11 => Some(false),
        _ => None,
    });
    assert_eq!(stale, vec![11]);
}
