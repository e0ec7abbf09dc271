//! Upstream connections: resolve, check every address, connect to a
//! checked address (never re-resolving), and relay bytes both ways.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::sys::socket::{setsockopt, sockopt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::splice::{self, Pipe};
use super::{ProxyError, Resolve, own_addresses, upstream_address_allowed};

/// Relay buffer per direction. Large buffers halve the syscalls of a bulk
/// transfer compared to tokio's 8 KiB default, which is most of the
/// proxy's cost on loopback.
pub const RELAY_BUFFER: usize = 256 * 1024;

/// Send and receive buffer of the agent's side of a tunnel (the kernel
/// doubles it for its bookkeeping). That side is the sandbox's loopback,
/// where a round trip takes microseconds, so a small buffer costs no
/// throughput; it bounds how many bytes wait between the proxy and the
/// agent, which keeps them in cache until the agent reads them. Without
/// it, autotuning grows the buffer to megabytes on a fast loopback and
/// the agent's copies miss the cache. The upstream side keeps autotuning:
/// it crosses a real network, whose bandwidth-delay product a fixed
/// buffer would cap.
pub const AGENT_SOCKET_BUFFER: usize = 256 * 1024;

/// The first resolved address that may not be used, if any. All of a
/// name's addresses must pass: a name that mixes public and internal
/// addresses is a rebinding attempt, not a service to half-use.
pub fn first_refused(addrs: &[SocketAddr], allow_internal: bool) -> Option<IpAddr> {
    addrs
        .iter()
        .map(SocketAddr::ip)
        .find(|ip| !upstream_address_allowed(*ip, allow_internal))
}

/// Resolves `host`, checks every address, and connects to the first
/// checked address that answers, all within `timeout`.
pub(crate) async fn connect_checked(
    resolver: &dyn Resolve,
    host: &str,
    port: u16,
    allow_internal: bool,
    timeout: Duration,
) -> Result<TcpStream, ProxyError> {
    let work = async {
        let addrs = resolver
            .resolve(host, port)
            .await
            .map_err(|source| ProxyError::Resolve {
                host: host.to_string(),
                source,
            })?;
        if let Some(addr) = first_refused(&addrs, allow_internal) {
            return Err(ProxyError::Internal {
                host: host.to_string(),
                addr,
            });
        }
        // The proxy runs on the host: a name that resolves to one of the
        // host's own addresses (public ones too) reaches its services.
        let own = |ip: IpAddr| !allow_internal && own_addresses::is_own_address(ip);
        if let Some(addr) = addrs.iter().map(SocketAddr::ip).find(|ip| own(*ip)) {
            return Err(ProxyError::Internal {
                host: host.to_string(),
                addr,
            });
        }
        let mut last = ProxyError::NoAddress {
            host: host.to_string(),
        };
        for addr in addrs {
            match crate::caller::connect_tcp(addr).await {
                Ok(stream) => {
                    let to_self = stream
                        .local_addr()
                        .is_ok_and(|local| own_addresses::connected_to_self(local, addr));
                    if to_self && !allow_internal {
                        return Err(ProxyError::Internal {
                            host: host.to_string(),
                            addr: addr.ip(),
                        });
                    }
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Err(source) => {
                    last = ProxyError::Connect {
                        host: host.to_string(),
                        addr,
                        source,
                    }
                }
            }
        }
        Err(last)
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| ProxyError::ConnectTimeout {
            host: host.to_string(),
            timeout,
        })?
}

/// Copies `from` to `to` until EOF, counting into `count`, then shuts
/// down the write side so the peer sees the end too.
async fn pump<R, W>(from: &mut R, to: &mut W, count: &AtomicU64) -> std::io::Result<()>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    let mut buf = vec![0u8; RELAY_BUFFER];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        to.write_all(&buf[..n]).await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
    to.shutdown().await
}

/// Relays between the agent's connection and the upstream until both
/// sides are done or either fails, counting bytes as they pass (so the
/// counts are right even when a side resets). Uses `splice(2)` when two
/// pipes can be had, else copies through user space.
pub(crate) async fn relay(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    up: &AtomicU64,
    down: &AtomicU64,
) {
    // Best effort: a refused size leaves autotuning on, which is correct,
    // only slower on loopback.
    let _ = setsockopt(client, sockopt::SndBuf, &AGENT_SOCKET_BUFFER);
    let _ = setsockopt(client, sockopt::RcvBuf, &AGENT_SOCKET_BUFFER);
    if let (Ok(up_pipe), Ok(down_pipe)) = (Pipe::new(), Pipe::new()) {
        let to_upstream = splice::pump(client, upstream, &up_pipe, up);
        let to_client = splice::pump(upstream, client, &down_pipe, down);
        return both(to_upstream, to_client).await;
    }
    let (mut client_read, mut client_write) = client.split();
    let (mut upstream_read, mut upstream_write) = upstream.split();
    let to_upstream = pump(&mut client_read, &mut upstream_write, up);
    let to_client = pump(&mut upstream_read, &mut client_write, down);
    both(to_upstream, to_client).await
}

/// Runs both directions until both end, or until either fails (then the
/// other is dropped: a reset on one side ends the tunnel).
async fn both(
    to_upstream: impl Future<Output = std::io::Result<()>>,
    to_client: impl Future<Output = std::io::Result<()>>,
) {
    tokio::pin!(to_upstream, to_client);
    let (mut up_done, mut down_done) = (false, false);
    while !(up_done && down_done) {
        tokio::select! {
            result = &mut to_upstream, if !up_done => {
                if result.is_err() { return; }
                up_done = true;
            }
            result = &mut to_client, if !down_done => {
                if result.is_err() { return; }
                down_done = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_address_must_pass() {
        let public: SocketAddr = "93.184.216.34:443".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:443".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:443".parse().unwrap();
        assert_eq!(first_refused(&[public], false), None);
        assert_eq!(first_refused(&[public, local], false), Some(local.ip()));
        assert_eq!(first_refused(&[mapped], false), Some(mapped.ip()));
        assert_eq!(first_refused(&[public, local], true), None);
        assert_eq!(first_refused(&[], false), None);
    }
}
