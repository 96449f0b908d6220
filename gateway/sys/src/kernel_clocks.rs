//! The kernel's clocks and the RTC: `CLOCK_REALTIME` read, set and slewed, `CLOCK_BOOTTIME`
//! read (deadlines that must not jump with the wall clock), and `/dev/rtc0`, which keeps
//! UTC (`RTC_RD_TIME` / `RTC_SET_TIME`). Policy lives in `core::clock`.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use nix::time::{clock_gettime, clock_settime, ClockId};

use riceguard_core::clock::{Civil, UnixTime};

pub const RTC: &str = "/dev/rtc0";

/// `CLOCK_REALTIME`.
#[allow(clippy::useless_conversion)] // time_t and c_long are i64 on our targets
pub fn realtime() -> UnixTime {
    match clock_gettime(ClockId::CLOCK_REALTIME) {
        Ok(t) => UnixTime::from_nanos(
            t.tv_sec()
                .saturating_mul(1_000_000_000)
                .saturating_add(t.tv_nsec()),
        ),
        Err(_) => UnixTime::EPOCH,
    }
}

/// `CLOCK_BOOTTIME`: monotonic, counts suspend, never stepped.
pub fn boottime() -> Duration {
    clock_gettime(ClockId::CLOCK_BOOTTIME)
        .map(|t| Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32))
        .unwrap_or(Duration::ZERO)
}

/// Set `CLOCK_REALTIME` (needs `CAP_SYS_TIME`).
pub fn set_realtime(t: UnixTime) -> io::Result<()> {
    let ts = nix::sys::time::TimeSpec::new(t.secs() as _, t.nanos().rem_euclid(1_000_000_000) as _);
    clock_settime(ClockId::CLOCK_REALTIME, ts).map_err(io::Error::from)
}

/// Step the clock by `by` ns (read, add, set: the few microseconds between are lost).
pub fn step(by: i64) -> io::Result<()> {
    set_realtime(realtime().add_nanos(by))
}

/// Slew the clock by `by` ns with `adjtime(3)` (about 0.5 ms per second, monotonic time
/// alike); replaces any slew still in progress.
pub fn slew(by: i64) -> io::Result<()> {
    let us = by / 1000;
    let tv = libc::timeval {
        tv_sec: us.div_euclid(1_000_000) as _,
        tv_usec: us.rem_euclid(1_000_000) as _,
    };
    // SAFETY: adjtime reads the timeval we own for the call and writes nothing (the old
    // delta pointer is null).
    let r = unsafe { libc::adjtime(&tv, std::ptr::null_mut()) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `struct rtc_time` of `<linux/rtc.h>`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RtcTime {
    tm_sec: libc::c_int,
    tm_min: libc::c_int,
    tm_hour: libc::c_int,
    tm_mday: libc::c_int,
    tm_mon: libc::c_int,
    tm_year: libc::c_int,
    tm_wday: libc::c_int,
    tm_yday: libc::c_int,
    tm_isdst: libc::c_int,
}

nix::ioctl_read!(rtc_rd_time, b'p', 0x09, RtcTime);
nix::ioctl_write_ptr!(rtc_set_time, b'p', 0x0a, RtcTime);

/// The RTC's time (unix seconds, the RTC keeping UTC). `Ok(None)`: it holds no valid
/// time (never set, battery dead: the driver says `EINVAL`).
pub fn rtc_read(dev: &str) -> io::Result<Option<i64>> {
    let f = OpenOptions::new().read(true).open(dev)?;
    let mut t = RtcTime::default();
    // SAFETY: RTC_RD_TIME writes one struct rtc_time into `t`, which we own and which has
    // the kernel's layout (#[repr(C)], nine ints).
    match unsafe { rtc_rd_time(f.as_raw_fd(), &mut t) } {
        Ok(_) => {}
        Err(nix::errno::Errno::EINVAL) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let c = Civil {
        year: i64::from(t.tm_year) + 1900,
        month: u32::try_from(t.tm_mon + 1).unwrap_or(0),
        day: u32::try_from(t.tm_mday).unwrap_or(0),
        hour: u32::try_from(t.tm_hour).unwrap_or(99),
        minute: u32::try_from(t.tm_min).unwrap_or(99),
        second: u32::try_from(t.tm_sec).unwrap_or(99),
    };
    Ok(c.to_unix())
}

/// Set the RTC to `secs` (unix seconds, UTC).
pub fn rtc_write(dev: &str, secs: i64) -> io::Result<()> {
    let f = OpenOptions::new().write(true).open(dev)?;
    let c = Civil::from_unix(secs);
    let t = RtcTime {
        tm_sec: c.second as _,
        tm_min: c.minute as _,
        tm_hour: c.hour as _,
        tm_mday: c.day as _,
        tm_mon: c.month as libc::c_int - 1,
        tm_year: (c.year - 1900) as _,
        ..RtcTime::default()
    };
    // SAFETY: RTC_SET_TIME reads one struct rtc_time from `t`, which outlives the call.
    unsafe { rtc_set_time(f.as_raw_fd(), &t) }
        .map(|_| ())
        .map_err(io::Error::from)
}

/// The boot id (`/proc/sys/kernel/random/boot_id`): new on every boot.
pub fn boot_id() -> Option<String> {
    let t = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let t = t.trim();
    (!t.is_empty() && t.len() <= 64).then(|| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_read() {
        // Tests assert behaviour, not time: only that the reads work and boot time moves.
        assert!(realtime() > UnixTime::EPOCH);
        let a = boottime();
        let b = boottime();
        assert!(b >= a && a > Duration::ZERO);
        assert!(boot_id().is_some_and(|id| id.len() == 36));
    }

    #[test]
    fn rtc_missing_is_an_error_not_a_panic() {
        assert!(rtc_read("/nonexistent/rtc").is_err());
        assert!(rtc_write("/nonexistent/rtc", 0).is_err());
    }
}
