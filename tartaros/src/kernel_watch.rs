//! The run's eBPF programs, from attach (before the init exists) to the
//! last drained event (after the cgroup is empty): the glue between
//! `ebpf` and the supervisor.

use std::path::{Path, PathBuf};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::ebpf::{
    AttachOptions, CaptureStats, CgroupPrograms, ConnectGrant, EbpfError, EventSource,
};
use crate::events::EffectSender;
use crate::policy::Policy;
use crate::proxy::OriginalDst;

/// At most this many directories may hold reachable unix sockets (a limit
/// of the eBPF program).
pub const MAX_UNIX_PREFIXES: usize = 8;

/// Decides what to attach: pure, unit-tested.
pub fn options(policy: &Policy, capture: bool, ring_bytes: u32) -> AttachOptions {
    // The sandbox's loopback is its own (a private network namespace): its
    // servers, the broker, the proxy and the --port gateways all live there,
    // so every port of 127.0.0.1 and ::1 is granted (port 0 = any). Every
    // other destination is refused: nothing else is reachable anyway, and
    // the attempt is recorded.
    let ports = [0u16];
    let grants = ports
        .iter()
        .flat_map(|port| {
            [
                ConnectGrant {
                    addr: std::net::Ipv4Addr::LOCALHOST.into(),
                    port: *port,
                },
                ConnectGrant {
                    addr: std::net::Ipv6Addr::LOCALHOST.into(),
                    port: *port,
                },
            ]
        })
        .collect();
    // Every place the agent may create a socket: the roots, the private
    // /tmp and the fresh `--tmpfs` directories (none holds a host socket
    // the agent could not make itself).
    let mut unix_allowed: Vec<PathBuf> = policy.writable_roots.clone();
    if policy.private_tmp {
        unix_allowed.push(PathBuf::from("/tmp"));
    }
    unix_allowed.extend(policy.tmpfs.iter().cloned());
    // The programs take the first slot whose prefix matches, and a root
    // nested in another must map to its own slot: the outer root's mirror
    // covers every mount below it (`unix_mirror.rs`), and the inner one's
    // names through that mirror would find nothing. Longest first.
    unix_allowed.sort_by(|a, b| {
        let len = |p: &PathBuf| p.as_os_str().len();
        len(b).cmp(&len(a)).then_with(|| a.cmp(b))
    });
    unix_allowed.dedup();
    let transparent = !policy.allow_domains.is_empty();
    AttachOptions {
        // The record of every attempt, and the interception, need the
        // connect programs; without them only the unix policy is attached.
        filter: capture || transparent,
        grants,
        capture,
        // Nothing is read from the ring without capture: none.
        ring_bytes: if capture { ring_bytes } else { 0 },
        unix_policy: !policy.deny_unix,
        unix_allowed,
        // With allowed domains, TCP connects to anything but loopback go to
        // the transparent proxy instead of failing with EPERM.
        transparent_port: transparent.then_some(crate::egress::TRANSPARENT_PORT),
        // The gateways' records carry the pid that opened each connection.
        attribution: capture
            && (transparent || !policy.local_ports.is_empty() || policy.broker.is_some()),
        gateway_ports: crate::egress::plan(policy, transparent)
            .iter()
            .map(|g| g.listen.addr.port())
            .collect::<std::collections::BTreeSet<u16>>()
            .into_iter()
            .collect(),
    }
}

/// Whether the unix socket policy can hold these roots.
pub fn unix_roots_fit(options: &AttachOptions) -> Result<(), String> {
    if options.unix_allowed.len() > MAX_UNIX_PREFIXES {
        return Err(format!(
            "at most {MAX_UNIX_PREFIXES} writable roots can hold unix sockets; merge roots or pass --deny-unix"
        ));
    }
    if let Some(long) = options
        .unix_allowed
        .iter()
        .find(|p| p.as_os_str().len() >= 107)
    {
        return Err(format!(
            "writable root {} is too long for the unix socket policy (106 bytes at most); use a shorter path or --deny-unix",
            long.display()
        ));
    }
    Ok(())
}

/// The forwarding task: its stats and the event source, handed back.
type Forwarding = JoinHandle<(CaptureStats, EventSource)>;

