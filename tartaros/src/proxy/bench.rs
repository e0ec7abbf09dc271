//! In-process benchmark of the proxy against a local upstream, for
//! `cargo xtask bench proxy`: a bulk download direct, through a CONNECT
//! tunnel and through the transparent listener, side by side, and the
//! latency of small requests each way. A benchmark, not a timed test.
//!
//! Next to throughput it reports the CPU time each of its three threads
//! (client, proxy, upstream) spent per GiB, and how busy they kept the
//! machine: on a host with fewer cores than threads, a path is bounded by
//! total CPU per byte, not by any one thread, and these figures show which
//! side a change made cheaper.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{OriginalDst, ProxyConfig, StaticResolver};

const HOST: &str = "bench.test";
const CHUNK: usize = 256 * 1024;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Bytes per download. Default: 1 GiB.
    pub bytes: u64,
    /// Small requests per latency measurement. Default: 2000.
    pub requests: usize,
    /// Downloads per mode; the median counts. Default: 3.
    pub runs: usize,
    /// Which of direct, CONNECT and transparent to download through
    /// (for profiling one path alone). Empty: all three.
    pub paths: Vec<Path>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            bytes: 1 << 30,
            requests: 2000,
            runs: 3,
            paths: Vec::new(),
        }
    }
}

/// The ways a client reaches the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Direct,
    Connect,
    Transparent,
    /// Absolute-form plain HTTP through the explicit proxy (latency only:
    /// every request opens a new upstream connection).
    AbsoluteForm,
}

impl Path {
    /// The path named `name` as the report prints it (any case).
    pub fn parse(name: &str) -> Option<Path> {
        [
            Path::Direct,
            Path::Connect,
            Path::Transparent,
            Path::AbsoluteForm,
        ]
        .into_iter()
        .find(|p| p.name().eq_ignore_ascii_case(name))
    }

    fn name(self) -> &'static str {
        match self {
            Path::Direct => "direct",
            Path::Connect => "CONNECT",
            Path::Transparent => "transparent",
            Path::AbsoluteForm => "absolute-form HTTP",
        }
    }
}

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
    fn add(&mut self, after: &[Duration; 3], before: &[Duration; 3], wall: Duration, bytes: u64) {
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
struct Clocks {
    client: ThreadClock,
    proxy: ThreadClock,
    upstream: ThreadClock,
}

impl Clocks {
    fn read(&self) -> [Duration; 3] {
        [self.client, self.proxy, self.upstream].map(ThreadClock::read)
    }
}

#[derive(Debug, Clone, Copy)]
struct ThreadClock(libc::clockid_t);

impl ThreadClock {
    fn current() -> Self {
        Self(libc::CLOCK_THREAD_CPUTIME_ID)
    }

    fn of(thread: &std::thread::JoinHandle<()>) -> io::Result<Self> {
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

    fn read(self) -> Duration {
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

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Runs the benchmark. Upstream, proxy and client each get a thread with
/// a current-thread runtime, as in production, where the supervisor's
/// single-threaded runtime serves the proxy between the agent's client
/// and a remote server.
pub fn run(options: &BenchOptions) -> io::Result<BenchReport> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(measure(options))
}

/// The upstream and the proxy, each on its own thread, for one round of
/// downloads.
struct Servers {
    client: Client,
    clocks: Clocks,
    stop: tokio::sync::watch::Sender<bool>,
    threads: [std::thread::JoinHandle<()>; 2],
}

impl Servers {
    fn start() -> io::Result<Self> {
        let upstream = bind()?;
        let upstream_addr = upstream.local_addr()?;
        let explicit = bind()?;
        let explicit_addr = explicit.local_addr()?;
        let transparent = bind()?;
        let transparent_addr = transparent.local_addr()?;
        let (stop, stopped) = tokio::sync::watch::channel(false);

        let upstream_thread =
            spawn_runtime("bench-upstream", stopped.clone(), move || async move {
                if let Ok(listener) = TcpListener::from_std(upstream) {
                    serve_upstream(listener).await;
                }
            })?;
        let proxy_thread = spawn_runtime("bench-proxy", stopped, move || async move {
            let resolver = StaticResolver::new().with_ip(HOST, upstream_addr.ip());
            let mut config = ProxyConfig::new(vec![HOST.to_string()], Arc::new(resolver));
            config.allow_internal = true;
            config.connect_ports = vec![upstream_addr.port()];
            config.http_ports = vec![upstream_addr.port()];
            let config = Arc::new(config);
            // Effects are produced as in production and dropped here.
            let (events, mut drain) = crate::events::channel();
            let original: OriginalDst = Arc::new(move |_: &TcpStream| Some(upstream_addr));
            let (Ok(explicit), Ok(transparent)) = (
                TcpListener::from_std(explicit),
                TcpListener::from_std(transparent),
            ) else {
                return;
            };
            tokio::join!(
                super::serve(explicit, config.clone(), events.clone()),
                super::serve_transparent(transparent, config, events, original),
                async { while drain.recv().await.is_some() {} },
            );
        })?;
        let clocks = Clocks {
            client: ThreadClock::current(),
            proxy: ThreadClock::of(&proxy_thread)?,
            upstream: ThreadClock::of(&upstream_thread)?,
        };
        Ok(Self {
            client: Client {
                upstream: upstream_addr,
                explicit: explicit_addr,
                transparent: transparent_addr,
            },
            clocks,
            stop,
            threads: [upstream_thread, proxy_thread],
        })
    }

    fn stop(self) {
        let _ = self.stop.send(true);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

fn bind() -> io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Runs `make()` on a new thread with its own current-thread runtime
/// until `stop` turns true.
fn spawn_runtime<F, Fut>(
    name: &str,
    mut stop: tokio::sync::watch::Receiver<bool>,
    make: F,
) -> io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                tokio::select! {
                    _ = make() => {}
                    _ = stop.wait_for(|stopped| *stopped) => {}
                }
            });
        })
}

