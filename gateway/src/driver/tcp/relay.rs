//! `riceguard udp2tcp` and `riceguard tcp2udp`: standalone UDP<->TCP relays with the
//! option names and the wire format of Mullvad's udp-over-tcp (u16 big-endian length +
//! datagram), so a stock WireGuard client behind a UDP-blocking network reaches the
//! gateway: client -> udp2tcp (on the client's side) -> TCP -> gateway's TCP listener
//! (or `tcp2udp` in front of any WireGuard server).
//!
//! Both carry only WireGuard messages: a datagram that is not one is not forwarded
//! (the far side would have to close the connection), and a frame that is not one
//! closes the connection. `tcp2udp` runs on the gateway's own [`TcpTransport`]
//! (limits, timeouts, congestion control, coalescing writer). `udp2tcp` is one
//! connection with blocking sockets and the same write rules: the datagrams waiting on
//! the UDP socket are framed into one buffer and leave in one `send`, never a bare
//! header; back-pressure stops reading UDP, so the kernel drops whole datagrams.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{self, MsgFlags};

use crate::core::congestion::CcPolicy;
use crate::core::device::ConnId;
use crate::core::framing::{
    check_message, tail_split, CoalescePolicy, FrameDecoder, HEADER_LEN, MAX_MESSAGE_LEN,
};
use crate::driver::tcp::transport::{
    set_cc, SendError, TcpConfig, TcpHandle, TcpSink, TcpTransport,
};
use crate::sys::tcp::{self as systcp, TcpTuning};