/// The attached programs and, with capture, the task that forwards their
/// events to the log.
pub struct KernelWatch {
    programs: CgroupPrograms,
    forwarder: Option<(Forwarding, oneshot::Sender<()>)>,
    /// Where the gap of skipped events goes at the end.
    effects: EffectSender,
}

/// The `lost_kind` of events the kernel skipped: it ran none of our
/// programs for them (`recursion_misses`).
pub const SKIPPED: &str = "program-skipped";

/// The gap for `skipped` events the kernel did not run the capture for;
/// a counter that cannot be read is a loss of unknown size.
pub fn skipped_gap(skipped: Option<u64>, capture: bool) -> Option<crate::events::Gap> {
    match skipped {
        _ if !capture => None,
        Some(0) => None,
        Some(count) => Some(crate::events::Gap {
            count,
            lost_kind: SKIPPED,
        }),
        None => Some(crate::events::Gap {
            count: 1,
            lost_kind: "loss-counters-unreadable",
        }),
    }
}

impl KernelWatch {
    /// Attaches to the run's cgroup; must happen before any process joins
    /// it, so that no effect precedes capture.
    /// `preload` is what [`crate::ebpf::preload`] started for `options`.
    pub fn start(
        cgroup: &Path,
        options: &AttachOptions,
        preload: Option<crate::ebpf::Preload>,
        effects: &EffectSender,
    ) -> Result<Self, EbpfError> {
        let mut programs = crate::ebpf::attach_preloaded(cgroup, options, preload)?;
        let forwarder = if options.capture {
            let source = programs.take_event_source()?;
            let (stop, stopped) = oneshot::channel();
            let task = tokio::spawn(crate::ebpf::forward(source, effects.clone(), stopped));
            Some((task, stop))
        } else {
            None
        };
        Ok(Self {
            programs,
            forwarder,
            effects: effects.clone(),
        })
    }

    /// See `CgroupPrograms::leave_ring`.
    pub fn leave_ring(&mut self) -> Option<crate::ebpf::LeftRing> {
        self.programs.leave_ring()
    }

    /// With a `transparent_port`: the original-destination lookup to hand
    /// to `crate::egress::open` (the transparent proxy refuses connections
    /// it returns `None` for). `None` without transparent interception.
    pub fn original_dst(&self) -> Option<OriginalDst> {
        self.programs.original_dst()
    }

    /// With capture: who opened an accepted connection (relay, proxy and
    /// broker records carry it as `pid`).
    pub fn connection_owner(&self) -> Option<crate::events::ConnectionOwner> {
        self.programs.connection_owner()
    }

    /// Program tags, for the log's genesis.
    pub fn tags(&self) -> Vec<String> {
        self.programs.program_tags()
    }

    /// Detaches the programs and drains what is left; the programs and
    /// the ring buffer are released by the returned [`Release`]. Call only
    /// once the cgroup is empty: later events cannot exist, earlier ones
    /// are all in the ring, so the programs can go while it is drained.
    pub async fn finish(self) -> (Option<CaptureStats>, Release) {
        // Before the programs go: the kernel counts per program.
        let skipped = self.programs.skipped_events();
        if let Some(gap) = skipped_gap(skipped, self.programs.captures()) {
            let _ = self.effects.send(crate::events::Entry::Gap(gap));
        }
        let mut release = Release::default();
        release.spawn(self.programs);
        let stats = match self.forwarder {
            Some((task, stop)) => {
                let _ = stop.send(());
                match task.await {
                    Ok((stats, source)) => {
                        release.spawn(source);
                        Some(stats)
                    }
                    Err(_) => None,
                }
            }
            None => None,
        };
        (stats, release)
    }
}

/// The programs and ring buffer of a finished watch, released on threads
/// of their own: detaching a dozen programs (each tracepoint's last probe
/// patches kernel text) and unmapping the ring is ~1.5 ms of kernel work
/// that need not delay the drain and the seal.
#[derive(Default)]
pub struct Release(Vec<std::thread::JoinHandle<()>>);

