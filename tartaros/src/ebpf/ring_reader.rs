//! Reading the ring buffer into the effect log's channel.

use std::collections::BTreeMap;
use std::time::Duration;

use aya::maps::{MapData, MapError, PerCpuHashMap, RingBuf};
use tartaros_common::capture::{LOST_SLOTS, effect};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::decode::{Decoded, Decoder};
use crate::events::{EffectSender, Entry, Gap};

/// How often the ring buffer is drained without a wake-up: capture
/// records wake the reader only once a batch is waiting (see
/// `RunConfig::wake_bytes`), so this bounds how late a record can be.
const POLL: Duration = Duration::from_millis(10);
/// How often (in polls) the loss counters are read while running.
const LOSS_CHECK_POLLS: u32 = 10;
/// Records handled before the task yields back to the runtime.
const BATCH: usize = 4096;

/// The ring buffer and a handle on the loss counters, taken from
/// [`super::CgroupPrograms::take_event_source`]; owned by
/// [`forward_events`], so it outlives a detach of the programs.
pub struct EventSource {
    ring: RingBuf<MapData>,
    lost: LostCounters,
    capture: bool,
}

/// One run's loss counters: its entry of `EVENTS_LOST` (own handle).
pub(super) struct LostCounters {
    pub map: PerCpuHashMap<MapData, u64, [u64; LOST_SLOTS]>,
    pub run: u64,
    /// Remove the entry when done: the last reader of an object other runs
    /// keep using. (The programs are detached and the run unregistered
    /// before the last drain reads the counters.)
    pub remove_when_done: bool,
}

impl Drop for LostCounters {
    fn drop(&mut self) {
        if self.remove_when_done {
            let _ = self.map.remove(&self.run);
        }
    }
}

impl std::fmt::Debug for EventSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSource")
            .field("capture", &self.capture)
            .finish_non_exhaustive()
    }
}

impl EventSource {
    pub(super) fn new(ring: RingBuf<MapData>, lost: LostCounters, capture: bool) -> Self {
        Self {
            ring,
            lost,
            capture,
        }
    }
}

/// What [`forward_events`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaptureStats {
    /// Records read from the ring buffer.
    pub records: u64,
    /// Effects sent on the channel (not counting gaps).
    pub forwarded: u64,
    /// Events the kernel could not write (ring buffer full), total.
    pub lost: u64,
    /// The same by effect kind (`event` when not attributable).
    pub lost_by_kind: BTreeMap<&'static str, u64>,
    /// Gap effects sent.
    pub gaps: u64,
    /// Records that could not be decoded (short, unknown type).
    pub invalid: u64,
    /// Effects that could not be sent because the receiver was gone.
    pub send_failed: u64,
    /// Why reading stopped early, if it did.
    pub error: Option<String>,
}

/// Sum over CPUs of each loss counter.
pub(super) fn read_lost(counters: &LostCounters) -> Result<[u64; LOST_SLOTS], MapError> {
    let mut sum = [0u64; LOST_SLOTS];
    for cpu in counters.map.get(&counters.run, 0)?.iter() {
        for (s, v) in sum.iter_mut().zip(cpu.iter()) {
            *s += v;
        }
    }
    Ok(sum)
}

struct Forwarder {
    decoder: Decoder,
    effects: EffectSender,
    stats: CaptureStats,
    reported: [u64; LOST_SLOTS],
    /// A read failed and its gap was sent.
    failed: bool,
}

impl Forwarder {
    /// Decodes up to `limit` records and sends them as one batch; returns
    /// how many were read.
    fn drain(&mut self, ring: &mut RingBuf<MapData>, limit: usize) -> usize {
        let mut n = 0;
        let mut records = Vec::new();
        let mut invalid = 0;
        while n < limit {
            let Some(item) = ring.next() else { break };
            n += 1;
            self.stats.records += 1;
            match self.decoder.decode(&item) {
                Decoded::Record(r) => {
                    drop(item);
                    records.push(r);
                }
                Decoded::Skip => {}
                Decoded::Invalid => invalid += 1,
            }
            if let Some(r) = self.decoder.take_refusal() {
                records.push(r);
            }
        }
        if invalid > 0 {
            // An effect the programs recorded that cannot be told: lost.
            self.stats.invalid += invalid;
            self.stats.lost += invalid;
            self.stats.gaps += 1;
            self.send_gap(Gap {
                count: invalid,
                lost_kind: "undecodable",
            });
        }
        if !records.is_empty() {
            let count = records.len() as u64;
            if self.effects.send(Entry::Records(records)).is_err() {
                self.stats.send_failed += count;
            } else {
                self.stats.forwarded += count;
            }
        }
        n
    }

    /// Reading failed: what it would have read is unknown, so the log
    /// says at least one event of it is lost (one gap, named after the
    /// first failure), and never verifies as complete.
    fn failed(&mut self, error: String, lost_kind: &'static str) {
        if !self.failed {
            self.failed = true;
            self.stats.lost += 1;
            self.stats.gaps += 1;
            self.send_gap(Gap {
                count: 1,
                lost_kind,
            });
        }
        self.stats.error = Some(error);
    }

    fn send_gap(&mut self, gap: Gap) {
        if self.effects.send(Entry::Gap(gap)).is_err() {
            self.stats.send_failed += 1;
        }
    }

