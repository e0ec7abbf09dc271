use std::collections::HashMap;

use super::*;
use crate::mounts::MountOp;

/// A host made of a few paths and users.
#[derive(Default)]
pub(super) struct FakeFiles {
    paths: HashMap<PathBuf, Stat>,
    users: HashMap<String, Identity>,
}

impl FakeFiles {
    pub(super) fn with(mut self, path: &str, kind: PathKind, uid: u32, mode: u32) -> Self {
        self.paths.insert(
            PathBuf::from(path),
            Stat {
                kind,
                uid,
                gid: uid,
                mode,
                links: 1,
            },
        );
        self
    }
}

impl Facts for FakeFiles {
    fn stat(&self, path: &Path, _follow: bool) -> Option<Stat> {
        self.paths.get(path).copied()
    }
    fn user(&self, name: &str) -> Result<Identity, String> {
        self.users
            .get(name)
            .copied()
            .ok_or_else(|| format!("no user {name}"))
    }
}

pub(super) fn root_host() -> Host {
    Host {
        root: true,
        seccomp: true,
        user_namespaces: true,
        cgroup_v2: Some("/sys/fs/cgroup".into()),
        cgroup_v2_writable: true,
        cgroup_kill: true,
        landlock_abi: Some(7),
        kernel: "6.18.0".into(),
        controllers: vec![("pids".into(), false), ("memory".into(), false)],
        user_counts: Some(crate::user_counts::UserCounts {
            inotify_instances: 128,
            inotify_watches: 192_546,
            pending_signals: 96_369,
            queue_bytes: 819_200,
        }),
    }
}

pub(super) fn project() -> FakeFiles {
    FakeFiles::default()
        .with("/", PathKind::Dir, 0, 0o755)
        .with("/w", PathKind::Dir, 1000, 0o755)
        .with("/w/.env", PathKind::File, 1000, 0o600)
}

pub(super) fn policy() -> Policy {
    Policy {
        writable_roots: vec!["/w".into()],
        ..Policy::default()
    }
}

pub(super) fn decide_with(
    policy: &Policy,
    host: &Host,
    files: &FakeFiles,
    log: Option<&Path>,
    env: &[(String, String)],
) -> Result<RunPlan, Refusal> {
    let argv = vec!["true".to_string()];
    let request = Request {
        policy,
        argv: &argv,
        cwd: Path::new("/w"),
        log,
        log_buffer: 1 << 20,
        launcher_env: env,
        setenv: &[],
        pty: false,
    };
    let facts = HostFacts {
        host,
        current: Identity { uid: 0, gid: 0 },
        on_behalf: false,
        host_sockets: &[],
        shared_programs: false,
        files,
        mount_table: Some(""),
        placeholder_registry: None,
    };
    decide(&request, &facts)
}

#[test]
fn a_plain_root_run_has_a_cgroup_and_only_the_unix_policy() {
    let sudo = [
        ("SUDO_UID".to_string(), "1000".to_string()),
        ("SUDO_GID".to_string(), "1000".to_string()),
    ];
    let plan = decide_with(&policy(), &root_host(), &project(), None, &sudo).unwrap();
    assert_eq!(
        plan.init.identity,
        Identity {
            uid: 1000,
            gid: 1000
        }
    );
    assert!(!plan.init.user_namespace);
    assert_eq!(plan.init.user_counts, None, "no user namespace to bound");
    assert!(plan.cgroup.is_some());
    let watch = plan.watch.expect("root attaches the unix socket policy");
    assert!(watch.unix_policy && !watch.capture && watch.transparent_port.is_none());
    assert!(
        !watch.filter,
        "no connect filter without --log or --allow-domain"
    );
    assert_eq!(watch.ring_bytes, 0, "no capture, no ring");
    assert!(plan.gateways.is_empty());
    assert!(plan.init.listeners.is_empty());
    assert!(plan.init.landlock.is_some());
    assert!(plan.init.seccomp.is_some());
    assert!(plan.materialize.is_empty());
}

#[test]
fn the_log_is_hidden_as_a_file_and_capture_is_attached() {
    let log = Path::new("/w/effects.jsonl");
    let plan = decide_with(&policy(), &root_host(), &project(), Some(log), &[]).unwrap();
    assert!(
        plan.init
            .mounts
            .contains(&MountOp::DenyReadFile(log.to_path_buf()))
    );
    let watch = plan.watch.expect("capture attaches eBPF");
    assert!(watch.capture);
    assert!(watch.unix_policy);
    assert_eq!(watch.transparent_port, None);
}

