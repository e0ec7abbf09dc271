//! The supervisor's log writer: creates the file exclusively, chains every
//! record to the previous line's hash, and writes whole lines only.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::canonical::{policy_hash, sha256, sha256_hex, to_canonical};
use super::record::Record;
use super::schema::{self, Decision, Genesis, Seal};
use super::secrets::{Secrets, zeroize_vec};
use super::{LogError, MAX_LINE_BYTES};
use crate::deputy::CreatedFile;

/// CLOCK_MONOTONIC in ns: the clock eBPF's `bpf_ktime_get_ns` reads, so kernel
/// and supervisor timestamps share one time line.
pub fn mono_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists
    // on Linux, so the call cannot fail and leaves `ts` filled in.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Wall time in ns since the Unix epoch (0 if the clock is before 1970).
pub fn wall_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Empty,
    Open,
    Sealed,
    Poisoned,
}

/// The only writer of an effect log. Not `Clone`: one chain, one writer.
pub struct LogWriter {
    file: File,
    path: PathBuf,
    next_seq: u64,
    prev: [u8; 32],
    counts: BTreeMap<String, u64>,
    lost: u64,
    state: State,
    secrets: Secrets,
    redactions: u64,
    // Complete lines not yet written (only when batching is on).
    pending: Vec<u8>,
    batch_bytes: usize,
    // The genesis's `run` object (run id and --label), when set.
    run: Option<Value>,
    /// Bytes written to the file, and the end of the blocks allocated for
    /// it (see [`space`]).
    written: u64,
    reserved_end: u64,
    /// Where the writeback started last (see [`space::start_writeback`]).
    writeback_from: u64,
    /// Set once the filesystem has no room left for the reserve: effect
    /// records are then dropped (and counted), the reserve holds the gap
    /// and the seal.
    full: Option<String>,
    dropped: u64,
    /// Records `verify` counts as naming no file (`unnamed`).
    nameless: u64,
    /// The most the log may grow to, reserve included (see
    /// [`space::size_limit`]).
    size_limit: u64,
    /// The free space the log leaves its filesystem, whatever other logs
    /// take (see [`space::kept_free`]).
    kept_free: u64,
    // Extra seal fields (the kernel-sourced `files` list).
    seal_extra: Map<String, Value>,
    /// The inode is append-only until the seal (`append_only.rs`).
    append_only: bool,
}

impl LogWriter {
    /// Creates `path` for the supervisor alone: O_CREAT|O_EXCL (an existing
    /// file or symlink is refused, never overwritten or appended to),
    /// O_APPEND, O_CLOEXEC, O_NOFOLLOW, mode 0600.
    pub fn create(path: &Path) -> Result<Self, LogError> {
        Self::create_undoable(path).map(|(writer, _)| writer)
    }

    /// [`Self::create`], and what removes the file again from the directory
    /// it was made in (for a run that fails to start; see deputy.rs).
    pub fn create_undoable(path: &Path) -> Result<(Self, CreatedFile), LogError> {
        let flags = libc::O_WRONLY | libc::O_APPEND;
        let (file, created) = crate::deputy::create_file(path, flags, 0o600).map_err(|source| {
            match source.kind() {
                ErrorKind::AlreadyExists => LogError::Exists {
                    path: path.to_path_buf(),
                },
                _ => LogError::Create {
                    path: path.to_path_buf(),
                    source,
                },
            }
        })?;
        let mut writer = Self {
            file,
            path: path.to_path_buf(),
            next_seq: 0,
            prev: [0; 32],
            counts: BTreeMap::new(),
            lost: 0,
            state: State::Empty,
            secrets: Secrets::default(),
            run: None,
            redactions: 0,
            nameless: 0,
            pending: Vec::new(),
            batch_bytes: 0,
            written: 0,
            reserved_end: 0,
            writeback_from: 0,
            full: None,
            dropped: 0,
            size_limit: u64::MAX,
            kept_free: 0,
            seal_extra: Map::new(),
            append_only: false,
        };
        writer.size_limit = space::size_limit(&writer.file);
        writer.kept_free = space::kept_free(&writer.file);
        writer.keep_reserve();
        Ok((writer, created))
    }

