//! `tartaros doctor`: what this host can enforce.

use crate::probe::Host;

/// Prints one line per mechanism; exits 0 when a strict run with the
/// default policy could start, 1 otherwise.
pub fn print() -> i32 {
    let host = Host::probe();
    let yes_no = |ok: bool| if ok { "yes" } else { "no" };
    println!("tartaros {}", env!("CARGO_PKG_VERSION"));
    println!("kernel               {}", host.kernel);
    println!("running as root      {}", yes_no(host.root));
    match host.landlock_abi {
        Some(abi) => println!(
            "landlock             ABI {abi}{}",
            if abi >= crate::landlock::MIN_FULL_ABI { "" } else { " (too old: writes not fully confined)" }
        ),
        None => println!("landlock             no (needs Linux 5.13+ with lsm=landlock)"),
    }
    println!("seccomp              {}", yes_no(host.seccomp));
    println!("user namespaces      {}", yes_no(host.user_namespaces));
    match &host.cgroup_v2 {
        Some(mount) => println!(
            "cgroup v2            {} (writable: {}, cgroup.kill: {})",
            mount.display(),
            yes_no(host.cgroup_v2_writable),
            yes_no(host.cgroup_kill)
        ),
        None => println!("cgroup v2            no"),
    }
    // EBPF-DOCTOR: program type probes are wired in once the ebpf module lands.
    let guarantees = crate::probe::guarantees(&crate::policy::Policy::default(), &host);
    let missing: Vec<_> = guarantees.iter().filter(|g| !g.installed).collect();
    for g in &missing {
        println!("missing: {}: {}", g.name, g.reason);
    }
    i32::from(!missing.is_empty())
}
