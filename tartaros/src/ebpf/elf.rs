//! Reading the embedded eBPF object: its map definitions, its read-only
//! data and the relocated instructions of one program. Pure: no syscalls,
//! so every step is unit-tested against the real object.
//!
//! We read the object ourselves instead of through aya's loader, whose
//! constructor parses the whole kernel BTF (~20 ms at every start) although
//! none of our programs needs CO-RE relocations.
//!
//! A program is its function symbol's instructions, with:
//! - map references (`R_BPF_64_64` against a symbol of the `maps` section)
//!   patched to `BPF_PSEUDO_MAP_FD` with the map's descriptor;
//! - `.rodata` references patched to `BPF_PSEUDO_MAP_VALUE` (the map's
//!   descriptor and the offset in it);
//! - calls into `.text` (`R_BPF_64_32`: `memset` and friends the compiler
//!   emits) resolved by appending each called function once and pointing
//!   the call at it. Only functions that are called are appended: the
//!   verifier refuses unreachable instructions;
//! - function addresses (`R_BPF_64_64` against `.text`: `bpf_loop`
//!   callbacks) resolved the same way, as `BPF_PSEUDO_FUNC` loads. The
//!   kernel then wants BTF `func_info` for every function, so the program
//!   also lists where each one starts.

use std::os::fd::RawFd;

use super::rawprog::RawError;

const SHT_SYMTAB: u32 = 2;
const SHT_REL: u32 = 9;
const STT_FUNC: u8 = 2;
const STT_SECTION: u8 = 3;
const R_BPF_64_64: u32 = 1;
const R_BPF_64_32: u32 = 10;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const BPF_PSEUDO_MAP_VALUE: u8 = 2;
const BPF_PSEUDO_CALL: u8 = 1;
const BPF_PSEUDO_FUNC: u8 = 4;
const OP_LD_IMM64: u8 = 0x18;
const OP_CALL: u8 = 0x85;
const INSN: usize = 8;
/// Name the `.rodata` map is looked up by.
pub const RODATA: &str = ".rodata";
/// aya-ebpf's `bpf_map_def`: type, key size, value size, max entries,
/// flags, id, pinning; seven `u32`.
const MAP_DEF_BYTES: usize = 28;

struct Shdr {
    name: u32,
    kind: u32,
    offset: usize,
    size: usize,
    link: u32,
    info: u32,
}

struct Symbol<'a> {
    name: &'a str,
    kind: u8,
    section: usize,
    value: usize,
    size: usize,
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
fn i32_at(b: &[u8], off: usize) -> Result<i32, RawError> {
    rd::<4>(b, off).map(i32::from_le_bytes)
}

/// A map as the object declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapDef {
    pub name: String,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

pub struct Elf<'a> {
    data: &'a [u8],
    sections: Vec<Shdr>,
    shstrtab: usize,
}

impl<'a> Elf<'a> {
    pub fn parse(data: &'a [u8]) -> Result<Self, RawError> {
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

    fn section(&self, index: usize) -> Result<&Shdr, RawError> {
        self.sections
            .get(index)
            .ok_or_else(|| RawError::Elf(format!("no section {index}")))
    }

    fn bytes(&self, s: &Shdr) -> Result<&'a [u8], RawError> {
        self.data
            .get(s.offset..s.offset + s.size)
            .ok_or_else(|| RawError::Elf("section out of bounds".into()))
    }

