//! `riceguard ssh --root DIR`: the console over SSH. Owns the SSH server process: its
//! host key (through [`crate::perm::ssh_host_key`]), when and where it listens, who may
//! connect and log in, and the console child each session runs.
//!
//! - Listens on `[::]:SshPort` (both families) only while the saved configuration in DIR
//!   has an `SshKey`; the file is read again every [`RECHECK`], and the listener started,
//!   stopped or moved when keys or port change; open sessions stay when only the port
//!   moves.
//! - Public keys only (no password, no keyboard-interactive), login name `admin`; the keys
//!   are read from the saved configuration at each login, and a logged-in session whose
//!   key is deleted (or its name given another key) is ended at the next re-read.
//! - The host key is read again at each re-read too: an import's commit (or its rollback)
//!   that writes another one is what new connections get, without a restart.
//! - Each session channel runs `riceguard console --root DIR --name ssh-N:KEY
//!   --authenticated ssh` ([`child`]): on a pseudo-terminal for an interactive shell, on
//!   pipes for a command or a script, whose exit status the client gets.
//! - Limits ([`admission`], [`server::LOGIN_GRACE`]): 20 s to log in, 4 connections
//!   logging in per source and 16 in all, 8 sessions; a source [`source_allowed`] refuses
//!   is closed at accept.
//!
//! tokio runs only in this process (one thread), for russh.

pub mod admission;
pub mod child;
pub mod server;

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::core::config::SshKey;
use crate::core::net::Cidr;
use crate::perm::config::{load, Ini};
use crate::perm::ssh_host_key;

/// How often the saved configuration is read for keys and port.
pub const RECHECK: Duration = Duration::from_secs(2);
/// The scheduling niceness the server runs at: the data plane comes first.
pub const NICE: i32 = 10;

const USAGE: &str = "usage: riceguard ssh --root DIR [--listen ADDR] [--deny-source CIDR]... [--pidfile P] [--status-file S] [--socket U]
  DIR           the perm partition: the saved configuration (SshKey, SshPort), the host key
  --listen      the address to listen on (default :: , both IPv6 and IPv4); the port is SshPort
  --deny-source refuse connections from CIDR at accept (repeatable; for tests)
  --pidfile, --status-file, --socket  passed to each session's console (tests on a host:
                its commits then signal no daemon of the host's)";

struct Args {
    root: PathBuf,
    listen: IpAddr,
    deny: Vec<Cidr>,
    /// Passed to each console as they are.
    console_args: Vec<String>,
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut root = None;
    let mut listen = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
    let mut deny = Vec::new();
    let mut console_args = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |n: &str| it.next().cloned().ok_or(format!("{n} needs a value"));
        match a.as_str() {
            "--root" => root = Some(PathBuf::from(val("--root")?)),
            "--listen" => {
                let v = val("--listen")?;
                listen = v
                    .parse()
                    .map_err(|_| format!("--listen `{v}`: not an address"))?;
            }
            "--deny-source" => {
                let v = val("--deny-source")?;
                deny.push(
                    v.parse::<Cidr>()
                        .map_err(|e| format!("--deny-source `{v}`: {e}"))?,
                );
            }
            "--pidfile" | "--status-file" | "--socket" => {
                let v = val(a)?;
                console_args.extend([a.clone(), v]);
            }
            "-h" | "--help" => return Err(String::new()),
            o => return Err(format!("unknown argument `{o}`")),
        }
    }
    Ok(Args {
        root: root.ok_or("--root DIR is required")?,
        listen,
        deny,
        console_args,
    })
}

/// Whether `ip` may connect to the SSH server at all: checked right after accept,
/// whatever the firewall does (`Firewall = off`, or a table someone removed, does not
/// open it). The appliance's rule for its services, `core::firewall::services`: from the
/// tunnel (its subnets, the enabled peers' allowed IPs) and the LAN port; one-armed from
/// the uplink's own subnets (cut to /16, /48 around the box's address); from the box itself.
/// Judged on the saved configuration and the interfaces' addresses as they are now. Never
/// from a `--deny-source` range. Fails closed when the addresses cannot be read.
pub fn source_allowed(root: &Path, deny: &[Cidr], ip: IpAddr) -> Result<(), String> {
    if deny.iter().any(|c| c.contains(ip)) {
        return Err("a --deny-source range".into());
    }
    let ip = ip.to_canonical();
    if ip.is_loopback() {
        return Ok(());
    }
    let cfg = load(root, &Ini).config;
    let mut nl = crate::sys::netlink::Netlink::open()
        .map_err(|e| format!("the interfaces' addresses cannot be read ({e}): refused"))?;
    let ports = crate::driver::appliance::firewall::ports_now(
        &mut nl,
        &cfg.gateway.interface_name,
        &cfg,
        0,
    );
    use crate::core::firewall::services::{source, Source};
    match source(&cfg, &ports, ip) {
        Source::Outside => Err(if ports.lan.is_some() {
            "not from the tunnel or the LAN port (two-armed: the uplink never reaches the box's services)".into()
        } else {
            "not from the tunnel or the uplink's own subnet".into()
        }),
        _ => Ok(()),
    }
}