async fn measure(options: &BenchOptions) -> io::Result<BenchReport> {
    let paths: Vec<Path> = [Path::Direct, Path::Connect, Path::Transparent]
        .into_iter()
        .filter(|p| options.paths.is_empty() || options.paths.contains(p))
        .collect();
    let mut samples = vec![Vec::new(); paths.len()];
    let mut cpu = vec![CpuUse::default(); paths.len()];
    // Interleaved so that drift (other load, CPU frequency) hits all alike.
    // Each round starts the upstream and proxy threads afresh: three busy
    // threads share two CPUs, and where the scheduler first puts them can
    // hold for a whole round (a proxied download at 0.65x or at 1.0x of
    // direct); fresh threads make the median one over placements.
    for _ in 0..options.runs.max(1) {
        let servers = Servers::start()?;
        for (i, path) in paths.iter().enumerate() {
            let before = servers.clocks.read();
            let start = Instant::now();
            let downloaded = servers.client.download(*path, options.bytes).await;
            cpu[i].add(
                &servers.clocks.read(),
                &before,
                start.elapsed(),
                options.bytes,
            );
            samples[i].push(downloaded?);
        }
        servers.stop();
    }
    let throughput = paths
        .iter()
        .zip(samples)
        .map(|(p, s)| (*p, median_f64(s)))
        .collect();
    let cpu = paths.iter().copied().zip(cpu).collect();
    let latency_paths = [
        Path::Direct,
        Path::Connect,
        Path::Transparent,
        Path::AbsoluteForm,
    ];
    let latency = if options.requests == 0 {
        Vec::new()
    } else {
        let servers = Servers::start()?;
        let latencies = servers
            .client
            .latency(&latency_paths, options.requests)
            .await;
        servers.stop();
        latency_paths.into_iter().zip(latencies?).collect()
    };
    Ok(BenchReport {
        bytes: options.bytes,
        runs: options.runs.max(1),
        throughput,
        cpu,
        latency,
    })
}

