use super::*;

fn dirs_only(path: &Path) -> Option<bool> {
    Some(!path.to_string_lossy().ends_with(".env"))
}

#[test]
fn write_deny_inside_root_is_bound_read_only_and_its_parents_pinned() {
    let policy = Policy {
        writable_roots: vec!["/work".into()],
        write_denies: vec!["/work/a/b/.env".into(), "/etc/x".into()],
        ..Default::default()
    };
    let ops = plan(&policy, Path::new("/"), &dirs_only);
    assert!(ops.contains(&MountOp::DenyWrite("/work/a/b/.env".into())));
    assert!(ops.contains(&MountOp::Pin("/work/a".into())));
    assert!(ops.contains(&MountOp::Pin("/work/a/b".into())));
    assert!(
        !ops.contains(&MountOp::Pin("/work".into())),
        "root's parent is not writable"
    );
    assert!(
        !ops.iter()
            .any(|op| matches!(op, MountOp::DenyWrite(p) if p.starts_with("/etc")))
    );
    let pin = ops
        .iter()
        .position(|op| matches!(op, MountOp::Pin(_)))
        .unwrap();
    let deny = ops
        .iter()
        .position(|op| matches!(op, MountOp::DenyWrite(_)))
        .unwrap();
    assert!(
        pin < deny,
        "pins go first so a deny cannot be hidden by them"
    );
}

fn position(ops: &[MountOp], want: impl Fn(&MountOp) -> bool) -> usize {
    ops.iter().position(want).unwrap()
}

#[test]
fn roots_are_held_before_the_base_turns_read_only_and_attached_after_dev() {
    let policy = Policy {
        writable_roots: vec!["/work".into(), "/work/sub".into(), "/dev/shm/w".into()],
        write_denies: vec!["/work/a/.env".into()],
        ..Default::default()
    };
    let ops = plan(&policy, Path::new("/work"), &dirs_only);
    let holds: Vec<&MountOp> = ops
        .iter()
        .filter(|op| matches!(op, MountOp::Hold { .. }))
        .collect();
    assert_eq!(
        holds,
        vec![
            &MountOp::Hold {
                path: "/dev/shm/w".into(),
                read_only: false
            },
            &MountOp::Hold {
                path: "/work".into(),
                read_only: false
            },
        ],
        "a root inside a root comes with it"
    );
    let base = position(&ops, |op| op == &MountOp::ReadOnlyBase);
    let dev = position(&ops, |op| matches!(op, MountOp::PrivateDev { .. }));
    let attach = position(&ops, |op| op == &MountOp::Attach("/work".into()));
    let pin = position(&ops, |op| matches!(op, MountOp::Pin(_)));
    let deny = position(&ops, |op| matches!(op, MountOp::DenyWrite(_)));
    assert!(position(&ops, |op| matches!(op, MountOp::Hold { .. })) < base);
    assert!(base < dev && dev < attach && attach < pin && pin < deny);
    assert!(ops.contains(&MountOp::PrivateDev {
        mount_points: vec!["/dev/shm/w".into()],
        shm: crate::tmpfs_bounds::of(&policy),
    }));
}

#[test]
fn a_private_tmp_keeps_roots_writable_and_everything_else_read_only() {
    let policy = Policy {
        writable_roots: vec!["/tmp/w".into(), "/tmp".into()],
        read_allows: vec!["/tmp/tool".into()],
        read_denies: vec!["/tmp/other/secret".into(), "/dev/shm/x".into()],
        private_tmp: true,
        ..Default::default()
    };
    let ops = plan(&policy, Path::new("/tmp/w/src"), &dirs_only);
    assert!(ops.contains(&MountOp::Hold {
        path: "/tmp/w".into(),
        read_only: false
    }));
    assert!(ops.contains(&MountOp::Hold {
        path: "/tmp/tool".into(),
        read_only: true
    }));
    assert!(
        !ops.iter()
            .any(|op| matches!(op, MountOp::Hold { path, .. } if path == Path::new("/tmp") || path == Path::new("/tmp/w/src"))),
        "the host's /tmp stays out, the cwd comes with its root: {ops:?}"
    );
    assert!(
        !ops.iter().any(
            |op| matches!(op, MountOp::DenyReadDir(p) | MountOp::DenyReadFile(p)
            if !HOST_ONLY.iter().any(|h| p == Path::new(h)))
        ),
        "nothing of the host to hide in the private /tmp and /dev: {ops:?}"
    );
    let mut hiding = plan_with_mirrors(&policy, Path::new("/"), &dirs_only, 2);
    let hide = hide_sockets(
        &hiding,
        &policy,
        &[
            "/run/docker.sock".into(),
            "/dev/log".into(),
            "/tmp/x.sock".into(),
        ],
    );
    hiding.extend(hide);
    let hidden: Vec<&MountOp> = hiding
        .iter()
        .filter(|op| matches!(op, MountOp::HideSocket(_)))
        .collect();
    assert!(
        hiding
            .iter()
            .any(|op| matches!(op, MountOp::PrivateDev { mount_points, .. }
        if mount_points.ends_with(&["/dev/.u/0".into(), "/dev/.u/1".into()])))
    );
    assert_eq!(
        hidden,
        vec![&MountOp::HideSocket("/run/docker.sock".into())]
    );
}