const UDP2TCP_USAGE: &str =
    "usage: riceguard udp2tcp --udp-listen ADDR --tcp-forward ADDR [TCP OPTIONS]
  Forward WireGuard UDP datagrams received on --udp-listen over one TCP connection
  to --tcp-forward (u16 big-endian length framing, as Mullvad's udp2tcp).";
const TCP2UDP_USAGE: &str =
    "usage: riceguard tcp2udp --tcp-listen ADDR [--tcp-listen ADDR ...] --udp-forward ADDR
                         [--udp-bind IP] [--max-connections N] [--max-per-source N]
                         [TCP OPTIONS]
  Accept TCP connections and forward each one's frames to --udp-forward from its own
  UDP socket (as Mullvad's tcp2udp).";
const TCP_OPTIONS_USAGE: &str = "TCP OPTIONS:
  --nodelay                 set TCP_NODELAY (recommended: writes are already batched)
  --recv-buffer BYTES       SO_RCVBUF
  --send-buffer BYTES       SO_SNDBUF
  --tcp-recv-timeout SECS   close a connection that receives nothing for SECS
  --fwmark MARK             SO_MARK on the TCP socket
  --bbr-rtt-ms MS           smoothed RTT above which bbr is used instead of cubic (40)";

/// Options shared by both directions (Mullvad's `TcpOptions` plus the cc threshold).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TcpOpts {
    pub nodelay: bool,
    pub recv_buffer: Option<u32>,
    pub send_buffer: Option<u32>,
    pub recv_timeout: Option<Duration>,
    pub fwmark: Option<u32>,
    pub bbr_rtt_ms: Option<u32>,
}

impl TcpOpts {
    fn tuning(&self) -> TcpTuning {
        TcpTuning {
            nodelay: self.nodelay,
            send_buffer: self.send_buffer,
            recv_buffer: self.recv_buffer,
            fwmark: self.fwmark,
            ..TcpTuning::default()
        }
    }

    fn cc(&self) -> CcPolicy {
        self.bbr_rtt_ms
            .map_or_else(CcPolicy::default, CcPolicy::with_threshold_ms)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Udp2TcpOptions {
    pub udp_listen: SocketAddr,
    pub tcp_forward: SocketAddr,
    pub tcp: TcpOpts,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tcp2UdpOptions {
    pub tcp_listen: Vec<SocketAddr>,
    pub udp_forward: SocketAddr,
    pub udp_bind: Option<IpAddr>,
    pub max_connections: usize,
    pub max_per_source: usize,
    pub tcp: TcpOpts,
}

/// A command line that cannot be used; the message names the option.
#[derive(Debug, PartialEq, Eq)]
pub struct ArgError(String);

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn value<'a>(args: &'a [String], i: &mut usize, name: &str) -> Result<&'a str, ArgError> {
    *i += 1;
    args.get(*i)
        .map(String::as_str)
        .ok_or_else(|| ArgError(format!("{name} needs a value")))
}

fn parsed<T: std::str::FromStr>(s: &str, name: &str, what: &str) -> Result<T, ArgError> {
    s.parse()
        .map_err(|_| ArgError(format!("{name}: '{s}' is not {what}")))
}

/// Parse one TCP option at `args[*i]`; `Ok(false)` if it is not one.
fn tcp_opt(args: &[String], i: &mut usize, o: &mut TcpOpts) -> Result<bool, ArgError> {
    let name = args[*i].as_str();
    match name {
        "--nodelay" => o.nodelay = true,
        "--recv-buffer" => {
            o.recv_buffer = Some(parsed(value(args, i, name)?, name, "a byte count")?)
        }
        "--send-buffer" => {
            o.send_buffer = Some(parsed(value(args, i, name)?, name, "a byte count")?)
        }
        "--tcp-recv-timeout" => {
            let s: u64 = parsed(value(args, i, name)?, name, "a number of seconds")?;
            o.recv_timeout = Some(Duration::from_secs(s.max(1)));
        }
        "--fwmark" => o.fwmark = Some(parsed(value(args, i, name)?, name, "a number")?),
        "--bbr-rtt-ms" => o.bbr_rtt_ms = Some(parsed(value(args, i, name)?, name, "milliseconds")?),
        _ => return Ok(false),
    }
    Ok(true)
}

fn addr(s: &str, name: &str) -> Result<SocketAddr, ArgError> {
    parsed(s, name, "an IP:PORT address (IPv6 as [ADDR]:PORT)")
}

pub fn parse_udp2tcp(args: &[String]) -> Result<Udp2TcpOptions, ArgError> {
    let (mut udp_listen, mut tcp_forward, mut tcp) = (None, None, TcpOpts::default());
    let mut i = 0;
    while i < args.len() {
        let name = args[i].as_str();
        if !tcp_opt(args, &mut i, &mut tcp)? {
            match name {
                "--udp-listen" => udp_listen = Some(addr(value(args, &mut i, name)?, name)?),
                "--tcp-forward" => tcp_forward = Some(addr(value(args, &mut i, name)?, name)?),
                _ => return Err(ArgError(format!("unknown option '{name}'"))),
            }
        }
        i += 1;
    }
    Ok(Udp2TcpOptions {
        udp_listen: udp_listen.ok_or_else(|| ArgError("--udp-listen is required".into()))?,
        tcp_forward: tcp_forward.ok_or_else(|| ArgError("--tcp-forward is required".into()))?,
        tcp,
    })
}

pub fn parse_tcp2udp(args: &[String]) -> Result<Tcp2UdpOptions, ArgError> {
    let mut o = Tcp2UdpOptions {
        tcp_listen: Vec::new(),
        udp_forward: SocketAddr::from(([0, 0, 0, 0], 0)),
        udp_bind: None,
        max_connections: 256,
        max_per_source: 8,
        tcp: TcpOpts::default(),
    };
    let mut forward = None;
    let mut i = 0;
    while i < args.len() {
        let name = args[i].as_str();
        if !tcp_opt(args, &mut i, &mut o.tcp)? {
            match name {
                "--tcp-listen" => o.tcp_listen.push(addr(value(args, &mut i, name)?, name)?),
                "--udp-forward" => forward = Some(addr(value(args, &mut i, name)?, name)?),
                "--udp-bind" => {
                    o.udp_bind = Some(parsed(value(args, &mut i, name)?, name, "an IP address")?)
                }
                "--max-connections" => {
                    o.max_connections = parsed(value(args, &mut i, name)?, name, "a number")?
                }
                "--max-per-source" => {
                    o.max_per_source = parsed(value(args, &mut i, name)?, name, "a number")?
                }
                _ => return Err(ArgError(format!("unknown option '{name}'"))),
            }
        }
        i += 1;
    }
    if o.tcp_listen.is_empty() {
        return Err(ArgError(
            "--tcp-listen is required (may be given more than once)".into(),
        ));
    }
    o.udp_forward = forward.ok_or_else(|| ArgError("--udp-forward is required".into()))?;
    Ok(o)
}

fn help_or(args: &[String], usage: &str) -> Option<ExitCode> {
    args.iter().any(|a| a == "-h" || a == "--help").then(|| {
        println!("{usage}\n{TCP_OPTIONS_USAGE}");
        ExitCode::SUCCESS
    })
}

/// `riceguard udp2tcp ...`
pub fn udp2tcp_main(args: &[String]) -> ExitCode {
    crate::logger::init();
    if let Some(c) = help_or(args, UDP2TCP_USAGE) {
        return c;
    }
    let opts = match parse_udp2tcp(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}\n{UDP2TCP_USAGE}\n{TCP_OPTIONS_USAGE}");
            return ExitCode::from(2);
        }
    };
    match Udp2Tcp::connect(&opts).and_then(|u| u.run()) {
        Ok(()) => {
            log::info!("udp2tcp: TCP connection to {} closed", opts.tcp_forward);
            ExitCode::from(1)
        }
        Err(e) => {
            log::error!("udp2tcp: {e}");
            ExitCode::from(1)
        }
    }
}