fn percentiles(mut samples: Vec<Duration>) -> Latency {
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

fn median_f64(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

struct Client {
    upstream: SocketAddr,
    explicit: SocketAddr,
    transparent: SocketAddr,
}

impl Client {
    async fn open(&self, path: Path) -> io::Result<TcpStream> {
        let stream = match path {
            Path::Direct => TcpStream::connect(self.upstream).await?,
            Path::Transparent => TcpStream::connect(self.transparent).await?,
            Path::AbsoluteForm => TcpStream::connect(self.explicit).await?,
            Path::Connect => {
                let mut stream = TcpStream::connect(self.explicit).await?;
                let port = self.upstream.port();
                let request =
                    format!("CONNECT {HOST}:{port} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n");
                stream.write_all(request.as_bytes()).await?;
                let (head, _) = read_head(&mut stream).await?;
                if !head.starts_with("HTTP/1.1 200") {
                    return Err(io::Error::other(format!("CONNECT refused: {head}")));
                }
                stream
            }
        };
        stream.set_nodelay(true)?;
        Ok(stream)
    }

    fn request(&self, path: Path, resource: &str) -> String {
        let port = self.upstream.port();
        let target = match path {
            Path::AbsoluteForm => format!("http://{HOST}:{port}{resource}"),
            _ => resource.to_string(),
        };
        format!("GET {target} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n")
    }

    /// Downloads `bytes` and returns MB/s.
    async fn download(&self, path: Path, bytes: u64) -> io::Result<f64> {
        let mut stream = self.open(path).await?;
        let start = Instant::now();
        stream
            .write_all(self.request(path, &format!("/bytes/{bytes}")).as_bytes())
            .await?;
        let (_, mut got) = read_head(&mut stream).await?;
        let mut buf = vec![0u8; CHUNK];
        while (got as u64) < bytes {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "download cut short",
                ));
            }
            got += n;
        }
        Ok(bytes as f64 / start.elapsed().as_secs_f64() / 1e6)
    }

    /// Round trips of a small request on one kept-alive connection.
    /// Round trips of a small request, one kept-alive connection per
    /// path, interleaved request by request so that noise hits all alike.
    async fn latency(&self, paths: &[Path], requests: usize) -> io::Result<Vec<Latency>> {
        let mut streams = Vec::new();
        for path in paths {
            streams.push((self.open(*path).await?, self.request(*path, "/ping")));
        }
        let mut samples = vec![Vec::with_capacity(requests); paths.len()];
        for i in 0..requests + requests / 10 {
            for ((stream, request), samples) in streams.iter_mut().zip(samples.iter_mut()) {
                let start = Instant::now();
                stream.write_all(request.as_bytes()).await?;
                let (_, body) = read_head(stream).await?;
                let mut rest = [0u8; 4];
                stream
                    .read_exact(&mut rest[..4usize.saturating_sub(body)])
                    .await?;
                // The first tenth warms caches and connections up.
                if i >= requests / 10 {
                    samples.push(start.elapsed());
                }
            }
        }
        Ok(samples.into_iter().map(percentiles).collect())
    }
}

/// Reads a response or request head; returns it and how many body bytes
/// came with it (the bench protocol never pipelines, so at most a few).
async fn read_head(stream: &mut TcpStream) -> io::Result<(String, usize)> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed in a head",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            return Ok((head, buf.len() - end - 4));
        }
        if buf.len() > 64 * 1024 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "head too large"));
        }
    }
}

/// The upstream: `GET /bytes/N` answers N zero bytes, anything else a
/// 4-byte `pong`, on kept-alive connections.
async fn serve_upstream(listener: TcpListener) {
    while let Ok((mut stream, _)) = listener.accept().await {
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let zeros = vec![0u8; CHUNK];
            while let Ok((head, _)) = read_head(&mut stream).await {
                let size = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|target| target.rsplit_once("/bytes/"))
                    .and_then(|(_, n)| n.parse::<u64>().ok());
                let result = match size {
                    Some(mut left) => {
                        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {left}\r\n\r\n");
                        let mut result = stream.write_all(head.as_bytes()).await;
                        while left > 0 && result.is_ok() {
                            let n = left.min(CHUNK as u64) as usize;
                            result = stream.write_all(&zeros[..n]).await;
                            left -= n as u64;
                        }
                        result
                    }
                    None => {
                        stream
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\npong")
                            .await
                    }
                };
                if result.is_err() {
                    return;
                }
            }
        });
    }
}
