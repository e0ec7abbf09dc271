//! `tartaros doctor --json`: the host's abilities and, for root and for an
//! ordinary user, which guarantees a run would lack and how to get them.

use serde_json::{Value, json};

use crate::host_facts::Host;
use crate::policy::Policy;

/// A policy that asks for everything a run can ask for (network gateways,
/// limits, capture), so that the report lists every missing piece.
pub fn demanding_policy() -> Policy {
    Policy {
        allow_domains: vec!["example.org".into()],
        local_ports: vec![8080],
        max_processes: Some(4096),
        max_memory: Some(1 << 30),
        ..Default::default()
    }
}

fn missing(policy: &Policy, host: &Host) -> Vec<Value> {
    crate::guarantee::missing(policy, host, true)
        .into_iter()
        .map(|(name, reason)| json!({ "guarantee": name, "how_to_get_it": reason }))
        .collect()
}

/// The report and the exit status `doctor` uses (1 when the current user
/// lacks a default guarantee, as in the text form).
pub fn collect() -> (Value, i32) {
    let host = Host::probe();
    let as_root = Host {
        root: true,
        cgroup_v2_writable: host.cgroup_v2.is_some(),
        ..host.clone()
    };
    let as_user = Host {
        root: false,
        cgroup_v2_writable: !host.root && host.cgroup_v2_writable,
        ..host.clone()
    };
    let demanding = demanding_policy();
    let code = i32::from(!crate::guarantee::missing(&Policy::default(), &host, true).is_empty());
    let programs: serde_json::Map<String, Value> = crate::ebpf::probe_program_types()
        .into_iter()
        .map(|(name, loads)| (name.to_string(), Value::Bool(loads)))
        .collect();
    let report = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "kernel": host.kernel,
        "root": host.root,
        "landlock_abi": host.landlock_abi,
        "seccomp": host.seccomp,
        "user_namespaces": host.user_namespaces,
        "cgroup_v2": host.cgroup_v2.as_ref().map(|p| p.display().to_string()),
        "cgroup_v2_writable": host.cgroup_v2_writable,
        "cgroup_kill": host.cgroup_kill,
        "bpf_program_types": programs,
        "missing": {
            "root": missing(&demanding, &as_root),
            "ordinary_user": missing(&demanding, &as_user),
        },
    });
    (report, code)
}
