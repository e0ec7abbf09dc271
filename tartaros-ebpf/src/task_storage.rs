//! A task-local storage map (`BPF_MAP_TYPE_TASK_STORAGE`, Linux 5.11 for
//! tracing programs; `bpf_get_current_task_btf`, 5.11): one value per
//! task, which the kernel keeps in the task and frees with it. aya-ebpf
//! 0.2 has no such map type, so its definition is written out here; the
//! loader gives it the BTF it needs (`rawprog.rs`).
//!
//! Why: the calls in flight were a hash map keyed by `pid_tgid`, and its
//! insert, lookup and delete on every captured call (plus an element
//! allocation charged to the supervisor's memory cgroup) were the largest
//! part of the capture's cost in the agent's own syscalls (docs/ebpf.md,
//! "Session 12"). A task's entry is found from the task itself, is made
//! once in the task's life, and goes with it: a task that exits inside a
//! call leaves nothing behind, and a thread that `execve`s and becomes the
//! leader (a new `pid_tgid`) still finds its entry.

use core::{cell::UnsafeCell, marker::PhantomData, ptr};

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_LOCAL_STORAGE_GET_F_CREATE, bpf_map_def, bpf_map_type},
    helpers::generated::{bpf_get_current_task_btf, bpf_task_storage_get},
};

#[repr(transparent)]
pub struct TaskStorage<V> {
    def: UnsafeCell<bpf_map_def>,
    _v: PhantomData<V>,
}

// SAFETY: the definition is only read by the loader; the kernel owns the
// values, each reached by its own task.
unsafe impl<V> Sync for TaskStorage<V> {}

impl<V> TaskStorage<V> {
    pub const fn new() -> Self {
        Self {
            def: UnsafeCell::new(bpf_map_def {
                type_: bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE,
                key_size: 4,
                value_size: size_of::<V>() as u32,
                // The kernel requires 0 entries and no preallocation.
                max_entries: 0,
                map_flags: BPF_F_NO_PREALLOC,
                id: 0,
                pinning: 0,
            }),
            _v: PhantomData,
        }
    }

    /// The current task's value, made (zeroed) when it has none; `None`
    /// when it cannot be made (no memory) or the storage is busy.
    #[inline(always)]
    pub fn get_or_create(&self) -> Option<*mut V> {
        self.lookup(u64::from(BPF_LOCAL_STORAGE_GET_F_CREATE))
    }

    /// The current task's value, if it has one.
    #[inline(always)]
    pub fn get(&self) -> Option<*mut V> {
        self.lookup(0)
    }

    #[inline(always)]
    fn lookup(&self, flags: u64) -> Option<*mut V> {
        // SAFETY: helpers of tracing programs; the task pointer is the
        // kernel's own (`PTR_TO_BTF_ID`), the map pointer this map's
        // definition, which the loader relocates to the map.
        let value = unsafe {
            let task = bpf_get_current_task_btf();
            bpf_task_storage_get(self.def.get().cast(), task.cast(), ptr::null_mut(), flags)
        };
        (!value.is_null()).then_some(value.cast::<V>())
    }
}
