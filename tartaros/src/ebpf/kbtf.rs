//! Kernel structure offsets from the kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! aya-ebpf programs get no CO-RE relocations, so the capture programs read
//! kernel structures (`task_struct`, `mm_struct`, `linux_binprm`) at offsets
//! that user space looks up here, in the running kernel's own type
//! information, and passes in the `CONFIG` map. A minimal reader of the BTF
//! format (`Documentation/bpf/btf.rst`): one pass over the type section,
//! then member lookups that descend into anonymous structs and unions
//! (`mm_struct` keeps all its fields in one).

use std::collections::HashMap;

/// Offsets the capture programs need. Cached as JSON in /run/tartaros
/// (`load.rs`) under a versioned name: a missing `Option` field reads as
/// `None`, so change that version with the fields.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KernelLayout {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_real_parent: u32,
    pub task_mm: u32,
    pub task_exit_code: u32,
    /// `task_struct.fs`: fork records compare the parent's and the child's
    /// (a `CLONE_FS` child moves its parent's cwd).
    pub task_fs: u32,
    /// `task_struct.thread_info.status` (x86), if present.
    pub task_ti_status: Option<u32>,
    pub mm_arg_start: u32,
    pub mm_arg_end: u32,
    pub bprm_filename: u32,
    pub bprm_argc: u32,
    /// `sched_process_exit` has the `group_dead` argument (recent kernels).
    pub exit_group_dead: bool,
    /// `(uaddr, uaddrlen)` offsets in `struct bpf_sock_addr_kern`; `None`
    /// before 6.7 (no `uaddrlen`, no unix hooks).
    pub sock_addr_kern: Option<(u32, u32)>,
    /// BTF id of the kfunc `bpf_sock_addr_set_sun_path` (Linux 6.7), which
    /// the unix programs call to pin an allowed name (`rawprog::link_kfunc`).
    pub set_sun_path: Option<u32>,
    /// BTF id of the kfunc `bpf_cast_to_kern_ctx` (Linux 6.2).
    pub cast_to_kern_ctx: Option<u32>,
    /// BTF ids of the `btf_trace_<tracepoint>` typedefs that `tp_btf`
    /// programs attach to, in the order of [`TP_BTF`].
    pub tp_btf_ids: [u32; 5],
    /// What `fdpath.rs` walks from a descriptor to its file's names, or
    /// why it cannot (records then fall back to `/proc`, and say so).
    pub file: Result<tartaros_common::capture::FileLayout, String>,
}

#[path = "kbtf_file.rs"]
mod file;

/// The tracepoints of the `tp_btf` capture programs, in attach order:
/// process events first, so that no exec can slip between them and the
/// syscall capture, and `sys_enter` before `sys_exit`, so that every exit
/// of a sandbox call finds what its entry read.
pub const TP_BTF: [&str; 5] = [
    "sched_process_exec",
    "sched_process_fork",
    "sched_process_exit",
    "sys_enter",
    "sys_exit",
];

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// One parsed type: kind, name offset, size/type field, vlen, kind_flag,
/// and where its trailing data starts in the type section.
#[derive(Clone, Copy)]
struct Ty {
    kind: u32,
    name: u32,
    size_or_type: u32,
    vlen: u32,
    kflag: bool,
    data: usize,
}

struct Btf<'a> {
    types: Vec<Ty>,
    type_data: &'a [u8],
    strings: &'a [u8],
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