impl Release {
    fn spawn<T: Send + 'static>(&mut self, parts: T) {
        // A thread that cannot start drops its closure, and the parts with
        // it, right here.
        let thread = std::thread::Builder::new()
            .name("ebpf-release".into())
            .spawn(move || drop(parts));
        self.0.extend(thread.ok());
    }

    /// Returns once everything is detached and unmapped.
    pub fn wait(self) {
        for thread in self.0 {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_the_kernel_skipped_are_a_gap_and_an_unreadable_count_too() {
        assert_eq!(skipped_gap(Some(0), true), None);
        assert_eq!(skipped_gap(Some(3), false), None);
        let gap = skipped_gap(Some(3), true).unwrap();
        assert_eq!((gap.count, gap.lost_kind), (3, SKIPPED));
        let gap = skipped_gap(None, true).unwrap();
        assert_eq!((gap.count, gap.lost_kind), (1, "loss-counters-unreadable"));
    }

    #[test]
    fn gateways_are_granted_and_roots_hold_unix_sockets() {
        let policy = Policy {
            local_ports: vec![8080],
            allow_domains: vec!["crates.io".into()],
            writable_roots: vec!["/work".into()],
            ..Default::default()
        };
        let options = options(&policy, true, 1 << 20);
        assert!(
            options
                .grants
                .iter()
                .all(|g| g.port == 0 && g.addr.is_loopback())
        );
        assert_eq!(options.grants.len(), 2);
        assert_eq!(options.unix_allowed, vec![PathBuf::from("/work")]);
        assert!(options.unix_policy && options.capture);
        assert_eq!(
            options.transparent_port,
            Some(crate::egress::TRANSPARENT_PORT)
        );
        assert_eq!(
            options_for_deny_unix().transparent_port,
            None,
            "no domains, no interception"
        );
        let denied = options_for_deny_unix();
        assert!(
            !denied.unix_policy,
            "--deny-unix refuses every unix socket in seccomp already"
        );
    }

    fn options_for_deny_unix() -> AttachOptions {
        options(
            &Policy {
                deny_unix: true,
                ..Default::default()
            },
            false,
            1 << 20,
        )
    }

    /// Only a run whose gateways attribute connections, or that
    /// intercepts them, gets full-size maps for that in an object of its
    /// own; every other run's are small.
    #[test]
    fn a_run_s_own_maps_are_sized_to_what_it_uses() {
        use tartaros_common::{MAP_ALLOW, MAP_OWNER_PORT, MAP_RUNS, MAP_TPROXY_COOKIE};
        let small = Some(crate::ebpf::UNUSED_MAP_ENTRIES);
        let logged = options(&Policy::default(), true, 1 << 20);
        assert!(!logged.attribution);
        assert_eq!(logged.own_map_entries(MAP_OWNER_PORT), small);
        assert_eq!(logged.own_map_entries(MAP_TPROXY_COOKIE), small);
        assert_eq!(
            logged.own_map_entries(MAP_ALLOW),
            Some(crate::ebpf::OWN_ALLOW_ENTRIES)
        );
        assert_eq!(logged.own_map_entries(MAP_RUNS), None, "as declared");
        let relayed = Policy {
            local_ports: vec![8080],
            ..Default::default()
        };
        let relayed = options(&relayed, true, 1 << 20);
        assert!(relayed.attribution);
        let own = Some(tartaros_common::TPROXY_MAX_ENTRIES);
        assert_eq!(relayed.own_map_entries(MAP_OWNER_PORT), own);
        assert_eq!(relayed.own_map_entries(MAP_TPROXY_COOKIE), small);
        assert_ne!(logged.sizing(), relayed.sizing(), "not one object");
        let proxied = Policy {
            allow_domains: vec!["crates.io".into()],
            ..Default::default()
        };
        let proxied = options(&proxied, true, 1 << 20);
        assert_eq!(proxied.own_map_entries(MAP_TPROXY_COOKIE), None);
        assert_eq!(proxied.own_map_entries(MAP_OWNER_PORT), own);
        let unlogged = options(&Policy::default(), false, 1 << 20);
        assert!(!unlogged.attribution, "nothing to attribute without a log");
    }

    #[test]
    fn too_many_roots_for_the_unix_policy_are_refused() {
        let policy = Policy {
            writable_roots: (0..9).map(|i| PathBuf::from(format!("/r{i}"))).collect(),
            ..Default::default()
        };
        assert!(unix_roots_fit(&options(&policy, false, 1 << 20)).is_err());
    }
}
