//! `tartaros doctor`: what this host can enforce.

use crate::host_facts::Host;

/// Prints one line per mechanism; exits 0 when a strict run with the
/// default policy could start, 1 otherwise. With `clean`, first removes the
/// cgroups of runs whose supervisor and janitor were killed.
pub fn print(clean: bool) -> i32 {
    if clean {
        let removed = crate::debris::sweep_all();
        for path in &removed {
            println!("removed leftover cgroup {}", path.display());
        }
        println!("removed {} leftover run cgroup(s)", removed.len());
    }
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
    if !clean {
        let left = crate::debris::find_all().len();
        if left > 0 {
            println!(
                "leftover cgroups     {left} of killed runs (remove them with tartaros doctor --clean)"
            );
        }
    }
    // The read-only base and the private /dev need the fd mount API.
    println!(
        "read-only base       {}",
        if crate::host_facts::kernel_at_least(&host.kernel, 5, 12) {
            "yes (mount_setattr): nothing outside the writable roots can change"
        } else {
            "no (needs Linux 5.12+ for mount_setattr); runs fail to start"
        }
    );
    let unix_hooks = crate::host_facts::kernel_at_least(&host.kernel, 6, 7);
    println!(
        "unix sockets         {}",
        match (host.root, unix_hooks) {
            (true, true) => "eBPF policy (as root) refuses every socket path outside the roots; those listening at start are hidden too".to_string(),
            (true, false) =>
                "no eBPF unix hooks (Linux 6.7+): only sockets listening at start are hidden; use --deny-unix".to_string(),
            (false, _) => crate::host_facts::UNIX_WITHOUT_BPF.to_string(),
        }
    );
    for (program, loads) in crate::ebpf::probe_program_types() {
        println!(
            "bpf {program:<16} {}",
            if loads { "loads" } else { "refused" }
        );
    }
    let socket = crate::service::socket_path();
    if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
        println!(
            "service              listening on {}: ordinary users' runs go through it (cgroups, eBPF, gateways)",
            socket.display()
        );
    } else {
        println!(
            "service              not running ({}): ordinary users get the user-namespace path without cgroup limits or eBPF; start it with `systemctl enable --now tartaros.socket` or `tartaros service`",
            socket.display()
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
        let ledger =
            match crate::guarantee::requested(&crate::policy::Policy::default(), view, true) {
                Ok(ledger) => ledger,
                Err(refusal) => {
                    println!("as {who:<14} {}", refusal.message);
                    if view.root == host.root {
                        missing_now = 1;
                    }
                    continue;
                }
            };
        let missing: Vec<_> = ledger.entries().iter().filter(|e| !e.installed).collect();
        if missing.is_empty() {
            println!("as {who:<14} every default guarantee installs");
        }
        // Also what network grants, limits and capture would lack.
        let demanding = crate::doctor_report::demanding_policy();
        for (name, reason) in crate::guarantee::missing(&demanding, view, true) {
            println!("as {who:<14} missing {name}: {reason}");
        }
        if view.root == host.root {
            missing_now = missing.len();
        }
    }
    i32::from(missing_now > 0)
}
