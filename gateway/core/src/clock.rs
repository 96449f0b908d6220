//! The appliance's clock as plain data: the boot floor, the saved time's text, the SNTP
//! v4 packet (RFC 4330 / RFC 5905 §7.3), the offset of one answer, the discipline policy
//! (step, slew or refuse), the per-server poll schedule and the status line. No I/O and
//! no clock reads: wall time ([`UnixTime`]) and boot time (a `Duration` of
//! `CLOCK_BOOTTIME`) come in as arguments. `sys::kernel_clocks` sets the clock,
//! `driver::appliance::ntp` runs the client, `init::clock_floor` sets the floor at boot and
//! saves the time.
//!
//! # Why the rules are what they are
//!
//! WireGuard needs a clock that never goes back, not a correct one: a peer drops an
//! initiation whose TAI64N timestamp is not newer than the last one it saw from us, and
//! boringtun's `Tunn` reads the wall clock once when it is made and adds monotonic time
//! after. So:
//!
//! - **Boot floor.** At boot the clock is set to the latest of the RTC, the saved time
//!   and the image's build time ([`boot_decision`]); the winner is the "source". The
//!   saved time is written [`SAVE_AHEAD`] ahead of the clock every [`SAVE_EVERY`], so
//!   after a power cut the floor is at or past every timestamp the box sent; at a clean
//!   halt (the gateway already stopped) it is the clock plus [`SAVE_AT_HALT`].
//!   Flash wear: 144 periodic writes a day (one every 10 min), plus one per boot, halt and
//!   stepping sync; each is a few 4 KiB blocks with the ext4 journal, under 5 MiB a day.
//!   The cost of the lead: a box that lost power less than 11 min after a save boots up
//!   to 11 min ahead. When the boot before agreed with NTP (its saves record the clock and
//!   that boot's stamp lead: [`SavedTime::agreed`]), its stamps were at most the true time
//!   of the cut plus that lead plus a second, so the first answer of this boot may step the
//!   clock back to the server's time plus that lead plus [`BACK_MARGIN`], never below the
//!   previous save's stamps or the build time ([`Policy::back_to`]). Without it every
//!   power cut would add up to 11 min that nothing takes back. For that boot init holds
//!   the gateway back until the first answer is settled ([`Stamps::settled`], at most
//!   [`GATEWAY_WAIT`]): its `Tunn`s read the wall clock once, so made before a step back
//!   they would stamp ahead of the clock for the rest of the boot. When the wait runs out
//!   first, the NTP client records that lead ([`Stamps::ahead`]), every save adds it to
//!   the floor and the next boot's first answer keeps the clock that far ahead; a `Tunn`
//!   made after the step for a peer that already saw the earlier stamps is dropped by it
//!   until the clock passes them (at most the step).
//! - **Never backward** (but the first answer after a power cut, above). A backward step
//!   would make every `Tunn` created after it (a reconfiguration, the next boot) stamp
//!   lower than what the peers last saw: they drop its initiations until the clock catches
//!   up. So the policy never steps backward:
//!   corrections back of up to [`MAX_BACKWARD`] are slewed (adjtime: the clock runs
//!   slower, never back, and `CLOCK_MONOTONIC` is slewed alike, so the stamps of older
//!   `Tunn`s stay in step with it); larger ones are refused and `show status` says so.
//! - **Step at the first sync, slew after.** The first accepted answer steps the clock
//!   forward (or slews a small backward offset); later ones slew up to
//!   [`STEP_THRESHOLD`] and step forward beyond it.
//! - **Bounded forward.** SNTP is unauthenticated, and option 42 comes from the uplink's
//!   DHCP server, which the gateway does not trust (it may be hostile). One far-future answer would
//!   become the floor and every peer's last-seen timestamp: a lock-out that survives
//!   reboots (nothing can go back again). So one server may move the clock at most
//!   [`MAX_SINGLE_AHEAD`] (24 h) ahead of the boot floor plus the boot time elapsed since
//!   (the "expected" time; summed over the boot, so small steps do not creep further).
//!   Beyond that a step needs answers from at least two servers at different IP
//!   addresses that agree within [`AGREE`] (2 s), and both must be IP addresses written
//!   in `[Gateway] Ntp` ([`Origin::Address`]: chosen by the owner). Servers named by DHCP
//!   are the uplink's word, and so is every address a configured *name* resolves to: the
//!   resolver is the one DHCP names, so all of them, however many names, are one source
//!   ([`Origin::Name`]). Neither can make a far step, alone or together. An agreed step
//!   becomes the new "expected" base. This stops the DHCP and DNS tricks, not a rogue
//!   router: SNTP is unauthenticated, and whoever routes our packets can forge every
//!   server's answer; the 24 h bound is the limit there. Staying behind is harmless to
//!   WireGuard (only log dates suffer); running ahead is not.
//! - **Never past 2200.** No answer sets the clock past [`LATEST_NTP`] (a day short of
//!   [`LATEST_PLAUSIBLE`]), however many servers agree: the next boot would not believe
//!   a saved time or an RTC past 2200, fall back to the build time, and every peer would
//!   refuse our handshakes (their last-seen stamps are far ahead).
//! - **What an answer must be.** Mode 4 (server), version 3 or 4, the originate timestamp
//!   equal to the 64-bit random cookie we sent as our transmit timestamp (an off-path
//!   forger must guess it; it also leaks nothing of our clock), stratum 1–15, leap
//!   indicator not 3 (unsynchronised), non-zero receive and transmit timestamps.
//!   Stratum 0 is a kiss-o'-death (checked after the cookie, so a forger cannot send one):
//!   `RATE` doubles that server's poll interval, `DENY` and `RSTR` stop using it.
//! - **NTP eras.** NTP seconds are 32-bit since 1900 and wrap in 2036: a timestamp is read
//!   in the 136-year window centred on our own clock ([`ntp_to_unix`]); a wrong era would
//!   be a jump of 136 years, which the forward bound refuses anyway.
//! - **Polling.** 64 s to 1024 s per server, doubling after each good answer; an
//!   unanswered query backs off from 16 s doubling to 1024 s; a send that could not leave
//!   (no route yet) is retried in 5 s, as nothing reached the server.
//!
//! # Own code, not `sntpc`
//!
//! `sntpc` (0.3–0.5) is a good small client, but it owns the socket and the clock read
//! (its `NtpTimestampGenerator` and `NtpUdpSocket` traits), checks neither the cookie
//! the way we want nor the kiss codes as policy, and its version churn changes that
//! API. What we need is one 48-byte packet with a checked reader (smoltcp style, fuzzed:
//! `fuzz/fuzz_targets/sntp.rs`), plus the policy above, which no crate has. About 200
//! lines of wire code against a dependency for the same.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

