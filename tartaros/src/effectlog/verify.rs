//! `tartaros log verify`: checks the chain, the canonical form, the schema and
//! the seal, and answers with one exit code and one line.
//!
//! Precedence: tampered (1) beats unsealed / truncated (2) beats incomplete
//! (3); the first problem found, reading from the top, is the one reported.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde_json::{Map, Value};

use super::MAX_LINE_BYTES;
use super::canonical::{parse_canonical, sha256, sha256_hex, to_canonical};
use super::escape::terminal_capped;
use super::schema;
use super::unnamed::{self, Unnamed};

/// Sealed, chain intact, nothing lost, cgroup emptied.
pub const VERDICT_OK: u8 = 0;
/// A line was edited, removed, reordered, inserted or appended after the seal,
/// or is not something the writer produces.
pub const VERDICT_TAMPERED: u8 = 1;
/// A valid chain prefix without a seal, a last line cut mid-way, an empty
/// file, or a file that cannot be read.
pub const VERDICT_UNSEALED: u8 = 2;
/// Sealed and intact, but events were lost (including records the writer
/// dropped when its filesystem filled up), the cgroup was not empty, or
/// the genesis says event capture was degraded.
pub const VERDICT_INCOMPLETE: u8 = 3;

/// The outcome of a verification: `code` is the exit code of
/// `tartaros log verify`, `message` one line saying what and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub code: u8,
    pub message: String,
}

impl Verdict {
    fn new(code: u8, message: String) -> Self {
        // Every log string in a message is escaped where it is put in; this
        // catches any text that was not (the escape is not idempotent, so
        // it runs only when a raw control character is there).
        let raw = message
            .chars()
            .any(|c| c.is_control() || super::escape::is_invisible(c));
        let message = if raw {
            super::escape::terminal(&message)
        } else {
            message
        };
        Self { code, message }
    }
}

/// Verifies the log at `path` and, when `head` is given (the hex head the
/// run printed when it sealed the log, or its status channel's), that the
/// seal line hashes to it. The chain is a plain hash, not a signature: a
/// log rewritten offline (a record dropped, every line after it re-chained,
/// the seal's counts and digest recomputed) verifies `ok` by itself; only
/// a head kept apart from the file tells it from the original.
pub fn verify_file_with_head(path: &Path, head: Option<&str>) -> Verdict {
    let Some(want) = head else {
        return verify_file(path);
    };
    // One read: the seal compared with the head is the seal of the lines
    // just verified, never a second read of a file that may have changed
    // (or a pipe that serves another log to each open).
    let (verdict, sealed) = match File::open(path) {
        Ok(f) => check(BufReader::new(f)),
        Err(_) => return verify_file(path),
    };
    against_head(verdict, sealed, want)
}

/// `verdict` for a log whose seal line hashes to `sealed`, when the reader
/// expects the head `want`: any other seal (or none) is tampered.
pub(crate) fn against_head(verdict: Verdict, sealed: Option<[u8; 32]>, want: &str) -> Verdict {
    if verdict.code != VERDICT_OK && verdict.code != VERDICT_INCOMPLETE {
        return verdict;
    }
    let got = sealed.map(hex::encode).unwrap_or_default();
    if got.eq_ignore_ascii_case(want.trim()) {
        return verdict;
    }
    Verdict::new(
        VERDICT_TAMPERED,
        format!(
            "tampered: the seal's head is {got}, not the expected {}: the log was rewritten, or is another run's",
            terminal_capped(want, 64)
        ),
    )
}

/// Verifies the log at `path`. Never fails: an unreadable file is reported as
/// code 2 (there is no complete log to vouch for).
pub fn verify_file(path: &Path) -> Verdict {
    // A FIFO is read once, as it comes (`tests/log_forged.rs`): its open
    // waits for a writer, as any reader of a pipe does. The other readers
    // refuse it without waiting (`source::open_without_waiting`).
    match File::open(path) {
        Ok(f) => verify_reader(BufReader::new(f)),
        Err(e) => Verdict::new(
            VERDICT_UNSEALED,
            // Messages reach a terminal: the path and every string taken
            // from the log are escaped.
            format!(
                "unreadable: cannot open {}: {e}",
                terminal_capped(&path.to_string_lossy(), 4096)
            ),
        ),
    }
}

/// Verifies a log read from `reader` (a file, or bytes in memory).
pub fn verify_reader<R: BufRead>(reader: R) -> Verdict {
    check(reader).0
}

