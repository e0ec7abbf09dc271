//! The run's effect log: one task owns the [`LogWriter`] and is the only
//! writer; every producer (eBPF reader, proxy, broker, supervisor) sends
//! [`Record`](crate::effectlog::Record)s on a channel. The genesis is written before the agent starts
//! and the seal only after the cgroup is empty and the channel drained.

use std::path::Path;

use crate::effectlog::{ExitStatus, Genesis, LogError, LogWriter, Record, Seal};
use crate::events::{EffectReceiver, EffectSender, Entry};
use crate::fswatch::FsWatch;

/// Creates the log file and writes the genesis.
pub fn open(path: &Path, genesis: Genesis) -> Result<LogWriter, LogError> {
    let mut writer = LogWriter::create(path)?;
    // Batch appends; the drain task flushes whenever the channel runs dry,
    // so a crash loses at most what was in flight.
    writer.set_batch_bytes(BATCH_BYTES);
    writer.genesis(genesis)?;
    writer.flush()?;
    Ok(writer)
}

/// Records are written in chunks of this size (or after FLUSH_INTERVAL).
pub const BATCH_BYTES: usize = 64 * 1024;

/// The longest a record waits in the writer's buffer.
const FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);

fn flush(writer: &mut LogWriter) {
    if let Err(e) = writer.flush() {
        crate::warn::say(format_args!("{e}"));
    }
}

/// Appends one record; returns 1 if the writer refused it.
fn append(writer: &mut LogWriter, record: &mut Record) -> u64 {
    match writer.record(record) {
        // Counted by the writer, reported once by `drain`.
        Ok(_) | Err(LogError::Full { .. }) => 0,
        Err(e) => {
            crate::warn::say(format_args!("failed to log a {} record: {e}", record.kind));
            1
        }
    }
}

/// Drains `effects` into the log until every sender is gone; returns the
/// writer for the seal. A record the writer refuses is a supervisor bug:
/// it is reported and counted as lost, never silently dropped.
pub async fn drain(writer: LogWriter, effects: EffectReceiver) -> LogWriter {
    drain_with(writer, effects, None, InitPid::default()).await
}

/// The sandbox init's host pid, once it exists. The init is TartarOS's own
/// code (PID 1 of the sandbox, outside the agent's Landlock domain, so the
/// agent cannot trace it): its setup before the agent exists (mounts, the
/// private /dev's nodes, the hostname) is not the agent's doing and is left
/// out of the log, all but its `exec`, `fork` and `exit`, which say when
/// the sandbox started and the agent was born.
#[derive(Debug, Clone, Default)]
pub struct InitPid(std::sync::Arc<std::sync::atomic::AtomicU32>);

impl InitPid {
    pub fn set(&self, pid: u32) {
        self.0.store(pid, std::sync::atomic::Ordering::Release);
    }

    fn is_setup(&self, record: &Record) -> bool {
        let init = self.0.load(std::sync::atomic::Ordering::Acquire);
        init != 0 && record.pid == init && !matches!(record.kind, "exec" | "fork" | "exit")
    }
}

