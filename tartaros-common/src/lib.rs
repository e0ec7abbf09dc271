//! Types shared by the eBPF programs and the supervisor. Every type is
//! `#[repr(C)]` without implicit padding so both sides agree on the layout.
#![no_std]
