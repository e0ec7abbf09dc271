//! What `cargo xtask bench proxy` reports: throughput, latency and the CPU
//! each thread spent, and how they are measured.

use std::fmt;
use std::io;
use std::time::Duration;

use super::Path;

/// Latency percentiles of small request/response round trips.
#[derive(Debug, Clone, Copy)]
pub struct Latency {
    pub p50: Duration,
    pub p99: Duration,
}

#[derive(Debug, Clone)]
pub struct BenchReport {
    pub bytes: u64,
    pub runs: usize,
    /// Median throughput in MB/s (10^6 bytes) per path.
    pub throughput: Vec<(Path, f64)>,
    /// CPU time the bench's threads spent on the downloads, per path,
    /// summed over all runs (so a mean, where throughput is a median).
    pub cpu: Vec<(Path, CpuUse)>,
    /// Small-request latency per path.
    pub latency: Vec<(Path, Latency)>,
}

impl BenchReport {
    fn throughput_of(&self, path: Path) -> Option<f64> {
        self.throughput
            .iter()
            .find(|(p, _)| *p == path)
            .map(|(_, v)| *v)
    }

    fn latency_of(&self, path: Path) -> Option<Latency> {
        self.latency
            .iter()
            .find(|(p, _)| *p == path)
            .map(|(_, v)| *v)
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let direct = self.throughput_of(Path::Direct).unwrap_or(f64::NAN);
        writeln!(
            f,
            "proxy throughput: {} MiB per download, median of {} runs",
            self.bytes >> 20,
            self.runs
        )?;
        for (path, mbps) in &self.throughput {
            writeln!(
                f,
                "  {:<20} {:>9.0} MB/s  {:>5.2}x direct",
                path.name(),
                mbps,
                mbps / direct
            )?;
        }
        // All online CPUs, not this thread's affinity mask (which a profiler
        // may have narrowed).
        // SAFETY: sysconf reads a system value and touches no memory of ours.
        let cores = usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) })
            .unwrap_or(1)
            .max(1);
        writeln!(
            f,
            "CPU ms per GiB (client + proxy + upstream threads; busy: of {cores} CPUs)"
        )?;
        for (path, cpu) in &self.cpu {
            let [client, proxy, upstream] = cpu.per_gib();
            writeln!(
                f,
                "  {:<20} {:>5.0} + {:>5.0} + {:>5.0} = {:>5.0}  busy {:>3.0}%",
                path.name(),
                client,
                proxy,
                upstream,
                client + proxy + upstream,
                cpu.busy(cores) * 100.0
            )?;
        }
        let base = self
            .latency_of(Path::Direct)
            .map(|l| l.p50)
            .unwrap_or_default();
        writeln!(
            f,
            "small request latency (p50 / p99, added p50 over direct)"
        )?;
        for (path, latency) in &self.latency {
            writeln!(
                f,
                "  {:<20} {:>7.1} us / {:>7.1} us  +{:.1} us",
                path.name(),
                micros(latency.p50),
                micros(latency.p99),
                micros(latency.p50.saturating_sub(base))
            )?;
        }
        Ok(())
    }
}

/// CPU time of the client, proxy and upstream threads during downloads.
/// It shows where a path spends CPU, and whether the threads had the
/// machine to themselves (`busy` near 100% of the cores means the path is
/// CPU-bound, not waiting on the relay).
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuUse {
    /// Client, proxy, upstream.
    pub threads: [Duration; 3],
    pub wall: Duration,
    pub bytes: u64,
}

impl CpuUse {
    pub(super) fn add(
        &mut self,
        after: &[Duration; 3],
        before: &[Duration; 3],
        wall: Duration,
        bytes: u64,
    ) {
        for (sum, (a, b)) in self.threads.iter_mut().zip(after.iter().zip(before)) {
            *sum += a.saturating_sub(*b);
        }
        self.wall += wall;
        self.bytes += bytes;
    }

    /// Milliseconds per GiB moved, per thread.
    pub fn per_gib(&self) -> [f64; 3] {
        let gib = self.bytes as f64 / f64::from(1u32 << 30);
        self.threads
            .map(|t| t.as_secs_f64() * 1e3 / gib.max(f64::MIN_POSITIVE))
    }

    /// Share of `cores` the three threads kept busy.
    pub fn busy(&self, cores: usize) -> f64 {
        let used: f64 = self.threads.iter().map(Duration::as_secs_f64).sum();
        used / (self.wall.as_secs_f64() * cores as f64).max(f64::MIN_POSITIVE)
    }
}

/// Per-thread CPU clocks, readable from the client's thread.
pub(super) struct Clocks {
    pub(super) client: ThreadClock,
    pub(super) proxy: ThreadClock,
    pub(super) upstream: ThreadClock,
}

impl Clocks {
    pub(super) fn read(&self) -> [Duration; 3] {
        [self.client, self.proxy, self.upstream].map(ThreadClock::read)
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct ThreadClock(libc::clockid_t);

impl ThreadClock {
    pub(super) fn current() -> Self {
        Self(libc::CLOCK_THREAD_CPUTIME_ID)
    }

    pub(super) fn of(thread: &std::thread::JoinHandle<()>) -> io::Result<Self> {
        use std::os::unix::thread::JoinHandleExt;
        let mut id: libc::clockid_t = 0;
        // SAFETY: the thread is joinable (we hold its handle), so its
        // pthread_t is valid; the call only writes `id`.
        let rc = unsafe { libc::pthread_getcpuclockid(thread.as_pthread_t(), &mut id) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(Self(id))
    }

    pub(super) fn read(self) -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime only writes the timespec we own. A thread
        // that has exited reads as an error, which counts as zero.
        if unsafe { libc::clock_gettime(self.0, &mut ts) } != 0 {
            return Duration::ZERO;
        }
        Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        )
    }
}

pub(super) fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub(super) fn percentiles(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    let at = |q: f64| {
        let index = ((samples.len().max(1) - 1) as f64 * q) as usize;
        samples.get(index).copied().unwrap_or_default()
    };
    Latency {
        p50: at(0.50),
        p99: at(0.99),
    }
}

pub(super) fn median_f64(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}
