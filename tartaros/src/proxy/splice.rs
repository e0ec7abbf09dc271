//! Zero-copy relaying with `splice(2)`: socket → pipe → socket moves page
//! references inside the kernel instead of copying every byte into the
//! proxy and out again. On loopback the copies are most of a tunnel's
//! cost, so this is what brings a CONNECT transfer close to a direct one.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::Interest;
use tokio::net::TcpStream;

/// Pipe capacity asked for (the kernel keeps its 64 KiB default if this is
/// above `/proc/sys/fs/pipe-max-size` for an unprivileged process). Sized
/// together with the agent-side socket buffer
/// (`upstream::AGENT_SOCKET_BUFFER`): 256 KiB moves enough per splice that
/// syscalls stay cheap, while the bytes in flight towards the agent stay
/// few enough to be still in cache when the agent copies them out. With
/// 1 MiB pipes and autotuned buffers the agent's side needed about 1.8
/// times the CPU per byte (docs/egress.md); 64 KiB costs too many splices.
const PIPE_SIZE: usize = 256 * 1024;

pub(crate) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

impl Pipe {
    pub(crate) fn new() -> io::Result<Self> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 writes two descriptors into the array we own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both are fresh descriptors that
        // nothing else owns.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: fcntl on a descriptor we own; no memory is passed.
        let size = unsafe {
            libc::fcntl(
                write.as_raw_fd(),
                libc::F_SETPIPE_SZ,
                PIPE_SIZE as libc::c_int,
            )
        };
        // SAFETY: as above; F_GETPIPE_SZ only reads the pipe's size.
        let actual = if size > 0 {
            size
        } else {
            unsafe { libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ) }
        };
        Ok(Self {
            read,
            write,
            capacity: usize::try_from(actual).unwrap_or(0).max(4096),
        })
    }
}

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: with null offsets splice reads and writes only the two
    // descriptors; no memory of ours is handed to the kernel.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Moves `from` to `to` through `pipe` until EOF, then half-closes `to`.
/// The pipe is always drained before the next splice in, so an EAGAIN on
/// the way in can only mean "socket not readable" (and on the way out
/// "socket not writable"), which keeps tokio's readiness tracking right.
pub(crate) async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    pipe: &Pipe,
    count: &AtomicU64,
) -> io::Result<()> {
    loop {
        from.readable().await?;
        let n = match from.try_io(Interest::READABLE, || {
            splice(from.as_raw_fd(), pipe.write.as_raw_fd(), pipe.capacity)
        }) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            // Both halves stay open otherwise; the peer sees our EOF.
            return nix::sys::socket::shutdown(to.as_raw_fd(), nix::sys::socket::Shutdown::Write)
                .map_err(io::Error::from);
        }
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                splice(pipe.read.as_raw_fd(), to.as_raw_fd(), left)
            }) {
                Ok(m) => {
                    left -= m;
                    count.fetch_add(m as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn splices_everything_and_passes_eof() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut writer = TcpStream::connect(addr).await.unwrap();
        let (from, _) = listener.accept().await.unwrap();
        let to = TcpStream::connect(addr).await.unwrap();
        let (mut reader, _) = listener.accept().await.unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let write = tokio::spawn(async move {
            writer.write_all(&sent).await.unwrap();
            writer.shutdown().await.unwrap();
        });
        let pipe = Pipe::new().unwrap();
        let count = AtomicU64::new(0);
        let read = async {
            let mut got = Vec::new();
            reader.read_to_end(&mut got).await.unwrap();
            got
        };
        let (pumped, got) = tokio::join!(pump(&from, &to, &pipe, &count), read);
        pumped.unwrap();
        write.await.unwrap();
        assert_eq!(got, data);
        assert_eq!(count.load(Ordering::Relaxed), data.len() as u64);
    }
}
