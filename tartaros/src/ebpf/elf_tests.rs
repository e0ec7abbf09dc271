use super::*;

const ALL_PROGRAMS: [&str; 14] = [
    "sock_create",
    "connect4",
    "connect6",
    "sendmsg4",
    "sendmsg6",
    "sock_ops",
    "unix_connect",
    "unix_sendmsg",
    "sched_process_exec",
    "sched_process_fork",
    "sched_process_exit",
    "sys_enter",
    "sys_exit",
    "probe_raw_tp",
];

const MAPS: [&str; 17] = [
    "ALLOW",
    "CONN_LIVE",
    "CONN_QUOTA",
    "EVENTS",
    "EVENTS_LOST",
    "FILE_LAYOUT",
    "OWNER_COOKIE",
    "OWNER_PORT",
    "PENDING",
    "RING",
    "RUNS",
    "RUN_LEVEL",
    "SYS_CALL",
    "TPROXY_COOKIE",
    "TPROXY_PORT",
    "UNIX_ALLOW",
    RODATA,
];

fn fds(name: &str) -> Option<RawFd> {
    MAPS.iter()
        .position(|m| *m == name)
        .map(|i| 100 + i as RawFd)
}

#[test]
fn every_program_relocates_with_its_maps_and_callees() {
    let object = super::super::EBPF_OBJECT;
    for program in ALL_PROGRAMS {
        let Relocated { insns, functions } = relocated(object, program, &fds).unwrap();
        assert!(insns.len().is_multiple_of(INSN), "{program}");
        // Every ld_imm64 that names a map carries one of our fds.
        for insn in insns.chunks_exact(INSN) {
            if insn[0] == OP_LD_IMM64 && matches!(insn[1] >> 4, 1 | 2) {
                let fd = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
                assert!(
                    (100..100 + MAPS.len() as i32).contains(&fd),
                    "{program}: fd {fd}"
                );
            }
        }
        // Every call lands on the first instruction of an appended
        // function whose code it is.
        let elf = Elf::parse(object).unwrap();
        let main_end = elf.function(program).unwrap().size / INSN;
        let text = elf.section_index(".text").unwrap();
        let text_functions: Vec<&[u8]> = elf
            .symbols()
            .unwrap()
            .into_iter()
            .filter(|f| f.kind == STT_FUNC && f.section == text)
            .map(|f| &elf.bytes(elf.section(text).unwrap()).unwrap()[f.value..f.value + f.size])
            .collect();
        let mut callbacks = 0;
        for (i, insn) in insns.chunks_exact(INSN).enumerate() {
            let call = insn[0] == OP_CALL && insn[1] >> 4 == BPF_PSEUDO_CALL;
            let callback = insn[0] == OP_LD_IMM64 && insn[1] >> 4 == BPF_PSEUDO_FUNC;
            callbacks += usize::from(callback);
            if call || callback {
                let imm = i64::from(i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]));
                let target = usize::try_from(i as i64 + 1 + imm).unwrap();
                assert!(target >= main_end, "{program}: call at {i} into itself");
                let at = &insns[target * INSN..];
                assert!(
                    text_functions.iter().any(|code| at.starts_with(code)),
                    "{program}: call at {i} lands on no function"
                );
                assert!(
                    functions.is_empty() || functions.contains(&(target as u32)),
                    "{program}: {target} missing from the function list"
                );
            }
        }
        // Only programs with callbacks need (and get) the list, which
        // starts with the program itself.
        assert_eq!(callbacks > 0, !functions.is_empty(), "{program}");
        if program.starts_with("unix_") {
            assert_eq!(callbacks, 2, "{program}: the bpf_loop callbacks");
        }
        if callbacks > 0 {
            assert_eq!(functions[0], 0, "{program}");
        }
    }
    assert!(relocated(object, "no_such_program", &fds).is_err());
    assert!(relocated(b"junk", "x", &fds).is_err());
    assert!(
        relocated(object, "connect4", &|_| None).is_err(),
        "a missing map is an error"
    );
}

#[test]
fn map_definitions_and_rodata_are_read() {
    let elf = Elf::parse(super::super::EBPF_OBJECT).unwrap();
    let maps = elf.map_defs().unwrap();
    let events = maps.iter().find(|m| m.name == "EVENTS").unwrap();
    // Declared as a hash (the loader makes it a hash of ring buffers).
    assert_eq!(
        (events.map_type, events.key_size, events.value_size),
        (1, 8, 4),
        "BPF_MAP_TYPE_HASH of u64 -> u32"
    );
    let allow = maps.iter().find(|m| m.name == "ALLOW").unwrap();
    assert_eq!(
        (allow.key_size, allow.value_size),
        (size_of::<tartaros_common::AllowKey>() as u32, 4)
    );
    assert!(elf.rodata().unwrap().is_some_and(|r| !r.is_empty()));
    let shared = elf
        .rodata_offset("RINGS_SHARED")
        .unwrap()
        .expect("RINGS_SHARED");
    let rodata = elf.rodata().unwrap().unwrap();
    assert_eq!(&rodata[shared..shared + 4], &[0; 4], "compiled as 0");
    // The syscall table the programs read is the one the tests check
    // (an object built from other sources would differ here).
    let table = elf
        .rodata_offset("SYSCALL_TABLE")
        .unwrap()
        .expect("SYSCALL_TABLE");
    let expected = tartaros_common::capture::call_shape::TABLE;
    let compiled: Vec<u32> = rodata[table..table + 4 * expected.len()]
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    assert_eq!(compiled, expected);
}
