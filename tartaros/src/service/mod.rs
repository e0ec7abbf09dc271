//! `tartaros service`: a root service that runs sandboxes for ordinary
//! users with the whole feature set (cgroups, eBPF capture and filtering,
//! gateways), never with more than the caller could do itself.
//!
//! - [`server`]: accepts connections on a unix socket and starts one
//!   worker process per connection (a fresh exec of our binary, dying with
//!   the service), handing it the maps of the eBPF programs it loaded once
//!   ([`programs`]), and refusing connections over the bounds on workers
//!   still reading their request ([`pending`]) and on runs in progress per
//!   caller ([`running`]);
//! - [`worker`]: authenticates the caller (`SO_PEERCRED`, `SO_PEERGROUPS`;
//!   a caller that is itself a sandboxed agent is refused, [`sandboxed`]),
//!   takes its stdio, and runs the ordinary `tartaros run` path as root with
//!   the caller's identity for the agent and the caller's file access for
//!   everything it creates on the caller's behalf (the log, placeholders);
//! - [`client`]: what `tartaros run` does when an ordinary user runs it and
//!   the socket is there.
//!
//! The wire format is length-prefixed JSON frames ([`frame`]), pure and
//! unit-tested; every request is treated as hostile input.

pub mod client;
pub mod frame;
pub mod pending;
pub mod programs;
pub mod running;
pub mod sandboxed;
pub mod server;
pub mod worker;

use std::path::PathBuf;

/// Where the service listens unless `TARTAROS_SERVICE` names another socket.
pub const DEFAULT_SOCKET: &str = "/run/tartaros/tartaros.sock";
/// The launcher's variable naming another socket (tests, several services).
pub const SOCKET_ENV: &str = "TARTAROS_SERVICE";
/// The hidden argument that makes `main()` run a worker.
pub const WORKER_ARG: &str = "__tartaros_service_worker";

/// The socket the client uses.
pub fn socket_path() -> PathBuf {
    std::env::var_os(SOCKET_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
}