/// [`drain`], with the capture's records joined to the kernel's file
/// notifications of `truth` (kernel-sourced paths, `write` records, the
/// seal's `files`; see [`crate::fswatch`]).
pub async fn drain_with(
    mut writer: LogWriter,
    mut effects: EffectReceiver,
    mut truth: Option<FsWatch>,
    init: InitPid,
) -> LogWriter {
    let mut refused = 0u64;
    let mut full_reported = false;
    // Buffered records reach the file when the buffer is full (in
    // `LogWriter::record`) or at the latest FLUSH_INTERVAL after the
    // first of them: one write(2) per record, which a trickle of events
    // would otherwise cause, slows the agent's own file operations on the
    // same filesystem (a journal handle and an mtime update each).
    let mut flush_at: Option<tokio::time::Instant> = None;
    loop {
        let received = match flush_at {
            Some(deadline) => {
                tokio::select! {
                    effect = effects.recv() => Some(effect),
                    () = tokio::time::sleep_until(deadline) => None,
                }
            }
            None => Some(effects.recv().await),
        };
        let effect = match received {
            Some(Some(effect)) => effect,
            Some(None) => break,
            None => {
                if let Some(truth) = truth.as_mut() {
                    refused += write_truth(&mut writer, truth.tick(), truth.take_lost());
                }
                flush(&mut writer);
                flush_at = truth
                    .as_ref()
                    .map(|_| tokio::time::Instant::now() + TRUTH_INTERVAL);
                continue;
            }
        };
        let mut batch = vec![effect];
        while let Ok(more) = effects.try_recv() {
            batch.push(more);
        }
        for entry in batch {
            match entry {
                Entry::Records(mut records) => {
                    records.retain(|r| !init.is_setup(r));
                    let records = match truth.as_mut() {
                        Some(truth) => truth.admit(records),
                        None => records,
                    };
                    for mut record in records {
                        refused += append(&mut writer, &mut record);
                    }
                }
                // A gateway's record: neither the init's setup nor a file
                // effect for the join.
                Entry::Record(mut record) => refused += append(&mut writer, &mut record),
                // Producers report lost events in-band.
                Entry::Gap(gap) => {
                    if let Err(e) = writer.gap(gap.count.max(1), gap.lost_kind) {
                        eprintln!("tartaros: failed to log a gap record: {e}");
                    }
                }
            }
        }
        if refused > 0 {
            let _ = writer.gap(refused, "refused-record");
            refused = 0;
        }
        if !full_reported && let Some(why) = writer.full() {
            eprintln!(
                "tartaros: the effect log is full ({why}): later records are dropped and the log will verify as incomplete"
            );
            full_reported = true;
        }
        if !writer.writes_pending() && truth.is_none() {
            flush_at = None;
        } else if flush_at.is_none() {
            flush_at = Some(tokio::time::Instant::now() + FLUSH_INTERVAL);
        }
    }
    if let Some(mut truth) = truth {
        let (records, seal) = truth.finish();
        let refused = write_truth(&mut writer, records, truth.take_lost());
        if refused > 0 {
            let _ = writer.gap(refused, "refused-record");
        }
        writer.set_seal_fields(seal);
        // Closing the group waits for the kernel to free its marks (see
        // `fswatch::Marks`): not in the way of the seal.
        let _ = std::thread::Builder::new()
            .name("fanotify-close".into())
            .spawn(move || drop(truth));
    }
    flush(&mut writer);
    writer
}

/// How often the kernel's notifications are read while no record comes.
const TRUTH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(50);

/// Writes the records of the kernel-sourced path join, and a gap for lost
/// notifications; returns how many records the writer refused.
fn write_truth(writer: &mut LogWriter, records: Vec<Record>, lost: [(u64, &str); 2]) -> u64 {
    let mut refused = 0;
    for mut record in records {
        refused += append(writer, &mut record);
    }
    for (count, kind) in lost {
        if count == 0 {
            continue;
        }
        match writer.gap(count, kind) {
            Ok(_) | Err(LogError::Full { .. }) => {}
            Err(e) => eprintln!("tartaros: failed to log a gap record: {e}"),
        }
    }
    refused
}

/// Writes the seal: only called once the cgroup is empty (or known not to
/// be) and every producer has finished.
pub fn seal(
    mut writer: LogWriter,
    code: i32,
    signal: Option<i32>,
    cgroup_empty: bool,
) -> Result<String, LogError> {
    let exit_status = match signal {
        Some(signal) => ExitStatus::Signal(signal),
        None => ExitStatus::Code(code),
    };
    let head = writer.seal(Seal {
        exit_status,
        cgroup_empty,
    })?;
    // `LogWriter::seal` has synced the seal before it gave the reserve
    // back; another fdatasync here waited only for the journal to commit
    // that truncation (0.3-4 ms at the end of every `--log` run), which
    // the log's durability does not need: a crash before it leaves
    // blocks past the end of the file, not a shorter log.
    Ok(head)
}

/// How a run's log ended, for the exit status and the status channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogOutcome {
    /// Hash of the seal line; `None` when the seal could not be written.
    pub head: Option<String>,
    /// Why the log is not complete (what `verify` will answer 2 or 3 for);
    /// `None` for a complete log.
    pub incomplete: Option<String>,
}

impl LogOutcome {
    pub fn complete(&self) -> bool {
        self.incomplete.is_none()
    }
}

