//! The per-peer client transport state machine for the TCP fallback (sans-IO, time
//! passed in): which transport a peer with an `Endpoint` uses, when to open TCP, when
//! to probe UDP again, when to go back.
//!
//! ```text
//!   Udp --2 handshakes unanswered--> Connecting --tcp_connected--> Tcp
//!    ^                                 |  ^                          |  probes UDP on a
//!    |                      tcp_failed v  | backoff elapsed          |  30 s..10 min backoff
//!    |                               Reconnect <---tcp_failed--------+
//!    +---- probe handshake answered over UDP + authenticated UDP rx -+
//! ```
//!
//! Rules:
//! - A UDP handshake attempt is *unanswered* once a newer one was sent without an answer
//!   in between, or `answer_timeout` (5 s, WireGuard's REKEY_TIMEOUT) passed. After
//!   `unanswered_limit` (2) unanswered attempts the machine asks for TCP; traffic stays
//!   on UDP until TCP is connected.
//! - On TCP, [`Action::ProbeUdp`] asks for a real handshake over UDP after the probe
//!   interval: 30 s, doubling to a 10 min cap, each with ±`jitter_pct` % jitter. The
//!   peer returns to UDP when a probe handshake is answered over UDP *and* an
//!   authenticated packet then arrives over UDP.
//! - Flap damping: after returning to UDP the TCP connection lingers for `tcp_linger`
//!   (30 s) so a path that fails again goes straight back to it. A fall-back within
//!   `flap_window` (5 min) of a return to UDP is a *flap*: the probe backoff continues
//!   from where it stopped (doubled) instead of restarting at 30 s, so an on/off path
//!   settles on TCP with probes at most every 10 min. UDP that stays up longer than
//!   `flap_window` resets the backoff.
//! - A failed TCP connect or a lost TCP connection is retried after a jittered
//!   backoff of 1 s doubling to 60 s, reset once TCP carries authenticated traffic.
//!   UDP handshakes keep going meanwhile and win if answered.

use std::time::{Duration, Instant};

/// The outer transport of a peer's WireGuard messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// What the driver must do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Open a TCP connection to the peer's endpoint address, TCP port.
    ConnectTcp,
    /// TCP is connected: send this peer's messages over it from now on.
    SwitchToTcp,
    /// Send a real handshake initiation over UDP (a probe).
    ProbeUdp,
    /// UDP works again: send over UDP from now on (keep TCP open until `CloseTcp`).
    SwitchToUdp,
    /// Close the lingering TCP connection.
    CloseTcp,
}

/// Timing knobs; the defaults are the documented ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FallbackConfig {
    pub answer_timeout: Duration,
    pub unanswered_limit: u32,
    pub probe_initial: Duration,
    pub probe_max: Duration,
    pub reconnect_initial: Duration,
    pub reconnect_max: Duration,
    pub flap_window: Duration,
    pub tcp_linger: Duration,
    /// Jitter as ± percent of each backoff delay.
    pub jitter_pct: u32,
}

impl Default for FallbackConfig {
    fn default() -> Self {
        FallbackConfig {
            answer_timeout: Duration::from_secs(5),
            unanswered_limit: 2,
            probe_initial: Duration::from_secs(30),
            probe_max: Duration::from_secs(600),
            reconnect_initial: Duration::from_secs(1),
            reconnect_max: Duration::from_secs(60),
            flap_window: Duration::from_secs(300),
            tcp_linger: Duration::from_secs(30),
            jitter_pct: 10,
        }
    }
}

/// A seeded xorshift64* source for backoff jitter, so tests are deterministic and
/// peers seeded differently do not probe in lockstep.
#[derive(Clone, Debug)]
pub struct Jitter {
    state: u64,
}

impl Jitter {
    pub fn new(seed: u64) -> Self {
        Jitter { state: seed | 1 }
    }

