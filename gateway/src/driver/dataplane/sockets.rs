//! The workers' UDP sockets: [`bind_udp`] binds one per worker to the listen port
//! (`SO_REUSEPORT`), and [`SocketSet`] holds them with a generation (workers pick up
//! replaced sockets at their next wake) and the [`StickyTable`] all sends use.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::core::config::OffloadMode;
use crate::driver::dataplane::sticky::StickyTable;
use crate::sys::udp::{UdpOptions, UdpSocket};

/// The UDP sockets of all workers, all bound to the listen port (`SO_REUSEPORT`), and
/// the local address each peer reaches them at ([`StickyTable`]).
pub struct SocketSet {
    inner: RwLock<Arc<Vec<Arc<UdpSocket>>>>,
    generation: AtomicU64,
    pub port: std::sync::atomic::AtomicU16,
    pub sticky: Arc<StickyTable>,
}

impl SocketSet {
    pub fn new(socks: Vec<Arc<UdpSocket>>, port: u16) -> SocketSet {
        SocketSet {
            inner: RwLock::new(Arc::new(socks)),
            generation: AtomicU64::new(1),
            port: std::sync::atomic::AtomicU16::new(port),
            sticky: Arc::default(),
        }
    }

    pub fn get(&self) -> (u64, Arc<Vec<Arc<UdpSocket>>>) {
        let g = self.inner.read().unwrap_or_else(|p| p.into_inner());
        (self.generation.load(Ordering::Acquire), g.clone())
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn replace(&self, socks: Vec<Arc<UdpSocket>>, port: u16) {
        *self.inner.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(socks);
        self.port.store(port, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Any socket, for sends from outside the workers (timers).
    pub fn any(&self) -> Option<Arc<UdpSocket>> {
        self.get().1.first().cloned()
    }

    /// One datagram to `to` from outside the workers (timer-made handshakes and
    /// keepalives, the TCP thread's fallback probes), from the local address `to` last
    /// reached us at, as the workers answer it: on a multi-homed uplink a keepalive from
    /// another address would reach a peer that does not know it (wireguard-go keeps the
    /// source on the endpoint). A source that is gone is forgotten and routing picks.
    pub fn send_sticky(&self, d: &[u8], to: std::net::SocketAddr) {
        let Some(s) = self.any() else { return };
        let src = self.sticky.source_for(to);
        if let Err(e) = s.send_from(src, d, to) {
            if src.is_some()
                && e.raw_os_error()
                    .is_some_and(crate::sys::udp::stale_source_errno)
            {
                self.sticky.clear();
                let _ = s.send_to(d, to);
            }
        }
    }
}

/// Why [`bind_udp`] failed.
#[derive(Debug)]
pub enum BindError {
    Udp(std::io::Error),
    Mark(std::io::Error),
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BindError::Udp(e) => write!(f, "{e}"),
            BindError::Mark(e) => write!(f, "cannot set fwmark: {e}"),
        }
    }
}

/// Bind `n` UDP sockets to one port with `SO_REUSEPORT` (dual-stack where IPv6 exists).
/// Port 0 picks a port no one holds and binds all to it. `gro`/`gso`
/// follow the configured offload level; the decision made at start is applied after.
/// A port another program holds is refused even if that program also set
/// `SO_REUSEPORT` (same user): the sockets would silently share its traffic.
pub fn bind_udp(
    n: usize,
    port: u16,
    fwmark: Option<u32>,
    mode: OffloadMode,
) -> Result<(Vec<Arc<UdpSocket>>, u16), BindError> {
    let opts = UdpOptions {
        gro: matches!(mode, OffloadMode::Auto | OffloadMode::Gso),
        gso: matches!(mode, OffloadMode::Auto | OffloadMode::Gso),
        ..UdpOptions::default()
    };
    let udp_err = |e: crate::sys::udp::UdpError| {
        BindError::Udp(match e {
            crate::sys::udp::UdpError::Bind { source, .. } => source,
            e => std::io::Error::other(e.to_string()),
        })
    };
    let probe = UdpOptions {
        reuse_port: false,
        gro: false,
        gso: false,
        pktinfo: false,
        buffer_bytes: 0,
    };
    let mut port = port;
    if port == 0 {
        // Choose the port with an exclusive bind: the kernel may give a SO_REUSEPORT
        // socket's port 0 the port of another program's SO_REUSEPORT socket (same user),
        // and the two would split the traffic.
        let s = UdpSocket::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)), &probe)
            .or_else(|_| UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)), &probe))
            .map_err(udp_err)?;
        port = s.local_addr().port();
    }
    {
        // An exclusive bind (no SO_REUSEPORT) fails if anyone holds the port; dropped
        // at once, so our own sockets can take it.
        let any6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
        if let Err(e) = UdpSocket::bind(any6, &probe) {
            let free_v4 = UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)), &probe);
            match (e, free_v4) {
                // The v6 failure was about the port: report it.
                (e @ crate::sys::udp::UdpError::Bind { .. }, _) => return Err(udp_err(e)),
                (_, Err(e)) => return Err(udp_err(e)),
                (_, Ok(_)) => {}
            }
        }
    }
    let mut socks = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        let any6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
        let s = match UdpSocket::bind(any6, &opts) {
            Ok(s) => s,
            // No IPv6 in this kernel or namespace: IPv4 only.
            Err(_) => UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)), &opts)
                .map_err(udp_err)?,
        };
        if fwmark.is_some() {
            crate::sys::set_mark(&s, fwmark).map_err(BindError::Mark)?;
        }
        if std::env::var("RG_FAULT_GSO").as_deref() == Ok("einval") {
            if let Err(e) = s.inject_gso_failure() {
                log::warn!("RG_FAULT_GSO: {e}");
            }
        }
        port = s.local_addr().port();
        socks.push(Arc::new(s));
    }
    Ok((socks, port))
}
