//! The serial-console configuration CLI. (Skeleton.)
use std::process::ExitCode;

pub fn main(_args: &[String]) -> ExitCode {
    eprintln!("console: not built yet");
    ExitCode::from(1)
}
