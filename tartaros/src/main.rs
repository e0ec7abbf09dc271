//! The `tartaros` binary. The sandbox init is dispatched
//! here, before any runtime thread exists, so that they start
//! single-threaded; everything else goes to the CLI.

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let code = match args.get(1).and_then(|a| a.to_str()) {
        Some(tartaros::init::INIT_ARG) => tartaros::init::main(),
        _ => {
            tartaros::cli_extra::quiet_broken_pipe();
            tartaros::cli::main(args)
        }
    };
    std::process::exit(code)
}