const NANOS: i64 = 1_000_000_000;

/// Nanoseconds since the Unix epoch (UTC, no leap seconds). Signed: an RTC at 1970 minus
/// a correction, and offsets, are representable; covers 1678..2262.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixTime(i64);

impl UnixTime {
    pub const EPOCH: UnixTime = UnixTime(0);

    pub const fn from_nanos(ns: i64) -> UnixTime {
        UnixTime(ns)
    }
    pub const fn from_secs(s: i64) -> UnixTime {
        UnixTime(s.saturating_mul(NANOS))
    }
    pub const fn nanos(self) -> i64 {
        self.0
    }
    /// Whole seconds, rounded down.
    pub const fn secs(self) -> i64 {
        self.0.div_euclid(NANOS)
    }
    pub const fn add_nanos(self, d: i64) -> UnixTime {
        UnixTime(self.0.saturating_add(d))
    }
    pub fn plus(self, d: Duration) -> UnixTime {
        self.add_nanos(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }
    /// `self - earlier` in nanoseconds (negative if `earlier` is later).
    pub const fn since(self, earlier: UnixTime) -> i64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// ISO 8601 in UTC, to the second: `2026-11-30T12:34:56Z`.
impl fmt::Display for UnixTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = Civil::from_unix(self.secs());
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            c.year, c.month, c.day, c.hour, c.minute, c.second
        )
    }
}

/// A UTC calendar time, as an RTC keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Civil {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

impl Civil {
    /// From Unix seconds (Howard Hinnant's `civil_from_days`).
    pub fn from_unix(secs: i64) -> Civil {
        let days = secs.div_euclid(86_400);
        let sod = secs.rem_euclid(86_400);
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        Civil {
            year,
            month,
            day,
            hour: (sod / 3600) as u32,
            minute: (sod / 60 % 60) as u32,
            second: (sod % 60) as u32,
        }
    }

    /// To Unix seconds; `None` when a field is out of range (an RTC read as garbage).
    pub fn to_unix(&self) -> Option<i64> {
        if !(1..=12).contains(&self.month)
            || !(1..=31).contains(&self.day)
            || self.hour > 23
            || self.minute > 59
            || self.second > 60
            || !(1..=9999).contains(&self.year)
        {
            return None;
        }
        let y = self.year - i64::from(self.month <= 2);
        let era = y.div_euclid(400);
        let yoe = y.rem_euclid(400);
        let m = i64::from(self.month);
        let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(self.day) - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        Some(
            days * 86_400
                + i64::from(self.hour) * 3600
                + i64::from(self.minute) * 60
                + i64::from(self.second),
        )
    }
}

// ---------------------------------------------------------------------------------------
// The boot floor and the saved time.

/// How often init saves the time to perm.
pub const SAVE_EVERY: Duration = Duration::from_secs(600);
/// How far ahead of the clock a periodic save is: the interval plus a minute for a late or
/// slow write, so the saved time stays ahead of the clock between saves.
pub const SAVE_AHEAD: Duration = Duration::from_secs(660);
/// Ahead at a clean halt, when the gateway has already stopped sending.
pub const SAVE_AT_HALT: Duration = Duration::from_secs(2);
/// Times after this (2200-01-01) are not believed from a file or an RTC.
pub const LATEST_PLAUSIBLE: i64 = 7_258_118_400;
/// No NTP answer sets the clock past this (unix seconds): a day short of
/// [`LATEST_PLAUSIBLE`], so the saved time, written ahead of the clock, stays believable.
pub const LATEST_NTP: i64 = LATEST_PLAUSIBLE - 86_400;

/// Where the clock at boot came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootSource {
    Rtc,
    Saved,
    Build,
}

impl BootSource {
    pub fn name(self) -> &'static str {
        match self {
            BootSource::Rtc => "rtc",
            BootSource::Saved => "saved",
            BootSource::Build => "build",
        }
    }
    pub fn parse(s: &str) -> Option<BootSource> {
        Some(match s {
            "rtc" => BootSource::Rtc,
            "saved" => BootSource::Saved,
            "build" => BootSource::Build,
            _ => return None,
        })
    }
}

/// What init does with the clock at boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootDecision {
    /// The latest of the candidates (unix seconds), if any was known.
    pub floor: Option<i64>,
    /// Set the clock to this (it is behind the floor); `None`: leave it.
    pub set_to: Option<i64>,
    /// The winner; `Rtc` also when the clock (which the kernel set from the RTC) is
    /// already at or past the floor.
    pub source: BootSource,
}

/// The boot floor: the latest of `rtc`, `saved` and `build` (unix seconds; ties go to
/// the RTC, then the saved time), compared with the clock as it is (`now`).
pub fn boot_decision(
    now: i64,
    rtc: Option<i64>,
    saved: Option<i64>,
    build: Option<i64>,
) -> BootDecision {
    let mut best: Option<(i64, BootSource)> = None;
    for (t, s) in [
        (rtc, BootSource::Rtc),
        (saved, BootSource::Saved),
        (build, BootSource::Build),
    ] {
        if let Some(t) = t.filter(|&t| (0..=LATEST_PLAUSIBLE).contains(&t)) {
            if best.is_none_or(|(b, _)| t > b) {
                best = Some((t, s));
            }
        }
    }
    match best {
        Some((floor, source)) if now < floor => BootDecision {
            floor: Some(floor),
            set_to: Some(floor),
            source,
        },
        _ => BootDecision {
            floor: best.map(|b| b.0),
            set_to: None,
            source: BootSource::Rtc,
        },
    }
}

