//! Loads and attaches programs without aya, straight from the ELF object.
//!
//! - The unix-socket policy programs: aya 0.14 knows neither
//!   `cgroup/connect_unix` nor `cgroup/sendmsg_unix` (Linux 6.7): it cannot
//!   parse such section names and its `CgroupSockAddrAttachType` has no unix
//!   variants, while the kernel requires the expected attach type at load
//!   time. They sit in `cgroup/connect4/<name>` sections (aya parses them as
//!   connect4 programs and never loads them).
//! - The capture programs: loading `tp_btf` programs through aya needs
//!   aya's full parse of the kernel BTF (~17 ms, on top of the ~20 ms its
//!   loader spends on it); here the attach target's BTF id comes from our
//!   own quick pass (`kbtf`), which start-up needs anyway for the offsets.
//!
//! For a function symbol: take its instructions, patch the map references
//! (`R_BPF_64_64` relocations against symbols of the `maps` section) with
//! the file descriptors of the maps aya created, `BPF_PROG_LOAD`, then
//! attach with `BPF_LINK_CREATE` (cgroups) or `BPF_RAW_TRACEPOINT_OPEN`
//! (tracepoints). Anything else (calls into `.text`, `.rodata`) is refused:
//! these programs are written not to need it.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `BPF_PROG_TYPE_RAW_TRACEPOINT`.
pub const PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
/// `BPF_PROG_TYPE_CGROUP_SOCK_ADDR`.
pub const PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;
/// `BPF_PROG_TYPE_TRACING`.
pub const PROG_TYPE_TRACING: u32 = 26;
/// `BPF_TRACE_RAW_TP`: the attach type of `tp_btf` programs.
pub const ATTACH_TRACE_RAW_TP: u32 = 23;
/// `BPF_CGROUP_UNIX_CONNECT` (Linux 6.7).
pub const ATTACH_UNIX_CONNECT: u32 = 49;
/// `BPF_CGROUP_UNIX_SENDMSG` (Linux 6.7).
pub const ATTACH_UNIX_SENDMSG: u32 = 50;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const SHT_SYMTAB: u32 = 2;
const SHT_REL: u32 = 9;
const STT_FUNC: u8 = 2;
const R_BPF_64_64: u32 = 1;
/// Size of the `union bpf_attr` buffer handed to the kernel (larger than
/// every member used; the kernel requires the tail to be zero).
const ATTR_BYTES: usize = 144;

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
}

struct Shdr {
    name: u32,
    kind: u32,
    offset: usize,
    size: usize,
    link: u32,
    info: u32,
}

fn rd<const N: usize>(b: &[u8], off: usize) -> Result<[u8; N], RawError> {
    b.get(off..off + N)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| RawError::Elf(format!("read past the end at {off}")))
}
fn u16_at(b: &[u8], off: usize) -> Result<u16, RawError> {
    rd::<2>(b, off).map(u16::from_le_bytes)
}
fn u32_at(b: &[u8], off: usize) -> Result<u32, RawError> {
    rd::<4>(b, off).map(u32::from_le_bytes)
}
fn u64_at(b: &[u8], off: usize) -> Result<u64, RawError> {
    rd::<8>(b, off).map(u64::from_le_bytes)
}

struct Elf<'a> {
    data: &'a [u8],
    sections: Vec<Shdr>,
    shstrtab: usize,
}