impl<'a> Btf<'a> {
    fn parse(data: &'a [u8]) -> Result<Self, String> {
        if u16_at(data, 0) != Some(0xeb9f) {
            return Err("not little-endian BTF (bad magic)".into());
        }
        let field = |off| u32_at(data, off).ok_or("truncated BTF header");
        let hdr_len = field(4)? as usize;
        let (type_off, type_len) = (field(8)? as usize, field(12)? as usize);
        let (str_off, str_len) = (field(16)? as usize, field(20)? as usize);
        let section = |off: usize, len: usize| {
            data.get(hdr_len + off..hdr_len + off + len)
                .ok_or("BTF section out of bounds")
        };
        let type_data = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?;
        // Type ids start at 1; id 0 is `void`.
        let mut types = vec![Ty {
            kind: 0,
            name: 0,
            size_or_type: 0,
            vlen: 0,
            kflag: false,
            data: 0,
        }];
        let mut p = 0;
        while p < type_data.len() {
            let (name, info, st) = match (
                u32_at(type_data, p),
                u32_at(type_data, p + 4),
                u32_at(type_data, p + 8),
            ) {
                (Some(a), Some(b), Some(c)) => (a, b, c),
                _ => return Err(format!("truncated BTF type at {p}")),
            };
            let kind = (info >> 24) & 0x1f;
            let vlen = info & 0xffff;
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen as usize,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen as usize,
                KIND_PTR | 7 | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | 12
                | 16 | KIND_TYPE_TAG => 0,
                other => return Err(format!("unknown BTF kind {other}")),
            };
            types.push(Ty {
                kind,
                name,
                size_or_type: st,
                vlen,
                kflag: info >> 31 == 1,
                data: p + 12,
            });
            p += 12 + extra;
        }
        Ok(Self {
            types,
            type_data,
            strings,
        })
    }

    fn name(&self, off: u32) -> &[u8] {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        &rest[..end]
    }

    /// Ids of the named types of `kind` among `wanted`.
    fn find(&self, wanted: &[(&str, u32)]) -> HashMap<(String, u32), u32> {
        let mut found = HashMap::new();
        for (id, t) in self.types.iter().enumerate().skip(1) {
            if t.name == 0 {
                continue;
            }
            for (name, kind) in wanted {
                if t.kind == *kind
                    && self.name(t.name) == name.as_bytes()
                    && !found.contains_key(&((*name).to_owned(), *kind))
                {
                    found.insert(((*name).to_owned(), *kind), id as u32);
                }
            }
        }
        found
    }

    fn ty(&self, id: u32) -> Option<&Ty> {
        self.types.get(id as usize)
    }

    /// Follows typedef / const / volatile / restrict / type tags.
    fn strip(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.ty(id) {
                Some(t)
                    if matches!(
                        t.kind,
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
                    ) =>
                {
                    id = t.size_or_type
                }
                _ => break,
            }
        }
        id
    }

    /// Byte offset and type of member `name` of struct/union `id`,
    /// searching anonymous members too.
    fn member(&self, id: u32, name: &str, depth: u32) -> Option<(u32, u32)> {
        let t = self.ty(self.strip(id))?;
        if !matches!(t.kind, KIND_STRUCT | KIND_UNION) || depth > 8 {
            return None;
        }
        for i in 0..t.vlen as usize {
            let m = t.data + 12 * i;
            let m_name = u32_at(self.type_data, m)?;
            let m_type = u32_at(self.type_data, m + 4)?;
            let raw = u32_at(self.type_data, m + 8)?;
            // With kind_flag the low 24 bits are the bit offset.
            let bits = if t.kflag { raw & 0x00ff_ffff } else { raw };
            if m_name == 0 {
                if let Some((off, ty)) = self.member(m_type, name, depth + 1) {
                    return Some((bits / 8 + off, ty));
                }
            } else if self.name(m_name) == name.as_bytes() {
                return Some((bits / 8, m_type));
            }
        }
        None
    }

    /// Offset of a dotted member path such as `thread_info.status`.
    fn offset(&self, id: u32, path: &str) -> Option<u32> {
        let mut ty = id;
        let mut total = 0;
        for part in path.split('.') {
            let (off, next) = self.member(ty, part, 0)?;
            total += off;
            ty = next;
        }
        Some(total)
    }

    /// Number of parameters of the function behind typedef `id` (a pointer
    /// to a function prototype, as `btf_trace_*` typedefs are).
    fn params(&self, id: u32) -> Option<u32> {
        let ptr = self.ty(self.strip(id))?;
        if ptr.kind != KIND_PTR {
            return None;
        }
        let proto = self.ty(self.strip(ptr.size_or_type))?;
        (proto.kind == KIND_FUNC_PROTO).then_some(proto.vlen)
    }
}

