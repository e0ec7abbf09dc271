//! The bpf(2) calls that load the object: create its maps, load its
//! programs, attach them with links. No aya loader on this path (see
//! `elf.rs` for why); aya's typed maps wrap the descriptors made here.
//!
//! Every program is loaded with the expected attach type the kernel checks
//! at load time, which also covers the unix hooks aya 0.14 does not know
//! (`BPF_CGROUP_UNIX_CONNECT` / `_SENDMSG`, Linux 6.7), and `tp_btf`
//! programs get their target's BTF id from our own quick pass (`kbtf`).

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `BPF_PROG_TYPE_CGROUP_SOCK` (Linux 4.10).
pub const PROG_TYPE_CGROUP_SOCK: u32 = 9;
/// `BPF_PROG_TYPE_SOCK_OPS` (Linux 4.13).
pub const PROG_TYPE_SOCK_OPS: u32 = 13;
/// `BPF_PROG_TYPE_CGROUP_SOCK_ADDR` (Linux 4.17).
pub const PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;
/// `BPF_PROG_TYPE_TRACING` (Linux 5.5 for `tp_btf`).
pub const PROG_TYPE_TRACING: u32 = 26;
/// `BPF_CGROUP_INET_SOCK_CREATE`.
pub const ATTACH_INET_SOCK_CREATE: u32 = 2;
/// `BPF_CGROUP_SOCK_OPS`.
pub const ATTACH_SOCK_OPS: u32 = 3;
/// `BPF_CGROUP_INET4_CONNECT`.
pub const ATTACH_INET4_CONNECT: u32 = 10;
/// `BPF_CGROUP_INET6_CONNECT`.
pub const ATTACH_INET6_CONNECT: u32 = 11;
/// `BPF_CGROUP_UDP4_SENDMSG`.
pub const ATTACH_UDP4_SENDMSG: u32 = 14;
/// `BPF_CGROUP_UDP6_SENDMSG`.
pub const ATTACH_UDP6_SENDMSG: u32 = 15;
/// `BPF_TRACE_RAW_TP`: the attach type of `tp_btf` programs.
pub const ATTACH_TRACE_RAW_TP: u32 = 23;
/// `BPF_CGROUP_UNIX_CONNECT` (Linux 6.7).
pub const ATTACH_UNIX_CONNECT: u32 = 49;
/// `BPF_CGROUP_UNIX_SENDMSG` (Linux 6.7).
pub const ATTACH_UNIX_SENDMSG: u32 = 50;
/// `BPF_F_RDONLY_PROG`: programs may only read the map.
pub const MAP_F_RDONLY_PROG: u32 = 1 << 7;
/// `BPF_MAP_TYPE_TASK_STORAGE` (Linux 5.11 for tracing programs).
pub const MAP_TYPE_TASK_STORAGE: u32 = 29;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_BTF_LOAD: libc::c_long = 18;
const BPF_MAP_FREEZE: libc::c_long = 22;
const BPF_LINK_CREATE: libc::c_long = 28;
/// Size of the `union bpf_attr` buffer handed to the kernel (larger than
/// every member used; the kernel requires the tail to be zero).
pub(super) const ATTR_BYTES: usize = 144;

/// Errors of this module, wrapped by `EbpfError`.
#[derive(Debug, thiserror::Error)]
pub enum RawError {
    #[error("failed to parse the eBPF object: {0}")]
    Elf(String),
    #[error("failed to relocate {program}: {reason}")]
    Relocation { program: String, reason: String },
    #[error("failed to load {program} into the kernel: {source}{log}")]
    Load {
        program: String,
        source: std::io::Error,
        log: String,
    },
    #[error("failed to attach {program}: {source}")]
    Link {
        program: String,
        source: std::io::Error,
    },
    #[error("failed to use the eBPF map {map}: {source}")]
    Wrap {
        map: String,
        source: Box<aya::maps::MapError>,
    },
    #[error("failed to load the tracing programs: their loading thread panicked")]
    Panicked,
    #[error(
        "failed to load {program}: it calls {kfunc}, which this kernel does not have (Linux 6.7+ has it); pass --deny-unix"
    )]
    NoKfunc {
        program: String,
        kfunc: &'static str,
    },
    #[error("failed to create the eBPF map {map}: {source}")]
    Map { map: String, source: std::io::Error },
}