impl<'a> Elf<'a> {
    fn parse(data: &'a [u8]) -> Result<Self, RawError> {
        if data.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1]) {
            return Err(RawError::Elf(
                "not a 64-bit little-endian ELF object".into(),
            ));
        }
        let shoff = u64_at(data, 0x28)? as usize;
        let shentsize = u16_at(data, 0x3a)? as usize;
        let shnum = u16_at(data, 0x3c)? as usize;
        let shstrndx = u16_at(data, 0x3e)? as usize;
        let mut sections = Vec::with_capacity(shnum);
        for i in 0..shnum {
            let h = shoff + i * shentsize;
            sections.push(Shdr {
                name: u32_at(data, h)?,
                kind: u32_at(data, h + 4)?,
                offset: u64_at(data, h + 24)? as usize,
                size: u64_at(data, h + 32)? as usize,
                link: u32_at(data, h + 40)?,
                info: u32_at(data, h + 44)?,
            });
        }
        if shstrndx >= sections.len() {
            return Err(RawError::Elf("bad section name table index".into()));
        }
        Ok(Self {
            data,
            sections,
            shstrtab: shstrndx,
        })
    }

    fn bytes(&self, s: &Shdr) -> Result<&'a [u8], RawError> {
        self.data
            .get(s.offset..s.offset + s.size)
            .ok_or_else(|| RawError::Elf("section out of bounds".into()))
    }

    fn str_in(&self, table: usize, off: u32) -> Result<&'a str, RawError> {
        let t = self
            .sections
            .get(table)
            .ok_or_else(|| RawError::Elf("bad string table".into()))?;
        let b = self.bytes(t)?.get(off as usize..).unwrap_or_default();
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        std::str::from_utf8(&b[..end]).map_err(|_| RawError::Elf("non-UTF-8 name".into()))
    }

    fn section_name(&self, s: &Shdr) -> Result<&'a str, RawError> {
        self.str_in(self.shstrtab, s.name)
    }

    /// (section index, offset, size) of the function symbol `name`.
    fn function(&self, name: &str) -> Result<(usize, usize, usize), RawError> {
        for symtab in &self.sections {
            if symtab.kind != SHT_SYMTAB {
                continue;
            }
            for sym in self.bytes(symtab)?.chunks_exact(24) {
                let info = sym[4];
                if info & 0xf != STT_FUNC
                    || self.str_in(symtab.link as usize, u32_at(sym, 0)?)? != name
                {
                    continue;
                }
                let shndx = u16_at(sym, 6)? as usize;
                return Ok((shndx, u64_at(sym, 8)? as usize, u64_at(sym, 16)? as usize));
            }
        }
        Err(RawError::Elf(format!("no function {name}")))
    }
}

/// Instructions of the function `program` with every map reference
/// patched with the fd `map_fd` returns for the map's name.
pub fn relocated(
    object: &[u8],
    program: &str,
    map_fd: &dyn Fn(&str) -> Option<RawFd>,
) -> Result<Vec<u8>, RawError> {
    let elf = Elf::parse(object)?;
    let (idx, start, size) = elf.function(program)?;
    let section = elf
        .sections
        .get(idx)
        .ok_or_else(|| RawError::Elf(format!("{program} is in no section")))?;
    let mut insns = elf
        .bytes(section)?
        .get(start..start + size)
        .ok_or_else(|| RawError::Elf(format!("{program} out of its section")))?
        .to_vec();
    let reloc_err = |reason: String| RawError::Relocation {
        program: program.to_owned(),
        reason,
    };
    let rels = elf
        .sections
        .iter()
        .filter(|s| s.kind == SHT_REL && s.info as usize == idx);
    for rel in rels {
        let symtab = elf
            .sections
            .get(rel.link as usize)
            .ok_or_else(|| reloc_err("bad symbol table link".into()))?;
        let symbols = elf.bytes(symtab)?;
        let strtab = symtab.link as usize;
        for entry in elf.bytes(rel)?.chunks_exact(16) {
            let at = u64_at(entry, 0)? as usize;
            // Other functions of the same section have their own.
            let Some(offset) = at.checked_sub(start).filter(|o| *o < size) else {
                continue;
            };
            let info = u64_at(entry, 8)?;
            let (sym, rtype) = ((info >> 32) as usize, info as u32);
            if rtype != R_BPF_64_64 {
                return Err(reloc_err(format!(
                    "relocation type {rtype} at {offset} (a call into .text?); only map references are supported"
                )));
            }
            let st_name = u32_at(symbols, sym * 24)?;
            let st_shndx = u16_at(symbols, sym * 24 + 6)? as usize;
            let target = elf
                .sections
                .get(st_shndx)
                .ok_or_else(|| reloc_err("symbol in no section".into()))?;
            let target = elf.section_name(target)?;
            let name = elf.str_in(strtab, st_name)?;
            if target != "maps" {
                return Err(reloc_err(format!(
                    "reference to {name} in {target}; only maps are supported"
                )));
            }
            let fd = map_fd(name).ok_or_else(|| reloc_err(format!("no map {name}")))?;
            // ld_imm64: opcode 0x18, src_reg (high nibble of byte 1) =
            // BPF_PSEUDO_MAP_FD, imm (bytes 4..8) = the map's fd.
            let insn = insns
                .get_mut(offset..offset + 16)
                .ok_or_else(|| reloc_err(format!("offset {offset} out of bounds")))?;
            if insn[0] != 0x18 {
                return Err(reloc_err(format!("no ld_imm64 at {offset}")));
            }
            insn[1] = (insn[1] & 0x0f) | (BPF_PSEUDO_MAP_FD << 4);
            insn[4..8].copy_from_slice(&fd.to_le_bytes());
        }
    }
    Ok(insns)
}

