//! TartarOS: a local sandbox for AI coding agents on Linux.
//!
//! The library holds every decision (policy, Landlock rules, seccomp rules,
//! mount plan) as pure functions, and one module per kernel mechanism applies
//! them. The binary in `main.rs` is a thin CLI over it.

pub mod broker;
pub mod caller;
pub mod cgroup;
pub mod cli;
pub mod cli_extra;
pub mod config;
pub mod credentials;
pub mod debris;
pub mod decide;
pub mod deputy;
pub mod devfs;
pub mod doctor;
pub mod doctor_report;
pub mod ebpf;
pub mod effectlog;
pub mod egress;
pub mod environment;
pub mod events;
pub mod exit;
pub mod fswatch;
pub mod guarantee;
pub mod harness;
pub mod host_facts;
pub mod identity_map;
pub mod init;
pub mod ipc_limits;
pub mod janitor;
pub mod kernel_watch;
pub mod landlock;
pub mod launch;
pub mod limits;
pub mod link_walk;
pub mod materialize;
pub mod mount_aliases;
pub mod mount_tree;
pub mod mounts;
pub mod network;
pub mod path_checks;
pub mod plan;
pub mod policy;
pub mod port_relay;
pub mod proxy;
pub mod pty;
pub mod pty_helper;
pub mod run_options;
pub mod runlog;
pub mod sched_reset;
pub mod scope;
pub mod seccomp;
pub mod service;
pub mod spawn;
pub mod status;
pub mod stdio_relay;
pub mod stdio_tty;
pub mod stop;
pub mod supervisor;
pub mod tmpfs_bounds;
pub mod tty_state;
pub mod undo;
pub mod unix_mirror;
pub mod warn;
pub mod zygote;
