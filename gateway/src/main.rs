//! The `riceguard` binary: dispatches to the face named by argv.
// A second crate root: the library's `forbid` does not cover it.
#![forbid(unsafe_code)]
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    riceguard::cli::main(args)
}
