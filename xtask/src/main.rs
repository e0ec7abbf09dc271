//! Project automation: `cargo xtask <command>`.
mod deps;
mod lab;

fn main() {}