pub(super) fn bpf(cmd: libc::c_long, attr: &mut [u8; ATTR_BYTES]) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a zero-initialised `union bpf_attr` of ATTR_BYTES
    // bytes that outlives the call; the kernel reads (and for some
    // commands writes) at most that many bytes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            ATTR_BYTES as libc::c_uint,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

pub(super) fn put(attr: &mut [u8; ATTR_BYTES], off: usize, bytes: &[u8]) {
    attr[off..off + bytes.len()].copy_from_slice(bytes);
}

/// Takes ownership of a descriptor a successful bpf(2) call returned.
pub(super) fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

/// What the kernel needs to know about a program besides its code.
#[derive(Clone, Copy, Debug)]
pub struct ProgSpec<'a> {
    pub name: &'a str,
    pub prog_type: u32,
    pub expected_attach_type: u32,
    /// BTF id of the attach target (`tp_btf`), 0 otherwise.
    pub attach_btf_id: u32,
}

/// `BPF_PROG_LOAD`. `functions`: where each function starts, for a
/// program with callbacks (see `elf::Relocated`), else empty.
pub fn load(spec: ProgSpec<'_>, insns: &[u8], functions: &[u32]) -> Result<OwnedFd, RawError> {
    load_logged(spec, insns, functions, None)
}

