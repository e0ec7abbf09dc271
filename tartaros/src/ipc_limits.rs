//! The limits of the run's own IPC namespace, set by the init while it is
//! still privileged there (root, or root of the user namespace that owns
//! the IPC namespace).
//!
//! A new IPC namespace starts with the kernel's defaults, not the host's
//! settings: 16 EiB of System V shared memory, 32,000 message queues of
//! 16 KiB, 1,024,000,000 semaphores. Segments, queued messages and
//! semaphore sets outlive every process of the run
//! (killing them frees nothing) until the namespace goes, so without a
//! memory limit an agent could hold any amount of RAM there. The values
//! come from the planner (`tmpfs_bounds::ipc_of`). The agent cannot raise
//! them: the files belong to the namespace's owner, and it has no
//! capability left.

use crate::tmpfs_bounds::IpcBounds;

#[derive(Debug, thiserror::Error)]
pub enum IpcLimitsError {
    #[error("failed to set {name} of the sandbox's IPC namespace to {value}: {source}")]
    Write {
        name: &'static str,
        value: u64,
        source: std::io::Error,
    },
}

/// Writes `bounds` into the IPC namespace the caller is in: the sysctls
/// under /proc/sys/kernel act on the writer's namespace.
pub fn apply(bounds: &IpcBounds) -> Result<(), IpcLimitsError> {
    for (name, value) in [
        ("shmmax", bounds.shm_bytes),
        ("shmall", bounds.shm_pages),
        ("msgmni", bounds.message_queues),
    ] {
        std::fs::write(format!("/proc/sys/kernel/{name}"), value.to_string()).map_err(
            |source| IpcLimitsError::Write {
                name,
                value,
                source,
            },
        )?;
    }
    // SEMMSL and SEMOPM keep the kernel's defaults: a set may be as large
    // as before, there are fewer semaphores in all.
    let sem = format!("32000 {} 500 {}", bounds.semaphores, bounds.semaphore_sets);
    std::fs::write("/proc/sys/kernel/sem", sem).map_err(|source| IpcLimitsError::Write {
        name: "sem",
        value: bounds.semaphores,
        source,
    })?;
    Ok(())
}