#[test]
fn an_ordinary_user_gets_a_user_namespace_and_degrades() {
    let host = Host {
        root: false,
        cgroup_v2_writable: false,
        ..root_host()
    };
    let log = Path::new("/w/effects.jsonl");
    let mut plan = decide_with(&policy(), &host, &project(), Some(log), &[]).unwrap();
    assert!(plan.init.user_namespace);
    assert_eq!(plan.init.identity, Identity { uid: 0, gid: 0 });
    // A share of the user's inotify counts, which the run would share.
    assert_eq!(plan.init.user_counts.map(|c| c.inotify_instances), Some(32));
    assert!(plan.cgroup.is_none());
    assert!(plan.watch.is_none());
    assert!(
        plan.ledger
            .names(false)
            .contains(&"ebpf-capture".to_string())
    );
    assert!(!plan.ledger.take_warnings().is_empty());
}

#[test]
fn user_without_root_is_refused() {
    let host = Host {
        root: false,
        ..root_host()
    };
    let policy = Policy {
        user: Some("alice".into()),
        ..policy()
    };
    let refusal = decide_with(&policy, &host, &project(), None, &[]).unwrap_err();
    assert_eq!(refusal.code, exit::REFUSED);
    assert!(
        refusal
            .message
            .contains("--user needs tartaros to run as root")
    );
}

#[test]
fn an_unknown_user_is_refused() {
    let policy = Policy {
        user: Some("nobody-here".into()),
        ..policy()
    };
    let refusal = decide_with(&policy, &root_host(), &project(), None, &[]).unwrap_err();
    assert!(refusal.message.contains("nobody-here"));
}

#[test]
fn absent_denies_are_materialized_with_their_parents() {
    let policy = Policy {
        write_denies: vec!["/w/.git/hooks".into()],
        materialize_absent_handoff: true,
        ..policy()
    };
    let plan = decide_with(&policy, &root_host(), &project(), None, &[]).unwrap();
    assert_eq!(
        plan.materialize,
        vec![PathBuf::from("/w/.git"), PathBuf::from("/w/.git/hooks")]
    );
    assert!(
        plan.init
            .mounts
            .contains(&MountOp::DenyWrite("/w/.git/hooks".into()))
    );
}

#[test]
fn an_absent_deny_without_materialize_degrades_or_refuses() {
    let lenient = Policy {
        read_denies: vec!["/w/secret".into()],
        ..policy()
    };
    let mut plan = decide_with(&lenient, &root_host(), &project(), None, &[]).unwrap();
    assert!(plan.materialize.is_empty());
    assert_eq!(plan.ledger.names(false), vec!["deny-mounts"]);
    assert!(
        plan.ledger
            .take_warnings()
            .iter()
            .any(|w| w.starts_with("deny-mounts not installed: ")
                && w.contains("pass --materialize"))
    );
    let strict = Policy {
        strict: true,
        ..lenient
    };
    let refusal = decide_with(&strict, &root_host(), &project(), None, &[]).unwrap_err();
    assert!(refusal.message.contains("does not exist"));
}

#[test]
fn an_absent_deny_outside_the_roots_degrades_or_refuses() {
    // Only the host can create it, and the cover needs it at the start;
    // without Landlock nothing else holds it.
    let lenient = Policy {
        read_denies: vec!["/home/u/.config/gh".into()],
        materialize_absent_handoff: true,
        ..policy()
    };
    let no_landlock = Host {
        landlock_abi: None,
        ..root_host()
    };
    let mut plan = decide_with(&lenient, &no_landlock, &project(), None, &[]).unwrap();
    assert!(
        plan.materialize.is_empty(),
        "nothing is made outside the roots"
    );
    assert!(plan.ledger.names(false).iter().any(|n| n == "deny-mounts"));
    assert!(
        plan.ledger.take_warnings().iter().any(|w| {
            w.contains("/home/u/.config/gh does not exist") && w.contains("create it")
        })
    );
    // Where Landlock cannot hold it (entries of /proc come and go), a
    // strict run refuses.
    let strict = Policy {
        strict: true,
        read_denies: vec!["/proc/driver/absent".into()],
        ..lenient
    };
    let refusal = decide_with(&strict, &root_host(), &project(), None, &[]).unwrap_err();
    assert!(
        refusal.message.contains("would be readable"),
        "{}",
        refusal.message
    );
}

