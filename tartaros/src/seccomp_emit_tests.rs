//! Our program gives the answer seccompiler's program gives for the same
//! rules (the library is the independent oracle), and decides a number no
//! rule names within a few instructions: both run by a classic BPF
//! interpreter over every number and the arguments the rules compare.

use std::collections::BTreeMap;

use super::compile::{arch, parts, syscall_nr};
use super::emit::{BPF_ALU_AND_K, Syscall, dispatch};
use super::prologue::prologue;
use super::prologue::{BPF_JMP_JA, BPF_JMP_JEQ_K, BPF_JMP_JGE_K, BPF_LD_W_ABS, BPF_RET_K};
use super::*;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, sock_filter,
};

const BPF_JMP_JGT_K: u16 = 0x25;
const BPF_JMP_JSET_K: u16 = 0x45;
const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;

fn opts(strict: bool, deny_unix: bool) -> SeccompOptions {
    SeccompOptions {
        strict,
        deny_unix,
        host_terminal: false,
    }
}

/// Runs `program` on one `struct seccomp_data`; returns the action and
/// the number of instructions executed.
fn run(program: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> (u32, usize) {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_le_bytes());
    data[4..8].copy_from_slice(&arch.to_le_bytes());
    for (i, arg) in args.iter().enumerate() {
        data[16 + 8 * i..24 + 8 * i].copy_from_slice(&arg.to_le_bytes());
    }
    let (mut a, mut pc, mut steps) = (0u32, 0usize, 0usize);
    loop {
        let insn = &program[pc];
        steps += 1;
        let (jt, jf) = (usize::from(insn.jt), usize::from(insn.jf));
        let branch = |taken: bool| pc + 1 + if taken { jt } else { jf };
        pc = match insn.code {
            BPF_LD_W_ABS => {
                let at = insn.k as usize;
                a = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
                pc + 1
            }
            BPF_ALU_AND_K => {
                a &= insn.k;
                pc + 1
            }
            BPF_JMP_JEQ_K => branch(a == insn.k),
            BPF_JMP_JGE_K => branch(a >= insn.k),
            BPF_JMP_JGT_K => branch(a > insn.k),
            BPF_JMP_JSET_K => branch(a & insn.k != 0),
            BPF_JMP_JA => pc + 1 + insn.k as usize,
            BPF_RET_K => return (insn.k, steps),
            other => panic!("instruction {other:#x} at {pc} is not interpreted here"),
        };
    }
}

/// The same rules compiled by seccompiler, behind the same prologue (as
/// the filter was built before `seccomp_emit.rs`).
fn oracle(opts: &SeccompOptions) -> BpfProgram {
    let (target, audit_arch, x32_bit) = arch().expect("supported test architecture");
    let mut table: BTreeMap<i64, Option<Vec<SeccompRule>>> = BTreeMap::new();
    let mut early = Vec::new();
    for rule in rules(opts) {
        let nr = syscall_nr(rule.syscall).expect("a number");
        if rule.errno != libc::EPERM {
            early.push((nr, rule.errno));
            continue;
        }
        let slot = table.entry(nr).or_insert_with(|| Some(Vec::new()));
        if rule.when.is_empty() {
            *slot = None;
        } else if let Some(list) = slot {
            let mut conds = Vec::new();
            for c in &rule.when {
                for (len, op, value) in condition(c) {
                    conds.push(SeccompCondition::new(c.index, len, op, value).unwrap());
                }
            }
            list.push(SeccompRule::new(conds).unwrap());
        }
    }
    let map = table
        .into_iter()
        .map(|(nr, r)| (nr, r.unwrap_or_default()))
        .collect();
    let filter = SeccompFilter::new(
        map,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        target,
    )
    .unwrap();
    let body: BpfProgram = filter.try_into().unwrap();
    let mut program = prologue(audit_arch, x32_bit, &early);
    program.extend(body);
    program
}

fn condition(c: &ArgCond) -> Vec<(SeccompCmpArgLen, SeccompCmpOp, u64)> {
    // Dword: the low 32 bits only (see `ArgTest`); a pointer all 64.
    let low = |op, value: u32| (SeccompCmpArgLen::Dword, op, u64::from(value));
    match &c.test {
        ArgTest::Eq(v) => vec![low(SeccompCmpOp::Eq, v.value)],
        ArgTest::Ne(v) => vec![low(SeccompCmpOp::Ne, v.value)],
        ArgTest::HasBits(v) => vec![low(SeccompCmpOp::MaskedEq(v.value.into()), v.value)],
        ArgTest::MaskedEq { mask, value } => {
            vec![low(SeccompCmpOp::MaskedEq((*mask).into()), value.value)]
        }
        ArgTest::NotIn(vs) => vs.iter().map(|v| low(SeccompCmpOp::Ne, v.value)).collect(),
        ArgTest::NotNull => vec![(SeccompCmpArgLen::Qword, SeccompCmpOp::Ne, 0)],
    }
}