    /// Turns increases of the loss counters into gaps.
    fn check_lost(&mut self, counters: &LostCounters) {
        let now = match read_lost(counters) {
            Ok(now) => now,
            Err(e) => {
                self.failed(
                    format!("failed to read the loss counters: {e}"),
                    "loss-counters-unreadable",
                );
                return;
            }
        };
        for (slot, &now) in now.iter().enumerate() {
            let reported = self.reported[slot];
            if now <= reported {
                continue;
            }
            let count = now - reported;
            self.reported[slot] = now;
            self.decoder.forget_cwds();
            let kind = effect::name(slot as u16);
            self.stats.lost += count;
            *self.stats.lost_by_kind.entry(kind).or_default() += count;
            self.stats.gaps += 1;
            self.send_gap(Gap {
                count,
                lost_kind: kind,
            });
        }
    }
}

/// Forwards every record of `source` as a
/// [`Record`](crate::effectlog::Record) to `effects` until `stop` resolves
/// (or its sender is dropped), then drains everything left in the ring
/// buffer and the loss counters, and returns.
///
/// The ring is drained on wake-ups and every 10 ms; loss counters are
/// checked every 100 ms and at the end; each increase is
/// sent as a [`Gap`]. Stop only
/// after the cgroup is empty: events of processes still running would be
/// written after the drain.
pub async fn forward_events(
    source: EventSource,
    effects: EffectSender,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> CaptureStats {
    forward(source, effects, stop).await.0
}

/// [`forward_events`], handing the source back instead of dropping it:
/// unmapping the ring buffer is ~0.5 ms of kernel work that the caller may
/// do elsewhere.
pub async fn forward(
    source: EventSource,
    effects: EffectSender,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> (CaptureStats, EventSource) {
    let EventSource {
        ring,
        lost,
        capture,
    } = source;
    let mut fw = Forwarder {
        decoder: Decoder::new(),
        effects,
        stats: CaptureStats::default(),
        reported: [0; LOST_SLOTS],
        failed: false,
    };
    // SAFETY: the ring buffer owns its map fd, which stays open and
    // unchanged for as long as the AsyncFd (which owns the RingBuf) lives.
    let registered = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) };
    let mut afd = match registered {
        Ok(afd) => afd,
        Err(e) => {
            // Without epoll, poll on the timer instead: slower, not lossy.
            let (mut ring, cause) = e.into_parts();
            fw.stats.error = Some(format!(
                "failed to register the ring buffer with the runtime ({cause}); polling"
            ));
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            loop {
                tokio::select! {
                    _ = &mut stop => break,
                    _ = tick.tick() => {
                        while fw.drain(&mut ring, BATCH) == BATCH {}
                        fw.check_lost(&lost);
                    }
                }
            }
            while fw.drain(&mut ring, BATCH) > 0 {}
            fw.check_lost(&lost);
            return (fw.stats, EventSource::new(ring, lost, capture));
        }
    };
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut polls = 0u32;
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => break,
            guard = afd.readable_mut() => match guard {
                Ok(mut guard) => {
                    if fw.drain(guard.get_inner_mut(), BATCH) < BATCH {
                        guard.clear_ready();
                    } else {
                        // Readiness is kept: come back after other tasks ran.
                        drop(guard);
                        tokio::task::yield_now().await;
                    }
                }
                Err(e) => {
                    fw.failed(
                        format!("failed to wait for the ring buffer: {e}"),
                        "ring-unreadable",
                    );
                    break;
                }
            },
            _ = tick.tick() => {
                while fw.drain(afd.get_mut(), BATCH) == BATCH {
                    tokio::task::yield_now().await;
                }
                polls += 1;
                if polls.is_multiple_of(LOSS_CHECK_POLLS) {
                    fw.check_lost(&lost);
                }
            }
        }
    }
    while fw.drain(afd.get_mut(), BATCH) > 0 {}
    fw.check_lost(&lost);
    let ring = afd.into_inner();
    (fw.stats, EventSource::new(ring, lost, capture))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loss counters that cannot be read (here: the run has no entry) are
    /// a gap in the log, once, never silence: the log must not verify as
    /// complete when nobody knows what was lost.
    #[test]
    fn unreadable_loss_counters_are_one_gap_not_silence() {
        if !nix::unistd::geteuid().is_root() {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "needs root");
            eprintln!("skipping: creating a BPF map needs root");
            return;
        }
        let fd = super::super::rawprog::create_map(super::super::rawprog::MapSpec {
            name: "EVENTS_LOST",
            map_type: 5, // BPF_MAP_TYPE_PERCPU_HASH
            key_size: 8,
            value_size: (8 * LOST_SLOTS) as u32,
            max_entries: 4,
            flags: tartaros_common::MAP_NO_PREALLOC,
            inner_map: None,
        })
        .unwrap();
        let data = MapData::from_fd(fd).unwrap();
        let counters = LostCounters {
            map: PerCpuHashMap::try_from(aya::maps::Map::PerCpuHashMap(data)).unwrap(),
            run: 7,
            remove_when_done: false,
        };
        let (tx, mut rx) = crate::events::channel();
        let mut fw = Forwarder {
            decoder: Decoder::new(),
            effects: tx,
            stats: CaptureStats::default(),
            reported: [0; LOST_SLOTS],
            failed: false,
        };
        fw.check_lost(&counters);
        fw.check_lost(&counters);
        let gap = Gap {
            count: 1,
            lost_kind: "loss-counters-unreadable",
        };
        assert_eq!(rx.try_recv().ok(), Some(Entry::Gap(gap)));
        assert!(rx.try_recv().is_err(), "one gap per cause");
        assert_eq!((fw.stats.lost, fw.stats.gaps), (1, 1));
        assert!(fw.stats.error.is_some());
    }
}
