//! The `tartaros` binary. The sandbox init and the service's workers are
//! dispatched here, before any runtime thread exists, so that they start
//! single-threaded; an ordinary user's run goes to the service where one
//! listens; everything else goes to the CLI.

fn main() {
    // A launcher that ignores SIGCHLD (an ignored signal stays ignored
    // across exec) would have our children reaped behind our back: the
    // supervisor's wait and the init's would never see them end.
    // SAFETY: restoring a default disposition takes no memory.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let code = match args.get(1).and_then(|a| a.to_str()) {
        Some(tartaros::init::INIT_ARG) => tartaros::init::main(),
        Some(tartaros::service::WORKER_ARG) => tartaros::service::worker::main(),
        run => {
            // Before any thread: a `> out.txt` of the launcher must not
            // reach the agent as a descriptor (stdio_relay.rs).
            if run == Some("run") {
                // What the relay replaces: the status channel must not be
                // a second open of one of these files (status_guard.rs).
                tartaros::status_guard::remember_standard_streams();
                tartaros::stdio_relay::relay_host_files(&args);
            }
            tartaros::cli_extra::quiet_broken_pipe();
            match tartaros::service::client::delegate(&args) {
                Some(code) => code,
                None => tartaros::cli::main(args),
            }
        }
    };
    std::process::exit(code)
}