/// Reads the offsets from raw kernel BTF.
pub fn layout(data: &[u8]) -> Result<KernelLayout, String> {
    let btf = Btf::parse(data)?;
    let wanted = [
        ("task_struct", KIND_STRUCT),
        ("mm_struct", KIND_STRUCT),
        ("linux_binprm", KIND_STRUCT),
        ("bpf_sock_addr_kern", KIND_STRUCT),
        ("bpf_sock_addr_set_sun_path", KIND_FUNC),
        ("bpf_cast_to_kern_ctx", KIND_FUNC),
        ("btf_trace_sched_process_exec", KIND_TYPEDEF),
        ("btf_trace_sched_process_fork", KIND_TYPEDEF),
        ("btf_trace_sched_process_exit", KIND_TYPEDEF),
        ("btf_trace_sys_enter", KIND_TYPEDEF),
        ("btf_trace_sys_exit", KIND_TYPEDEF),
    ];
    let ids = btf.find(&wanted);
    let id = |name: &str, kind| {
        ids.get(&(name.to_owned(), kind))
            .copied()
            .ok_or_else(|| format!("no type {name} in the kernel BTF"))
    };
    let task = id("task_struct", KIND_STRUCT)?;
    let mm = id("mm_struct", KIND_STRUCT)?;
    let bprm = id("linux_binprm", KIND_STRUCT)?;
    let off = |ty: u32, st: &str, path: &str| {
        btf.offset(ty, path)
            .ok_or_else(|| format!("no member {path} in struct {st} of the kernel BTF"))
    };
    let exit_params = id("btf_trace_sched_process_exit", KIND_TYPEDEF)
        .ok()
        .and_then(|t| btf.params(t))
        .unwrap_or(2);
    let sock_addr_kern = id("bpf_sock_addr_kern", KIND_STRUCT)
        .ok()
        .and_then(|t| Some((btf.offset(t, "uaddr")?, btf.offset(t, "uaddrlen")?)));
    Ok(KernelLayout {
        task_pid: off(task, "task_struct", "pid")?,
        task_tgid: off(task, "task_struct", "tgid")?,
        task_real_parent: off(task, "task_struct", "real_parent")?,
        task_mm: off(task, "task_struct", "mm")?,
        task_exit_code: off(task, "task_struct", "exit_code")?,
        task_fs: off(task, "task_struct", "fs")?,
        task_ti_status: btf.offset(task, "thread_info.status"),
        mm_arg_start: off(mm, "mm_struct", "arg_start")?,
        mm_arg_end: off(mm, "mm_struct", "arg_end")?,
        bprm_filename: off(bprm, "linux_binprm", "filename")?,
        bprm_argc: off(bprm, "linux_binprm", "argc")?,
        // (void *ctx, struct task_struct *p, bool group_dead)
        exit_group_dead: exit_params >= 3,
        sock_addr_kern,
        set_sun_path: id("bpf_sock_addr_set_sun_path", KIND_FUNC).ok(),
        cast_to_kern_ctx: id("bpf_cast_to_kern_ctx", KIND_FUNC).ok(),
        tp_btf_ids: [
            id("btf_trace_sched_process_exec", KIND_TYPEDEF)?,
            id("btf_trace_sched_process_fork", KIND_TYPEDEF)?,
            id("btf_trace_sched_process_exit", KIND_TYPEDEF)?,
            id("btf_trace_sys_enter", KIND_TYPEDEF)?,
            id("btf_trace_sys_exit", KIND_TYPEDEF)?,
        ],
        file: file::offsets(&btf),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_running_kernel() {
        let Ok(data) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("skipping: no /sys/kernel/btf/vmlinux");
            return;
        };
        let l = layout(&data).unwrap();
        eprintln!("{l:?}");
        assert_eq!(l.task_tgid, l.task_pid + 4, "pid and tgid are adjacent");
        assert_eq!(l.mm_arg_end, l.mm_arg_start + 8);
        assert!(l.task_mm > 0 && l.task_real_parent > 0 && l.bprm_filename > 0);
        assert!(l.tp_btf_ids.iter().all(|&id| id > 0));
    }

    #[test]
    fn rejects_garbage() {
        assert!(layout(b"not btf").is_err());
        assert!(layout(&[0x9f, 0xeb, 1, 0, 24, 0, 0, 0]).is_err());
    }
}

#[cfg(test)]
mod timing {
    /// `cargo test --release -p tartaros --lib btf_parse_time -- --ignored --nocapture`
    #[test]
    #[ignore = "benchmark"]
    fn btf_parse_time() {
        let t = std::time::Instant::now();
        let data = std::fs::read("/sys/kernel/btf/vmlinux").unwrap();
        let read = t.elapsed();
        let t = std::time::Instant::now();
        super::layout(&data).unwrap();
        let ours = t.elapsed();
        eprintln!("read {read:?}, layout {ours:?}");
    }
}
