//! The syscall table is whole and agrees with the capture: built from the
//! kernel's x86-64 list (`fixtures/syscall_64.txt`, written from the
//! kernel headers on the development hosts).

use std::collections::BTreeMap;

use tartaros_common::capture::{effect, effect_of, nr};
use tartaros_common::syscalls::{Class, TABLE, class_of, name_of, number_of};

fn kernel_list() -> BTreeMap<u32, String> {
    let text = include_str!("fixtures/syscall_64.txt");
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let mut parts = line.split_whitespace();
        let n: u32 = parts.next().and_then(|n| n.parse().ok()).expect("number");
        let name = parts.next().expect("name").to_string();
        assert!(out.insert(n, name).is_none(), "{line}: number twice");
    }
    out
}

#[test]
fn every_kernel_syscall_is_classified_once_under_its_own_name() {
    let kernel = kernel_list();
    assert!(kernel.len() > 370, "the fixture lost lines");
    for (n, name) in &kernel {
        assert_eq!(name_of(*n), Some(name.as_str()), "syscall {n} ({name})");
    }
    let mut last = None;
    for (n, name, _) in TABLE {
        assert!(last < Some(*n), "{name}: the table is not sorted by number");
        last = Some(*n);
        assert_eq!(
            kernel.get(n).map(String::as_str),
            Some(*name),
            "{n} {name} is not in the kernel's list"
        );
        assert_eq!(number_of(name), Some(*n));
    }
}

#[test]
fn the_capture_looks_at_exactly_the_captured_and_refused_syscalls() {
    for n in 0..1024u32 {
        let class = class_of(n);
        let captured = matches!(class, Some(Class::Captured(_)));
        let refused = matches!(class, Some(Class::Refused));
        let name = name_of(n).unwrap_or("(none)");
        assert_eq!(nr::is_effect(n), captured, "{n} {name}: capture vs table");
        assert_eq!(nr::is_refused(n), refused, "{n} {name}: refused vs table");
        assert_eq!(
            nr::is_captured(u64::from(n)),
            captured || refused,
            "{n} {name}"
        );
        let kind = effect_of(n);
        match class {
            Some(Class::Captured(k)) => assert_eq!(kind, k, "{n} {name}: kind"),
            Some(Class::Refused) => assert_eq!(kind, effect::SYSCALL, "{n} {name}"),
            _ => assert_eq!(
                kind,
                effect::OTHER,
                "{n} {name}: captured but not in the table"
            ),
        }
        if let Some(Class::Captured(k) | Class::Traced(k)) = class {
            assert_ne!(effect::name(k), "event", "{n} {name}: no log name");
        }
    }
    assert!(!nr::is_captured(u64::from(u32::MAX) + 1));
}

#[test]
fn reasons_are_given() {
    for (n, name, class) in TABLE {
        if let Class::RefusedQuiet(why) | Class::ThroughFd(why) | Class::Inert(why) = class {
            assert!(why.len() > 10, "{n} {name}: say why");
        }
    }
}
