//! Which eBPF program types the host accepts (for `tartaros doctor`).
//!
//! Loads the tiny `probe_*` programs from the embedded object into the
//! kernel without attaching them, then unloads everything. (The real
//! programs need the maps our own loader makes, see `load.rs`.) Needs the same privileges as a real run (root / CAP_BPF).

use aya::programs::{BtfTracePoint, CgroupSock, CgroupSockAddr, FEntry, Lsm, RawTracePoint};
use aya::{Btf, Ebpf};

/// Program types probed, in report order.
const PROBES: [&str; 6] = [
    "cgroup_sock_addr",
    "cgroup_sock",
    "raw_tracepoint",
    "tp_btf",
    "lsm",
    "fentry",
];

/// For each program type, whether a minimal program of that type loads on
/// this host. Every type reports `false` when the object cannot be loaded at
/// all (no privileges, no BPF syscall).
pub fn probe_program_types() -> Vec<(&'static str, bool)> {
    // Kernel BTF is needed to resolve the attach targets of tp_btf, LSM and
    // fentry programs; without it those report `false`.
    let btf = Btf::from_sys_fs().ok();
    // aya's loader is fine here: `doctor` is not on the start-up path.
    let object = super::elf::Elf::parse(super::EBPF_OBJECT).and_then(|e| e.without_task_storage());
    let Ok(mut ebpf) = object
        .map_err(|_| ())
        .and_then(|o| aya::EbpfLoader::new().load(&o).map_err(|_| ()))
    else {
        return PROBES.iter().map(|p| (*p, false)).collect();
    };
    PROBES
        .iter()
        .map(|probe| (*probe, loads(&mut ebpf, probe, btf.as_ref())))
        .collect()
}

fn loads(ebpf: &mut Ebpf, probe: &str, btf: Option<&Btf>) -> bool {
    match probe {
        "cgroup_sock_addr" => {
            program::<CgroupSockAddr>(ebpf, "probe_sock_addr").is_some_and(|p| p.load().is_ok())
        }
        "cgroup_sock" => {
            program::<CgroupSock>(ebpf, "probe_sock").is_some_and(|p| p.load().is_ok())
        }
        "raw_tracepoint" => {
            program::<RawTracePoint>(ebpf, "probe_raw_tp").is_some_and(|p| p.load().is_ok())
        }
        "tp_btf" => btf.is_some_and(|btf| {
            program::<BtfTracePoint>(ebpf, "probe_tp_btf")
                .is_some_and(|p| p.load("sched_process_exec", btf).is_ok())
        }),
        "lsm" => btf.is_some_and(|btf| {
            program::<Lsm>(ebpf, "probe_lsm").is_some_and(|p| p.load("file_open", btf).is_ok())
        }),
        "fentry" => btf.is_some_and(|btf| {
            program::<FEntry>(ebpf, "probe_fentry")
                .is_some_and(|p| p.load("do_unlinkat", btf).is_ok())
        }),
        _ => false,
    }
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Option<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program>,
{
    ebpf.program_mut(name).and_then(|p| p.try_into().ok())
}
