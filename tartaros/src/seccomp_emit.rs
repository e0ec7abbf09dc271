//! The seccomp program after its prologue: a search tree over the numbers
//! the rules name, each leaf holding its syscalls' rule blocks, in classic
//! BPF. Every other number is allowed within about ten instructions.
//!
//! Why not seccompiler's compiler (which stays, as the independent oracle
//! of `seccomp_emit_tests.rs`): its program is one chain of ~670
//! instructions that every syscall number walks, and the kernel walks it
//! for each of the ~460 numbers when the filter is installed
//! (`seccomp_cache_prepare`, which finds the numbers it may always allow),
//! then JIT-compiles every instruction: 0.29 ms of every agent's start,
//! between fork and exec (the uprobe medians of 30 root runs; a standalone
//! filter of 672 instructions walked in full costs 836 µs per install, the
//! same behind an early jump 102 µs). The rules are few and simple (a
//! conjunction of tests of one 32-bit argument word, or a pointer against
//! NULL), so their code is short: see docs/seccomp.md for the figures.

use seccompiler::sock_filter;

use super::prologue::{BPF_JMP_JA, BPF_JMP_JEQ_K, BPF_JMP_JGE_K, BPF_LD_W_ABS, BPF_RET_K};
use super::prologue::{jump, ret_errno, stmt};
use super::{ArgCond, ArgTest};

pub(super) const BPF_ALU_AND_K: u16 = 0x54;
/// `struct seccomp_data.args`: six 64-bit words after nr, arch and ip.
const DATA_ARGS: u32 = 16;
/// At most this many numbers are compared one by one at a leaf.
const LEAF: usize = 4;
/// Classic BPF conditional jumps hold 8-bit offsets.
const MAX_JUMP: usize = u8::MAX as usize;

// The low word of an argument is the first in memory on the architectures
// `compile::arch` supports.
const _: () = assert!(cfg!(target_endian = "little"));

/// One syscall's rules: it fails with EPERM when every condition of any
/// one rule holds; a rule without conditions always holds.
pub(super) struct Syscall<'a> {
    pub nr: u32,
    pub rules: Vec<&'a [ArgCond]>,
}

/// The dispatch, to follow the prologue (which leaves the syscall number
/// in the accumulator): `syscalls` sorted by number, without repeats.
/// `None` when a rule is too long for a conditional jump over it.
pub(super) fn dispatch(syscalls: &[Syscall<'_>]) -> Option<Vec<sock_filter>> {
    if syscalls.len() <= LEAF {
        let mut out = Vec::new();
        for syscall in syscalls {
            let block = block(&syscall.rules)?;
            // A different number skips the block; the block always returns.
            out.push(jump(BPF_JMP_JEQ_K, syscall.nr, 0, jump_len(block.len())?));
            out.extend(block);
        }
        out.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
        return Some(out);
    }
    let mid = syscalls.len() / 2;
    let left = dispatch(&syscalls[..mid])?;
    let right = dispatch(&syscalls[mid..])?;
    let at_least = syscalls[mid].nr;
    let mut out = Vec::with_capacity(left.len() + right.len() + 2);
    match jump_len(left.len()) {
        Some(skip) => out.push(jump(BPF_JMP_JGE_K, at_least, skip, 0)),
        None => {
            // Too far for the 8-bit offset: through an unconditional jump.
            out.push(jump(BPF_JMP_JGE_K, at_least, 0, 1));
            out.push(stmt(BPF_JMP_JA, u32::try_from(left.len()).ok()?));
        }
    }
    out.extend(left);
    out.extend(right);
    Some(out)
}

fn jump_len(len: usize) -> Option<u8> {
    u8::try_from(len).ok().filter(|_| len <= MAX_JUMP)
}

/// A syscall's rules, each falling through to the next when one of its
/// conditions fails, then ALLOW.
fn block(rules: &[&[ArgCond]]) -> Option<Vec<sock_filter>> {
    let mut out = Vec::new();
    for rule in rules {
        if rule.is_empty() {
            out.push(ret_errno(libc::EPERM));
            return Some(out);
        }
        out.extend(rule_code(rule)?);
    }
    out.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
    Some(out)
}

/// Which branch of a conditional jump leaves the rule.
enum Fail {
    OnTrue,
    OnFalse,
}

/// One rule: its conditions, each jumping past the rule when it fails,
/// then EPERM.
fn rule_code(rule: &[ArgCond]) -> Option<Vec<sock_filter>> {
    let mut out = Vec::new();
    let mut fails = Vec::new();
    let mut fail_if = |out: &mut Vec<sock_filter>, value: u32, fail: Fail| {
        fails.push((out.len(), fail));
        out.push(jump(BPF_JMP_JEQ_K, value, 0, 0));
    };
    for cond in rule {
        let low = DATA_ARGS + 8 * u32::from(cond.index);
        out.push(stmt(BPF_LD_W_ABS, low));
        match &cond.test {
            ArgTest::Eq(v) => fail_if(&mut out, v.value, Fail::OnFalse),
            ArgTest::Ne(v) => fail_if(&mut out, v.value, Fail::OnTrue),
            ArgTest::HasBits(v) => {
                out.push(stmt(BPF_ALU_AND_K, v.value));
                fail_if(&mut out, v.value, Fail::OnFalse);
            }
            ArgTest::MaskedEq { mask, value } => {
                out.push(stmt(BPF_ALU_AND_K, *mask));
                fail_if(&mut out, value.value, Fail::OnFalse);
            }
            ArgTest::NotIn(values) => {
                for v in values {
                    fail_if(&mut out, v.value, Fail::OnTrue);
                }
            }
            ArgTest::NotNull => {
                // A low word other than 0 holds: skip the high word's test.
                out.push(jump(BPF_JMP_JEQ_K, 0, 0, 2));
                out.push(stmt(BPF_LD_W_ABS, low + 4));
                fail_if(&mut out, 0, Fail::OnTrue);
            }
        }
    }
    out.push(ret_errno(libc::EPERM));
    let len = out.len();
    for (at, fail) in fails {
        // To the first instruction after the rule.
        let skip = jump_len(len - at - 1)?;
        match fail {
            Fail::OnTrue => out[at].jt = skip,
            Fail::OnFalse => out[at].jf = skip,
        }
    }
    Some(out)
}