#[test]
fn host_sockets_outside_the_roots_are_hidden() {
    let table = "Num RefCount Protocol Flags Type St Inode Path\n\
        0000: 00000002 00000000 00010000 0001 01 1 /run/docker.sock\n\
        0001: 00000002 00000000 00010000 0001 01 2 @abstract\n\
        0002: 00000002 00000000 00010000 0001 01 3 /work/own.sock\n\
        0003: 00000003 00000000 00000000 0001 03 4\n";
    let policy = Policy {
        writable_roots: vec!["/work".into()],
        ..Default::default()
    };
    assert_eq!(
        host_sockets_to_hide(table, &policy),
        vec![PathBuf::from("/run/docker.sock")]
    );
    // No cap: every listening socket is covered.
    let many: String = (0..1000)
        .map(|i| format!("{i:04}: 0 0 0 1 01 {i} /run/s{i}.sock\n"))
        .collect();
    let header = "Num RefCount Protocol Flags Type St Inode Path\n";
    assert_eq!(
        host_sockets_to_hide(&format!("{header}{many}"), &policy).len(),
        1000
    );
}

#[test]
fn host_sockets_under_a_root_are_named_in_a_warning() {
    let table = "Num RefCount Protocol Flags Type St Inode Path\n\
        0000: 00000002 00000000 00010000 0001 01 11 /tmp/tmux-1000/default\n\
        0000: 00000002 00000000 00010000 0001 01 12 /tmp/.X11-unix/X0\n\
        0000: 00000002 00000000 00010000 0001 01 13 @/tmp/.X11-unix/X0\n\
        0000: 00000002 00000000 00010000 0001 01 14 /run/docker.sock\n\
        0000: 00000002 00000000 00010000 0001 01 15 /tmpx/s\n";
    let policy = Policy {
        writable_roots: vec!["/tmp".into()],
        ..Default::default()
    };
    let found = host_sockets_in_roots(table, &policy);
    assert_eq!(
        found,
        vec![
            PathBuf::from("/tmp/.X11-unix/X0"),
            PathBuf::from("/tmp/tmux-1000/default")
        ]
    );
    let warning = reachable_sockets_warning(&found).unwrap();
    assert!(warning.contains("\"/tmp/tmux-1000/default\""), "{warning}");
    assert!(warning.contains("--private-tmp"), "{warning}");
    let many: Vec<PathBuf> = (0..5).map(|i| format!("/w/s{i}").into()).collect();
    assert!(
        reachable_sockets_warning(&many)
            .unwrap()
            .contains("and 2 more")
    );
    assert_eq!(reachable_sockets_warning(&[]), None);
    // A private /tmp hides the host's /tmp: nothing there is reached.
    let private = Policy {
        private_tmp: true,
        ..Default::default()
    };
    assert!(host_sockets_in_roots(table, &private).is_empty());
    // A name with a terminal escape is shown escaped.
    let odd = reachable_sockets_warning(&[PathBuf::from("/w/\u{1b}[2J")]).unwrap();
    assert!(!odd.contains('\u{1b}'), "{odd}");
}

#[test]
fn read_denies_pick_file_or_dir_and_skip_absent() {
    let policy = Policy {
        read_denies: vec!["/home/u/.ssh".into(), "/work/.env".into(), "/gone".into()],
        ..Default::default()
    };
    let exists = |p: &Path| match p.to_str() {
        Some("/gone") => None,
        Some(s) if s.ends_with(".env") => Some(false),
        _ => Some(true),
    };
    let ops = plan(&policy, Path::new("/"), &exists);
    assert!(ops.contains(&MountOp::DenyReadDir("/home/u/.ssh".into())));
    assert!(ops.contains(&MountOp::DenyReadFile("/work/.env".into())));
    assert!(!ops.iter().any(|op| format!("{op:?}").contains("/gone")));
    assert_eq!(ops[0], MountOp::MakePrivate);
}

#[test]
fn the_host_s_cgroup_hierarchies_and_tartaros_s_state_are_covered_once() {
    for (dir, parent) in [(CGROUP_ROOT, "/sys"), (STATE_DIR, "/run")] {
        let cover = MountOp::DenyReadDir(dir.into());
        let count = |ops: &[MountOp]| ops.iter().filter(|op| **op == cover).count();
        let policy = Policy {
            writable_roots: vec!["/w".into()],
            ..Default::default()
        };
        assert_eq!(count(&plan(&policy, Path::new("/w"), &dirs_only)), 1);
        // Denied by the policy already, or absent: nothing more.
        let denied = Policy {
            read_denies: vec![parent.into()],
            ..policy.clone()
        };
        assert_eq!(count(&plan(&denied, Path::new("/w"), &dirs_only)), 0);
        assert_eq!(count(&plan(&policy, Path::new("/w"), &|_| None)), 0);
    }
}
