//! The head of the seccomp program: the architecture and x32 checks and
//! the unconditional non-EPERM answers, in classic BPF.

use seccompiler::sock_filter;

// Classic BPF opcodes and `struct seccomp_data` offsets (linux/filter.h,
// linux/seccomp.h).
pub(super) const BPF_LD_W_ABS: u16 = 0x20;
pub(super) const BPF_JMP_JEQ_K: u16 = 0x15;
pub(super) const BPF_JMP_JGE_K: u16 = 0x35;
pub(super) const BPF_JMP_JA: u16 = 0x05;
pub(super) const BPF_RET_K: u16 = 0x06;
const DATA_NR: u32 = 0;
pub(super) const DATA_ARCH: u32 = 4;

pub(super) fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

pub(super) fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

pub(super) fn ret_errno(errno: i32) -> sock_filter {
    // Errno values are small positive numbers; the kernel keeps 16 bits.
    stmt(
        BPF_RET_K,
        libc::SECCOMP_RET_ERRNO | (errno as u32 & libc::SECCOMP_RET_DATA),
    )
}

/// The head of the program:
/// 1. any other audit arch (32-bit compat entry, e.g. `int 0x80`) -> EPERM
///    (the library's filters kill the process there);
/// 2. on x86_64 any number >= the x32 bit (x32 ABI, and bogus numbers) -> EPERM;
/// 3. the unconditional non-EPERM rules (`clone3` -> ENOSYS).
///
/// It leaves the syscall number in the accumulator for the dispatch
/// (`seccomp_emit.rs`).
pub(super) fn prologue(
    audit_arch: u32,
    x32_bit: Option<u32>,
    early: &[(i64, i32)],
) -> Vec<sock_filter> {
    let mut p = vec![
        stmt(BPF_LD_W_ABS, DATA_ARCH),
        jump(BPF_JMP_JEQ_K, audit_arch, 1, 0),
        ret_errno(libc::EPERM),
        stmt(BPF_LD_W_ABS, DATA_NR),
    ];
    if let Some(bit) = x32_bit {
        p.push(jump(BPF_JMP_JGE_K, bit, 0, 1));
        p.push(ret_errno(libc::EPERM));
    }
    for &(nr, errno) in early {
        // Syscall numbers are small and positive.
        p.push(jump(BPF_JMP_JEQ_K, nr as u32, 0, 1));
        p.push(ret_errno(errno));
    }
    p
}