/// The saved time's (or build time's) text: unix seconds and a newline.
pub fn time_text(secs: i64) -> String {
    format!("{secs}\n")
}

/// Read [`time_text`]'s form; anything else (empty, torn, implausible) is `None`.
pub fn parse_time_text(text: &str) -> Option<i64> {
    let t: i64 = text.trim().parse().ok()?;
    (0..=LATEST_PLAUSIBLE).contains(&t).then_some(t)
}

/// This boot's handshake stamps against its clock, kept by the NTP client in
/// `/run/riceguard/clock.stamps` and read by every save: `ahead` ns, by which the `Tunn`s
/// made before a step back stamp ahead of the clock (they read the wall clock once), and
/// whether the clock `agrees` with NTP now, and whether the first answer of the boot has
/// been `settled` (acted on or refused: init holds the gateway back until then after a
/// power cut, see the module comment).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamps {
    pub ahead: i64,
    pub agrees: bool,
    pub settled: bool,
}

impl Stamps {
    pub fn to_text(&self) -> String {
        format!(
            "ahead_ns {}\nagrees {}\nsettled {}\n",
            self.ahead,
            u8::from(self.agrees),
            u8::from(self.settled)
        )
    }
    /// Anything unreadable is "nothing known": no lead, not agreeing.
    pub fn from_text(text: &str) -> Stamps {
        let mut st = Stamps::default();
        for l in text.lines().take(8) {
            match l.split_once(' ') {
                Some(("ahead_ns", v)) => st.ahead = v.trim().parse().unwrap_or(0).max(0),
                Some(("agrees", v)) => st.agrees = v.trim() == "1",
                Some(("settled", v)) => st.settled = v.trim() == "1",
                _ => {}
            }
        }
        st
    }
}

/// The saved time on perm: the floor (unix seconds: the clock plus this boot's stamp lead
/// plus the save's lead), and, when the clock agreed with NTP at that save, the clock it
/// was made at and the stamp lead then (`agreed WALL AHEAD_NS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SavedTime {
    pub floor: i64,
    pub agreed: Option<(i64, i64)>,
}

impl SavedTime {
    /// The save made at clock `now` with `stamps`, `lead` ahead.
    pub fn at(now: UnixTime, stamps: Stamps, lead: Duration) -> SavedTime {
        SavedTime {
            floor: now.add_nanos(stamps.ahead).plus(lead).secs(),
            agreed: stamps.agrees.then(|| (now.secs(), stamps.ahead)),
        }
    }
    /// `FLOOR\n`, then `agreed WALL AHEAD_NS\n` when known.
    pub fn to_text(&self) -> String {
        match self.agreed {
            Some((w, a)) => format!("{}\nagreed {w} {a}\n", self.floor),
            None => time_text(self.floor),
        }
    }
    /// The first line as [`parse_time_text`] reads it; an `agreed` line that does not read,
    /// or does not lie below the floor, is left out (then no step back).
    pub fn from_text(text: &str) -> Option<SavedTime> {
        let mut lines = text.lines();
        let floor = parse_time_text(lines.next()?)?;
        let agreed = lines
            .find_map(|l| l.strip_prefix("agreed "))
            .and_then(|v| {
                let (w, a) = v.trim().split_once(' ')?;
                Some((
                    parse_time_text(w)?,
                    a.parse::<i64>().ok().filter(|&a| a >= 0)?,
                ))
            })
            .filter(|&(w, a)| w.saturating_add(a / NANOS) <= floor);
        Some(SavedTime { floor, agreed })
    }
}

/// How far back the first answer of this boot may step the clock ([`Policy::back_to`]):
/// when this boot's floor is the saved time and the clock agreed with NTP at that save,
/// never below that save's stamps (`WALL + AHEAD`, or the build time if later), and
/// `AHEAD` past the server's time (the previous boot's stamps ran that far ahead of its
/// clock). `None`: never back.
pub fn back_floor(
    source: BootSource,
    saved: Option<SavedTime>,
    build: Option<i64>,
) -> Option<(UnixTime, i64)> {
    let (w, a) = saved.filter(|_| source == BootSource::Saved)?.agreed?;
    let min = UnixTime::from_secs(w).add_nanos(a);
    Some((build.map_or(min, |b| min.max(UnixTime::from_secs(b))), a))
}

/// What init recorded about the boot floor in `/run/riceguard/clock.boot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootRecord {
    pub source: BootSource,
    /// The clock right after init set (or kept) it.
    pub wall: UnixTime,
    /// `CLOCK_BOOTTIME` then.
    pub boot: Duration,
    /// [`back_floor`]: how far back the first answer may step the clock, and the extra
    /// lead past the server's time.
    pub back_to: Option<(UnixTime, i64)>,
}

impl BootRecord {
    pub fn to_text(&self) -> String {
        let mut t = format!(
            "source {}\nwall_ns {}\nboot_ns {}\n",
            self.source.name(),
            self.wall.nanos(),
            self.boot.as_nanos()
        );
        if let Some((b, a)) = self.back_to {
            t.push_str(&format!("back_to_ns {} {a}\n", b.nanos()));
        }
        t
    }
    pub fn from_text(text: &str) -> Option<BootRecord> {
        let (mut source, mut wall, mut boot, mut back_to) = (None, None, None, None);
        for l in text.lines().take(16) {
            match l.split_once(' ') {
                Some(("source", v)) => source = BootSource::parse(v.trim()),
                Some(("wall_ns", v)) => wall = v.trim().parse().ok().map(UnixTime::from_nanos),
                Some(("boot_ns", v)) => boot = v.trim().parse().ok().map(Duration::from_nanos),
                Some(("back_to_ns", v)) => {
                    back_to = v.trim().split_once(' ').and_then(|(b, a)| {
                        Some((UnixTime::from_nanos(b.parse().ok()?), a.parse().ok()?))
                    })
                }
                _ => {}
            }
        }
        Some(BootRecord {
            source: source?,
            wall: wall?,
            boot: boot?,
            back_to,
        })
    }
}