    fn str_in(&self, table: usize, off: u32) -> Result<&'a str, RawError> {
        let b = self
            .bytes(self.section(table)?)?
            .get(off as usize..)
            .unwrap_or_default();
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        std::str::from_utf8(&b[..end]).map_err(|_| RawError::Elf("non-UTF-8 name".into()))
    }

    fn section_name(&self, index: usize) -> Result<&'a str, RawError> {
        self.str_in(self.shstrtab, self.section(index)?.name)
    }

    fn section_index(&self, name: &str) -> Option<usize> {
        (0..self.sections.len()).find(|&i| self.section_name(i).is_ok_and(|n| n == name))
    }

    fn symtab(&self) -> Result<(usize, &Shdr), RawError> {
        self.sections
            .iter()
            .enumerate()
            .find(|(_, s)| s.kind == SHT_SYMTAB)
            .ok_or_else(|| RawError::Elf("no symbol table".into()))
    }

    fn symbol(&self, index: usize) -> Result<Symbol<'a>, RawError> {
        let (_, symtab) = self.symtab()?;
        let entry = self
            .bytes(symtab)?
            .get(index * 24..index * 24 + 24)
            .ok_or_else(|| RawError::Elf(format!("no symbol {index}")))?;
        Ok(Symbol {
            name: self.str_in(symtab.link as usize, u32_at(entry, 0)?)?,
            kind: entry[4] & 0xf,
            section: u16_at(entry, 6)? as usize,
            value: u64_at(entry, 8)? as usize,
            size: u64_at(entry, 16)? as usize,
        })
    }

    fn symbols(&self) -> Result<Vec<Symbol<'a>>, RawError> {
        let (_, symtab) = self.symtab()?;
        (0..symtab.size / 24).map(|i| self.symbol(i)).collect()
    }

    /// A copy of the object whose task-storage maps are declared as
    /// 1-entry arrays, for aya's loader (the doctor's probes, which use no
    /// map): a map definition of the `maps` section has no BTF, which the
    /// kernel requires of a task-storage map, so aya could not create it.
    pub fn without_task_storage(&self) -> Result<Vec<u8>, RawError> {
        const MAP_TYPE_ARRAY: u32 = 2;
        let mut out = self.data.to_vec();
        let Some(maps) = self.section_index("maps") else {
            return Ok(out);
        };
        let base = self.section(maps)?.offset;
        for s in self.symbols()? {
            let at = base + s.value;
            if s.section != maps
                || s.size < MAP_DEF_BYTES
                || u32_at(self.data, at)? != super::rawprog::MAP_TYPE_TASK_STORAGE
            {
                continue;
            }
            // type, key size, (value size kept), entries, flags.
            for (word, value) in [(0, MAP_TYPE_ARRAY), (1, 4), (3, 1), (4, 0)] {
                let slot = out
                    .get_mut(at + 4 * word..at + 4 * word + 4)
                    .ok_or_else(|| RawError::Elf(format!("map {} out of bounds", s.name)))?;
                slot.copy_from_slice(&value.to_le_bytes());
            }
        }
        Ok(out)
    }

    /// The maps the object declares, in symbol order.
    pub fn map_defs(&self) -> Result<Vec<MapDef>, RawError> {
        let Some(maps) = self.section_index("maps") else {
            return Ok(Vec::new());
        };
        let bytes = self.bytes(self.section(maps)?)?;
        self.symbols()?
            .into_iter()
            .filter(|s| s.section == maps && s.size >= MAP_DEF_BYTES)
            .map(|s| {
                let at = |i: usize| u32_at(bytes, s.value + 4 * i);
                Ok(MapDef {
                    name: s.name.to_owned(),
                    map_type: at(0)?,
                    key_size: at(1)?,
                    value_size: at(2)?,
                    max_entries: at(3)?,
                    flags: at(4)?,
                })
            })
            .collect()
    }

    /// The object's read-only data, if it has any.
    pub fn rodata(&self) -> Result<Option<&'a [u8]>, RawError> {
        self.section_index(RODATA)
            .map(|i| self.section(i).and_then(|s| self.bytes(s)))
            .transpose()
    }

    /// Offset in the read-only data of the global `name`, if there is one.
    pub fn rodata_offset(&self, name: &str) -> Result<Option<usize>, RawError> {
        let Some(rodata) = self.section_index(RODATA) else {
            return Ok(None);
        };
        Ok(self
            .symbols()?
            .into_iter()
            .find(|s| s.section == rodata && s.name == name)
            .map(|s| s.value))
    }

    /// Size in bytes of program `name`'s own code (without the functions
    /// it calls).
    pub fn program_size(&self, name: &str) -> Result<usize, RawError> {
        Ok(self.function(name)?.size)
    }

    /// The function symbol `name`.
    fn function(&self, name: &str) -> Result<Symbol<'a>, RawError> {
        self.symbols()?
            .into_iter()
            .find(|s| s.kind == STT_FUNC && s.name == name)
            .ok_or_else(|| RawError::Elf(format!("no function {name}")))
    }

    /// The function of section `section` that starts at `offset`.
    fn function_at(&self, section: usize, offset: usize) -> Result<Symbol<'a>, RawError> {
        self.symbols()?
            .into_iter()
            .find(|s| s.kind == STT_FUNC && s.section == section && s.value == offset)
            .ok_or_else(|| RawError::Elf(format!("no function at {offset} in section {section}")))
    }

    /// (offset in the section, type, symbol) of every relocation of
    /// section `section`.
    fn relocations(&self, section: usize) -> Result<Vec<(usize, u32, usize)>, RawError> {
        let mut out = Vec::new();
        for rel in self
            .sections
            .iter()
            .filter(|s| s.kind == SHT_REL && s.info as usize == section)
        {
            for entry in self.bytes(rel)?.chunks_exact(16) {
                let info = u64_at(entry, 8)?;
                out.push((
                    u64_at(entry, 0)? as usize,
                    info as u32,
                    (info >> 32) as usize,
                ));
            }
        }
        Ok(out)
    }
}