#[test]
fn a_denied_file_with_other_links_degrades_or_refuses() {
    let mut files = project().with("/w/.env", PathKind::File, 65534, 0o600);
    let lenient = Policy {
        read_denies: vec!["/w/.env".into()],
        ..policy()
    };
    let mut plan = decide_with(&lenient, &root_host(), &files, None, &[]).unwrap();
    assert!(plan.ledger.names(false).is_empty(), "one link is fine");
    assert!(
        !plan
            .ledger
            .take_warnings()
            .iter()
            .any(|w| w.contains("hard links"))
    );
    files.paths.get_mut(Path::new("/w/.env")).unwrap().links = 2;
    let mut plan = decide_with(&lenient, &root_host(), &files, None, &[]).unwrap();
    assert_eq!(plan.ledger.names(false), vec!["deny-mounts"]);
    assert!(
        plan.ledger
            .take_warnings()
            .iter()
            .any(|w| w.contains("has 2 hard links"))
    );
    let strict = Policy {
        strict: true,
        ..lenient
    };
    let refusal = decide_with(&strict, &root_host(), &files, None, &[]).unwrap_err();
    assert!(
        refusal.message.contains("hard links"),
        "{}",
        refusal.message
    );
}

#[test]
fn an_unwritable_root_is_warned_about() {
    let files = project().with("/w", PathKind::Dir, 0, 0o755);
    let mut plan = decide_with(&policy(), &root_host(), &files, None, &[]).unwrap();
    let warnings = plan.ledger.take_warnings();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("cannot write /w"));
}

#[test]
fn allowed_domains_open_gateways_and_interception() {
    let policy = Policy {
        allow_domains: vec!["crates.io".into()],
        ..policy()
    };
    let plan = decide_with(&policy, &root_host(), &project(), None, &[]).unwrap();
    let kinds: Vec<_> = plan.gateways.iter().map(|g| g.kind).collect();
    use crate::egress::GatewayKind;
    assert_eq!(
        kinds,
        [
            GatewayKind::Proxy,
            GatewayKind::Proxy,
            GatewayKind::Transparent,
            GatewayKind::Transparent
        ]
    );
    assert_eq!(plan.init.listeners.len(), 4);
    let watch = plan.watch.unwrap();
    assert!(!watch.capture);
    assert!(watch.transparent_port.is_some());
}

#[test]
fn too_many_unix_roots_degrade_the_unix_policy() {
    let mut files = project();
    let roots: Vec<PathBuf> = (0..9).map(|i| PathBuf::from(format!("/r{i}"))).collect();
    for root in &roots {
        files = files.with(root.to_str().unwrap(), PathKind::Dir, 0, 0o777);
    }
    let policy = Policy {
        writable_roots: roots,
        ..Policy::default()
    };
    let plan = decide_with(
        &policy,
        &root_host(),
        &files,
        Some(Path::new("/r0/log")),
        &[],
    )
    .unwrap();
    assert!(!plan.watch.unwrap().unix_policy);
    assert_eq!(plan.ledger.names(false), vec!["unix-socket-policy"]);
}

#[test]
fn an_ordinary_user_gets_the_gateways_without_interception() {
    let host = Host {
        root: false,
        cgroup_v2_writable: false,
        ..root_host()
    };
    let policy = Policy {
        allow_domains: vec!["crates.io".into()],
        local_ports: vec![8080],
        ..policy()
    };
    let plan = decide_with(&policy, &host, &project(), None, &[]).unwrap();
    use crate::egress::GatewayKind;
    let kinds: Vec<_> = plan.gateways.iter().map(|g| g.kind).collect();
    assert!(kinds.contains(&GatewayKind::Proxy));
    assert!(!kinds.contains(&GatewayKind::Transparent));
    assert_eq!(plan.init.listeners.len(), 4);
    assert!(plan.ledger.installed(Guarantee::Gateways));
    assert_eq!(
        plan.ledger.names(false),
        vec![
            "cgroup",
            "unix-socket-policy",
            "connect-filter",
            "transparent-interception"
        ]
    );
    assert!(
        plan.init
            .env
            .iter()
            .any(|(k, v)| k == "HTTPS_PROXY" && v == "http://127.0.0.1:3128")
    );
}

#[test]
fn a_service_caller_runs_as_itself_and_cannot_choose_a_user() {
    let argv = vec!["true".to_string()];
    let files = project();
    let caller = Identity {
        uid: 1000,
        gid: 1000,
    };
    let facts = HostFacts {
        host: &root_host(),
        current: caller,
        on_behalf: true,
        host_sockets: &[],
        shared_programs: false,
        files: &files,
        mount_table: Some(""),
        placeholder_registry: None,
    };
    let request = |policy| Request {
        policy,
        argv: &argv,
        cwd: Path::new("/w"),
        log: None,
        log_buffer: 1 << 20,
        launcher_env: &[],
        setenv: &[],
        pty: false,
    };
    let plain = policy();
    let plan = decide(&request(&plain), &facts).unwrap();
    assert_eq!(plan.init.identity, caller);
    assert!(!plan.init.user_namespace);
    let with_user = Policy {
        user: Some("root".into()),
        ..policy()
    };
    let refusal = decide(&request(&with_user), &facts).unwrap_err();
    assert!(
        refusal
            .message
            .contains("not available through the service")
    );
}