/// The verdict, and the hash of the seal line when the log is sealed and
/// its chain intact.
pub(crate) fn check<R: BufRead>(mut reader: R) -> (Verdict, Option<[u8; 32]>) {
    let mut state = Chain::default();
    let mut buf = Vec::new();
    let mut lineno: u64 = 0;
    loop {
        buf.clear();
        // The cap bounds memory on a hostile file with no newlines.
        let limit = MAX_LINE_BYTES as u64 + 1;
        let n = match (&mut reader).take(limit).read_until(b'\n', &mut buf) {
            Ok(n) => n,
            Err(e) => {
                let verdict = Verdict::new(
                    VERDICT_UNSEALED,
                    format!("unreadable: cannot read line {}: {e}", lineno + 1),
                );
                return (verdict, None);
            }
        };
        if n == 0 {
            break;
        }
        lineno += 1;
        let Some(line) = buf.strip_suffix(b"\n") else {
            return (state.unterminated(lineno, buf.len()), None);
        };
        if let Err(why) = state.line(lineno, line) {
            let verdict = Verdict::new(VERDICT_TAMPERED, format!("tampered: line {lineno}: {why}"));
            return (verdict, None);
        }
    }
    // After the seal's line, `prev` is that line's hash.
    (state.finish(lineno), state.sealed_at.map(|_| state.prev))
}

#[derive(Default)]
struct Chain {
    prev: [u8; 32],
    counts: BTreeMap<String, u64>,
    lost: u64,
    gaps: u64,
    first_gap: Option<u64>,
    /// A `log-full` gap: the writer dropped records for lack of room.
    log_full: bool,
    /// The degraded capture guarantees the genesis lists.
    degraded_capture: Vec<String>,
    sealed_at: Option<u64>,
    cgroup_empty: bool,
    /// Changed files the seal lists without a hash, or not at all (its
    /// bounds): the tree cannot be checked against the log for them.
    unhashed: u64,
    /// File records whose name is neither the kernel's nor whole (see
    /// [`unnamed`]), and the line of the first.
    nameless: u64,
    first_nameless: Option<(u64, String)>,
    /// Refused attempts named only by the agent's string, resolved after
    /// the call (see [`unnamed`]).
    claimed: u64,
    /// The seal's `not_started`: the agent never ran, and why.
    not_started: Option<String>,
    /// The seal's `end_unknown`: the agent ran, but how it ended is lost.
    end_unknown: Option<String>,
}

impl Chain {
    /// Checks one complete line (without its newline).
    fn line(&mut self, lineno: u64, line: &[u8]) -> Result<(), String> {
        if let Some(s) = self.sealed_at {
            return Err(format!("a line follows the seal on line {s}"));
        }
        let value = parse_canonical(line)?;
        let m = value.as_object().ok_or("not a JSON object")?;
        let expected = lineno - 1;
        let seq = schema::uint(m, "seq")?;
        if seq != expected {
            return Err(format!("seq is {seq}, expected {expected}"));
        }
        if m.get("prev").and_then(Value::as_str) != Some(hex::encode(self.prev).as_str()) {
            return Err(if lineno == 1 {
                "prev is not 64 zeros".to_string()
            } else {
                format!("prev does not match the hash of line {}", lineno - 1)
            });
        }
        let kind = m
            .get("kind")
            .and_then(Value::as_str)
            .ok_or("`kind` is missing or not a string")?;
        match kind {
            "genesis" if lineno == 1 => {
                schema::check_genesis(m)?;
                self.degraded_capture = degraded_capture(m);
            }
            _ if lineno == 1 => {
                return Err(format!(
                    "the first record is `{}`, not genesis",
                    terminal_capped(kind, 64)
                ));
            }
            "genesis" => return Err("a second genesis record".into()),
            "gap" => {
                self.lost = self.lost.saturating_add(schema::check_gap(m)?);
                self.gaps += 1;
                self.first_gap.get_or_insert(lineno);
                self.log_full |= m.get("lost_kind").and_then(Value::as_str) == Some("log-full");
            }
            "seal" => self.seal(lineno, m)?,
            k if schema::is_effect_kind(k) => {
                schema::check_effect(m)?;
                match unnamed::classify(m) {
                    Some(Unnamed::Lost(why)) => {
                        self.nameless += 1;
                        self.first_nameless
                            .get_or_insert((lineno, format!("{} {why}", plain(k))));
                    }
                    Some(Unnamed::Claimed) => self.claimed += 1,
                    None => {}
                }
            }
            other => return Err(format!("unknown kind `{}`", terminal_capped(other, 64))),
        }
        if kind != "seal" {
            *self.counts.entry(kind.to_string()).or_insert(0) += 1;
        }
        self.prev = sha256(line);
        Ok(())
    }