/// Why a sealed run has no status of its agent's own.
#[derive(Debug, Clone, Copy)]
pub enum NoAgentEnd<'a> {
    /// The agent never started (`not_started`): a guarantee the genesis
    /// lists could not be installed, say.
    NotStarted(&'a str),
    /// The agent started, but the init ended without reporting how the
    /// agent ended (`end_unknown`; adversarial round 23b).
    Unknown(&'a str),
}

/// Seals the run's log and says whether it is complete: sealed, nothing
/// lost or dropped, the cgroup emptied, and capture not degraded
/// (`capture_degraded`: the genesis lists it), the same conditions under
/// which `tartaros log verify` says `ok`.
pub fn finish(
    mut writer: LogWriter,
    code: i32,
    signal: Option<i32>,
    cgroup_empty: bool,
    capture_degraded: bool,
    no_end: Option<NoAgentEnd<'_>>,
) -> LogOutcome {
    // The genesis lists what the run planned to install; a run whose
    // init could not install it (seccomp refused by an outer filter) ended
    // before the agent, and the seal says why (adversarial round 22). An
    // init that ended after the start leaves the agent's end unknown,
    // which is not the same (round 23b).
    match no_end {
        Some(NoAgentEnd::NotStarted(why)) => {
            writer.set_seal_fields(serde_json::json!({ "not_started": why }));
        }
        Some(NoAgentEnd::Unknown(why)) => {
            writer.set_seal_fields(serde_json::json!({ "end_unknown": why }));
        }
        None => {}
    }
    let full = writer.full().map(str::to_owned);
    let lost = writer.lost() + writer.dropped();
    let nameless = writer.nameless();
    let head = match seal(writer, code, signal, cgroup_empty) {
        Ok(head) => head,
        Err(e @ (LogError::Foreign { .. } | LogError::Moved { .. })) => {
            return LogOutcome {
                head: None,
                incomplete: Some(e.to_string()),
            };
        }
        Err(e) => {
            return LogOutcome {
                head: None,
                incomplete: Some(format!("{e}; the log is unsealed")),
            };
        }
    };
    let incomplete = if lost > 0 {
        Some(match full {
            Some(why) => format!("it is full ({why}); {lost} records are missing"),
            None => format!("{lost} events were lost"),
        })
    } else if !cgroup_empty {
        Some("the cgroup was not empty when it was sealed".to_string())
    } else if capture_degraded {
        Some("event capture was not installed (degraded)".to_string())
    } else if nameless > 0 {
        Some(format!("{nameless} file records name no file"))
    } else {
        None
    };
    LogOutcome {
        head: Some(head),
        incomplete,
    }
}

/// A sender and receiver pair for one run.
pub fn channel() -> (EffectSender, EffectReceiver) {
    crate::events::channel()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effectlog::{VERDICT_OK, verify_file};
    use serde_json::{Value, json};

    /// A gateway's record reaches the log in the shape the schema gives
    /// it: common fields at the top, what the gateway saw in `target`.
    #[tokio::test]
    async fn a_gateway_record_is_logged_with_its_fields_in_target() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let genesis = Genesis::new(json!({}), vec![], vec![], vec![]);
        let writer = open(&path, genesis).unwrap();
        let (tx, rx) = channel();
        let record = Record::new("proxy")
            .with("host", "evil.example")
            .with("port", 443)
            .with("decision", "denied")
            .with("reason", "domain not allowed");
        tx.send(record.into()).unwrap();
        drop(tx);
        let writer = drain(writer, rx).await;
        seal(writer, 0, None, true).unwrap();
        assert_eq!(verify_file(&path).code, VERDICT_OK);
        let text = std::fs::read_to_string(&path).unwrap();
        let line: Value = serde_json::from_str(text.lines().nth(1).unwrap()).unwrap();
        let keys: Vec<&str> = line
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "decision", "errno", "kind", "mono_ns", "pid", "ppid", "prev", "seq", "target",
                "uid", "wall_ns"
            ]
        );
        assert_eq!(
            line["target"],
            json!({"host": "evil.example", "port": 443, "reason": "domain not allowed"})
        );
        assert_eq!(
            (&line["decision"], &line["errno"]),
            (&json!("denied"), &json!(0))
        );
        assert!(line["mono_ns"].as_u64().unwrap() > 0);
    }
}
