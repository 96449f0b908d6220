//! The `riceguard` binary: dispatches to the face named by argv.
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    riceguard::cli::main(args)
}