    fn next(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// `d` scaled by a uniform factor in [100-pct, 100+pct] %.
    pub fn apply(&mut self, d: Duration, pct: u32) -> Duration {
        let pct = u64::from(pct.min(100));
        if pct == 0 {
            return d;
        }
        let factor = 100 - pct + self.next() % (2 * pct + 1);
        d * factor as u32 / 100
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Udp,
    Connecting,
    Tcp,
    Reconnect { at: Instant },
}

/// One peer's transport choice. Feed it events, then call [`Fallback::poll`] until
/// it returns `None`; wake it again at [`Fallback::poll_timeout`].
#[derive(Clone, Debug)]
pub struct Fallback {
    cfg: FallbackConfig,
    jitter: Jitter,
    state: State,
    /// UDP handshakes sent since the last UDP answer.
    udp_attempts: u32,
    udp_last_sent: Option<Instant>,
    probe_interval: Duration,
    next_probe: Option<Instant>,
    probe_answered: bool,
    reconnect_delay: Duration,
    returned_to_udp: Option<Instant>,
    tcp_open: bool,
    close_tcp_at: Option<Instant>,
    switch_pending: bool,
}

impl Fallback {
    pub fn new(cfg: FallbackConfig, jitter: Jitter) -> Self {
        Fallback {
            cfg,
            jitter,
            state: State::Udp,
            udp_attempts: 0,
            udp_last_sent: None,
            probe_interval: cfg.probe_initial,
            next_probe: None,
            probe_answered: false,
            reconnect_delay: cfg.reconnect_initial,
            returned_to_udp: None,
            tcp_open: false,
            close_tcp_at: None,
            switch_pending: false,
        }
    }

    /// Where this peer's messages go now.
    pub fn transport(&self) -> Transport {
        match self.state {
            State::Tcp => Transport::Tcp,
            _ => Transport::Udp,
        }
    }

    /// The interval the next probe schedule would use (for status output and tests).
    pub fn probe_interval(&self) -> Duration {
        self.probe_interval
    }

    /// A handshake initiation was sent over `t`.
    pub fn handshake_sent(&mut self, now: Instant, t: Transport) {
        if t == Transport::Udp {
            self.udp_attempts = self.udp_attempts.saturating_add(1);
            self.udp_last_sent = Some(now);
            if self.state == State::Tcp {
                self.probe_answered = false;
            }
        }
    }

    /// A handshake response (or cookie reply) arrived over `t`.
    pub fn handshake_answered(&mut self, _now: Instant, t: Transport) {
        if t == Transport::Udp {
            self.udp_attempts = 0;
            self.probe_answered = true;
        }
    }

    /// An authenticated (decrypted) packet arrived over `t`.
    pub fn authenticated_rx(&mut self, now: Instant, t: Transport) {
        match t {
            Transport::Udp => {
                self.udp_attempts = 0;
                if self.state != State::Udp && self.probe_answered {
                    let was_tcp = self.state == State::Tcp;
                    self.state = State::Udp;
                    self.returned_to_udp = Some(now);
                    self.next_probe = None;
                    self.probe_answered = false;
                    self.switch_pending = was_tcp;
                    if self.tcp_open {
                        self.close_tcp_at = Some(now + self.cfg.tcp_linger);
                    }
                }
            }
            Transport::Tcp => self.reconnect_delay = self.cfg.reconnect_initial,
        }
    }

    /// The TCP connection asked for by [`Action::ConnectTcp`] is up.
    pub fn tcp_connected(&mut self, now: Instant) {
        self.tcp_open = true;
        match self.state {
            State::Connecting => self.enter_tcp(now),
            // UDP came back while connecting: keep it as the lingering connection.
            State::Udp => self.close_tcp_at = Some(now + self.cfg.tcp_linger),
            _ => {}
        }
    }

    /// The TCP connection failed to connect or was lost.
    pub fn tcp_failed(&mut self, now: Instant) {
        self.tcp_open = false;
        self.close_tcp_at = None;
        if matches!(self.state, State::Connecting | State::Tcp) {
            let delay = self.jitter.apply(self.reconnect_delay, self.cfg.jitter_pct);
            self.reconnect_delay = (self.reconnect_delay * 2).min(self.cfg.reconnect_max);
            self.state = State::Reconnect { at: now + delay };
            // Back on UDP for now: count its handshakes afresh.
            self.udp_attempts = 0;
            self.next_probe = None;
        }
    }

    /// UDP attempts that count as unanswered at `now`.
    fn udp_unanswered(&self, now: Instant) -> u32 {
        match self.udp_last_sent {
            Some(t) if now < t + self.cfg.answer_timeout => self.udp_attempts.saturating_sub(1),
            _ => self.udp_attempts,
        }
    }

    fn enter_tcp(&mut self, now: Instant) {
        self.state = State::Tcp;
        self.probe_answered = false;
        self.switch_pending = false;
        self.close_tcp_at = None;
        self.next_probe = Some(now + self.jitter.apply(self.probe_interval, self.cfg.jitter_pct));
    }

    /// Set the probe interval for a new stay on TCP (the flap rule).
    fn start_fallback(&mut self, now: Instant) {
        let flapped = matches!(self.returned_to_udp, Some(t) if now < t + self.cfg.flap_window);
        self.probe_interval = if flapped {
            (self.probe_interval * 2).min(self.cfg.probe_max)
        } else {
            self.cfg.probe_initial
        };
        self.udp_attempts = 0;
    }

    /// The next thing to do, if any; call until `None`.
    pub fn poll(&mut self, now: Instant) -> Option<Action> {
        if self.switch_pending {
            self.switch_pending = false;
            return Some(Action::SwitchToUdp);
        }
        if let Some(t) = self.close_tcp_at {
            if now >= t && self.state == State::Udp {
                self.close_tcp_at = None;
                self.tcp_open = false;
                return Some(Action::CloseTcp);
            }
        }
        match self.state {
            State::Udp => {
                if self.udp_unanswered(now) >= self.cfg.unanswered_limit {
                    self.start_fallback(now);
                    if self.tcp_open {
                        self.enter_tcp(now);
                        return Some(Action::SwitchToTcp);
                    }
                    self.state = State::Connecting;
                    return Some(Action::ConnectTcp);
                }
                None
            }
            State::Connecting => None,
            State::Tcp => {
                let due = self.next_probe?;
                if now < due {
                    return None;
                }
                // Double for the next one: 30 s, 60 s, ... capped.
                self.probe_interval = (self.probe_interval * 2).min(self.cfg.probe_max);
                let next = self.jitter.apply(self.probe_interval, self.cfg.jitter_pct);
                self.next_probe = Some(now + next);
                Some(Action::ProbeUdp)
            }
            State::Reconnect { at } => {
                if now < at {
                    return None;
                }
                self.state = State::Connecting;
                Some(Action::ConnectTcp)
            }
        }
    }

    /// When [`Fallback::poll`] next has something to do (`None`: only on an event).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let state_t = match self.state {
            State::Udp => {
                // The moment the newest attempt turns unanswered.
                if self.udp_attempts >= self.cfg.unanswered_limit.max(1) {
                    self.udp_last_sent.map(|t| t + self.cfg.answer_timeout)
                } else {
                    None
                }
            }
            State::Connecting => None,
            State::Tcp => self.next_probe,
            State::Reconnect { at } => Some(at),
        };
        match (state_t, self.close_tcp_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn exact() -> Fallback {
        Fallback::new(
            FallbackConfig {
                jitter_pct: 0,
                ..FallbackConfig::default()
            },
            Jitter::new(1),
        )
    }

    /// Drive WireGuard-like handshake retries over UDP (every 5 s) until TCP is asked
    /// for; returns the time of that request.
    fn fall_back(f: &mut Fallback, mut now: Instant) -> Instant {
        for _ in 0..10 {
            f.handshake_sent(now, Transport::Udp);
            now += S;
            for _ in 0..5 {
                if let Some(a) = f.poll(now) {
                    assert_eq!(a, Action::ConnectTcp);
                    return now;
                }
                now += S;
            }
        }
        panic!("never fell back");
    }

    /// Run poll every second from `from` until `until`; returns (time, action) pairs.
    fn run(f: &mut Fallback, from: Instant, until: Instant) -> Vec<(Duration, Action)> {
        let mut out = Vec::new();
        let mut now = from;
        while now <= until {
            while let Some(a) = f.poll(now) {
                out.push((now - from, a));
            }
            now += S;
        }
        out
    }

    #[test]
    fn falls_back_after_two_unanswered() {
        let t0 = Instant::now();
        let mut f = exact();
        assert_eq!(f.transport(), Transport::Udp);
        f.handshake_sent(t0, Transport::Udp);
        assert_eq!(f.poll(t0 + 4 * S), None, "first attempt still has time");
        assert_eq!(f.poll(t0 + 5 * S), None, "one unanswered is not enough");
        f.handshake_sent(t0 + 5 * S, Transport::Udp);
        assert_eq!(f.poll(t0 + 9 * S), None);
        assert_eq!(f.poll_timeout(), Some(t0 + 10 * S));
        assert_eq!(f.poll(t0 + 10 * S), Some(Action::ConnectTcp));
        assert_eq!(f.transport(), Transport::Udp, "UDP until TCP is connected");
        f.tcp_connected(t0 + 11 * S);
        assert_eq!(f.transport(), Transport::Tcp);
    }

    #[test]
    fn answered_handshakes_never_fall_back() {
        let t0 = Instant::now();
        let mut f = exact();
        for i in 0..20u32 {
            let now = t0 + 5 * S * i;
            f.handshake_sent(now, Transport::Udp);
            f.handshake_answered(now + S, Transport::Udp);
            assert_eq!(f.poll(now + 4 * S), None);
        }
    }

    #[test]
    fn probe_schedule_doubles_to_cap() {
        let t0 = Instant::now();
        let mut f = exact();
        let t = fall_back(&mut f, t0);
        f.tcp_connected(t);
        let acts = run(&mut f, t, t + 3600 * S);
        let probes: Vec<u64> = acts
            .iter()
            .filter(|(_, a)| *a == Action::ProbeUdp)
            .map(|(d, _)| d.as_secs())
            .collect();
        let gaps: Vec<u64> = std::iter::once(probes[0])
            .chain(probes.windows(2).map(|w| w[1] - w[0]))
            .collect();
        assert_eq!(&gaps[..7], &[30, 60, 120, 240, 480, 600, 600]);
        assert_eq!(f.transport(), Transport::Tcp, "unanswered probes keep TCP");
    }

    #[test]
    fn jitter_is_bounded_and_deterministic() {
        let mk = || Fallback::new(FallbackConfig::default(), Jitter::new(42));
        let t0 = Instant::now();
        let (mut a, mut b) = (mk(), mk());
        let ta = fall_back(&mut a, t0);
        let tb = fall_back(&mut b, t0);
        a.tcp_connected(ta);
        b.tcp_connected(tb);
        let ra = run(&mut a, ta, ta + 3000 * S);
        assert_eq!(
            ra,
            run(&mut b, tb, tb + 3000 * S),
            "same seed, same schedule"
        );
        let probes: Vec<u64> = ra
            .iter()
            .filter(|(_, a)| *a == Action::ProbeUdp)
            .map(|(d, _)| d.as_secs())
            .collect();
        let first = probes[0];
        assert!((27..=34).contains(&first), "30 s ± 10 %: {first}");
        let gap = probes[1] - probes[0];
        assert!((54..=67).contains(&gap), "60 s ± 10 %: {gap}");
        let mut j = Jitter::new(7);
        for _ in 0..1000 {
            let d = j.apply(Duration::from_secs(600), 10);
            assert!(d >= Duration::from_secs(540) && d <= Duration::from_secs(660));
        }
    }

    #[test]
    fn returns_to_udp_on_answered_probe_with_traffic() {
        let t0 = Instant::now();
        let mut f = exact();
        let t = fall_back(&mut f, t0);
        f.tcp_connected(t);
        let probe_at = t + 30 * S;
        assert_eq!(f.poll(probe_at), Some(Action::ProbeUdp));
        f.handshake_sent(probe_at, Transport::Udp);
        // Authenticated UDP traffic alone (without the probe's answer) is not enough...
        f.authenticated_rx(probe_at, Transport::Tcp);
        assert_eq!(f.poll(probe_at + S), None);
        f.handshake_answered(probe_at + S, Transport::Udp);
        assert_eq!(
            f.transport(),
            Transport::Tcp,
            "answer alone does not switch"
        );
        f.authenticated_rx(probe_at + 2 * S, Transport::Udp);
        assert_eq!(f.transport(), Transport::Udp);
        assert_eq!(f.poll(probe_at + 2 * S), Some(Action::SwitchToUdp));
        assert_eq!(f.poll(probe_at + 3 * S), None);
        // TCP lingers, then is closed.
        assert_eq!(f.poll(probe_at + 32 * S), Some(Action::CloseTcp));
        assert_eq!(f.poll(probe_at + 33 * S), None);
    }

    #[test]
    fn flapping_is_damped() {
        let t0 = Instant::now();
        let mut f = exact();
        let mut t = fall_back(&mut f, t0);
        f.tcp_connected(t);
        let mut first_probe_gaps = Vec::new();
        for _ in 0..6 {
            // Wait for the first probe, answer it, return to UDP...
            let mut p = t;
            while f.poll(p) != Some(Action::ProbeUdp) {
                p += S;
            }
            first_probe_gaps.push((p - t).as_secs());
            f.handshake_sent(p, Transport::Udp);
            f.handshake_answered(p, Transport::Udp);
            f.authenticated_rx(p, Transport::Udp);
            assert_eq!(f.poll(p), Some(Action::SwitchToUdp));
            // ...and UDP dies again at once: straight back onto the lingering TCP.
            let mut now = p + S;
            f.handshake_sent(now, Transport::Udp);
            now += 5 * S;
            f.handshake_sent(now, Transport::Udp);
            now += 5 * S;
            assert_eq!(
                f.poll(now),
                Some(Action::SwitchToTcp),
                "lingering TCP reused"
            );
            assert_eq!(f.transport(), Transport::Tcp);
            t = now;
        }
        assert_eq!(first_probe_gaps, vec![30, 120, 480, 600, 600, 600]);
    }

    #[test]
    fn stable_udp_resets_backoff() {
        let t0 = Instant::now();
        let mut f = exact();
        let t = fall_back(&mut f, t0);
        f.tcp_connected(t);
        let p = t + 30 * S;
        assert_eq!(f.poll(p), Some(Action::ProbeUdp));
        f.handshake_sent(p, Transport::Udp);
        f.handshake_answered(p, Transport::Udp);
        f.authenticated_rx(p, Transport::Udp);
        assert_eq!(f.poll(p), Some(Action::SwitchToUdp));
        assert_eq!(f.poll(p + 40 * S), Some(Action::CloseTcp));
        // UDP fine for 10 min, then it fails: the backoff starts at 30 s again.
        let later = p + 600 * S;
        let t2 = fall_back(&mut f, later);
        f.tcp_connected(t2);
        assert_eq!(f.poll(t2 + 29 * S), None);
        assert_eq!(f.poll(t2 + 30 * S), Some(Action::ProbeUdp));
    }

    #[test]
    fn reconnect_backoff_bounded() {
        let t0 = Instant::now();
        let mut f = exact();
        let mut now = fall_back(&mut f, t0);
        let mut delays = Vec::new();
        for _ in 0..9 {
            f.tcp_failed(now);
            assert_eq!(f.transport(), Transport::Udp);
            let at = f.poll_timeout().unwrap();
            delays.push((at - now).as_secs());
            assert_eq!(f.poll(at - S), None);
            assert_eq!(f.poll(at), Some(Action::ConnectTcp));
            now = at;
        }
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
        // Connected and carrying traffic: the reconnect backoff resets.
        f.tcp_connected(now);
        f.authenticated_rx(now, Transport::Tcp);
        f.tcp_failed(now + S);
        assert_eq!(f.poll_timeout(), Some(now + 2 * S));
    }

    #[test]
    fn udp_answer_during_reconnect_returns_to_udp() {
        let t0 = Instant::now();
        let mut f = exact();
        let t = fall_back(&mut f, t0);
        f.tcp_failed(t + S);
        f.handshake_sent(t + 2 * S, Transport::Udp);
        f.handshake_answered(t + 2 * S, Transport::Udp);
        f.authenticated_rx(t + 2 * S, Transport::Udp);
        assert_eq!(f.transport(), Transport::Udp);
        assert_eq!(f.poll(t + 100 * S), None, "no reconnect once UDP works");
    }
}
