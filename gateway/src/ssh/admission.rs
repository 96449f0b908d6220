//! Who may hold a connection, as numbers (sshd's `MaxStartups`, per source too): at most
//! [`MAX_UNAUTH_PER_SOURCE`] connections still logging in per source address and
//! [`MAX_UNAUTH`] in all, at most [`MAX_SESSIONS`] logged in (memory on a small board).
//! No I/O: the server asks at accept and at login, and gives slots back when a connection
//! ends.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

/// Connections still logging in, per source address.
pub const MAX_UNAUTH_PER_SOURCE: usize = 4;
/// Connections still logging in, in all.
pub const MAX_UNAUTH: usize = 16;
/// Logged-in connections.
pub const MAX_SESSIONS: usize = 8;

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// This source already has [`MAX_UNAUTH_PER_SOURCE`] connections logging in.
    SourceBusy,
    /// [`MAX_UNAUTH`] connections are logging in.
    Busy,
    /// [`MAX_SESSIONS`] are logged in.
    SessionsFull,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::SourceBusy => write!(
                f,
                "{MAX_UNAUTH_PER_SOURCE} connections from this source are already logging in"
            ),
            Refusal::Busy => write!(f, "{MAX_UNAUTH} connections are already logging in"),
            Refusal::SessionsFull => write!(f, "{MAX_SESSIONS} sessions are already open"),
        }
    }
}

#[derive(Debug, Default)]
pub struct Admission {
    unauth: HashMap<IpAddr, usize>,
    unauth_total: usize,
    sessions: usize,
}

impl Admission {
    /// A new connection from `ip`, logging in: take a slot or say why not.
    pub fn admit(&mut self, ip: IpAddr) -> Result<(), Refusal> {
        if self.unauth_total >= MAX_UNAUTH {
            return Err(Refusal::Busy);
        }
        let n = self.unauth.entry(ip).or_insert(0);
        if *n >= MAX_UNAUTH_PER_SOURCE {
            return Err(Refusal::SourceBusy);
        }
        *n += 1;
        self.unauth_total += 1;
        Ok(())
    }

    /// A connection from `ip` that was logging in ended (or logged in).
    pub fn leave(&mut self, ip: IpAddr) {
        if let Some(n) = self.unauth.get_mut(&ip) {
            *n -= 1;
            self.unauth_total -= 1;
            if *n == 0 {
                self.unauth.remove(&ip);
            }
        }
    }

    /// A connection from `ip` logged in: it moves from logging in to the sessions, if
    /// there is room; otherwise it keeps its login slot.
    pub fn login(&mut self, ip: IpAddr) -> Result<(), Refusal> {
        if self.sessions >= MAX_SESSIONS {
            return Err(Refusal::SessionsFull);
        }
        self.leave(ip);
        self.sessions += 1;
        Ok(())
    }

    /// A logged-in connection ended.
    pub fn logout(&mut self) {
        self.sessions = self.sessions.saturating_sub(1);
    }

    /// (connections logging in, sessions)
    pub fn counts(&self) -> (usize, usize) {
        (self.unauth_total, self.sessions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    #[test]
    fn per_source_and_total_limits() {
        let mut a = Admission::default();
        for _ in 0..MAX_UNAUTH_PER_SOURCE {
            a.admit(ip(1)).unwrap();
        }
        assert_eq!(a.admit(ip(1)), Err(Refusal::SourceBusy));
        // Another source still gets in, up to the total.
        for i in 0..(MAX_UNAUTH - MAX_UNAUTH_PER_SOURCE) {
            a.admit(ip(10 + (i / MAX_UNAUTH_PER_SOURCE) as u8)).unwrap();
        }
        assert_eq!(a.admit(ip(99)), Err(Refusal::Busy));
        a.leave(ip(1));
        a.admit(ip(99)).unwrap();
        assert_eq!(a.counts(), (MAX_UNAUTH, 0));
    }

    #[test]
    fn a_login_frees_its_slot_and_sessions_are_bounded() {
        let mut a = Admission::default();
        for i in 0..MAX_SESSIONS {
            a.admit(ip(i as u8)).unwrap();
            a.login(ip(i as u8)).unwrap();
        }
        assert_eq!(a.counts(), (0, MAX_SESSIONS));
        a.admit(ip(50)).unwrap();
        assert_eq!(a.login(ip(50)), Err(Refusal::SessionsFull));
        assert_eq!(a.counts(), (1, MAX_SESSIONS));
        a.logout();
        a.login(ip(50)).unwrap();
        assert_eq!(a.counts(), (0, MAX_SESSIONS));
        // Leaving twice (a bug elsewhere) does not underflow or free another's slot.
        a.leave(ip(50));
        assert_eq!(a.counts(), (0, MAX_SESSIONS));
    }
}