/// `riceguard tcp2udp ...`
pub fn tcp2udp_main(args: &[String]) -> ExitCode {
    crate::logger::init();
    if let Some(c) = help_or(args, TCP2UDP_USAGE) {
        return c;
    }
    let opts = match parse_tcp2udp(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}\n{TCP2UDP_USAGE}\n{TCP_OPTIONS_USAGE}");
            return ExitCode::from(2);
        }
    };
    match Tcp2Udp::bind(opts) {
        Ok(t) => {
            let e = t.run();
            log::error!("tcp2udp: {e}");
            ExitCode::from(1)
        }
        Err(e) => {
            log::error!("tcp2udp: {e}");
            ExitCode::from(1)
        }
    }
}

/// Set the policy's initial algorithm; after a second of traffic, the RTT-based one.
struct CcCheck {
    policy: CcPolicy,
    at: Option<Instant>,
}

impl CcCheck {
    fn start(tcp: &TcpStream, policy: CcPolicy) -> Self {
        let _ = set_cc(tcp, policy.choose(None));
        CcCheck {
            policy,
            at: Some(Instant::now() + Duration::from_secs(1)),
        }
    }

    fn maybe(&mut self, tcp: &TcpStream) {
        if self.at.is_some_and(|t| Instant::now() >= t) {
            self.at = None;
            if let Ok(info) = systcp::tcp_info(tcp) {
                if let Some(want) = self.policy.recheck(self.policy.low, info.srtt) {
                    let _ = set_cc(tcp, want);
                    log::debug!("srtt {:?}: congestion control {want}", info.srtt);
                }
            }
        }
    }
}

/// Wait until a non-blocking connect finishes (or `timeout`), then make it blocking.
fn finish_connect(tcp: TcpStream, timeout: Duration) -> io::Result<TcpStream> {
    let mut fds = [PollFd::new(tcp.as_fd(), PollFlags::POLLOUT)];
    let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
    let n = loop {
        match nix::poll::poll(&mut fds, PollTimeout::from(ms)) {
            Err(Errno::EINTR) => continue,
            r => break r?,
        }
    };
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "TCP connect timed out",
        ));
    }
    systcp::take_error(&tcp)?;
    tcp.set_nonblocking(false)?;
    Ok(tcp)
}

/// Frame UDP datagrams onto TCP until either side fails. Each wakeup takes every
/// datagram already waiting (up to the write budget) and writes them in one `send`.
fn pump_udp_to_tcp(
    udp: &UdpSocket,
    tcp: &TcpStream,
    stop: &AtomicBool,
    mut cc: CcCheck,
) -> io::Result<()> {
    let policy = CoalescePolicy::default();
    let mut buf = vec![0u8; policy.max_write + HEADER_LEN + MAX_MESSAGE_LEN];
    udp.set_read_timeout(Some(Duration::from_millis(500)))?;
    let mut mss = systcp::tcp_info(tcp)
        .map(|i| i.snd_mss as usize)
        .unwrap_or(1448);
    while !stop.load(Ordering::Relaxed) {
        let budget = policy.write_budget(mss);
        let (mut len, mut last) = (0, 0);
        // First datagram: block (bounded by the read timeout so `stop` is seen).
        let mut flags = MsgFlags::empty();
        loop {
            let slot = &mut buf[len + HEADER_LEN..len + HEADER_LEN + MAX_MESSAGE_LEN];
            let n = match socket::recv(udp.as_raw_fd(), slot, flags) {
                Ok(n) => n,
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => break,
                // A previous send to the UDP peer bounced (ICMP unreachable): keep going.
                Err(Errno::ECONNREFUSED) => continue,
                Err(e) => return Err(e.into()),
            };
            if check_message(&slot[..n], MAX_MESSAGE_LEN).is_ok() {
                buf[len..len + HEADER_LEN].copy_from_slice(&(n as u16).to_be_bytes());
                len += HEADER_LEN + n;
                last = HEADER_LEN + n;
            }
            if len >= budget {
                break;
            }
            flags = MsgFlags::MSG_DONTWAIT;
        }
        if len > 0 {
            match tail_split(len, last, mss) {
                Some(first) => {
                    systcp::send_all(tcp, &buf[..first])?;
                    systcp::send_all(tcp, &buf[first..len])?;
                }
                None => systcp::send_all(tcp, &buf[..len])?,
            }
            cc.maybe(tcp);
            if let Ok(i) = systcp::tcp_info(tcp) {
                mss = (i.snd_mss as usize).max(536);
            }
        }
    }
    Ok(())
}

