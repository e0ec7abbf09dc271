//! The supervisor-owned, append-only, hash-chained effect log.
//!
//! One canonical JSON object per line (keys sorted at every level, integers
//! only, no insignificant whitespace). Every line carries `seq` (contiguous
//! from 0) and `prev`, the hex SHA-256 of the previous line's exact bytes
//! (64 zeros for line 0). The first record is `genesis`, the last one `seal`;
//! in between are effect records and `gap` records for lost events.
//!
//! - [`LogWriter`] is the only writer (the supervisor); every record reaches
//!   the file as one complete line, so a crash leaves a prefix that verifies as
//!   unsealed.
//! - [`verify_file`] / [`verify_reader`] check a log and return a [`Verdict`]
//!   whose `code` is the exit code of `tartaros log verify`.
//! - [`show`] prints a readable timeline or a process tree, [`summary`]
//!   what a reviewer asks first, [`report`] one self-contained HTML page;
//!   all three verify first and escape every log string ([`escape`]).
//!
//! The full schema, with an example line per kind, is in `docs/effect-log.md`.

mod canonical;
pub mod escape;
pub mod names;
pub mod reader_cli;
mod record;
mod report;
mod schema;
mod secrets;
mod show;
mod source;
mod summary;
mod unnamed;
mod verify;
mod writer;

use std::path::PathBuf;

pub use canonical::{policy_hash, to_canonical};
pub use record::{Record, Target};
pub use report::{ReportError, report};
pub use schema::{Decision, EFFECT_KINDS, ExitStatus, Genesis, Seal};
pub use show::{
    Filter, FilterError, ShowOptions, TimeBound, expand_kinds, glob_match, parse_time, show,
};
/// For the seal, which hashes what git runs first.
pub(crate) use summary::runs_on_host;
pub use summary::{Summary, summarize, summary_json, summary_text};
pub use verify::{
    VERDICT_INCOMPLETE, VERDICT_OK, VERDICT_TAMPERED, VERDICT_UNSEALED, Verdict, verify_file,
    verify_file_with_head, verify_reader,
};
pub use writer::{LogWriter, mono_now_ns, wall_now_ns};

/// Longest line the writer emits and the verifier accepts (a record with a
/// huge argv must be trimmed by the caller); bounds the verifier's memory on a
/// hostile file.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// Everything that can go wrong while writing or reading an effect log.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// O_EXCL refused: never append to or overwrite a log we did not start.
    #[error("failed to create effect log {}: the file already exists; choose another path", path.display())]
    Exists { path: PathBuf },
    #[error("failed to create effect log {}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to make effect log {} append-only for the run (another process that can write its directory could replace it); put the log on a local filesystem with inode flags (ext4, xfs, btrfs, tmpfs)", path.display())]
    AppendOnly {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to write effect log record {seq} to {}", path.display())]
    Write {
        seq: u64,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to sync effect log {}", path.display())]
    Sync {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to serialize a log record: {at} holds a float (the log holds integers only)")]
    Float { at: String },
    #[error("failed to append a `{kind}` record: {reason}")]
    Invalid { kind: String, reason: String },
    #[error("failed to append a `{kind}` record: the log has no genesis record yet")]
    NoGenesis { kind: String },
    #[error("failed to write genesis: the log already has {records} records")]
    GenesisTwice { records: u64 },
    #[error("failed to append a `{kind}` record: the log is already sealed")]
    Sealed { kind: String },
    /// A write failed part-way; appending more would turn a verifiable
    /// truncated prefix into a corrupt middle line.
    #[error("failed to append a `{kind}` record: an earlier write failed, the log is closed")]
    Poisoned { kind: String },
    /// The log's filesystem is full: the record is dropped and counted in
    /// the `log-full` gap the seal is preceded by.
    #[error(
        "failed to append a `{kind}` record: the log's filesystem is full ({why}); free space there or put the log elsewhere"
    )]
    Full { kind: String, why: String },
    /// Bytes the writer did not write: another process that could write
    /// the file (an agent of another run with the same uid, whose root
    /// holds it) appended to the live log (adversarial round 24b).
    #[error(
        "failed to keep effect log {} to our own records: {bytes} bytes in it were written by another process, and `log verify` will say tampered; keep logs outside every run's writable roots",
        path.display()
    )]
    Foreign { path: PathBuf, bytes: u64 },
    /// The log's name leads to another file (or none) at the seal: its
    /// directory was moved and another put in its place (adversarial
    /// round 24b: `verify` of the name said ok for an older log).
    #[error(
        "failed to keep effect log {}: the name no longer leads to this run's log (a directory on the way was moved or replaced), so what `log verify` reads there is not this run's; keep logs outside every run's writable roots",
        path.display()
    )]
    Moved { path: PathBuf },
    #[error("failed to read effect log {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A pipe or a device cannot be read twice with the same bytes, and
    /// a reader must show the bytes it verified.
    #[error(
        "failed to read effect log {}: it is not a regular file (a pipe or a device); save it to a file and read that",
        path.display()
    )]
    NotAFile { path: PathBuf },
    #[error("failed to write the timeline")]
    Output {
        #[source]
        source: std::io::Error,
    },
}

#[cfg(test)]
pub(crate) mod testutil;