/// [`load`] with the verifier's statistics (`BPF_LOG_STATS`: "processed N
/// insns ..."), for tests that hold the verification cost down.
#[cfg(test)]
pub fn verifier_stats(
    spec: ProgSpec<'_>,
    insns: &[u8],
    functions: &[u32],
) -> Result<String, RawError> {
    let mut buf = vec![0u8; 4096];
    load_logged(spec, insns, functions, Some(&mut buf))?;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(0);
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

fn load_logged(
    spec: ProgSpec<'_>,
    insns: &[u8],
    functions: &[u32],
    stats: Option<&mut Vec<u8>>,
) -> Result<OwnedFd, RawError> {
    const LICENSE: &CStr = c"Dual MIT/GPL";
    let func_info = if functions.is_empty() {
        None
    } else {
        let btf = load_func_btf().map_err(|source| RawError::Load {
            program: spec.name.to_owned(),
            source,
            log: "; loading its function BTF".into(),
        })?;
        // `struct bpf_func_info`: first instruction, BTF type id.
        let records: Vec<u8> = functions
            .iter()
            .flat_map(|&first| [first, FUNC_TYPE_ID])
            .flat_map(u32::to_le_bytes)
            .collect();
        Some((btf, records))
    };
    // `BPF_LOG_LEVEL1`, `BPF_LOG_STATS`.
    let attempt = |log: Option<&mut Vec<u8>>, level: u32| {
        let mut attr = [0u8; ATTR_BYTES];
        put(&mut attr, 0, &spec.prog_type.to_le_bytes());
        put(&mut attr, 4, &((insns.len() / 8) as u32).to_le_bytes());
        put(&mut attr, 8, &(insns.as_ptr() as u64).to_le_bytes());
        put(&mut attr, 16, &(LICENSE.as_ptr() as u64).to_le_bytes());
        if let Some(buf) = log {
            put(&mut attr, 24, &level.to_le_bytes());
            put(&mut attr, 28, &(buf.len() as u32).to_le_bytes());
            put(&mut attr, 32, &(buf.as_mut_ptr() as u64).to_le_bytes());
        }
        let short: Vec<u8> = spec.name.bytes().take(15).collect();
        put(&mut attr, 48, &short);
        put(&mut attr, 68, &spec.expected_attach_type.to_le_bytes());
        if let Some((btf, records)) = &func_info {
            put(&mut attr, 72, &(btf.as_raw_fd() as u32).to_le_bytes());
            put(&mut attr, 76, &8u32.to_le_bytes());
            put(&mut attr, 80, &(records.as_ptr() as u64).to_le_bytes());
            put(&mut attr, 88, &((records.len() / 8) as u32).to_le_bytes());
        }
        put(&mut attr, 108, &spec.attach_btf_id.to_le_bytes());
        bpf(BPF_PROG_LOAD, &mut attr).map(owned)
    };
    attempt(stats, 4).map_err(|source| {
        // Load again with the verifier log to say why.
        let mut buf = vec![0u8; 256 * 1024];
        let _ = attempt(Some(&mut buf), 1);
        let end = buf.iter().position(|&b| b == 0).unwrap_or(0);
        let text = String::from_utf8_lossy(&buf[..end]);
        let tail: Vec<&str> = text.lines().rev().take(12).collect();
        let log = if tail.is_empty() {
            String::new()
        } else {
            let lines: Vec<&str> = tail.into_iter().rev().collect();
            format!("; verifier: {}", lines.join(" | "))
        };
        RawError::Load {
            program: spec.name.to_owned(),
            source,
            log,
        }
    })
}

/// `BPF_PSEUDO_KFUNC_CALL` in a call's source register: its `imm` is the
/// BTF id of a kernel function in vmlinux (Linux 5.13).
const PSEUDO_KFUNC_CALL: u8 = 2;
/// `BPF_JMP | BPF_CALL`.
const OP_CALL: u8 = 0x85;

/// Turns every call of helper number `placeholder` in `insns` into a call
/// of the kernel function with BTF id `btf_id`, and returns how many there
/// were. Our eBPF toolchain cannot name a kfunc, so the programs call a
/// helper number no kernel has (`tartaros_common::capture::KFUNC_*`),
/// and a program whose placeholder is left fails to load.
pub fn link_kfunc(insns: &mut [u8], placeholder: u32, btf_id: u32) -> usize {
    let mut linked = 0;
    for insn in insns.chunks_exact_mut(8) {
        let imm = u32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
        // A helper call has source register 0.
        if insn[0] == OP_CALL && insn[1] >> 4 == 0 && imm == placeholder {
            insn[1] = PSEUDO_KFUNC_CALL << 4;
            insn[2..4].copy_from_slice(&0u16.to_le_bytes());
            insn[4..8].copy_from_slice(&btf_id.to_le_bytes());
            linked += 1;
        }
    }
    linked
}

/// The one function type every `func_info` record names.
const FUNC_TYPE_ID: u32 = 2;

/// Loads (`BPF_BTF_LOAD`, Linux 4.18; `func_info` 5.0) the smallest BTF
/// that describes functions: `void f(void)`, static, which suits every
/// function of ours. The kernel only checks that each record names a
/// `FUNC`, and wants callbacks static; our programs need nothing else from
/// BTF, and the object's own would need aya's fixups to load.
fn load_func_btf() -> std::io::Result<OwnedFd> {
    const BTF_KIND_FUNC: u32 = 12;
    const BTF_KIND_FUNC_PROTO: u32 = 13;
    // [1] FUNC_PROTO returning void, no arguments; [2] FUNC "f" of type 1,
    // linkage static (0 in `vlen`).
    let types = [0, BTF_KIND_FUNC_PROTO << 24, 0, 1, BTF_KIND_FUNC << 24, 1];
    load_btf(&types, b"\0f\0")
}

/// Loads the smallest BTF a task-storage map needs: the kernel checks
/// that its key is a 32-bit `INT` and that its value type is as big as
/// the value. [1] `int`; [2] `char`; [3] `char[value_size]`.
fn load_storage_btf(value_size: u32) -> std::io::Result<OwnedFd> {
    const BTF_KIND_INT: u32 = 1;
    const BTF_KIND_ARRAY: u32 = 3;
    const INT_SIGNED: u32 = 1 << 24;
    #[rustfmt::skip]
    let types = [
        1, BTF_KIND_INT << 24, 4, INT_SIGNED | 32,
        5, BTF_KIND_INT << 24, 1, 8,
        0, BTF_KIND_ARRAY << 24, 0, 2, 1, value_size,
    ];
    load_btf(&types, b"\0int\0char\0")
}

/// `BPF_BTF_LOAD` of `types` (raw `struct btf_type` words) and `strings`.
fn load_btf(types: &[u32], strings: &[u8]) -> std::io::Result<OwnedFd> {
    let type_len = (types.len() * 4) as u32;
    let mut blob = Vec::with_capacity(24 + type_len as usize + strings.len());
    // `struct btf_header`: magic, version 1, flags 0, its own length,
    // then type and string sections (offsets after the header).
    blob.extend_from_slice(&0xeb9f_u16.to_le_bytes());
    blob.extend_from_slice(&[1, 0]);
    for word in [24, 0, type_len, type_len, strings.len() as u32] {
        blob.extend_from_slice(&u32::to_le_bytes(word));
    }
    blob.extend(types.iter().flat_map(|t| t.to_le_bytes()));
    blob.extend_from_slice(strings);
    let mut attr = [0u8; ATTR_BYTES];
    put(&mut attr, 0, &(blob.as_ptr() as u64).to_le_bytes());
    put(&mut attr, 16, &(blob.len() as u32).to_le_bytes());
    bpf(BPF_BTF_LOAD, &mut attr).map(owned)
}

/// `BPF_LINK_CREATE` of `prog` on the cgroup `cgroup` (Linux 5.7). The
/// program stays attached as long as the returned fd is open.
pub fn link_cgroup(
    program: &str,
    prog: &OwnedFd,
    cgroup: BorrowedFd<'_>,
    attach_type: u32,
) -> Result<OwnedFd, RawError> {
    let mut attr = [0u8; ATTR_BYTES];
    put(&mut attr, 0, &(prog.as_raw_fd() as u32).to_le_bytes());
    put(&mut attr, 4, &(cgroup.as_raw_fd() as u32).to_le_bytes());
    put(&mut attr, 8, &attach_type.to_le_bytes());
    bpf(BPF_LINK_CREATE, &mut attr)
        .map(owned)
        .map_err(|source| RawError::Link {
            program: program.to_owned(),
            source,
        })
}

/// `BPF_RAW_TRACEPOINT_OPEN` of a `tp_btf` program: attaches it to the
/// BTF target it was loaded for (no name), with `cookie` as the link's BPF
/// cookie when it is not 0 (Linux 6.10; an older kernel refuses the
/// nonzero field). The link lives as long as the returned fd.
pub fn open_tracepoint(program: &str, prog: &OwnedFd, cookie: u64) -> Result<OwnedFd, RawError> {
    // struct { u64 name; u32 prog_fd; u32 :32; u64 cookie; } raw_tracepoint
    let mut attr = [0u8; ATTR_BYTES];
    put(&mut attr, 8, &(prog.as_raw_fd() as u32).to_le_bytes());
    put(&mut attr, 16, &cookie.to_le_bytes());
    bpf(BPF_RAW_TRACEPOINT_OPEN, &mut attr)
        .map(owned)
        .map_err(|source| RawError::Link {
            program: program.to_owned(),
            source,
        })
}

/// The kernel's tag (hash of the instructions) of a loaded program, hex.
pub fn tag(prog: BorrowedFd<'_>) -> Option<String> {
    // struct bpf_prog_info: u32 type, u32 id, u8 tag[8], ...
    let mut info = [0u8; 16];
    obj_info(prog, &mut info).ok()?;
    Some(hex::encode(&info[8..16]))
}

/// `BPF_OBJ_GET_INFO_BY_FD`: the kernel's `struct bpf_*_info` of `fd`'s
/// object into `info` (its first `info.len()` bytes; the kernel fills in
/// what it has and may follow pointers the caller put in `info`).
pub(super) fn obj_info(fd: BorrowedFd<'_>, info: &mut [u8]) -> std::io::Result<()> {
    let mut attr = [0u8; ATTR_BYTES];
    put(&mut attr, 0, &(fd.as_raw_fd() as u32).to_le_bytes());
    put(&mut attr, 4, &(info.len() as u32).to_le_bytes());
    put(&mut attr, 8, &(info.as_mut_ptr() as u64).to_le_bytes());
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(drop)
}

/// `struct bpf_prog_info` up to `recursion_misses` (Linux 5.12) and its
/// offsets there.
const PROG_INFO_BYTES: usize = 216;
const PROG_INFO_ID: usize = 4;
const PROG_INFO_RECURSION_MISSES: usize = 208;

fn prog_info(prog: BorrowedFd<'_>) -> Option<[u8; PROG_INFO_BYTES]> {
    let mut info = [0u8; PROG_INFO_BYTES];
    obj_info(prog, &mut info).ok()?;
    Some(info)
}

/// The program's id, for a process that opens it again by id.
pub fn prog_id(prog: BorrowedFd<'_>) -> Option<u32> {
    let info = prog_info(prog)?;
    Some(u32::from_le_bytes(
        info[PROG_INFO_ID..PROG_INFO_ID + 4].try_into().ok()?,
    ))
}

/// How often the kernel skipped the (tracing) program because it was
/// already running on that CPU (its recursion guard): each skip is an
/// event no program saw.
pub fn recursion_misses(prog: BorrowedFd<'_>) -> Option<u64> {
    let info = prog_info(prog)?;
    let at = PROG_INFO_RECURSION_MISSES;
    Some(u64::from_le_bytes(info[at..at + 8].try_into().ok()?))
}

/// `BPF_PROG_GET_FD_BY_ID` (needs CAP_SYS_ADMIN).
pub fn prog_by_id(id: u32) -> Option<OwnedFd> {
    let mut attr = [0u8; ATTR_BYTES];
    put(&mut attr, 0, &id.to_le_bytes());
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut attr).ok()?;
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).ok()?) })
}