/// Read frames from TCP and send each message as one UDP datagram.
fn pump_tcp_to_udp(tcp: &TcpStream, udp: &UdpSocket) -> io::Result<()> {
    let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
    let mut buf = vec![0u8; 64 * 1024];
    let mut tcp_r = tcp;
    loop {
        let n = match tcp_r.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        dec.feed(&buf[..n], |m| {
            // A lost datagram is what UDP allows; the relay keeps going.
            let _ = udp.send(m);
        })
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    }
}

/// The client-side relay: one UDP peer, one TCP connection.
pub struct Udp2Tcp {
    udp: UdpSocket,
    tcp: TcpStream,
    cc: CcPolicy,
}

impl Udp2Tcp {
    /// Bind UDP and connect TCP (as Mullvad's udp2tcp, TCP first).
    pub fn connect(o: &Udp2TcpOptions) -> io::Result<Udp2Tcp> {
        let udp = UdpSocket::bind(o.udp_listen).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot bind UDP {}: {e}", o.udp_listen))
        })?;
        let tcp = systcp::connect_nonblocking(o.tcp_forward, &o.tcp.tuning())
            .and_then(|t| finish_connect(t, Duration::from_secs(10)))
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot connect to {}/TCP: {e}", o.tcp_forward),
                )
            })?;
        tcp.set_read_timeout(o.tcp.recv_timeout)?;
        log::info!(
            "udp2tcp: {}/UDP <-> {}/TCP",
            udp.local_addr()?,
            o.tcp_forward
        );
        Ok(Udp2Tcp {
            udp,
            tcp,
            cc: o.tcp.cc(),
        })
    }

    pub fn local_udp_addr(&self) -> io::Result<SocketAddr> {
        self.udp.local_addr()
    }

    /// Relay until the TCP connection ends. The UDP socket is connected to the source
    /// of the first datagram, which is the one peer served from then on.
    pub fn run(self) -> io::Result<()> {
        let mut first = vec![0u8; MAX_MESSAGE_LEN];
        let (n, peer) = self.udp.recv_from(&mut first)?;
        self.udp.connect(peer)?;
        log::info!("udp2tcp: serving UDP peer {peer}");
        let cc = CcCheck::start(&self.tcp, self.cc);
        if check_message(&first[..n], MAX_MESSAGE_LEN).is_ok() {
            let mut f = (n as u16).to_be_bytes().to_vec();
            f.extend_from_slice(&first[..n]);
            systcp::send_all(&self.tcp, &f)?;
        }
        relay(self.udp, self.tcp, cc)
    }
}

/// Both directions until one ends; the other is then stopped.
fn relay(udp: UdpSocket, tcp: TcpStream, cc: CcCheck) -> io::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let (udp2, tcp2, stop2) = (udp.try_clone()?, tcp.try_clone()?, stop.clone());
    let up = std::thread::Builder::new()
        .name("udp->tcp".into())
        .spawn(move || {
            let r = pump_udp_to_tcp(&udp2, &tcp2, &stop2, cc);
            // TCP unusable: end the other direction too.
            let _ = tcp2.shutdown(Shutdown::Both);
            r
        })?;
    let r = pump_tcp_to_udp(&tcp, &udp);
    stop.store(true, Ordering::Relaxed);
    let _ = tcp.shutdown(Shutdown::Both);
    let up = up.join().unwrap_or(Ok(()));
    r.and(up)
}

/// The server-side relay, built on the gateway's own [`TcpTransport`] (same limits,
/// timeouts, congestion-control policy and coalescing writer): each TCP connection
/// gets its own UDP socket towards `--udp-forward`, created with its first message.
pub struct Tcp2Udp {
    transport: TcpTransport,
}