pub fn main(args: &[String]) -> ExitCode {
    crate::logger::init();
    let a = match parse_args(args) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("riceguard ssh: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let rc = match run(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("ssh: {e}");
            ExitCode::from(1)
        }
    };
    crate::logger::flush();
    rc
}

/// The keys and port the saved configuration in `root` has now.
fn wanted(root: &Path) -> (Vec<SshKey>, u16) {
    let g = load(root, &Ini).config.gateway;
    (g.ssh_keys, g.ssh_port)
}

fn run(a: Args) -> Result<(), String> {
    stay_out_of_the_way(&a.root);
    let (seed, made) = ssh_host_key::get_or_create(&a.root, || {
        let mut s = [0u8; 32];
        rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut s);
        s
    })
    .map_err(|e| format!("host key: {e}"))?;
    let fp = ssh_host_key::fingerprint(&seed);
    crate::logger::console_line(&format!(
        "ssh: host key {fp} (ED25519){}",
        if made { ", made now" } else { "" }
    ));
    let bin = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let deny = a.deny.clone();
    let root = a.root.clone();
    let root_src = a.root.clone();
    let shared = Arc::new(server::Shared::new(
        a.root.clone(),
        bin,
        a.console_args.clone(),
        Arc::new(move |ip| source_allowed(&root_src, &deny, ip)),
        Box::new(move || wanted(&root).0),
        Arc::new(server::russh_config(host_key(&seed))),
    ));
    confirm_watch(a.root.clone(), &a.console_args);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    rt.block_on(watch(a.root, a.listen, shared, seed));
    Ok(())
}

fn host_key(seed: &[u8; 32]) -> russh::keys::PrivateKey {
    russh::keys::PrivateKey::from(russh::keys::ssh_key::private::Ed25519Keypair::from_seed(
        seed,
    ))
}

/// The host key on perm changed under a running server (an import's commit, or the
/// rollback of one): new connections get it from now on. Says so on the console, where
/// the boot's fingerprint line was. A key that cannot be read keeps the one in use.
fn host_key_changed(root: &Path, current: &mut [u8; 32], shared: &server::Shared) {
    let now = match ssh_host_key::read(root) {
        Ok(Some(k)) => k,
        Ok(None) => return,
        Err(e) => {
            log::warn!("ssh: the host key on perm cannot be read ({e}): keeping the one in use");
            return;
        }
    };
    if now == *current {
        return;
    }
    shared.set_config(Arc::new(server::russh_config(host_key(&now))));
    crate::logger::console_line(&format!(
        "ssh: host key {} (ED25519), replacing {} (written by an import or its rollback); new connections get it",
        ssh_host_key::fingerprint(&now),
        ssh_host_key::fingerprint(current)
    ));
    *current = now;
}

/// A commit-confirm made over SSH does not depend on its session's console to roll back:
/// a thread looks every [`RECHECK`] and, once one is overdue by the consoles' grace,
/// rolls it back as a console of the box would (the serial console does the same on the
/// appliance; whichever comes first, once, under the configuration lock).
fn confirm_watch(root: PathBuf, console_args: &[String]) {
    let mut hooks = crate::console::system::SystemHooks::default();
    for pair in console_args.chunks(2) {
        if let [k, v] = pair {
            match k.as_str() {
                "--pidfile" => hooks.pidfile = PathBuf::from(v),
                "--status-file" => hooks.status_file = PathBuf::from(v),
                "--socket" => hooks.socket = Some(PathBuf::from(v)),
                _ => {}
            }
        }
    }
    let spawned = std::thread::Builder::new()
        .name("confirm-watch".into())
        .spawn(move || loop {
            std::thread::sleep(RECHECK);
            let Some(deadline) = crate::perm::confirm::pending(&root) else {
                continue;
            };
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let grace = crate::console::session::BACKUP_GRACE_SECS.unsigned_abs();
            if now < deadline.saturating_add(grace) {
                continue;
            }
            let h = crate::console::system::SystemHooks {
                pidfile: hooks.pidfile.clone(),
                socket: hooks.socket.clone(),
                status_file: hooks.status_file.clone(),
                job: None,
            };
            if let Some(said) = crate::console::settle_overdue_confirm(&root, "ssh-server", h) {
                for l in said.lines() {
                    log::info!("ssh: {l}");
                }
            }
        });
    if let Err(e) = spawned {
        log::warn!("ssh: cannot watch commit-confirm deadlines: {e}");
    }
}