/// A map to create.
#[derive(Clone, Copy, Debug)]
pub struct MapSpec<'a> {
    pub name: &'a str,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
    /// For a map of maps: a map like the ones it will hold.
    pub inner_map: Option<BorrowedFd<'a>>,
}

/// `BPF_MAP_CREATE`; a task-storage map gets the BTF it must have.
pub fn create_map(spec: MapSpec<'_>) -> Result<OwnedFd, RawError> {
    let fail = |source| RawError::Map {
        map: spec.name.to_owned(),
        source,
    };
    let mut attr = [0u8; ATTR_BYTES];
    // Held until the map exists (the map keeps its own reference).
    let btf = if spec.map_type == MAP_TYPE_TASK_STORAGE {
        Some(load_storage_btf(spec.value_size).map_err(fail)?)
    } else {
        None
    };
    if let Some(btf) = &btf {
        put(&mut attr, 48, &(btf.as_raw_fd() as u32).to_le_bytes());
        put(&mut attr, 52, &1u32.to_le_bytes());
        put(&mut attr, 56, &3u32.to_le_bytes());
    }
    put(&mut attr, 0, &spec.map_type.to_le_bytes());
    put(&mut attr, 4, &spec.key_size.to_le_bytes());
    put(&mut attr, 8, &spec.value_size.to_le_bytes());
    put(&mut attr, 12, &spec.max_entries.to_le_bytes());
    put(&mut attr, 16, &spec.flags.to_le_bytes());
    if let Some(inner) = spec.inner_map {
        put(&mut attr, 20, &(inner.as_raw_fd() as u32).to_le_bytes());
    }
    // The kernel accepts [A-Za-z0-9_.] in 15 bytes; names are for bpftool.
    let short: Vec<u8> = spec
        .name
        .bytes()
        .filter(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.')
        .take(15)
        .collect();
    put(&mut attr, 28, &short);
    bpf(BPF_MAP_CREATE, &mut attr).map(owned).map_err(fail)
}

/// Stores `value` at index 0 of the array `map` and freezes the map, so
/// user space cannot change it either (the `.rodata` contract).
pub fn fill_and_freeze(name: &str, map: BorrowedFd<'_>, value: &[u8]) -> Result<(), RawError> {
    let key = 0u32;
    let mut attr = [0u8; ATTR_BYTES];
    put(&mut attr, 0, &(map.as_raw_fd() as u32).to_le_bytes());
    put(
        &mut attr,
        8,
        &(std::ptr::from_ref(&key) as u64).to_le_bytes(),
    );
    put(&mut attr, 16, &(value.as_ptr() as u64).to_le_bytes());
    let fail = |source| RawError::Map {
        map: name.to_owned(),
        source,
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map_err(fail)?;
    let mut attr = [0u8; ATTR_BYTES];
    put(&mut attr, 0, &(map.as_raw_fd() as u32).to_le_bytes());
    bpf(BPF_MAP_FREEZE, &mut attr).map_err(fail)?;
    Ok(())
}