#[test]
fn our_program_answers_as_seccompiler_s_and_allows_other_numbers_at_once() {
    let (_, audit_arch, x32_bit) = arch().expect("supported test architecture");
    for (strict, deny_unix) in [(false, false), (false, true), (true, false), (true, true)] {
        let options = opts(strict, deny_unix);
        let [head, _] = parts(&options).expect("parts");
        let ours = build_program(&options).expect("program");
        let reference = oracle(&options);
        assert!(ours.len() * 3 < reference.len() * 2, "{}", ours.len());
        // Every constant either program compares with, and neighbours.
        // A pointer's high word alone: not NULL.
        let mut constants: Vec<u64> = vec![0, u64::from(u32::MAX), 1 << 32, u64::MAX];
        for insn in ours.iter().chain(&reference) {
            if matches!(
                insn.code,
                BPF_JMP_JEQ_K | BPF_JMP_JGE_K | BPF_JMP_JGT_K | BPF_JMP_JSET_K | BPF_ALU_AND_K
            ) {
                constants.push(u64::from(insn.k));
            }
        }
        constants.sort_unstable();
        constants.dedup();
        let mut values: Vec<u64> = constants
            .iter()
            .flat_map(|k| [*k, k | 1 << 32, k.wrapping_add(1)])
            .collect();
        values.sort_unstable();
        values.dedup();
        // Every number an EPERM rule names, from the rules themselves.
        let mut named: Vec<u32> = rules(&options)
            .iter()
            .filter(|r| r.errno == libc::EPERM)
            .map(|r| syscall_nr(r.syscall).expect("a number") as u32)
            .collect();
        named.sort_unstable();
        named.dedup();
        for nr in 0..1024u32 {
            let same = |args: [u64; 6]| {
                assert_eq!(
                    run(&ours, audit_arch, nr, args).0,
                    run(&reference, audit_arch, nr, args).0,
                    "nr {nr}, args {args:x?}"
                );
            };
            same([0; 6]);
            if !named.contains(&nr) {
                // What the kernel's cache walks at install.
                let steps = run(&ours, audit_arch, nr, [0; 6]).1;
                assert!(steps <= head.len() + 12, "nr {nr}: {steps} instructions");
                continue;
            }
            for i in 0..6 {
                for v in &values {
                    let mut args = [0; 6];
                    args[i] = *v;
                    same(args);
                }
            }
            // Two conditions of one rule (socket's domain and type,
            // prlimit64's resource and new limit); once, for the strictest
            // options, which have every rule.
            if !(strict && deny_unix) {
                continue;
            }
            for (i, j) in [(0, 1), (0, 2), (1, 2)] {
                for v in &constants {
                    for w in &constants {
                        let mut args = [0; 6];
                        args[i] = *v;
                        args[j] = *w;
                        same(args);
                    }
                }
            }
        }
        // Other architectures and the x32 numbers stay refused.
        for nr in [0, 59, 0x4000_0000, 0x4000_0001, u32::MAX] {
            assert_eq!(run(&ours, 0x4000_0003, nr, [0; 6]).0, EPERM);
        }
        if let Some(bit) = x32_bit {
            assert_eq!(run(&ours, audit_arch, bit | 1, [0; 6]).0, EPERM);
        }
    }
}

#[test]
fn the_dispatch_finds_every_number_and_reaches_far_subtrees() {
    // Rules long enough that a left subtree is beyond an 8-bit jump.
    let long: Vec<ArgCond> = (0..40)
        .map(|i| ArgCond {
            index: 0,
            name: "x",
            test: ArgTest::Ne(Named {
                name: "v",
                value: i,
            }),
        })
        .collect();
    for n in [1u32, 2, 4, 5, 9, 64, 200] {
        for conditional in [false, true] {
            let syscalls: Vec<Syscall<'_>> = (0..n)
                .map(|i| Syscall {
                    nr: i * 3 + 1,
                    rules: if conditional {
                        vec![&long[..]]
                    } else {
                        vec![&[]]
                    },
                })
                .collect();
            let mut program = vec![sock_filter {
                code: BPF_LD_W_ABS,
                jt: 0,
                jf: 0,
                k: 0,
            }];
            program.extend(dispatch(&syscalls).expect("dispatch"));
            for nr in 0..(n * 3 + 4) {
                let named = nr % 3 == 1 && nr < n * 3;
                // An argument none of the 40 values: the long rule holds.
                let (ret, _) = run(&program, 0, nr, [99, 0, 0, 0, 0, 0]);
                let expected = if named {
                    EPERM
                } else {
                    libc::SECCOMP_RET_ALLOW
                };
                assert_eq!(ret, expected, "{n} numbers, nr {nr}");
                if named && conditional {
                    let (ret, _) = run(&program, 0, nr, [7, 0, 0, 0, 0, 0]);
                    assert_eq!(ret, libc::SECCOMP_RET_ALLOW, "{n} numbers, nr {nr}");
                }
            }
        }
    }
}
