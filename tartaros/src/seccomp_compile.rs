//! The seccomp filter's compilation and installation: the decided rules
//! (`seccomp.rs`) turned into classic BPF for the running architecture,
//! and the one syscall that installs it.

use std::collections::BTreeMap;
use std::io;

use seccompiler::{BpfProgram, TargetArch, sock_filter};

use super::emit::{Syscall, dispatch};
use super::prologue::prologue;
use super::{ArgCond, MAX_INSNS, SeccompError, SeccompOptions, rules};

/// The audit architecture and x32 bit for the running architecture, or
/// `None` where no filter can be built.
pub(super) fn arch() -> Option<(TargetArch, u32, Option<u32>)> {
    if cfg!(target_arch = "x86_64") {
        Some((TargetArch::x86_64, 0xc000_003e, Some(0x4000_0000)))
    } else if cfg!(target_arch = "aarch64") {
        Some((TargetArch::aarch64, 0xc000_00b7, None))
    } else {
        None
    }
}

/// The number of `name` on the running architecture.
pub(super) fn syscall_nr(name: &str) -> Option<i64> {
    // Each `SYS_x` constant answers for the name `x`.
    macro_rules! table {
        ($($id:ident)*) => {
            $(if name == &stringify!($id)[4..] {
                return Some(libc::$id);
            })*
        };
    }
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    table! {
        SYS_ptrace SYS_process_vm_readv SYS_process_vm_writev SYS_process_madvise
        SYS_pidfd_getfd SYS_bpf SYS_perf_event_open SYS_kexec_load SYS_kexec_file_load
        SYS_init_module SYS_finit_module SYS_delete_module SYS_mount SYS_umount2
        SYS_pivot_root SYS_move_mount SYS_open_tree SYS_fsopen SYS_fsmount SYS_fsconfig
        SYS_fspick SYS_mount_setattr SYS_setns SYS_unshare SYS_clone SYS_clone3 SYS_keyctl
        SYS_add_key SYS_request_key SYS_userfaultfd SYS_ioctl SYS_io_setup SYS_io_submit SYS_io_uring_setup
        SYS_io_uring_enter SYS_io_uring_register SYS_socket SYS_socketpair SYS_acct
        SYS_swapon SYS_swapoff SYS_reboot SYS_syslog SYS_quotactl SYS_quotactl_fd
        SYS_open_by_handle_at SYS_name_to_handle_at SYS_lookup_dcookie SYS_personality
        SYS_settimeofday SYS_clock_settime SYS_clock_adjtime SYS_adjtimex SYS_sethostname
        SYS_setdomainname SYS_chroot SYS_memfd_create SYS_prctl SYS_fanotify_init SYS_kcmp
        SYS_migrate_pages SYS_move_pages SYS_setrlimit SYS_prlimit64
        SYS_fchmod SYS_fchmodat SYS_openat SYS_mknodat SYS_openat2 SYS_fcntl SYS_fadvise64
        SYS_madvise
    }
    #[cfg(target_arch = "x86_64")]
    table! { SYS_iopl SYS_ioperm SYS_modify_ldt SYS_uselib SYS_chmod SYS_open SYS_creat SYS_mknod }
    match name {
        // Linux 6.15, one number on every architecture, not yet in `libc`.
        "open_tree_attr" if arch().is_some() => Some(467),
        // Linux 6.6, one number on every architecture; `libc` lacks it on aarch64.
        "fchmodat2" if arch().is_some() => Some(452),
        _ => None,
    }
}

/// Compile the filter for `opts` for the running architecture. Pure: no
/// syscalls, so the sandbox init can build it early and install it last.
pub fn build_program(opts: &SeccompOptions) -> Result<BpfProgram, SeccompError> {
    let [head, tree] = parts(opts)?;
    let program: BpfProgram = head.into_iter().chain(tree).collect();
    if program.len() > MAX_INSNS {
        return Err(SeccompError::BadLength(program.len()));
    }
    Ok(program)
}

/// The program's two parts: the prologue and the dispatch with the rules.
pub(super) fn parts(opts: &SeccompOptions) -> Result<[BpfProgram; 2], SeccompError> {
    let (_, audit_arch, x32_bit) =
        arch().ok_or(SeccompError::UnsupportedArch(std::env::consts::ARCH))?;
    let decided = rules(opts);
    // Per syscall number, its EPERM rules' conditions (none: always).
    let mut table: BTreeMap<u32, Vec<&[ArgCond]>> = BTreeMap::new();
    let mut early = Vec::new();
    for rule in &decided {
        let nr = syscall_nr(rule.syscall).ok_or(SeccompError::UnknownSyscall(rule.syscall))?;
        if rule.errno != libc::EPERM {
            if !rule.when.is_empty() {
                return Err(SeccompError::UnsupportedRule {
                    syscall: rule.syscall,
                    errno: rule.errno,
                });
            }
            early.push((nr, rule.errno));
            continue;
        }
        let nr = u32::try_from(nr).map_err(|_| SeccompError::UnknownSyscall(rule.syscall))?;
        table.entry(nr).or_default().push(&rule.when);
    }
    let syscalls: Vec<Syscall<'_>> = table
        .into_iter()
        .map(|(nr, rules)| Syscall { nr, rules })
        .collect();
    let tree = dispatch(&syscalls).ok_or(SeccompError::Dispatch(syscalls.len()))?;
    Ok([prologue(audit_arch, x32_bit, &early), tree])
}

// seccompiler's `sock_filter` is a `repr(C)` copy of the kernel's; `install`
// hands it to the kernel as `libc::sock_filter`.
const _: () = assert!(
    std::mem::size_of::<sock_filter>() == std::mem::size_of::<libc::sock_filter>()
        && std::mem::align_of::<sock_filter>() == std::mem::align_of::<libc::sock_filter>()
);

/// Install `program` on the calling thread. Only syscalls, no allocation: it
/// may run between `fork` and `execve`. The caller must have set
/// `no_new_privs` (refused otherwise, even as root: without it a setuid
/// binary could run with the filter's protection but raised privileges). No
/// TSYNC: the sandbox init is single-threaded and filters are inherited.
pub fn install(program: &BpfProgram) -> Result<(), SeccompError> {
    let len = match u16::try_from(program.len()) {
        Ok(n) if n > 0 && program.len() <= MAX_INSNS => n,
        _ => return Err(SeccompError::BadLength(program.len())),
    };
    // SAFETY: PR_GET_NO_NEW_PRIVS takes no pointers and only reads a flag.
    let nnp = unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) };
    if nnp < 0 {
        return Err(SeccompError::QueryNoNewPrivs(io::Error::last_os_error()));
    }
    if nnp != 1 {
        return Err(SeccompError::NoNewPrivs);
    }
    let fprog = libc::sock_fprog {
        len,
        // The kernel only reads the program (copy_from_user).
        filter: program.as_ptr().cast::<libc::sock_filter>().cast_mut(),
    };
    // SAFETY: `fprog` points to `len` initialized instructions of identical
    // layout (asserted above) that outlive the call; the kernel copies them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::c_ulong::from(libc::SECCOMP_SET_MODE_FILTER),
            0 as libc::c_ulong,
            &fprog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(SeccompError::Install(io::Error::last_os_error()));
    }
    Ok(())
}