#[test]
fn with_the_unix_policy_sockets_are_pinned_not_hidden_and_hidden_again_if_it_is_lost() {
    let policy = Policy {
        writable_roots: vec!["/w".into()],
        tmpfs: vec!["/scratch".into()],
        ..Policy::default()
    };
    let argv = vec!["true".to_string()];
    let request = Request {
        policy: &policy,
        argv: &argv,
        cwd: Path::new("/w"),
        log: None,
        log_buffer: 1 << 20,
        launcher_env: &[],
        setenv: &[],
        pty: false,
    };
    let sockets = [PathBuf::from("/run/docker.sock")];
    let host = root_host();
    let files = project();
    let facts = HostFacts {
        host: &host,
        current: Identity { uid: 0, gid: 0 },
        on_behalf: false,
        host_sockets: &sockets,
        shared_programs: false,
        files: &files,
        mount_table: Some(""),
        placeholder_registry: None,
    };
    let mut plan = decide(&request, &facts).unwrap();
    // In the plan the init gets at once, or in its late part when the
    // unix policy did not attach.
    let hides =
        |plan: &RunPlan| {
            plan.init.mounts.iter().chain(&plan.late.hide_sockets).any(
                |op| matches!(op, MountOp::HideSocket(p) if p == Path::new("/run/docker.sock")),
            )
        };
    // Mirrored in the slot order of the unix programs' prefixes.
    let watch = plan.watch.as_ref().unwrap();
    assert_eq!(plan.late.unix_mirrors, watch.unix_allowed);
    assert_eq!(
        plan.late.unix_mirrors,
        vec![PathBuf::from("/scratch"), PathBuf::from("/w")],
        "longest first"
    );
    assert!(plan.init.mounts.iter().any(|op| matches!(op,
        MountOp::PrivateDev { mount_points, .. } if mount_points.contains(&PathBuf::from("/dev/.u/1")))));
    assert!(!hides(&plan), "nothing to hide: the hook refuses the name");
    plan.unix_policy_lost();
    assert!(plan.late.unix_mirrors.is_empty());
    assert!(hides(&plan), "without the hook, hide what listens now");

    // A run without the policy hides from the start.
    let denied = Policy {
        deny_unix: true,
        ..policy.clone()
    };
    let request = Request {
        policy: &denied,
        ..request
    };
    let plan = decide(&request, &facts).unwrap();
    assert!(plan.late.unix_mirrors.is_empty());
    assert!(hides(&plan));
}

#[test]
fn a_root_nested_in_another_has_the_first_slot_of_the_two() {
    let policy = Policy {
        writable_roots: vec!["/w".into(), "/w/sub".into(), "/a/b/c".into()],
        tmpfs: vec!["/w/sub/t".into()],
        private_tmp: true,
        ..policy()
    };
    let plan = decide_with(&policy, &root_host(), &project(), None, &[]).unwrap();
    let watch = plan.watch.as_ref().unwrap();
    let want: Vec<PathBuf> = ["/w/sub/t", "/a/b/c", "/w/sub", "/tmp", "/w"]
        .iter()
        .map(PathBuf::from)
        .collect();
    // The programs take the first prefix that matches; the mirrors follow
    // the same slots.
    assert_eq!(watch.unix_allowed, want);
    assert_eq!(plan.late.unix_mirrors, want);
}

#[test]
fn a_bind_on_or_above_a_writable_root_is_refused() {
    use crate::policy::scope::Bind;
    let bind = |target: &str| Bind {
        source: "/srv".into(),
        target: target.into(),
    };
    let with = |target: &str, private_tmp: bool| Policy {
        writable_roots: vec!["/w/project".into()],
        binds: vec![bind(target)],
        private_tmp,
        ..policy()
    };
    for (target, private_tmp) in [("/w/project", false), ("/w", false), ("/tmp", true)] {
        let refusal = decide_with(
            &with(target, private_tmp),
            &root_host(),
            &project(),
            None,
            &[],
        )
        .unwrap_err();
        assert_eq!(refusal.code, exit::REFUSED, "{target}");
        assert!(
            refusal.message.ends_with("; bind it elsewhere")
                && refusal.message.contains("would hide the writable root"),
            "{}",
            refusal.message
        );
    }
    // Below a root (the mirror covers it), beside it, or /tmp without a
    // private one.
    for target in ["/w/project/sub", "/w/other", "/tmp"] {
        assert!(
            decide_with(&with(target, false), &root_host(), &project(), None, &[]).is_ok(),
            "{target}"
        );
    }
}
