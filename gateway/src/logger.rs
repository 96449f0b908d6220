//! A small `log` backend: one line per record on stderr (the serial console under
//! init), with a monotonic timestamp and the level.

use std::io::Write;
use std::sync::OnceLock;
use std::time::Instant;

struct Logger {
    start: Instant,
    level: log::LevelFilter,
}

static LOGGER: OnceLock<Logger> = OnceLock::new();

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= self.level
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let t = self.start.elapsed();
        let mut e = std::io::stderr().lock();
        let _ = writeln!(
            e,
            "[{:>5}.{:03}] riceguard {:<5} {}",
            t.as_secs(),
            t.subsec_millis(),
            r.level(),
            r.args()
        );
    }

    fn flush(&self) {}
}

/// Install the logger once; the level comes from `RG_LOG` (error..trace), default info.
pub fn init() {
    let level = match std::env::var("RG_LOG")
        .unwrap_or_default()
        .to_ascii_lowercase()
        .as_str()
    {
        "error" => log::LevelFilter::Error,
        "warn" => log::LevelFilter::Warn,
        "debug" => log::LevelFilter::Debug,
        "trace" => log::LevelFilter::Trace,
        "off" => log::LevelFilter::Off,
        _ => log::LevelFilter::Info,
    };
    let l = LOGGER.get_or_init(|| Logger {
        start: Instant::now(),
        level,
    });
    if log::set_logger(l).is_ok() {
        log::set_max_level(level);
    }
}