/// A program ready for `BPF_PROG_LOAD`.
#[derive(Debug)]
pub struct Relocated {
    pub insns: Vec<u8>,
    /// First instruction of each function (the program's own first),
    /// when the code takes a function's address: the kernel only accepts
    /// callbacks with BTF `func_info` for every function. Empty otherwise.
    pub functions: Vec<u32>,
}

/// The function `program` ready for `BPF_PROG_LOAD`: map and `.rodata`
/// references carry the descriptor `map_fd` gives for the map's name
/// ([`RODATA`] for the read-only data), and the functions it calls or
/// takes the address of are appended.
pub fn relocated(
    object: &[u8],
    program: &str,
    map_fd: &dyn Fn(&str) -> Option<RawFd>,
) -> Result<Relocated, RawError> {
    let elf = Elf::parse(object)?;
    let err = |reason: String| RawError::Relocation {
        program: program.to_owned(),
        reason,
    };
    let main = elf.function(program)?;
    let mut insns = Vec::new();
    // Functions placed in the program: (section, offset in it, first byte).
    let mut placed: Vec<(usize, usize, usize)> = Vec::new();
    // Calls to point at their callee once every function is placed:
    // (byte of the call in `insns`, callee's section, callee's offset).
    let mut calls: Vec<(usize, usize, usize)> = Vec::new();
    let mut callbacks = false;
    let mut queue = vec![main];
    while let Some(function) = queue.pop() {
        let base = insns.len();
        let code = elf
            .bytes(elf.section(function.section)?)?
            .get(function.value..function.value + function.size)
            .ok_or_else(|| err(format!("{} out of its section", function.name)))?;
        insns.extend_from_slice(code);
        placed.push((function.section, function.value, base));
        let (start, end) = (function.value, function.value + function.size);
        let relocations = elf.relocations(function.section)?;
        let mut relocated_at = Vec::new();
        for (at, rtype, sym) in relocations {
            if !(start..end).contains(&at) {
                continue;
            }
            relocated_at.push(at);
            let here = base + (at - start);
            // An ld_imm64 is two instruction slots, a call one.
            let width = if rtype == R_BPF_64_32 { INSN } else { 2 * INSN };
            let insn = insns
                .get_mut(here..here + width)
                .ok_or_else(|| err(format!("relocation at {at} out of bounds")))?;
            let symbol = elf.symbol(sym)?;
            let target = elf.section_name(symbol.section)?;
            match (rtype, target) {
                (R_BPF_64_64, "maps") => {
                    let fd = map_fd(symbol.name)
                        .ok_or_else(|| err(format!("no map {}", symbol.name)))?;
                    patch_ld_imm64(insn, BPF_PSEUDO_MAP_FD, fd, None)
                        .map_err(|r| err(format!("{r} at {at}")))?;
                }
                (R_BPF_64_64, RODATA) => {
                    let fd = map_fd(RODATA).ok_or_else(|| err("no .rodata map".into()))?;
                    let offset = i32_at(insn, 4)?
                        .checked_add(i32::try_from(symbol.value).unwrap_or(i32::MAX))
                        .ok_or_else(|| err(format!("bad .rodata offset at {at}")))?;
                    patch_ld_imm64(insn, BPF_PSEUDO_MAP_VALUE, fd, Some(offset))
                        .map_err(|r| err(format!("{r} at {at}")))?;
                }
                (R_BPF_64_64, _) if symbol.kind == STT_SECTION || symbol.kind == STT_FUNC => {
                    if insn[0] != OP_LD_IMM64 {
                        return Err(err(format!("function address without ld_imm64 at {at}")));
                    }
                    // The immediate is a byte offset from the symbol.
                    let callee_offset =
                        usize::try_from(symbol.value as i64 + i64::from(i32_at(insn, 4)?))
                            .map_err(|_| err(format!("function before its section at {at}")))?;
                    let callee = elf.function_at(symbol.section, callee_offset)?;
                    insn[1] = (insn[1] & 0x0f) | (BPF_PSEUDO_FUNC << 4);
                    calls.push((here, callee.section, callee.value));
                    queue_call(&mut queue, &placed, callee);
                    callbacks = true;
                }
                (R_BPF_64_32, _) => {
                    if insn[0] != OP_CALL || insn[1] >> 4 != BPF_PSEUDO_CALL {
                        return Err(err(format!("call relocation without a call at {at}")));
                    }
                    let callee_offset = match symbol.kind {
                        STT_SECTION => {
                            let imm = i64::from(i32_at(insn, 4)?);
                            usize::try_from(symbol.value as i64 + (imm + 1) * INSN as i64)
                                .map_err(|_| err(format!("call before its section at {at}")))?
                        }
                        _ => symbol.value,
                    };
                    let callee = elf.function_at(symbol.section, callee_offset)?;
                    calls.push((here, callee.section, callee.value));
                    queue_call(&mut queue, &placed, callee);
                }
                (rtype, target) => {
                    return Err(err(format!(
                        "relocation type {rtype} against {} in {target} at {at}; only maps, .rodata and calls are supported",
                        symbol.name
                    )));
                }
            }
        }
        // Calls inside the same section have no relocation: the linker
        // resolved them pc-relative.
        for index in (0..function.size / INSN).map(|i| base + i * INSN) {
            let (op, src) = (insns[index], insns[index + 1] >> 4);
            let at = start + (index - base);
            if op != OP_CALL || src != BPF_PSEUDO_CALL || relocated_at.contains(&at) {
                continue;
            }
            let imm = i64::from(i32_at(&insns, index + 4)?);
            let callee_offset = usize::try_from(at as i64 + (imm + 1) * INSN as i64)
                .map_err(|_| err(format!("call before its section at {at}")))?;
            let callee = elf.function_at(function.section, callee_offset)?;
            calls.push((index, callee.section, callee.value));
            queue_call(&mut queue, &placed, callee);
        }
    }
    // Every function is in place: point each call at its callee.
    for (call, section, offset) in calls {
        let &(_, _, callee) = placed
            .iter()
            .find(|&&(s, o, _)| s == section && o == offset)
            .ok_or_else(|| err(format!("call at byte {call} to an unplaced function")))?;
        let distance = i32::try_from((callee as i64 - call as i64) / INSN as i64 - 1)
            .map_err(|_| err(format!("call at byte {call} too far")))?;
        insns[call + 4..call + 8].copy_from_slice(&distance.to_le_bytes());
    }
    let functions = if callbacks {
        placed
            .iter()
            .map(|&(_, _, first)| u32::try_from(first / INSN).map_err(|_| err("too long".into())))
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    Ok(Relocated { insns, functions })
}

fn queue_call<'a>(
    queue: &mut Vec<Symbol<'a>>,
    placed: &[(usize, usize, usize)],
    callee: Symbol<'a>,
) {
    let known =
        |s: &Symbol<'_>, section: usize, value: usize| s.section == section && s.value == value;
    if !placed.iter().any(|&(s, v, _)| known(&callee, s, v))
        && !queue.iter().any(|q| known(q, callee.section, callee.value))
    {
        queue.push(callee);
    }
}

/// Makes the `ld_imm64` in `insn` (16 bytes) load map `fd` (`MAP_FD`) or
/// a pointer `offset` bytes into its value (`MAP_VALUE`).
fn patch_ld_imm64(
    insn: &mut [u8],
    pseudo: u8,
    fd: RawFd,
    offset: Option<i32>,
) -> Result<(), &'static str> {
    if insn[0] != OP_LD_IMM64 {
        return Err("no ld_imm64");
    }
    insn[1] = (insn[1] & 0x0f) | (pseudo << 4);
    insn[4..8].copy_from_slice(&fd.to_le_bytes());
    if let Some(offset) = offset {
        insn[12..16].copy_from_slice(&offset.to_le_bytes());
    }
    Ok(())
}

#[cfg(test)]
#[path = "elf_tests.rs"]
mod tests;
