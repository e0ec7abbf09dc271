//! TartarOS: a local sandbox for AI coding agents on Linux.
//!
//! The library holds every decision (policy, Landlock rules, seccomp rules,
//! mount plan) as pure functions, and one module per kernel mechanism applies
//! them. The binary in `main.rs` is a thin CLI over it.

pub mod broker;
pub mod cgroup;
pub mod cli;
pub mod credentials;
pub mod doctor;
pub mod ebpf;
pub mod effectlog;
pub mod egress;
pub mod environment;
pub mod events;
pub mod exit;
pub mod forward;
pub mod fswatch;
pub mod init;
pub mod janitor;
pub mod kernel_watch;
pub mod landlock;
pub mod mounts;
pub mod network;
pub mod plan;
pub mod policy;
pub mod probe;
pub mod proxy;
pub mod runlog;
pub mod seccomp;
pub mod spawn;
pub mod supervisor;
