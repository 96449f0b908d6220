//! The daemon process: `main`, then start-up in order (configuration, TUN, sockets, UAPI
//! socket before daemonizing; signals blocked before any thread), the worker threads
//! pinned to cores, the timer thread, the UAPI and name-retry threads, and the signal
//! loop (SIGHUP reload, shutdown). Owns the pid file (appliance mode).

use super::args::{parse_args, Opts, USAGE};
use super::dns;
use super::metrics;
use super::runtime::{reload, Runtime};
use super::status::{self, status_path};
use super::timers;
use super::uapi;
use crate::driver::appliance::netconf;
use crate::driver::dataplane::heartbeat::Heartbeats;
use crate::driver::dataplane::shared::{Shared, TcpOut};
use crate::driver::dataplane::sockets::{bind_udp, SocketSet};
use crate::driver::dataplane::spread::Spread;
use crate::driver::dataplane::{poll, uring};
use crate::driver::tcp::link as tcp_link;

use std::net::{IpAddr, Ipv4Addr};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{SigSet, Signal};

use crate::core::config::Config;
use crate::core::device::Device;
use crate::sys::tun::Tun;
use crate::sys::udp::UdpSocket;

use crate::run::PIDFILE;
/// How often unresolved peer endpoint names are looked up again (appliance mode).
const RESOLVE_RETRY: Duration = Duration::from_secs(15);

/// `riceguard [-f] IFNAME` and `riceguard up --config FILE`.
pub fn main(args: &[String]) -> ExitCode {
    crate::logger::init();
    let opts = match parse_args(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let rc = match run(opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{e}");
            ExitCode::from(1)
        }
    };
    // The last lines (often the reason for exiting) reach the console first.
    crate::logger::flush();
    rc
}

fn cores_for(cfg: &Config, n: usize) -> Vec<usize> {
    if !cfg.gateway.cores.is_empty() {
        return cfg.gateway.cores.clone();
    }
    (0..n).collect()
}

