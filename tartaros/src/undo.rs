//! One undo stack for everything a run creates on the host before the
//! agent starts. A failed start unwinds it, the end of a run unwinds it,
//! and the janitor is told each step as it is pushed, so that a SIGKILLed
//! supervisor is unwound by the janitor the same way.

use crate::cgroup::{CgroupError, RunCgroup, TEARDOWN_TIMEOUT};
use crate::janitor::Janitor;
use std::path::Path;

/// One thing to undo.
pub enum Undo {
    /// Materialized placeholders: this run's share is given up; those no
    /// other run uses and still empty are removed.
    Placeholders(crate::materialize::Placeholders),
    /// A log file nothing was written to yet: removed, so that a run that
    /// never started leaves no empty log behind. Removed from the directory
    /// it was created in and only if it is still that file, never by path:
    /// the caller (or an agent) may have swapped that directory's path for
    /// a link to one where root would unlink something else.
    UnwrittenLog(crate::deputy::CreatedFile),
    /// The run's cgroup (and its v1 limit cgroups): killed and removed.
    Cgroup(RunCgroup),
}

/// The steps in the order they were done, and the janitor that mirrors them.
#[derive(Default)]
pub struct UndoStack {
    steps: Vec<Undo>,
    janitor: Option<Janitor>,
}

impl UndoStack {
    pub fn new(janitor: Option<Janitor>) -> Self {
        Self {
            steps: Vec::new(),
            janitor,
        }
    }

    /// Tells the janitor of a placeholder path before it is made, so that
    /// a supervisor killed while making it leaves nothing behind.
    pub fn announce(&mut self, placeholder: &Path) {
        if let Some(janitor) = self.janitor.as_mut() {
            janitor.placeholder(placeholder);
        }
    }

    /// Tells the janitor of the live log, append-only until its seal.
    pub fn announce_log(&mut self, fd: std::os::fd::RawFd, path: &std::path::Path) {
        if let Some(janitor) = self.janitor.as_mut() {
            janitor.log(fd, path);
        }
    }

    pub fn push(&mut self, step: Undo) {
        if let Some(janitor) = self.janitor.as_mut() {
            match &step {
                // Announced one by one before they were made.
                Undo::Placeholders(_) => {}
                Undo::Cgroup(cgroup) => {
                    janitor.cgroup(cgroup.path());
                    cgroup.v1_paths().iter().for_each(|v1| janitor.v1(v1));
                }
                // Left to the run itself: after a crash an empty log says
                // the run never got to write its genesis.
                Undo::UnwrittenLog(_) => {}
            }
        }
        self.steps.push(step);
    }

    /// Leaves the removal of a run's ring from the pin cache's `EVENTS` to
    /// the janitor, after the run (`ebpf::CgroupPrograms::leave_ring`).
    /// Without a janitor the run's handle removes it itself.
    /// `take` is asked only when there is a janitor.
    pub fn leave_ring(&mut self, take: impl FnOnce() -> Option<crate::ebpf::LeftRing>) {
        if let Some(janitor) = self.janitor.as_mut()
            && let Some(left) = take()
        {
            janitor.ring(&left);
        }
    }

    /// The log has its genesis: it stays, whatever happens next.
    pub fn keep_log(&mut self) {
        self.steps.retain(|s| !matches!(s, Undo::UnwrittenLog(_)));
    }

    pub fn cgroup(&self) -> Option<&RunCgroup> {
        self.steps.iter().find_map(|s| match s {
            Undo::Cgroup(cgroup) => Some(cgroup),
            _ => None,
        })
    }

    /// Empties the run's cgroup (kills what is left, waits), leaving it in
    /// place until [`Self::unwind`]; `Ok` when there is none.
    pub fn empty_cgroup(&self) -> Result<(), CgroupError> {
        match self.cgroup() {
            Some(cgroup) => cgroup.kill_and_wait(TEARDOWN_TIMEOUT),
            None => Ok(()),
        }
    }

    /// Undoes every step, newest first. Returns the cgroup's teardown
    /// result (`Ok` when there was none). The janitor is released only when
    /// everything was undone.
    pub fn unwind(mut self) -> Result<(), CgroupError> {
        let mut teardown = Ok(());
        while let Some(step) = self.steps.pop() {
            match step {
                Undo::Placeholders(mut held) => held.release(),
                Undo::UnwrittenLog(created) => {
                    // With the caller's file access, as it was created.
                    crate::caller::as_caller(|| created.remove());
                }
                Undo::Cgroup(cgroup) => teardown = cgroup.kill_and_remove(TEARDOWN_TIMEOUT),
            }
        }
        if let Some(janitor) = self.janitor.take()
            && teardown.is_ok()
        {
            janitor.done();
        }
        teardown
    }
}