// ---------------------------------------------------------------------------------------
// The SNTP packet.

pub const PORT: u16 = 123;
/// The fixed header; extension fields and a MAC may follow and are ignored.
pub const PACKET_LEN: usize = 48;
/// Seconds from 1900-01-01 (NTP era 0) to 1970-01-01.
pub const NTP_UNIX_OFFSET: i64 = 2_208_988_800;
const MODE_CLIENT: u8 = 3;
const MODE_SERVER: u8 = 4;

mod field {
    pub type Field = core::ops::Range<usize>;
    pub const LI_VN_MODE: usize = 0;
    pub const STRATUM: usize = 1;
    pub const REF_ID: Field = 12..16;
    pub const ORIGINATE: Field = 24..32;
    pub const RECEIVE: Field = 32..40;
    pub const TRANSMIT: Field = 40..48;
}

/// A kiss-o'-death code (RFC 5905 §7.4), from a stratum-0 answer's reference id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kiss {
    /// Slow down.
    Rate,
    /// Access denied: stop using this server.
    Deny,
    /// Access restricted: stop using this server.
    Rstr,
    Other([u8; 4]),
}

impl Kiss {
    fn from_ref_id(id: [u8; 4]) -> Kiss {
        match &id {
            b"RATE" => Kiss::Rate,
            b"DENY" => Kiss::Deny,
            b"RSTR" => Kiss::Rstr,
            _ => Kiss::Other(id),
        }
    }
}

impl fmt::Display for Kiss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kiss::Rate => f.write_str("RATE"),
            Kiss::Deny => f.write_str("DENY"),
            Kiss::Rstr => f.write_str("RSTR"),
            Kiss::Other(c) => {
                for &b in c {
                    let ch = if b.is_ascii_graphic() { b as char } else { '?' };
                    write!(f, "{ch}")?;
                }
                Ok(())
            }
        }
    }
}

/// Why an SNTP answer was not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SntpError {
    /// Shorter than the 48-byte header.
    Truncated { len: usize },
    /// Not a server's answer (mode 4).
    NotServer { mode: u8 },
    /// Version not 3 or 4.
    Version { version: u8 },
    /// The originate timestamp is not the cookie we sent: a late, duplicated or forged
    /// packet. Ignored; the query stays open.
    WrongOriginate,
    /// Stratum 0: the server tells us to slow down or go away.
    KissOfDeath(Kiss),
    /// Leap indicator 3: the server's own clock is not synchronised.
    Unsynchronised,
    /// Stratum 16 or more (unsynchronised or reserved).
    Stratum { stratum: u8 },
    /// A zero receive or transmit timestamp: not a time.
    ZeroTimestamp,
}

impl fmt::Display for SntpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SntpError::Truncated { len } => {
                write!(
                    f,
                    "answer of {len} bytes is shorter than an NTP header (48)"
                )
            }
            SntpError::NotServer { mode } => write!(f, "mode {mode} is not a server's answer"),
            SntpError::Version { version } => write!(f, "NTP version {version} (want 3 or 4)"),
            SntpError::WrongOriginate => {
                f.write_str("originate timestamp is not the one we sent (late or forged)")
            }
            SntpError::KissOfDeath(k) => write!(f, "kiss-o'-death {k}"),
            SntpError::Unsynchronised => {
                f.write_str("the server says its clock is unsynchronised (leap indicator 3)")
            }
            SntpError::Stratum { stratum } => {
                write!(f, "stratum {stratum}: the server is not synchronised")
            }
            SntpError::ZeroTimestamp => f.write_str("a zero receive or transmit timestamp"),
        }
    }
}

impl std::error::Error for SntpError {}