/// Listen while the saved configuration has keys, on its port; re-read every [`RECHECK`].
async fn watch(root: PathBuf, ip: IpAddr, shared: Arc<server::Shared>, mut seed: [u8; 32]) {
    let mut current: Option<(SocketAddr, tokio::task::JoinHandle<()>)> = None;
    let mut failed: Option<(SocketAddr, String)> = None;
    let mut said_idle = false;
    loop {
        let (keys, port) = wanted(&root);
        for l in shared.end_revoked(&keys) {
            log::warn!("{l}");
        }
        host_key_changed(&root, &mut seed, &shared);
        let want = (!keys.is_empty()).then(|| SocketAddr::new(ip, port));
        if want.is_none() && !said_idle {
            log::info!("ssh: no SSH key in the saved configuration: not listening");
            said_idle = true;
        }
        if current.as_ref().map(|c| c.0) != want {
            if let Some((addr, task)) = current.take() {
                task.abort();
                log::info!("ssh: no longer listening on {addr}");
            }
            match want {
                None => {}
                Some(addr) => match bind(addr) {
                    Ok(l) => {
                        said_idle = false;
                        failed = None;
                        log::info!(
                            "ssh: listening on {addr} ({} key{})",
                            keys.len(),
                            if keys.len() == 1 { "" } else { "s" }
                        );
                        current = Some((
                            addr,
                            tokio::spawn(server::accept_loop(l, Arc::clone(&shared))),
                        ));
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        if failed.as_ref() != Some(&(addr, msg.clone())) {
                            log::error!(
                                "ssh: cannot listen on {addr}: {msg} (trying again every {} s)",
                                RECHECK.as_secs()
                            );
                            failed = Some((addr, msg));
                        }
                    }
                },
            }
        }
        tokio::time::sleep(RECHECK).await;
    }
}

/// A listening socket on `addr`; on `::` it takes IPv4 too (v6only off, whatever the
/// sysctl says).
fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    use nix::sys::socket::{
        bind, listen, setsockopt, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType,
        SockaddrStorage,
    };
    let fam = if addr.is_ipv6() {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    let fd = socket(
        fam,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    if addr.is_ipv6() {
        setsockopt(&fd, sockopt::Ipv6V6Only, &false)?;
    }
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrStorage::from(addr),
    )?;
    listen(&fd, Backlog::new(64).unwrap_or(Backlog::MAXCONN))?;
    tokio::net::TcpListener::from_std(std::net::TcpListener::from(fd))
}

/// Run niced and off the data plane's cores when other cores are online: a connection
/// flood must not take CPU from the tunnel. The data plane's cores are the
/// configuration's `Cores`, else the board's `DATAPLANE_CORES` (where init steers the
/// uplink's receive queues).
fn stay_out_of_the_way(root: &Path) {
    if let Err(e) = crate::sys::process::set_nice(NICE) {
        log::warn!("ssh: cannot lower its priority: {e}");
    }
    let mut cores = load(root, &Ini).config.gateway.cores;
    if cores.is_empty() {
        if let Ok(t) = std::fs::read_to_string(crate::image_paths::BOARD_CONF) {
            cores = crate::init::board::parse(&t).0.dataplane_cores;
        }
    }
    let Ok(set) = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) else {
        return;
    };
    let allowed: Vec<usize> = (0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect();
    let Some(left) = off_cores(&allowed, &cores) else {
        log::info!("ssh: niced ({NICE}); on every CPU (no core outside the data plane's)");
        return;
    };
    let mut to = nix::sched::CpuSet::new();
    for &c in &left {
        let _ = to.set(c);
    }
    match nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &to) {
        Ok(()) => log::info!(
            "ssh: niced ({NICE}), on CPU {} (the data plane has {})",
            cpus(&left),
            cpus(&cores)
        ),
        Err(e) => log::warn!("ssh: cannot leave the data plane's cores: {e}"),
    }
}