fn bpf(cmd: libc::c_long, attr: &mut [u8; ATTR_BYTES]) -> std::io::Result<libc::c_long> {
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

fn put(attr: &mut [u8; ATTR_BYTES], off: usize, bytes: &[u8]) {
    attr[off..off + bytes.len()].copy_from_slice(bytes);
}

/// Takes ownership of a descriptor a successful bpf(2) call returned.
fn owned(fd: libc::c_long) -> OwnedFd {
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

/// `BPF_PROG_LOAD`.
pub fn load(spec: ProgSpec<'_>, insns: &[u8]) -> Result<OwnedFd, RawError> {
    const LICENSE: &CStr = c"Dual MIT/GPL";
    let attempt = |log: Option<&mut Vec<u8>>| {
        let mut attr = [0u8; ATTR_BYTES];
        put(&mut attr, 0, &spec.prog_type.to_le_bytes());
        put(&mut attr, 4, &((insns.len() / 8) as u32).to_le_bytes());
        put(&mut attr, 8, &(insns.as_ptr() as u64).to_le_bytes());
        put(&mut attr, 16, &(LICENSE.as_ptr() as u64).to_le_bytes());
        if let Some(buf) = log {
            put(&mut attr, 24, &1u32.to_le_bytes());
            put(&mut attr, 28, &(buf.len() as u32).to_le_bytes());
            put(&mut attr, 32, &(buf.as_mut_ptr() as u64).to_le_bytes());
        }
        let short: Vec<u8> = spec.name.bytes().take(15).collect();
        put(&mut attr, 48, &short);
        put(&mut attr, 68, &spec.expected_attach_type.to_le_bytes());
        put(&mut attr, 108, &spec.attach_btf_id.to_le_bytes());
        bpf(BPF_PROG_LOAD, &mut attr).map(owned)
    };
    attempt(None).map_err(|source| {
        // Load again with the verifier log to say why.
        let mut buf = vec![0u8; 256 * 1024];
        let _ = attempt(Some(&mut buf));
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

/// `BPF_RAW_TRACEPOINT_OPEN`: attaches a raw tracepoint program to
/// `tracepoint`, or a `tp_btf` program (`None`) to its BTF target. The
/// link lives as long as the returned fd.
pub fn open_tracepoint(
    program: &str,
    prog: &OwnedFd,
    tracepoint: Option<&CStr>,
) -> Result<OwnedFd, RawError> {
    let mut attr = [0u8; ATTR_BYTES];
    let name = tracepoint.map_or(0, |t| t.as_ptr() as u64);
    put(&mut attr, 0, &name.to_le_bytes());
    put(&mut attr, 8, &(prog.as_raw_fd() as u32).to_le_bytes());
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
    let mut attr = [0u8; ATTR_BYTES];
    put(&mut attr, 0, &(prog.as_raw_fd() as u32).to_le_bytes());
    put(&mut attr, 4, &(info.len() as u32).to_le_bytes());
    put(&mut attr, 8, &(info.as_mut_ptr() as u64).to_le_bytes());
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).ok()?;
    Some(hex::encode(&info[8..16]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relocates_programs_with_map_fds_only() {
        let obj = super::super::EBPF_OBJECT;
        let fds = |name: &str| match name {
            "CONFIG" => Some(7),
            "UNIX_ALLOW" => Some(8),
            "EVENTS" => Some(9),
            "EVENTS_LOST" => Some(10),
            _ => None,
        };
        for program in [
            "unix_connect",
            "unix_sendmsg",
            "sched_process_exec",
            "sched_process_fork",
            "sched_process_exit",
            "sys_exit",
        ] {
            let insns = relocated(obj, program, &fds).unwrap();
            assert!(insns.len() > 64 && insns.len().is_multiple_of(8));
            let patched = insns
                .chunks_exact(8)
                .filter(|i| i[0] == 0x18 && i[1] >> 4 == BPF_PSEUDO_MAP_FD)
                .count();
            assert!(patched >= 3, "{program}: {patched} map references");
        }
        assert!(relocated(obj, "no_such_program", &fds).is_err());
        assert!(relocated(b"junk", "x", &fds).is_err());
    }
}