    fn seal(&mut self, lineno: u64, m: &Map<String, Value>) -> Result<(), String> {
        schema::check_seal_shape(m)?;
        if m.get("head").and_then(Value::as_str) != Some(hex::encode(self.prev).as_str()) {
            return Err(format!(
                "seal head does not match the hash of line {}",
                lineno - 1
            ));
        }
        let mut body = m.clone();
        let digest = body.remove("digest");
        let want = to_canonical(&Value::Object(body))
            .map(|c| sha256_hex(c.as_bytes()))
            .map_err(|_| "seal holds a float".to_string())?;
        if digest.as_ref().and_then(Value::as_str) != Some(want.as_str()) {
            return Err("seal digest does not match the seal's contents".into());
        }
        let counts = m.get("counts").and_then(Value::as_object);
        let sealed: BTreeMap<String, u64> = counts
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
            .collect();
        if sealed != self.counts {
            return Err(format!(
                "seal counts do not match the records ({})",
                count_difference(&sealed, &self.counts)
            ));
        }
        let lost = schema::uint(m, "lost")?;
        if lost != self.lost {
            return Err(format!(
                "seal says {lost} events lost, the gap records add up to {}",
                self.lost
            ));
        }
        self.cgroup_empty = m.get("cgroup_empty").and_then(Value::as_bool) == Some(true);
        let skipped = m.get("files").and_then(Value::as_array).map_or(0, |f| {
            f.iter()
                .filter(|e| e.get("sha256").is_some_and(Value::is_null))
                .count()
        });
        let omitted = m.get("files_omitted").and_then(Value::as_u64).unwrap_or(0);
        self.unhashed = (skipped as u64).saturating_add(omitted);
        let text = |key: &str| m.get(key).and_then(Value::as_str).map(str::to_owned);
        self.not_started = text("not_started");
        self.end_unknown = text("end_unknown");
        self.sealed_at = Some(lineno);
        Ok(())
    }

    /// The file ends without a newline at `lineno`.
    fn unterminated(&self, lineno: u64, len: usize) -> Verdict {
        if len > MAX_LINE_BYTES {
            return Verdict::new(
                VERDICT_TAMPERED,
                format!("tampered: line {lineno}: longer than {MAX_LINE_BYTES} bytes"),
            );
        }
        if let Some(s) = self.sealed_at {
            return Verdict::new(
                VERDICT_TAMPERED,
                format!("tampered: line {lineno}: data after the seal on line {s}"),
            );
        }
        Verdict::new(
            VERDICT_UNSEALED,
            format!(
                "truncated: line {lineno} is cut mid-line (no final newline); lines 1-{} verify as an unsealed prefix",
                lineno - 1
            ),
        )
    }

    fn finish(&self, lines: u64) -> Verdict {
        let Some(sealed_at) = self.sealed_at else {
            let message = if lines == 0 {
                "unsealed: the log is empty".to_string()
            } else {
                format!(
                    "unsealed: lines 1-{lines} verify but there is no seal (the run did not finish or the log was cut)"
                )
            };
            return Verdict::new(VERDICT_UNSEALED, message);
        };
        if self.lost > 0 {
            let cause = if self.log_full {
                "; the log's filesystem filled up (or the log reached its size limit) and the writer dropped records"
            } else {
                ""
            };
            return Verdict::new(
                VERDICT_INCOMPLETE,
                format!(
                    "incomplete: {} events lost in {} gap records (first on line {}{cause})",
                    self.lost,
                    self.gaps,
                    self.first_gap.unwrap_or(0),
                ),
            );
        }
        if !self.cgroup_empty {
            return Verdict::new(
                VERDICT_INCOMPLETE,
                format!(
                    "incomplete: line {sealed_at}: the cgroup was not empty when the log was sealed"
                ),
            );
        }
        if !self.degraded_capture.is_empty() {
            return Verdict::new(
                VERDICT_INCOMPLETE,
                format!(
                    "incomplete: line 1: the genesis says {} was degraded, so effects went unrecorded",
                    self.degraded_capture.join(", ")
                ),
            );
        }
        if let Some((line, what)) = &self.first_nameless {
            return Verdict::new(
                VERDICT_INCOMPLETE,
                format!(
                    "incomplete: line {line}: {} file record(s) name no file (first: {what}, and no kernel name)",
                    self.nameless
                ),
            );
        }
        // Every effect is recorded; the seal's hashes are bounded, and says
        // so, so the reviewer knows which files the tree check cannot cover.
        let unhashed = if self.unhashed > 0 {
            format!(
                "; the seal has no hash for {} changed files (over its bounds, or with no name it could open)",
                self.unhashed
            )
        } else {
            String::new()
        };
        let claimed = if self.claimed > 0 {
            format!(
                "; {} refused attempts are named by the agent's string alone, resolved after the call",
                self.claimed
            )
        } else {
            String::new()
        };
        // The genesis lists guarantees the run only planned: say first
        // that none of them held an agent.
        // An agent that ran but whose end is lost (its init was killed) is
        // said so, never "never started" (adversarial round 23b).
        let not_started = match (&self.not_started, &self.end_unknown) {
            (Some(why), _) => format!(
                "; the agent never started: {}",
                super::escape::terminal_capped(why, 300)
            ),
            (None, Some(why)) => format!(
                "; the agent started, its end is unknown: {}",
                super::escape::terminal_capped(why, 300)
            ),
            (None, None) => String::new(),
        };
        Verdict::new(
            VERDICT_OK,
            format!(
                "ok: {lines} records, sealed on line {sealed_at}, head {}{not_started}{unhashed}{claimed}",
                hex::encode(self.prev)
            ),
        )
    }
}