fn cpus(c: &[usize]) -> String {
    let v: Vec<String> = c.iter().map(usize::to_string).collect();
    v.join(",")
}

/// The CPUs of `allowed` outside `dataplane`; `None` when that leaves none (or nothing
/// is to be left).
fn off_cores(allowed: &[usize], dataplane: &[usize]) -> Option<Vec<usize>> {
    if dataplane.is_empty() {
        return None;
    }
    let left: Vec<usize> = allowed
        .iter()
        .copied()
        .filter(|c| !dataplane.contains(c))
        .collect();
    (!left.is_empty()).then_some(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `--deny-source` ranges are refused before anything is read; the box itself
    /// (loopback, also as an IPv4-mapped address) is let in without reading either. The
    /// zones are `core::firewall::services`' tests and ci/ssh.sh's.
    #[test]
    fn deny_source_and_loopback() {
        let nowhere = Path::new("/nonexistent-riceguard-root");
        let deny: Vec<Cidr> = vec![
            "10.9.0.0/16".parse().unwrap(),
            "fd00:9::/32".parse().unwrap(),
        ];
        assert!(source_allowed(nowhere, &deny, "10.9.1.2".parse().unwrap()).is_err());
        assert!(source_allowed(nowhere, &deny, "fd00:9::5".parse().unwrap()).is_err());
        for lo in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            assert_eq!(
                source_allowed(nowhere, &deny, lo.parse().unwrap()),
                Ok(()),
                "{lo}"
            );
        }
    }

    #[test]
    fn off_the_data_planes_cores() {
        assert_eq!(off_cores(&[0, 1, 2, 3], &[1, 2, 3]), Some(vec![0]));
        assert_eq!(off_cores(&[0, 1], &[1]), Some(vec![0]));
        assert_eq!(off_cores(&[0, 1], &[]), None, "nothing to leave");
        assert_eq!(off_cores(&[1], &[1]), None, "no other core: stay");
        assert_eq!(off_cores(&[0, 1, 2], &[0, 7]), Some(vec![1, 2]));
    }

    #[test]
    fn args() {
        let a = parse_args(&[
            "--root".into(),
            "/p".into(),
            "--deny-source".into(),
            "10.0.0.0/8".into(),
        ])
        .unwrap();
        assert_eq!(a.root, PathBuf::from("/p"));
        assert_eq!(a.deny.len(), 1);
        assert!(parse_args(&["--deny-source".into(), "x".into()]).is_err());
        assert!(parse_args(&[]).is_err());
    }

    /// The fingerprint said at start is ssh-keygen's for the same key (RFC 8032's first
    /// test key: its public half is known, so the blob is checked independently).
    #[test]
    fn host_fingerprint_is_of_the_seeds_public_key() {
        let seed: [u8; 32] = [
            0x9d, 0x61, 0xb1, 0x9d, 0xef, 0xfd, 0x5a, 0x60, 0xba, 0x84, 0x4a, 0xf4, 0x92, 0xec,
            0x2c, 0xc4, 0x44, 0x49, 0xc5, 0x69, 0x7b, 0x32, 0x69, 0x19, 0x70, 0x3b, 0xac, 0x03,
            0x1c, 0xae, 0x7f, 0x60,
        ];
        let public: [u8; 32] = [
            0xd7, 0x5a, 0x98, 0x01, 0x82, 0xb1, 0x0a, 0xb7, 0xd5, 0x4b, 0xfe, 0xd3, 0xc9, 0x64,
            0x07, 0x3a, 0x0e, 0xe1, 0x72, 0xf3, 0xda, 0xa6, 0x23, 0x25, 0xaf, 0x02, 0x1a, 0x68,
            0xf7, 0x07, 0x51, 0x1a,
        ];
        let want = crate::core::ssh_key::fingerprint(&crate::core::ssh_key::ed25519_blob(&public));
        assert_eq!(ssh_host_key::fingerprint(&seed), want);
        // And russh's key from the same seed offers the same blob.
        let k = russh::keys::PrivateKey::from(
            russh::keys::ssh_key::private::Ed25519Keypair::from_seed(&seed),
        );
        assert_eq!(
            k.public_key().to_bytes().unwrap(),
            crate::core::ssh_key::ed25519_blob(&public)
        );
    }
}
