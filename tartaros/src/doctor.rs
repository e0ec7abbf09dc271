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
            if abi >= crate::landlock::MIN_FULL_ABI {
                ""
            } else {
                " (too old: writes not fully confined)"
            }
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
    for (program, loads) in crate::ebpf::probe_program_types() {
        println!(
            "bpf {program:<16} {}",
            if loads { "loads" } else { "refused" }
        );
    }
    // What a strict run would get, for root and for an ordinary user.
    let as_root = Host {
        root: true,
        cgroup_v2_writable: host.cgroup_v2.is_some(),
        ..host.clone()
    };
    // Root's view of cgroup writability says nothing about a user's.
    let as_user = Host {
        root: false,
        cgroup_v2_writable: !host.root && host.cgroup_v2_writable,
        ..host.clone()
    };
    let mut missing_now = 0;
    for (who, view) in [("root", &as_root), ("ordinary user", &as_user)] {
        let guarantees = crate::probe::guarantees(&crate::policy::Policy::default(), view, true);
        let missing: Vec<_> = guarantees.iter().filter(|g| !g.installed).collect();
        if missing.is_empty() {
            println!("as {who:<14} every default guarantee installs");
        }
        // Also what network grants, limits and capture would lack.
        let demanding = crate::doctor_report::demanding_policy();
        for g in crate::probe::guarantees(&demanding, view, true)
            .iter()
            .filter(|g| !g.installed)
        {
            println!("as {who:<14} missing {}: {}", g.name, g.reason);
        }
        if view.root == host.root {
            missing_now = missing.len();
        }
    }
    i32::from(missing_now > 0)
}