/// The capture guarantees the genesis lists as degraded: any guarantee
/// whose name says capture (`ebpf-capture` today).
fn degraded_capture(genesis: &Map<String, Value>) -> Vec<String> {
    genesis
        .get("guarantees")
        .and_then(|g| g.get("degraded"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|name| name.contains("capture"))
        .map(plain)
        .collect()
}

/// A name from the log, safe for a terminal: anything but letters,
/// digits, `-` and `_` becomes `?`.
fn plain(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '?'
            }
        })
        .collect()
}

/// Names the first kind whose count differs, for the one-line message.
fn count_difference(sealed: &BTreeMap<String, u64>, seen: &BTreeMap<String, u64>) -> String {
    let kinds = sealed.keys().chain(seen.keys());
    for k in kinds {
        let a = sealed.get(k).copied().unwrap_or(0);
        let b = seen.get(k).copied().unwrap_or(0);
        if a != b {
            return format!(
                "`{}`: seal says {a}, the log has {b}",
                terminal_capped(k, 64)
            );
        }
    }
    "a zero count is listed".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effectlog::testutil::{effect, genesis};
    use crate::effectlog::{ExitStatus, LogWriter, Seal};

    fn sealed(path: &Path, degraded: &[&str], gap: Option<(u64, &str)>) -> Verdict {
        let mut w = LogWriter::create(path).unwrap();
        let mut g = genesis();
        g.degraded = degraded.iter().map(|s| s.to_string()).collect();
        w.genesis(g).unwrap();
        w.record(&mut effect(
            "exec",
            10,
            1,
            5,
            serde_json::json!({"path": "/bin/true"}),
            None,
        ))
        .unwrap();
        if let Some((count, kind)) = gap {
            w.gap(count, kind).unwrap();
        }
        w.seal(Seal {
            exit_status: ExitStatus::Code(0),
            cgroup_empty: true,
        })
        .unwrap();
        verify_file(path)
    }

    /// Round 23b: an agent that started and whose init was killed is no
    /// agent that never started.
    #[test]
    fn an_unknown_end_is_ok_and_never_read_as_never_started() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        let mut w = LogWriter::create(&path).unwrap();
        w.genesis(genesis()).unwrap();
        let why = "the sandbox init ended (killed by signal 9) while the agent ran";
        w.set_seal_fields(serde_json::json!({ "end_unknown": why }));
        w.seal(Seal {
            exit_status: ExitStatus::Code(125),
            cgroup_empty: true,
        })
        .unwrap();
        let v = verify_file(&path);
        assert_eq!(v.code, VERDICT_OK, "{v:?}");
        assert!(
            v.message.contains("its end is unknown: the sandbox"),
            "{v:?}"
        );
        assert!(!v.message.contains("never started"), "{v:?}");
    }

    #[test]
    fn a_degraded_capture_is_incomplete_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let v = sealed(&dir.path().join("a"), &["ebpf-capture"], None);
        assert_eq!(v.code, VERDICT_INCOMPLETE, "{v:?}");
        assert!(v.message.contains("ebpf-capture was degraded"), "{v:?}");
        let v = sealed(&dir.path().join("b"), &["unix-socket-policy"], None);
        assert_eq!(v.code, VERDICT_OK, "another degraded guarantee: {v:?}");
    }

    #[test]
    fn a_full_log_is_incomplete_and_names_the_cause() {
        let dir = tempfile::tempdir().unwrap();
        let v = sealed(&dir.path().join("a"), &[], Some((7, "log-full")));
        assert_eq!(v.code, VERDICT_INCOMPLETE, "{v:?}");
        assert!(v.message.contains("filesystem filled up"), "{v:?}");
    }
}