/// An SNTP packet over a buffer (smoltcp style): [`Packet::new_checked`] for what came
/// from the network.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }
    /// A buffer long enough to hold the header.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, SntpError> {
        let len = buffer.as_ref().len();
        if len < PACKET_LEN {
            return Err(SntpError::Truncated { len });
        }
        Ok(Packet { buffer })
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    fn u64_at(&self, r: field::Field) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&self.b()[r]);
        u64::from_be_bytes(a)
    }
    pub fn leap(&self) -> u8 {
        self.b()[field::LI_VN_MODE] >> 6
    }
    pub fn version(&self) -> u8 {
        (self.b()[field::LI_VN_MODE] >> 3) & 7
    }
    pub fn mode(&self) -> u8 {
        self.b()[field::LI_VN_MODE] & 7
    }
    pub fn stratum(&self) -> u8 {
        self.b()[field::STRATUM]
    }
    pub fn ref_id(&self) -> [u8; 4] {
        let mut a = [0u8; 4];
        a.copy_from_slice(&self.b()[field::REF_ID]);
        a
    }
    pub fn originate(&self) -> u64 {
        self.u64_at(field::ORIGINATE)
    }
    pub fn receive(&self) -> u64 {
        self.u64_at(field::RECEIVE)
    }
    pub fn transmit(&self) -> u64 {
        self.u64_at(field::TRANSMIT)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_header(&mut self, leap: u8, version: u8, mode: u8) {
        self.buffer.as_mut()[field::LI_VN_MODE] = (leap & 3) << 6 | (version & 7) << 3 | mode & 7;
    }
    pub fn set_stratum(&mut self, s: u8) {
        self.buffer.as_mut()[field::STRATUM] = s;
    }
    pub fn set_ref_id(&mut self, id: [u8; 4]) {
        self.buffer.as_mut()[field::REF_ID].copy_from_slice(&id);
    }
    pub fn set_originate(&mut self, v: u64) {
        self.buffer.as_mut()[field::ORIGINATE].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_receive(&mut self, v: u64) {
        self.buffer.as_mut()[field::RECEIVE].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_transmit(&mut self, v: u64) {
        self.buffer.as_mut()[field::TRANSMIT].copy_from_slice(&v.to_be_bytes());
    }
}

/// Our query: version 4, mode 3, everything zero but the transmit timestamp, which holds
/// a random `cookie` instead of our clock (the server echoes it as the originate).
pub fn emit_request(cookie: u64) -> [u8; PACKET_LEN] {
    let mut buf = [0u8; PACKET_LEN];
    let mut p = Packet::new_unchecked(&mut buf[..]);
    p.set_header(0, 4, MODE_CLIENT);
    p.set_transmit(cookie);
    buf
}

/// A checked server answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub stratum: u8,
    /// The server's receive and transmit timestamps (NTP format).
    pub receive: u64,
    pub transmit: u64,
}

impl Reply {
    /// Check an answer to the query that carried `cookie` (order: form, cookie, then
    /// what the server says, so nobody off-path can make us act on a kiss).
    pub fn parse(bytes: &[u8], cookie: u64) -> Result<Reply, SntpError> {
        let p = Packet::new_checked(bytes)?;
        if p.mode() != MODE_SERVER {
            return Err(SntpError::NotServer { mode: p.mode() });
        }
        if !(3..=4).contains(&p.version()) {
            return Err(SntpError::Version {
                version: p.version(),
            });
        }
        if p.originate() != cookie {
            return Err(SntpError::WrongOriginate);
        }
        if p.stratum() == 0 {
            return Err(SntpError::KissOfDeath(Kiss::from_ref_id(p.ref_id())));
        }
        if p.leap() == 3 {
            return Err(SntpError::Unsynchronised);
        }
        if p.stratum() > 15 {
            return Err(SntpError::Stratum {
                stratum: p.stratum(),
            });
        }
        if p.receive() == 0 || p.transmit() == 0 {
            return Err(SntpError::ZeroTimestamp);
        }
        Ok(Reply {
            stratum: p.stratum(),
            receive: p.receive(),
            transmit: p.transmit(),
        })
    }
}

/// An NTP timestamp (32.32 fixed point since 1900, any era) as the Unix time in the
/// 136-year window centred on `pivot` (our clock).
pub fn ntp_to_unix(ts: u64, pivot: UnixTime) -> UnixTime {
    const ERA: i64 = 1 << 32;
    let secs32 = (ts >> 32) as i64;
    let frac_ns = (((ts & 0xffff_ffff) as u128 * NANOS as u128) >> 32) as i64;
    let base = pivot.secs().saturating_add(NTP_UNIX_OFFSET);
    let era = (base - secs32 + ERA / 2).div_euclid(ERA);
    let secs = era * ERA + secs32 - NTP_UNIX_OFFSET;
    UnixTime::from_secs(secs).add_nanos(frac_ns)
}

/// A Unix time as an NTP timestamp (its era dropped): for tests and test servers.
pub fn unix_to_ntp(t: UnixTime) -> u64 {
    let secs = (t.secs() + NTP_UNIX_OFFSET).rem_euclid(1 << 32) as u64;
    let ns = t.nanos().rem_euclid(NANOS) as u128;
    let frac = ((ns << 32) / NANOS as u128) as u64;
    secs << 32 | frac
}

/// What one answer says about our clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Add this (ns) to our clock to be right.
    pub offset: i64,
    /// Round trip minus the server's own time (ns), at least 0.
    pub delay: i64,
}