    /// Keeps [`space::RESERVE`] bytes allocated past the end of the file
    /// (see [`space`]); once that fails for lack of room, the log is full.
    fn keep_reserve(&mut self) {
        if self.full.is_some() || self.reserved_end >= self.written + space::RESERVE / 2 {
            return;
        }
        if self.written + space::RESERVE > self.size_limit {
            self.full = Some(format!(
                "it reached its size limit of {} MiB, half the free space of its filesystem at the start",
                self.size_limit >> 20
            ));
            return;
        }
        // Asked at each renewal (every half reserve written), since other
        // logs on the filesystem grow at the same time.
        if space::free_now(&self.file) < self.kept_free.saturating_add(space::RESERVE) {
            self.full = Some(format!(
                "its filesystem is down to the {} MiB kept free for the host",
                self.kept_free >> 20
            ));
            return;
        }
        match space::reserve(&self.file, self.written) {
            Ok(true) => self.reserved_end = self.written + space::RESERVE,
            Ok(false) => {}
            Err(e) => self.full = Some(e.to_string()),
        }
    }

    /// Why the log had to drop records (its filesystem filled up, or it
    /// reached its size limit), if it did.
    pub fn full(&self) -> Option<&str> {
        self.full.as_deref()
    }

    /// Effect records dropped since the log became full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Records written that name no file: `verify` will say the log is
    /// incomplete, and so must the run's exit status.
    pub fn nameless(&self) -> u64 {
        self.nameless
    }

    /// In full mode, counts one dropped record and refuses it.
    fn drop_when_full(&mut self, kind: &str) -> Result<(), LogError> {
        match &self.full {
            None => Ok(()),
            Some(why) => {
                self.dropped += 1;
                Err(LogError::Full {
                    kind: kind.to_string(),
                    why: why.clone(),
                })
            }
        }
    }

    /// Registers byte strings that must never appear in the log (broker token,
    /// injected credential values). Replaces (and zeroes) any earlier set.
    pub fn set_secrets(&mut self, secrets: Vec<Vec<u8>>) {
        self.secrets = Secrets::new(secrets);
    }

    /// Records the run id and the harness's `--label` in the genesis (as
    /// `run: {"id", "label"}`), so a log can be tied to its tool call.
    pub fn set_run(&mut self, id: &str, label: Option<&str>) {
        self.run = Some(json!({ "id": id, "label": label }));
    }

    /// The marker a secret becomes in this log.
    #[cfg(test)]
    pub(crate) fn redaction_marker(&self) -> String {
        String::from_utf8_lossy(self.secrets.marker()).into_owned()
    }

    /// How many secret occurrences were redacted so far (should stay 0; a
    /// non-zero value means some component put a secret in a record).
    pub fn redactions(&self) -> u64 {
        self.redactions
    }

    /// Batching: with `bytes > 0`, complete lines are buffered and written
    /// with one write(2) once `bytes` accumulate or on [`Self::flush`]. Only
    /// whole lines are ever written, so a crash still leaves a verifiable
    /// unsealed prefix (minus the unflushed records). 0 (the default) writes
    /// every record immediately. Genesis, gaps and the seal always flush.
    pub fn set_batch_bytes(&mut self, bytes: usize) {
        self.batch_bytes = bytes;
    }