fn run(opts: Opts) -> Result<(), String> {
    let appliance = opts.config_file.is_some();
    let mut cfg = Config::default();
    // The file as read, disabled peers included (the metrics endpoint's peers).
    let mut file_cfg: Option<Config> = None;
    if let Some(path) = &opts.config_file {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        let (parsed, warnings) =
            crate::core::ini::parse_with_warnings(path, &text).map_err(|e| e.to_string())?;
        for w in &warnings {
            log::warn!("{w}");
        }
        cfg = parsed;
        // validate() also requires the private key `up` needs.
        cfg.validate().map_err(|e| format!("{path}: {e}"))?;
        file_cfg = Some(cfg.clone());
        cfg = cfg.running();
    }
    let ifname = if appliance {
        cfg.gateway.interface_name.clone()
    } else {
        opts.ifname.clone()
    };
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    if let Some(c) = &opts.cores {
        cfg.gateway.cores = c.clone();
    }
    let cores = cores_for(&cfg, ncpu);
    let workers = opts.workers.unwrap_or(cores.len()).max(1);
    let g = &mut cfg.gateway;
    g.io_uring = opts.io_uring.unwrap_or(g.io_uring);
    g.offload = opts.offload.unwrap_or(g.offload);
    g.tun_offload = opts.tun_offload.unwrap_or(g.tun_offload);
    g.poll = opts.poll.unwrap_or(g.poll);
    g.hugepages = opts.hugepages.unwrap_or(g.hugepages);
    let gw = cfg.gateway.clone();

    let tun =
        Tun::create(&ifname, workers, gw.tun_offload).map_err(|e| format!("{ifname}: {e}"))?;
    let ifname = tun.name().to_string();
    let (socks, port) = bind_udp(
        workers,
        cfg.interface.listen_port.unwrap_or(0),
        cfg.interface.fwmark,
        gw.offload,
    )
    .map_err(|e| format!("UDP: {e}"))?;
    // The appliance decides for its uplink (it may have no route yet: DHCP comes later);
    // the drop-in form for the interface its host routes public traffic through.
    let egress = if appliance {
        crate::sys::nic::uplink(&gw.uplink)
    } else if gw.uplink.is_empty() {
        crate::sys::offload::egress_interface(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)))
    } else {
        Some(gw.uplink.clone())
    };
    let refs: Vec<&UdpSocket> = socks.iter().map(|s| &**s).collect();
    let decision = crate::sys::offload::decide_and_apply(egress.as_deref(), gw.offload, &refs);
    let tun_offload = tun.offload();
    log::info!(
        "{ifname}: TUN {}",
        if tun.vnet_hdr() {
            format!("virtio_net_hdr, offloads {tun_offload}")
        } else {
            "without offload".to_string()
        }
    );
    let listener = uapi::bind(&ifname).map_err(|e| format!("UAPI socket: {e}"))?;
    // Appliance mode only: the drop-in form leaves the network to wg-quick.
    let netconf = if appliance {
        Some(Arc::new(
            netconf::NetConf::start(&ifname, &cfg, port).map_err(|e| e.to_string())?,
        ))
    } else {
        None
    };
    if !opts.foreground {
        // The log goes to $RG_LOG_FILE when set (wireguard-go's daemon is silent too).
        let log_file = std::env::var("RG_LOG_FILE").ok();
        // No thread may run across fork: the log writer stops and restarts in the child.
        crate::logger::pause();
        let r = crate::sys::process::daemonize(log_file.as_deref());
        crate::logger::resume();
        r.map_err(|e| format!("daemonize: {e}"))?;
    }
    // Not under init: the daemon sends its own lines to the configured collector.
    crate::logger::syslog("gateway", cfg.gateway.syslog.as_ref());
    // Block the signals we handle before any thread exists, so only sigwait sees them.
    let mut sigs = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGUSR1,
    ] {
        sigs.add(s);
    }
    if opts.selftest_hang {
        // Only then: otherwise SIGUSR2 keeps its default action. A local signal from
        // init, never anything the network can cause.
        sigs.add(Signal::SIGUSR2);
    }
    sigs.thread_block().map_err(|e| format!("signals: {e}"))?;

    let device = Arc::new(Device::new(Box::new(rand_core::OsRng)));
    if let Some(mtu) = timers::read_mtu(&ifname) {
        device.set_mtu(mtu); // before any worker encrypts: padding is capped by it
    }
    let tcp_slot = Arc::new(tcp_link::TcpSlot::default());
    let tcp_slot_for_metrics = tcp_slot.clone();
    let sockets = Arc::new(SocketSet::new(socks, port));
    let vnet_hdr = tun.vnet_hdr();
    let tcp_sink = match tun.queue(0).map(|q| q.try_clone()) {
        Some(Ok(q)) => Some(Arc::new(tcp_link::DeviceSink::new(
            device.clone(),
            sockets.clone(),
            tcp_slot.clone(),
            q,
            vnet_hdr,
            tun.offload(),
        ))),
        _ => {
            log::warn!(
                "{ifname}: cannot share a TUN queue with the TCP transport; TCP fallback off"
            );
            None
        }
    };
    // One peer on every core: with more than one worker (and not turned off).
    let spread = if workers > 1 && opts.spread {
        match Spread::new(workers) {
            Ok(s) => Some(Arc::new(s)),
            Err(e) => {
                log::warn!("{ifname}: not spreading one peer over the workers: {e}");
                None
            }
        }
    } else {
        None
    };
    let shared = Arc::new(Shared {
        spread: spread.clone(),
        device: device.clone(),
        sockets,
        stop: Arc::new(AtomicBool::new(false)),
        tcp: Some(tcp_slot.clone() as Arc<dyn TcpOut>),
        tun_gone: Arc::new(AtomicBool::new(false)),
        heartbeats: Arc::new(Heartbeats::new(workers)),
    });
    let rt = Arc::new(Runtime::new(
        shared.clone(),
        ifname.clone(),
        workers,
        tcp_sink.clone(),
        tcp_slot,
        !appliance,
        gw.offload,
        decision.clone(),
    ));
    // The first apply also starts the TCP transport (listening, or client only).
    rt.apply_config_as(&cfg, true).map_err(|e| e.to_string())?;
    // Drop-in mode may have moved to a port free for TCP too.
    let port = rt.shared.sockets.port.load(Ordering::Relaxed);
    log::info!("{ifname}: up, {workers} worker(s) on cores {cores:?}, UDP port {port}");
    // Probe once for the whole process: a kernel without io_uring (or with it disabled by
    // sysctl or seccomp) is said once, and every worker takes the portable loop.
    let use_uring = gw.io_uring && crate::sys::uring::check().is_ok();
    let mut report = vec![
        format!("interface: {ifname}"),
        format!("mode: {}", if appliance { "appliance" } else { "drop-in" }),
        format!("workers: {workers} on cores {cores:?}"),
        format!("offload: {}", decision.reason),
        format!(
            "tun: {}",
            if vnet_hdr {
                format!("virtio_net_hdr, offloads {tun_offload}")
            } else {
                "plain (no offload)".into()
            }
        ),
        format!("io: {}", io_path(gw.io_uring, use_uring)),
    ];
    if spread.is_none() {
        report.push(format!(
            "spread: off ({})",
            if workers > 1 {
                "--spread off"
            } else {
                "one worker"
            }
        ));
    }
    let mut status_paths = vec![status_path(&ifname)];
    if appliance {
        // The console's `show status` reads this one.
        status_paths.push(crate::run::STATUS_FILE.into());
    }
    let board = Arc::new(status::StatusBoard::new(status_paths, report, workers));
    // Run-time lines: whether the UDP sockets send with GSO now (an EIO ends it on a
    // socket) and the peers it rests toward after an EINVAL, then the appliance's
    // (firewall, routes, proxy entries).
    let sockets = rt.shared.clone();
    let nc = netconf.clone();
    board.extra(Box::new(move || {
        let socks = sockets.sockets.get().1;
        let states: Vec<_> = socks.iter().map(|s| s.gso_state()).collect();
        let rests: Vec<_> = socks.iter().flat_map(|s| s.gso_rests()).collect();
        let mut v = crate::sys::udp::gso_status_lines(&states, &rests);
        if let Some(sp) = &spread {
            v.push(sp.status_line());
        }
        if let Some(nc) = &nc {
            v.extend(nc.status_lines());
        }
        v
    }));

    let mut handles = Vec::new();
    let ucfg = uring::engine::UringWorkerConfig::from_gateway(&gw);
    let poll_mode = gw.poll;
    for (i, q) in tun.into_queues().into_iter().enumerate() {
        let sh = shared.clone();
        let board = board.clone();
        let core = cores[i % cores.len()];
        handles.push(
            std::thread::Builder::new()
                .name(format!("rg-worker-{i}"))
                .spawn(move || {
                    pin_to(core);
                    let q = if use_uring {
                        let started =
                            |line: String| board.worker(i, format!("core {core}, {line}"));
                        match uring::engine::run(
                            i,
                            q,
                            tun_offload,
                            vnet_hdr,
                            sh.clone(),
                            &ucfg,
                            started,
                        ) {
                            Ok(()) => None,
                            Err(ns) => {
                                log::warn!(
                                    "worker {i}: io_uring not used ({}); portable loop",
                                    ns.error
                                );
                                board.worker(
                                    i,
                                    format!(
                                        "core {core}, poll loop (io_uring not used: {})",
                                        ns.error
                                    ),
                                );
                                Some(ns.tun)
                            }
                        }
                    } else {
                        board.worker(i, format!("core {core}, poll loop"));
                        Some(q)
                    };
                    if let Some(q) = q {
                        poll::engine::run(i, q, tun_offload, vnet_hdr, poll_mode, sh.clone());
                    }
                    if sh.tun_gone.load(Ordering::Relaxed) {
                        let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGTERM);
                    }
                })
                .map_err(|e| e.to_string())?,
        );
    }
    let events = Arc::new(super::events::EventBatch::new(opts.event_log.clone()));
    {
        let sh = shared.clone();
        let sink = tcp_sink.clone();
        let ifname = ifname.clone();
        let board = board.clone();
        let events = events.clone();
        std::thread::Builder::new()
            .name("rg-timers".into())
            .spawn(move || timers::run(&sh, sink.as_deref(), &ifname, &board, &events))
            .map_err(|e| e.to_string())?;
    }
    {
        let rt = rt.clone();
        std::thread::Builder::new()
            .name("rg-uapi".into())
            .spawn(move || {
                let stop = rt.shared.stop.clone();
                uapi::serve(listener, rt, stop)
            })
            .map_err(|e| e.to_string())?;
    }
    if let Some(nc) = &netconf {
        // Proxy entries follow the uplink's address (a DHCP lease may come later).
        nc.spawn_watch(shared.stop.clone())
            .map_err(|e| e.to_string())?;
    }
    // The DNS forwarder (appliance mode): on the tunnel's and the LAN port's addresses,
    // follows each reload.
    let dns = file_cfg.as_ref().map(|file| {
        let d = Arc::new(dns::Dns::new(cores.iter().take(workers).copied().collect()));
        d.follow(file);
        d
    });
    // The Prometheus endpoint (appliance mode, `Metrics = on`): follows each reload.
    let metrics = file_cfg.as_ref().map(|file| {
        let mx = metrics::Metrics::new(metrics::Sources {
            device: device.clone(),
            heartbeats: shared.heartbeats.clone(),
            tcp: tcp_slot_for_metrics.clone(),
            udp_tx: decision.udp_tx,
            started: std::time::Instant::now(),
            worker_cores: cores.iter().take(workers).copied().collect(),
            dns: dns.clone().map(|d| {
                let stats: metrics::DnsStats = Arc::new(move || d.stats());
                stats
            }),
        });
        mx.follow(file);
        mx
    });
    if appliance {
        let _ = std::fs::write(PIDFILE, format!("{}\n", std::process::id()));
        // Endpoint names that did not resolve (no lease, no resolver yet) are tried
        // again every RESOLVE_RETRY until they do; a reload resolves them too.
        let rt = rt.clone();
        let events = events.clone();
        std::thread::Builder::new()
            .name("rg-resolve".into())
            .spawn(move || {
                let stop = rt.shared.stop.clone();
                let mut waited = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(500));
                    waited += Duration::from_millis(500);
                    if waited < RESOLVE_RETRY {
                        continue;
                    }
                    waited = Duration::ZERO;
                    for said in rt.reresolve_unanswered(std::time::Instant::now()) {
                        events.say(&said);
                    }
                    match rt.retry_names() {
                        Ok(0) => {}
                        Ok(n) => log::info!("{n} peer endpoint name(s) resolved on retry"),
                        Err(e) => log::warn!("peer endpoint names resolved, but: {e}"),
                    }
                }
            })
            .map_err(|e| e.to_string())?;
    }

    // Reloads so far; the console waits for this to move after a commit.
    let mut generation = 0u64;
    loop {
        match sigs.wait() {
            Ok(Signal::SIGHUP) if appliance => {
                let Some(path) = opts.config_file.as_deref() else {
                    continue;
                };
                generation += 1;
                let result = reload(&rt, netconf.as_deref(), path, &ifname).map(|file| {
                    if let Some(mx) = &metrics {
                        mx.follow(&file);
                    }
                    if let Some(d) = &dns {
                        d.follow(&file);
                    }
                });
                board.reload(status::Reload { generation, result });
            }
            Ok(Signal::SIGUSR2) => {
                log::warn!("{ifname}: selftest: the workers stop their heartbeats");
                shared.heartbeats.freeze();
            }
            Ok(Signal::SIGHUP) | Ok(Signal::SIGUSR1) => {
                for (name, n) in device.drops.snapshot() {
                    log::info!("drops {name}: {n}");
                }
            }
            Ok(s) => {
                log::info!("{ifname}: {s:?}, shutting down");
                break;
            }
            Err(e) => {
                log::error!("sigwait: {e}");
                break;
            }
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    if let Some(mx) = &metrics {
        mx.stop();
    }
    if let Some(d) = &dns {
        d.stop();
    }
    if let Some(nc) = &netconf {
        nc.shutdown();
    }
    let _ = std::fs::remove_file(uapi::socket_path(&ifname));
    let _ = std::fs::remove_file(status_path(&ifname));
    let _ = std::fs::remove_file(crate::run::peers::path(&ifname));
    if appliance {
        remove_pidfile_if_ours(std::path::Path::new(PIDFILE), std::process::id());
    }
    rt.stop_tcp();
    for h in handles {
        let _ = h.join();
    }
    // What the timer thread's last tick queued, and the batch: written once more.
    events.take_from(&device);
    events.flush(std::time::Instant::now());
    Ok(())
}

/// Which loop the workers run, for the status report: the decision actually taken.
fn io_path(requested: bool, use_uring: bool) -> &'static str {
    // Both backends run the same offload pipeline (TSO split, GSO batches, GRO receive,
    // coalesced TUN writes); they differ only in how bytes reach the kernel.
    match (use_uring, requested) {
        (true, _) => "io_uring workers (multishot recvmsg, registered buffers, GSO batches)",
        (false, true) => "poll workers (io_uring asked for but unavailable; see the log)",
        (false, false) => "poll workers (IoUring = off)",
    }
}

fn pin_to(core: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(core).is_ok() {
        if let Err(e) = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set) {
            log::warn!("cannot pin worker to core {core}: {e}");
        }
    }
}

/// Remove the pid file only if it still names `pid`: another appliance daemon started
/// since (a restart, a second test's daemon on the same host) owns it now.
fn remove_pidfile_if_ours(path: &std::path::Path, pid: u32) {
    let ours = std::fs::read_to_string(path).is_ok_and(|t| t.trim() == pid.to_string());
    if ours {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_file_is_removed_only_by_its_owner() {
        let dir = crate::testutil::TempDir::new("pidfile");
        let p = dir.0.join("riceguard.pid");
        std::fs::write(&p, "4242\n").unwrap();
        remove_pidfile_if_ours(&p, 4243);
        assert!(p.exists(), "another daemon's pid file was removed");
        remove_pidfile_if_ours(&p, 4242);
        assert!(!p.exists());
        remove_pidfile_if_ours(&p, 4242); // gone already: nothing to do
    }
}