struct UdpSide {
    udp: UdpSocket,
    stop: AtomicBool,
}

struct Tcp2UdpSink {
    udp_forward: SocketAddr,
    udp_bind: IpAddr,
    handle: OnceLock<TcpHandle>,
    sides: Mutex<HashMap<ConnId, Arc<UdpSide>>>,
}

impl Tcp2UdpSink {
    fn side(&self, conn: ConnId, remote: SocketAddr) -> Option<Arc<UdpSide>> {
        let mut sides = self.sides.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = sides.get(&conn) {
            return Some(s.clone());
        }
        let handle = self.handle.get()?;
        let udp = UdpSocket::bind(SocketAddr::new(self.udp_bind, 0))
            .and_then(|u| u.connect(self.udp_forward).map(|_| u))
            .map_err(|e| log::warn!("tcp2udp: {remote}: no UDP socket: {e}"))
            .ok()?;
        let side = Arc::new(UdpSide {
            udp,
            stop: AtomicBool::new(false),
        });
        let (s2, h2) = (side.clone(), handle.clone());
        let spawned = std::thread::Builder::new()
            .name("tcp2udp-udp".into())
            .spawn(move || udp_to_transport(&s2, &h2, conn));
        if let Err(e) = spawned {
            log::warn!("tcp2udp: {remote}: cannot start a thread: {e}");
            handle.close(conn);
            return None;
        }
        log::debug!(
            "tcp2udp: conn {conn} from {remote} -> {}/UDP",
            self.udp_forward
        );
        sides.insert(conn, side.clone());
        Some(side)
    }
}

impl TcpSink for Tcp2UdpSink {
    fn on_message(&self, conn: ConnId, remote: SocketAddr, msg: &[u8]) -> bool {
        let Some(side) = self.side(conn, remote) else {
            return false;
        };
        // A lost datagram is what UDP allows; the relay keeps going.
        let _ = side.udp.send(msg);
        // A relay holds no keys: every message it forwards counts as authenticated.
        true
    }

    fn on_closed(&self, conn: ConnId) {
        let side = self
            .sides
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&conn);
        if let Some(s) = side {
            s.stop.store(true, Ordering::Relaxed);
        }
    }
}

/// UDP replies back onto the connection, one `send` per datagram as the gateway's
/// device does: the transport tells interactive packets from bulk and coalesces the
/// latter itself (so the helper test exercises that path).
fn udp_to_transport(side: &UdpSide, h: &TcpHandle, conn: ConnId) {
    let mut buf = vec![0u8; MAX_MESSAGE_LEN];
    // Bounded waits so that `stop` is seen once the connection is gone.
    if side
        .udp
        .set_read_timeout(Some(Duration::from_millis(500)))
        .is_err()
    {
        return h.close(conn);
    }
    while !side.stop.load(Ordering::Relaxed) {
        match side.udp.recv(&mut buf) {
            Ok(n) => match h.send(conn, &buf[..n]) {
                Ok(()) => {}
                Err(SendError::UnknownConn) | Err(SendError::Closed) => return,
                // Full: dropped whole. Invalid: not WireGuard, not forwarded.
                Err(_) => {}
            },
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            // Interrupted, or an ICMP error from an earlier send: keep going.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionRefused
                ) => {}
            Err(e) => {
                log::debug!("tcp2udp: conn {conn}: UDP receive failed: {e}");
                return h.close(conn);
            }
        }
    }
}