    /// True when buffered records have not reached the file yet.
    pub fn writes_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Writes any buffered lines (no fsync).
    pub fn flush(&mut self) -> Result<(), LogError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut buf: &[u8] = &self.pending;
        while !buf.is_empty() {
            match self.file.write(buf) {
                Ok(0) => {
                    return Err(self.poison(std::io::Error::from(ErrorKind::WriteZero)));
                }
                // A short write (e.g. a signal or a nearly full disk): keep
                // going so the line completes if at all possible.
                Ok(n) => {
                    buf = &buf[n..];
                    self.written += n as u64;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.poison(e)),
            }
        }
        self.pending.clear();
        self.keep_reserve();
        if self.written - self.writeback_from >= space::WRITEBACK_BYTES {
            space::start_writeback(&self.file, self.writeback_from, self.written);
            self.writeback_from = self.written;
        }
        Ok(())
    }

    /// Flushes and fdatasyncs, so what was written survives a power loss.
    pub fn sync(&mut self) -> Result<(), LogError> {
        self.flush()?;
        self.file.sync_data().map_err(|source| LogError::Sync {
            path: self.path.clone(),
            source,
        })
    }

    /// Starts an fdatasync of what was written on a thread of its own: the
    /// genesis reaches the disk without the agent's start waiting the
    /// ~0.5 ms of a journal commit for it (the seal syncs in line). Syncs
    /// here if no thread can be started.
    fn sync_in_background(&mut self) {
        let spawned = self.file.try_clone().ok().and_then(|file| {
            std::thread::Builder::new()
                .name("log-sync".into())
                .spawn(move || {
                    let _ = file.sync_data();
                })
                .ok()
        });
        if spawned.is_none() {
            let _ = self.file.sync_data();
        }
    }

    /// Number of records written (the next record's `seq`).
    pub fn records(&self) -> u64 {
        self.next_seq
    }

    /// Hex SHA-256 of the last line written (64 zeros before genesis).
    pub fn head(&self) -> String {
        String::from_utf8_lossy(&self.head_hex()).into_owned()
    }

    /// The head in hex, in a buffer: every record carries it, and hex's
    /// char iterator was a sixth of the append time in the profile.
    fn head_hex(&self) -> [u8; 64] {
        let mut hex = [0u8; 64];
        // 32 bytes always fill exactly 64 hex digits.
        let _ = hex::encode_to_slice(self.prev, &mut hex);
        hex
    }

    /// Total of all gap counts so far.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the genesis record (must be the first record).
    pub fn genesis(&mut self, g: Genesis) -> Result<u64, LogError> {
        if self.state != State::Empty {
            return Err(self
                .state_error("genesis")
                .unwrap_or(LogError::GenesisTwice {
                    records: self.next_seq,
                }));
        }
        let mut m = Map::new();
        m.insert("version".into(), g.version.into());
        m.insert("kernel".into(), g.kernel.into());
        m.insert("policy".into(), g.policy);
        m.insert(
            "guarantees".into(),
            json!({ "installed": g.installed, "degraded": g.degraded }),
        );
        m.insert("programs".into(), json!(g.programs));
        m.insert("started".into(), g.started_wall_ns.into());
        m.insert("mono_ns".into(), g.started_mono_ns.into());
        if let Some(run) = self.run.take() {
            m.insert("run".into(), run);
        }
        self.redactions += self.secrets.redact_map(&mut m) as u64;
        // Hash the policy as written (after redaction) so the verifier can
        // recompute it from the line.
        let hash = policy_hash(m.get("policy").unwrap_or(&Value::Null))?;
        m.insert("policy_hash".into(), hash.into());
        let seq = self.emit("genesis", m)?;
        self.state = State::Open;
        self.flush()?;
        self.sync_in_background();
        Ok(seq)
    }

    /// Appends an effect record (its `kind` one of
    /// [`super::EFFECT_KINDS`]); the writer adds seq and prev and redacts
    /// the secrets in `target`. Returns the record's seq.
    pub fn record(&mut self, record: &mut Record) -> Result<u64, LogError> {
        let kind = record.kind;
        if let Some(e) = self.state_error(kind) {
            return Err(e);
        }
        self.drop_when_full(kind)?;
        let invalid = |reason: String| LogError::Invalid {
            kind: kind.to_string(),
            reason,
        };
        if !schema::is_effect_kind(kind) {
            return Err(invalid(match kind {
                "genesis" | "gap" | "seal" => format!("use LogWriter::{kind} for it"),
                _ => "not an effect kind (see effectlog::EFFECT_KINDS)".to_string(),
            }));
        }
        if record.decision == Decision::Allowed && record.errno != 0 {
            return Err(invalid("`errno` must be 0 when allowed".to_string()));
        }
        self.redactions += self.secrets.redact_target(&mut record.target) as u64;
        let hex = self.head_hex();
        let prev = std::str::from_utf8(&hex).unwrap_or_default();
        let mut line = String::with_capacity(512);
        record.write_line(self.next_seq, prev, &mut line)?;
        let seq = self.chain(kind, line.into_bytes())?;
        self.nameless += u64::from(super::unnamed::names_no_file(record));
        if self.pending.len() >= self.batch_bytes {
            self.flush()?;
        }
        Ok(seq)
    }

    /// Records that `count` events of `lost_kind` were lost (e.g. ring buffer
    /// reserve failures). Never call it with 0.
    pub fn gap(&mut self, count: u64, lost_kind: &str) -> Result<u64, LogError> {
        if let Some(e) = self.state_error("gap") {
            return Err(e);
        }
        if count == 0 || lost_kind.is_empty() {
            return Err(LogError::Invalid {
                kind: "gap".into(),
                reason: "count must be > 0 and lost_kind non-empty".into(),
            });
        }
        let mut m = Map::new();
        m.insert("count".into(), count.into());
        m.insert("lost_kind".into(), lost_kind.into());
        m.insert("mono_ns".into(), mono_now_ns().into());
        m.insert("wall_ns".into(), wall_now_ns().into());
        self.redactions += self.secrets.redact_map(&mut m) as u64;
        let seq = self.emit("gap", m)?;
        self.lost = self.lost.saturating_add(count);
        self.flush()?;
        Ok(seq)
    }

    /// Writes the seal (per-kind counts, lost total, head) and syncs. Call it
    /// only after the cgroup is empty and the events are drained. Returns the
    /// hex hash of the seal line: printing it lets a reviewer pin the log.
    pub fn seal(&mut self, s: Seal) -> Result<String, LogError> {
        self.seal_with_files(s, None)
    }

    /// [`Self::seal`] with the seal's `files` list (each
    /// `{"path", "size", "sha256"}`, sorted by path): the regular files the
    /// run created or modified in the writable roots.
    pub fn seal_with_files(
        &mut self,
        s: Seal,
        files: Option<Vec<Value>>,
    ) -> Result<String, LogError> {
        if let Some(e) = self.state_error("seal") {
            return Err(e);
        }
        // What a full filesystem cost is a gap, in the reserve: the log
        // then verifies as incomplete instead of ending unsealed.
        if self.dropped > 0 {
            let dropped = std::mem::take(&mut self.dropped);
            self.gap(dropped, "log-full")?;
        }
        let mut m = std::mem::take(&mut self.seal_extra);
        if let Some(files) = files {
            m.insert("files".into(), Value::Array(files));
        }
        // Before the digest: redacted after it, a file named with a secret
        // made a genuine log `tampered` while the run reported it complete.
        let redacted = self.secrets.redact_map(&mut m);
        if redacted > 0
            && let Some(Value::Array(files)) = m.get_mut("files")
        {
            // A redacted name sorts elsewhere than the name it hides.
            files.sort_by(|a, b| {
                let path = |v: &Value| v.get("path").and_then(Value::as_str).map(str::to_owned);
                path(a).cmp(&path(b))
            });
        }
        self.redactions += redacted as u64;
        // What the reserve still holds, less what is pending.
        let left = self
            .reserved_end
            .saturating_sub(self.written + self.pending.len() as u64);
        space::fit_seal_files(&mut m, &self.file, left, self.kept_free);
        m.insert("exit_status".into(), s.exit_status.to_json());
        m.insert("cgroup_empty".into(), s.cgroup_empty.into());
        m.insert("counts".into(), json!(self.counts));
        m.insert("lost".into(), self.lost.into());
        m.insert("head".into(), self.head().into());
        m.insert("mono_ns".into(), mono_now_ns().into());
        m.insert("wall_ns".into(), wall_now_ns().into());
        // The seal is the one line no later `prev` covers, so it carries a
        // digest of itself: a flipped exit code is then still detected.
        let mut whole = m.clone();
        whole.insert("seq".into(), self.next_seq.into());
        whole.insert("prev".into(), self.head().into());
        whole.insert("kind".into(), "seal".into());
        let digest = sha256_hex(to_canonical(&Value::Object(whole))?.as_bytes());
        m.insert("digest".into(), digest.into());
        self.emit("seal", m)?;
        self.state = State::Sealed;
        self.sync()?;
        // The log is complete: its owner may remove it from now on, and
        // the reserve goes back (a truncation to the same size frees the
        // blocks past the end; an append-only inode refuses it).
        self.release_append_only();
        ownership::still_ours(&self.file, &self.path, self.written)?;
        Ok(self.head())
    }

    /// Adds the seal's optional fields of `extra` (`files`,
    /// `files_omitted`, `not_started`, `end_unknown`); the others are ignored
    /// ([`crate::fswatch`] builds the files list with more).
    pub fn set_seal_fields(&mut self, extra: Value) {
        if let Value::Object(extra) = extra {
            for (k, v) in extra {
                if schema::SEAL_OPTIONAL.contains(&k.as_str()) {
                    self.seal_extra.insert(k, v);
                }
            }
        }
    }

    fn state_error(&self, kind: &str) -> Option<LogError> {
        let kind = kind.to_string();
        match self.state {
            State::Open => None,
            State::Empty if kind == "genesis" => None,
            State::Empty => Some(LogError::NoGenesis { kind }),
            State::Sealed => Some(LogError::Sealed { kind }),
            State::Poisoned => Some(LogError::Poisoned { kind }),
        }
    }

    fn poison(&mut self, source: std::io::Error) -> LogError {
        self.state = State::Poisoned;
        self.pending.clear();
        LogError::Write {
            seq: self.next_seq.saturating_sub(1),
            path: self.path.clone(),
            source,
        }
    }

    /// Serializes one record, chains it and queues it as one complete line.
    fn emit(&mut self, kind: &str, mut m: Map<String, Value>) -> Result<u64, LogError> {
        let seq = self.next_seq;
        m.insert("seq".into(), seq.into());
        m.insert("prev".into(), self.head().into());
        m.insert("kind".into(), kind.into());
        let line = to_canonical(&Value::Object(m))?.into_bytes();
        self.chain(kind, line)
    }

    /// Chains the serialized record `line` and queues it.
    fn chain(&mut self, kind: &str, mut line: Vec<u8>) -> Result<u64, LogError> {
        let seq = self.next_seq;
        if !self.secrets.is_empty() {
            self.redactions += self.secrets.guard_line(&mut line) as u64;
        }
        if line.len() >= MAX_LINE_BYTES {
            let len = line.len();
            zeroize_vec(line);
            return Err(LogError::Invalid {
                kind: kind.to_string(),
                reason: format!("the record is {len} bytes, over the {MAX_LINE_BYTES}-byte limit"),
            });
        }
        // The chain covers the exact bytes written, after redaction.
        self.prev = sha256(&line);
        line.push(b'\n');
        self.pending.extend_from_slice(&line);
        self.next_seq += 1;
        // Every record passes here: allocate the key only for a new kind.
        match self.counts.get_mut(kind) {
            Some(count) => *count += 1,
            None => {
                self.counts.insert(kind.to_string(), 1);
            }
        }
        Ok(seq)
    }
}

impl Drop for LogWriter {
    // Buffered lines are complete records: writing them keeps as much of the
    // (unsealed) log as possible. Errors have nowhere to go here.
    fn drop(&mut self) {
        if self.state != State::Poisoned {
            let _ = self.flush();
        }
        self.release_append_only();
    }
}

#[cfg(test)]
mod tests;

mod held;
mod ownership;
mod space;
