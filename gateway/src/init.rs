//! PID 1 of the appliance image. (Skeleton.)
use std::process::ExitCode;

pub fn main(_args: &[String]) -> ExitCode {
    eprintln!("init: not built yet");
    ExitCode::from(1)
}