impl Sample {
    /// From the wall clock when the query left (`sent`), the round trip measured on the
    /// monotonic clock (so our own clock changing meanwhile does not matter), and the
    /// answer: offset = ((T2 - T1) + (T3 - T4)) / 2.
    pub fn new(sent: UnixTime, rtt: Duration, reply: &Reply) -> Sample {
        let rtt = i64::try_from(rtt.as_nanos()).unwrap_or(i64::MAX) as i128;
        let t1 = sent.nanos() as i128;
        let t4 = t1 + rtt;
        let t2 = ntp_to_unix(reply.receive, sent).nanos() as i128;
        let t3 = ntp_to_unix(reply.transmit, sent).nanos() as i128;
        let offset = ((t2 - t1) + (t3 - t4)) / 2;
        let delay = (rtt - (t3 - t2)).max(0);
        let clamp = |v: i128| v.clamp(i64::MIN as i128, i64::MAX as i128) as i64;
        Sample {
            offset: clamp(offset),
            delay: clamp(delay),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The policy.

/// Forward offsets beyond this are stepped after the first sync, smaller ones slewed.
pub const STEP_THRESHOLD: i64 = NANOS / 2;
/// Backward corrections up to this are slewed; larger ones refused.
pub const MAX_BACKWARD: i64 = NANOS;
/// How far one server may move the clock ahead of the expected time (boot floor plus
/// boot time since).
pub const MAX_SINGLE_AHEAD: i64 = 24 * 3600 * NANOS;
/// Two servers agree when their times are this close.
pub const AGREE: i64 = 2 * NANOS;
/// An observation of another server counts for agreement this long.
pub const AGREE_WINDOW: Duration = Duration::from_secs(600);
/// How far past the server's time the first answer after a power cut steps back to (the
/// answer's own error); under [`MAX_BACKWARD`], so the next answers slew the rest.
pub const BACK_MARGIN: i64 = NANOS / 2;
/// How long init holds the gateway back after a power cut for the first answer that may
/// step the clock back (see the module comment).
pub const GATEWAY_WAIT: Duration = Duration::from_secs(8);
/// An answer slower than this is too vague to set a clock by.
pub const MAX_DELAY: i64 = 5 * NANOS;

/// What to do with the clock after an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Step by `by` ns: forward (≥ 0), or back once after a power cut ([`Policy::back_to`]);
    /// `agreed`: a far step two servers agreed on.
    Step {
        by: i64,
        agreed: bool,
    },
    /// Slew by `by` ns (either sign, small).
    Slew {
        by: i64,
    },
    Refused(Refusal),
}

/// Why an answer did not change the clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Our clock is ahead of the server by more than [`MAX_BACKWARD`].
    Backward { by: i64 },
    /// A step this far ahead of the expected time needs two servers given as IP
    /// addresses in `[Gateway] Ntp` agreeing; `origin`: where this one came from.
    FarFuture { ahead: i64, origin: Origin },
    /// The answer's time (`at`) is past [`LATEST_NTP`]: far-future however many agree.
    PastLatest { at: UnixTime },
    /// The answer took too long.
    Delay { delay: i64 },
}

/// Nanoseconds as `+1.234 s` / `-3 h 2 min`: short and readable.
pub fn fmt_offset(ns: i64) -> String {
    let sign = if ns < 0 { '-' } else { '+' };
    let a = ns.unsigned_abs();
    let s = a / NANOS as u64;
    // Rounded to the nearest unit: a server 30 days ahead, asked a moment later, is "30 d".
    let near = |unit: u64| (s + unit / 2) / unit;
    if s < 120 {
        format!("{sign}{}.{:03} s", s, a % NANOS as u64 / 1_000_000)
    } else if s < 7200 {
        format!("{sign}{} min", near(60))
    } else if s < 3 * 86_400 {
        format!("{sign}{} h", near(3600))
    } else {
        format!("{sign}{} d", near(86_400))
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Refusal::Backward { by } => write!(
                f,
                "our clock is {} ahead of it: backward corrections over 1 s are refused (handshake timestamps must never go back)",
                fmt_offset(-by).trim_start_matches('+')
            ),
            Refusal::FarFuture { ahead, origin: Origin::Address } => write!(
                f,
                "its time is {} past the boot floor: a step over 24 h needs two `gateway ntp` servers given as IP addresses agreeing within 2 s",
                fmt_offset(ahead).trim_start_matches('+')
            ),
            Refusal::FarFuture { ahead, origin: Origin::Name } => write!(
                f,
                "its time is {} past the boot floor: addresses from the uplink's DNS are one source, however many names and addresses, and may not step the clock over 24 h (give two `gateway ntp` servers as IP addresses)",
                fmt_offset(ahead).trim_start_matches('+')
            ),
            Refusal::FarFuture { ahead, origin: Origin::Dhcp } => write!(
                f,
                "its time is {} past the boot floor: servers from DHCP may not step the clock over 24 h (give two `gateway ntp` servers as IP addresses)",
                fmt_offset(ahead).trim_start_matches('+')
            ),
            Refusal::PastLatest { at } => write!(
                f,
                "its time {at} is far-future: the clock is never set past {} (a later saved time or RTC is not believed at boot)",
                UnixTime::from_secs(LATEST_NTP)
            ),
            Refusal::Delay { delay } => write!(
                f,
                "the answer took {}: too slow to set a clock by",
                fmt_offset(delay).trim_start_matches('+')
            ),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Observation {
    addr: SocketAddr,
    /// What the server's time was at boot time `at`.
    time: UnixTime,
    at: Duration,
    origin: Origin,
}

/// The discipline: decides per answer, remembering the expected time and the last
/// answer of each server (for agreement).
#[derive(Debug, Clone)]
pub struct Policy {
    /// The expected time is `base_wall` at boot time `base_boot`, advancing with it.
    base_wall: UnixTime,
    base_boot: Duration,
    synced: bool,
    seen: Vec<Observation>,
    /// The first answer may step back, to no earlier than `.0` and `.1` ns past the
    /// server's time (see the module comment); gone after it.
    back_to: Option<(UnixTime, i64)>,
}

impl Policy {
    /// `wall` at boot time `boot` is the trusted base: the boot floor as init set it.
    pub fn new(wall: UnixTime, boot: Duration) -> Policy {
        Policy {
            base_wall: wall,
            base_boot: boot,
            synced: false,
            seen: Vec::new(),
            back_to: None,
        }
    }

    /// Let the first answer step the clock back (the boot record's
    /// [`BootRecord::back_to`]).
    pub fn back_to(mut self, floor: Option<(UnixTime, i64)>) -> Policy {
        self.back_to = floor;
        self
    }

    /// Whether an answer has been used.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// The expected time at boot time `now`.
    pub fn expected(&self, now: Duration) -> UnixTime {
        self.base_wall.plus(now.saturating_sub(self.base_boot))
    }

    /// Decide on `s` from `addr` (`origin`: where its address came from), our clock
    /// being `wall` at boot time `now`. The caller applies a `Step` or `Slew`.
    pub fn decide(
        &mut self,
        addr: SocketAddr,
        origin: Origin,
        wall: UnixTime,
        now: Duration,
        s: &Sample,
    ) -> Decision {
        if s.delay > MAX_DELAY {
            return Decision::Refused(Refusal::Delay { delay: s.delay });
        }
        let target = wall.add_nanos(s.offset);
        // Every decision below moves the clock to `target` or back: refused here, the
        // answer neither moves it nor counts for agreement.
        if target > UnixTime::from_secs(LATEST_NTP) {
            return Decision::Refused(Refusal::PastLatest { at: target });
        }
        self.seen
            .retain(|o| o.addr != addr && now.saturating_sub(o.at) <= AGREE_WINDOW);
        // Two sources: configured IP addresses, and different hosts (two ports of one
        // address are one server).
        let agreeing = origin == Origin::Address
            && self
                .seen
                .iter()
                .filter(|o| o.origin == Origin::Address && o.addr.ip() != addr.ip())
                .any(|o| o.time.plus(now.saturating_sub(o.at)).since(target).abs() <= AGREE);
        self.seen.push(Observation {
            addr,
            time: target,
            at: now,
            origin,
        });
        if let Some((floor, lead)) = self.back_to.take().filter(|_| !self.synced) {
            let to = target
                .add_nanos(lead.saturating_add(BACK_MARGIN))
                .max(floor);
            let by = to.since(wall);
            if by < -MAX_BACKWARD {
                self.synced = true;
                return Decision::Step { by, agreed: false };
            }
        }
        if s.offset < -MAX_BACKWARD {
            return Decision::Refused(Refusal::Backward { by: s.offset });
        }
        let ahead = target.since(self.expected(now));
        if s.offset > 0 && (ahead > MAX_SINGLE_AHEAD || s.offset > MAX_SINGLE_AHEAD) {
            if !agreeing {
                return Decision::Refused(Refusal::FarFuture { ahead, origin });
            }
            self.base_wall = target;
            self.base_boot = now;
            self.synced = true;
            return Decision::Step {
                by: s.offset,
                agreed: true,
            };
        }
        let first = !self.synced;
        self.synced = true;
        if s.offset >= 0 && (first || s.offset > STEP_THRESHOLD) {
            Decision::Step {
                by: s.offset,
                agreed: false,
            }
        } else {
            Decision::Slew { by: s.offset }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The poll schedule.

pub const MIN_POLL: Duration = Duration::from_secs(64);
pub const MAX_POLL: Duration = Duration::from_secs(1024);
/// First wait after an unanswered query; doubles to [`MAX_POLL`].
pub const RETRY_FIRST: Duration = Duration::from_secs(16);
/// After a send that could not leave (no route yet).
pub const RETRY_UNSENT: Duration = Duration::from_secs(5);
/// How long a query waits for its answer.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(3);

/// Where a server's address came from, which decides what its word may do to the clock
/// (see the module comment, "Bounded forward").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// An IP address written in `[Gateway] Ntp`: chosen by the owner, a source of its own;
    /// two of them agreeing may step the clock far.
    Address,
    /// An address of a host name in `[Gateway] Ntp`, resolved through the uplink's DNS
    /// (the resolver DHCP names): all of them, however many names, are one source, which
    /// never steps the clock far.
    Name,
    /// Named by the uplink's DHCP lease (option 42): never steps the clock far.
    Dhcp,
}

/// One server as the client knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerId {
    /// As configured (`host` or `host:port`), or `dhcp`.
    pub name: String,
    pub addr: SocketAddr,
    pub origin: Origin,
}

#[derive(Clone, Debug)]
struct Server {
    id: ServerId,
    interval: Duration,
    retry: Duration,
    next: Duration,
    dropped: Option<Kiss>,
    query: Option<Query>,
    last: String,
}

#[derive(Clone, Copy, Debug)]
struct Query {
    cookie: u64,
    sent_wall: UnixTime,
    sent: Duration,
}

/// What became of an answer or a query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Sample {
        server: ServerId,
        sample: Sample,
    },
    /// The server answered but the answer was not usable (kiss, unsynchronised, ...).
    Bad {
        server: ServerId,
        error: SntpError,
    },
    /// No answer within [`REPLY_TIMEOUT`].
    Timeout {
        server: ServerId,
    },
}

/// The per-server schedule: who is due, what is outstanding, backoff, kisses.
#[derive(Clone, Debug, Default)]
pub struct Poller {
    servers: Vec<Server>,
}

impl Poller {
    /// Replace the server list, keeping the state of servers already known (same
    /// address). New ones are due at `now`.
    pub fn set_servers(&mut self, now: Duration, ids: Vec<ServerId>) {
        let mut old = std::mem::take(&mut self.servers);
        for id in ids {
            if self.servers.iter().any(|s| s.id.addr == id.addr) {
                continue;
            }
            match old.iter().position(|s| s.id.addr == id.addr) {
                Some(i) => {
                    let mut s = old.swap_remove(i);
                    s.id = id;
                    self.servers.push(s);
                }
                None => self.servers.push(Server {
                    id,
                    interval: MIN_POLL,
                    retry: RETRY_FIRST,
                    next: now,
                    dropped: None,
                    query: None,
                    last: "not asked yet".into(),
                }),
            }
        }
    }

    pub fn servers(&self) -> impl Iterator<Item = &ServerId> {
        self.servers.iter().map(|s| &s.id)
    }

    /// Servers still used (not dropped by a kiss).
    pub fn usable(&self) -> usize {
        self.servers.iter().filter(|s| s.dropped.is_none()).count()
    }

    /// One line per server for the state file: `ADDR (NAME): what happened last`.
    pub fn report(&self) -> Vec<String> {
        self.servers
            .iter()
            .map(|s| format!("{} ({}): {}", s.id.addr, s.id.name, s.last))
            .collect()
    }

    /// When something is next due (a query to send or to give up on).
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.servers
            .iter()
            .filter(|s| s.dropped.is_none())
            .map(|s| match s.query {
                Some(q) => q.sent + REPLY_TIMEOUT,
                None => s.next,
            })
            .min()
    }

    /// The next query due at `now`: where to, and its bytes. `cookie` is fresh
    /// randomness; `wall` our clock now.
    pub fn poll_transmit(
        &mut self,
        now: Duration,
        wall: UnixTime,
        cookie: u64,
    ) -> Option<(SocketAddr, [u8; PACKET_LEN])> {
        let s = self
            .servers
            .iter_mut()
            .find(|s| s.dropped.is_none() && s.query.is_none() && s.next <= now)?;
        s.query = Some(Query {
            cookie,
            sent_wall: wall,
            sent: now,
        });
        Some((s.id.addr, emit_request(cookie)))
    }

    /// The query to `addr` could not be sent (no route, no address yet): try again soon.
    pub fn send_failed(&mut self, now: Duration, addr: SocketAddr, why: &str) {
        if let Some(s) = self.servers.iter_mut().find(|s| s.id.addr == addr) {
            s.query = None;
            s.next = now + RETRY_UNSENT;
            s.last = format!("could not send: {why}");
        }
    }

    /// A datagram from `from` at boot time `now`. `None`: not an answer to an open query
    /// (unknown sender, no query, wrong cookie), ignored.
    pub fn handle_reply(&mut self, now: Duration, from: SocketAddr, bytes: &[u8]) -> Option<Event> {
        let s = self.servers.iter_mut().find(|s| s.id.addr == from)?;
        let q = s.query?;
        match Reply::parse(bytes, q.cookie) {
            Err(SntpError::WrongOriginate)
            | Err(SntpError::Truncated { .. })
            | Err(SntpError::NotServer { .. }) => None,
            Ok(r) => {
                s.query = None;
                let sample = Sample::new(q.sent_wall, now.saturating_sub(q.sent), &r);
                s.next = now + s.interval;
                s.interval = (s.interval * 2).min(MAX_POLL);
                s.retry = RETRY_FIRST;
                s.last = format!(
                    "stratum {}, offset {}, delay {} ms",
                    r.stratum,
                    fmt_offset(sample.offset),
                    sample.delay / 1_000_000
                );
                Some(Event::Sample {
                    server: s.id.clone(),
                    sample,
                })
            }
            Err(e) => {
                s.query = None;
                match e {
                    SntpError::KissOfDeath(k @ (Kiss::Deny | Kiss::Rstr)) => {
                        s.dropped = Some(k);
                        s.last = format!("kiss-o'-death {k}: not asked again");
                    }
                    SntpError::KissOfDeath(Kiss::Rate) => {
                        s.interval = (s.interval * 2).min(MAX_POLL);
                        s.next = now + s.interval;
                        s.last = format!(
                            "kiss-o'-death RATE: polled every {} s now",
                            s.interval.as_secs()
                        );
                    }
                    e => {
                        s.next = now + s.retry;
                        s.retry = (s.retry * 2).min(MAX_POLL);
                        s.last = format!("refused its answer: {e}");
                    }
                }
                Some(Event::Bad {
                    server: s.id.clone(),
                    error: e,
                })
            }
        }
    }

    /// Give up on queries unanswered for [`REPLY_TIMEOUT`].
    pub fn handle_timeout(&mut self, now: Duration) -> Vec<Event> {
        let mut out = Vec::new();
        for s in &mut self.servers {
            if s.query.is_some_and(|q| now >= q.sent + REPLY_TIMEOUT) {
                s.query = None;
                s.next = now + s.retry;
                s.last = format!("no answer; asking again in {} s", s.retry.as_secs());
                s.retry = (s.retry * 2).min(MAX_POLL);
                out.push(Event::Timeout {
                    server: s.id.clone(),
                });
            }
        }
        out
    }

    /// The clock was stepped by `by` ns: queries still open measure from the new clock
    /// (an answer to a query sent before the step would otherwise carry the step again).
    pub fn clock_stepped(&mut self, by: i64) {
        for s in &mut self.servers {
            if let Some(q) = s.query.as_mut() {
                q.sent_wall = q.sent_wall.add_nanos(by);
            }
        }
    }

    /// Note what the policy made of a server's answer (for its report line).
    pub fn note(&mut self, addr: SocketAddr, what: &str) {
        if let Some(s) = self.servers.iter_mut().find(|s| s.id.addr == addr) {
            s.last = format!("{}; {what}", s.last);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The state the client publishes (`/run/riceguard/clock`) and the status line.

/// What `riceguard ntp` last published.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NtpState {
    /// Servers in use (not dropped).
    pub servers: u32,
    /// The server of the last sync and its boot time.
    pub last_sync: Option<(String, Duration)>,
    /// Per-server lines and refusals, for `show status`.
    pub notes: Vec<String>,
    /// Why the clock stays behind its servers: the last far-future refusal
    /// (`ADDR (NAME) refused: ...`), until an answer is used.
    pub behind: Option<String>,
}

impl NtpState {
    pub fn to_text(&self) -> String {
        let mut s = format!("servers {}\n", self.servers);
        if let Some((srv, at)) = &self.last_sync {
            s.push_str(&format!("sync {} {}\n", at.as_nanos(), srv));
        }
        for n in &self.notes {
            s.push_str(&format!("note {}\n", n.replace('\n', " ")));
        }
        if let Some(b) = &self.behind {
            s.push_str(&format!("behind {}\n", b.replace('\n', " ")));
        }
        s
    }

    /// Reads [`NtpState::to_text`]'s form; unknown lines are skipped, bad ones too.
    pub fn from_text(text: &str) -> NtpState {
        let mut st = NtpState::default();
        for l in text.lines().take(64) {
            match l.split_once(' ') {
                Some(("servers", v)) => st.servers = v.trim().parse().unwrap_or(0),
                Some(("sync", v)) => {
                    if let Some((ns, srv)) = v.split_once(' ') {
                        if let Ok(ns) = ns.parse::<u64>() {
                            st.last_sync = Some((srv.trim().into(), Duration::from_nanos(ns)));
                        }
                    }
                }
                Some(("note", v)) => st.notes.push(v.chars().take(300).collect()),
                Some(("behind", v)) => st.behind = Some(v.chars().take(300).collect()),
                _ => {}
            }
        }
        st
    }
}

/// The first line of `show status` and `riceguard status`: `clock: <UTC ISO 8601>
/// (source: ..., ...)`. `boot`: init's record (none on a host); `ntp`: the client's state
/// (none when it is not running).
pub fn status_line(
    wall: UnixTime,
    now: Duration,
    boot: Option<&BootRecord>,
    ntp: Option<&NtpState>,
) -> String {
    let source = boot.map_or("host clock (not set by riceguard)", |b| b.source.name());
    let tail = match ntp {
        Some(NtpState {
            last_sync: Some((srv, at)),
            ..
        }) => {
            return format!(
                "clock: {wall} (source: ntp {srv}, last sync {} s ago)",
                now.saturating_sub(*at).as_secs()
            )
        }
        Some(n) if n.servers > 0 => format!(
            "no sync yet from {} NTP server{}{}",
            n.servers,
            if n.servers == 1 { "" } else { "s" },
            n.behind
                .as_ref()
                .map_or_else(String::new, |b| format!(": {b}"))
        ),
        Some(_) => "no NTP server: set gateway ntp or get one from DHCP".into(),
        None if boot.is_some() => "NTP client not running".into(),
        None => return format!("clock: {wall} (source: {source})"),
    };
    format!("clock: {wall} (source: {source}, {tail})")
}

#[cfg(test)]
mod tests;
