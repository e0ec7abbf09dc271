//! The eBPF programs the service loads once for all its runs
//! ([`crate::ebpf::shared`]), and the parent cgroup they are attached to:
//! `<the service's own cgroup>/tartaros-<service pid>-<nanoseconds>`, named
//! like a run cgroup so that a sweep for debris (`crate::debris`) knows
//! whose it is. A janitor removes it (and whatever is left below it) when
//! the service ends, however it ends.

use std::path::PathBuf;

use crate::ebpf::shared::SharedPrograms;
use crate::janitor::Janitor;

/// Loads and attaches the programs, or says on stderr why runs will load
/// their own (each then pays a verifier pass, as a root run does). Must be
/// called while the process is single-threaded (it forks the janitor).
pub fn start() -> Option<SharedPrograms> {
    match try_start() {
        Ok((programs, warnings)) => {
            for w in warnings {
                eprintln!("tartaros: service: warning: {w}");
            }
            Some(programs)
        }
        Err(e) => {
            eprintln!("tartaros: service: warning: {e}; every run loads its own eBPF programs");
            None
        }
    }
}

fn try_start() -> Result<(SharedPrograms, Vec<String>), String> {
    let own = crate::cgroup::own_v2_dir()
        .ok_or("failed to find the service's cgroup v2 directory (no cgroup2 mount)")?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let parent: PathBuf = own.join(format!("tartaros-{}-{nanos}", std::process::id()));
    let mut janitor = Janitor::fork().map_err(|e| e.to_string())?;
    std::fs::create_dir(&parent).map_err(|e| {
        format!(
            "failed to create the runs' cgroup {}: {e}",
            parent.display()
        )
    })?;
    janitor.cgroup(&parent);
    // The janitor lives as long as the service: its pipe closes with us.
    std::mem::forget(janitor);
    delegate_controllers(&parent);
    SharedPrograms::start(&parent).map_err(|e| {
        let _ = std::fs::remove_dir(&parent);
        format!("failed to load the shared eBPF programs: {e}")
    })
}

/// Enables for the runs every controller the parent has, so that run
/// cgroups can hold limits in v2 as they could directly under the
/// service's cgroup. Best effort: without it limits fall back as before.
fn delegate_controllers(parent: &std::path::Path) {
    let Ok(available) = std::fs::read_to_string(parent.join("cgroup.controllers")) else {
        return;
    };
    let wanted: Vec<String> = available
        .split_whitespace()
        .map(|c| format!("+{c}"))
        .collect();
    if !wanted.is_empty() {
        let _ = std::fs::write(parent.join("cgroup.subtree_control"), wanted.join(" "));
    }
}
