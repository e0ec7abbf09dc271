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

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{OriginalDst, ProxyConfig, StaticResolver};

mod report;
pub use report::{BenchReport, CpuUse, Latency};
use report::{Clocks, ThreadClock, median_f64, percentiles};

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