impl Tcp2Udp {
    pub fn bind(opts: Tcp2UdpOptions) -> io::Result<Tcp2Udp> {
        let udp_bind = opts.udp_bind.unwrap_or(if opts.udp_forward.is_ipv4() {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        } else {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        });
        let sink = Arc::new(Tcp2UdpSink {
            udp_forward: opts.udp_forward,
            udp_bind,
            handle: OnceLock::new(),
            sides: Mutex::new(HashMap::new()),
        });
        let cfg = TcpConfig {
            listen: opts.tcp_listen.clone(),
            tuning: opts.tcp.tuning(),
            cc: opts.tcp.cc(),
            max_conns: opts.max_connections,
            max_per_source: opts.max_per_source,
            // Mullvad's tcp2udp has no receive timeout unless asked for one.
            idle_timeout: opts
                .tcp
                .recv_timeout
                .unwrap_or(Duration::from_secs(10 * 365 * 86400)),
            ..TcpConfig::default()
        };
        let transport = TcpTransport::start(cfg, sink.clone())?;
        let _ = sink.handle.set(transport.handle());
        for a in transport.local_addrs() {
            log::info!("tcp2udp: listening on {a}/TCP -> {}/UDP", opts.udp_forward);
        }
        Ok(Tcp2Udp { transport })
    }

    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.transport.local_addrs().to_vec()
    }

    /// Serve until the process ends.
    pub fn run(self) -> io::Error {
        loop {
            std::thread::park();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn mullvad_option_names() {
        let o = parse_udp2tcp(&args(
            "--udp-listen 127.0.0.1:51820 --tcp-forward [2001:db8::1]:443 --nodelay --recv-buffer 1000 \
             --send-buffer 2000 --tcp-recv-timeout 30 --fwmark 7",
        ))
        .unwrap();
        assert_eq!(o.tcp_forward, "[2001:db8::1]:443".parse().unwrap());
        assert_eq!(
            o.tcp,
            TcpOpts {
                nodelay: true,
                recv_buffer: Some(1000),
                send_buffer: Some(2000),
                recv_timeout: Some(Duration::from_secs(30)),
                fwmark: Some(7),
                bbr_rtt_ms: None
            }
        );
        let o = parse_tcp2udp(&args(
            "--tcp-listen 0.0.0.0:443 --tcp-listen [::]:80 --udp-forward 127.0.0.1:51820 --udp-bind 127.0.0.1",
        ))
        .unwrap();
        assert_eq!(o.tcp_listen.len(), 2);
        assert_eq!(o.udp_bind, Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert!(parse_tcp2udp(&args("--udp-forward 127.0.0.1:1")).is_err());
        assert!(parse_udp2tcp(&args("--udp-listen nonsense --tcp-forward 1.2.3.4:5")).is_err());
        assert!(parse_udp2tcp(&args("--udp-listen 1.2.3.4:5 --tcp-forward")).is_err());
        assert!(parse_udp2tcp(&args("--bogus")).is_err());
    }

    fn wg_msg(len: usize, fill: u8) -> Vec<u8> {
        let mut m = vec![fill; len];
        m[..4].copy_from_slice(&[4, 0, 0, 0]);
        m
    }

    #[test]
    fn udp_echo_through_udp2tcp_and_tcp2udp() {
        // UDP echo server standing in for a WireGuard server.
        let echo = UdpSocket::bind("127.0.0.1:0").unwrap();
        let echo_addr = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut b = [0u8; 65536];
            while let Ok((n, from)) = echo.recv_from(&mut b) {
                let _ = echo.send_to(&b[..n], from);
            }
        });
        let server = Tcp2Udp::bind(
            parse_tcp2udp(&args(&format!(
                "--tcp-listen 127.0.0.1:0 --udp-forward {echo_addr} --nodelay"
            )))
            .unwrap(),
        )
        .unwrap();
        let tcp_addr = server.local_addrs()[0];
        std::thread::spawn(move || server.run());
        let client = Udp2Tcp::connect(
            &parse_udp2tcp(&args(&format!(
                "--udp-listen 127.0.0.1:0 --tcp-forward {tcp_addr} --nodelay"
            )))
            .unwrap(),
        )
        .unwrap();
        let udp_addr = client.local_udp_addr().unwrap();
        std::thread::spawn(move || client.run());

        let app = UdpSocket::bind("127.0.0.1:0").unwrap();
        app.connect(udp_addr).unwrap();
        app.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 65536];
        for (i, len) in [32usize, 148, 1400, 60000, 33].iter().enumerate() {
            let m = wg_msg(*len, i as u8);
            app.send(&m).unwrap();
            let n = app.recv(&mut b).unwrap();
            assert_eq!(&b[..n], &m[..]);
        }
        // Non-WireGuard datagrams are not forwarded and do not break the relay.
        app.send(b"hello").unwrap();
        let m = wg_msg(64, 9);
        app.send(&m).unwrap();
        let n = app.recv(&mut b).unwrap();
        assert_eq!(&b[..n], &m[..]);
        // A burst arrives complete and in order (loopback does not drop at this size).
        for i in 0..50u8 {
            app.send(&wg_msg(1000, i)).unwrap();
        }
        for i in 0..50u8 {
            let n = app.recv(&mut b).unwrap();
            assert_eq!(&b[..n], &wg_msg(1000, i)[..]);
        }
    }
}
