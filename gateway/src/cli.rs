//! Argument dispatch for the binary's faces, and the small tools (`genkey`, `pubkey`).
use std::io::{Read, Write};
use std::process::ExitCode;

use crate::core::key::Key;

const USAGE: &str = "usage:
  riceguard [-f|--foreground] IFNAME    userspace WireGuard, drop-in for wireguard-go
  riceguard up --config FILE            appliance daemon from a config file
  riceguard genkey | pubkey             like `wg genkey` / `wg pubkey`
  riceguard status [IFNAME]             data-plane decisions and peers of running interfaces
  riceguard dhcp IFACE                  DHCPv4 client of the uplink (init runs it)
  riceguard ntp [--config FILE] [--lease FILE] [--server HOST] [--dry-run]
                                        SNTP client (init runs it)
  riceguard console --root DIR          the configuration console
  riceguard ssh --root DIR              the console over SSH, public keys only (init runs it)
  riceguard log [--root DIR] [N] [peer NAME]
                                        the last N (20) events of the event log (/perm)
  riceguard init                        PID 1 of the appliance image
  riceguard update SOURCE [--reboot]    install a signed update bundle into the other slot
  riceguard rollback-slot [--reboot]    make the other slot the default boot entry again
  riceguard --version";

pub fn main(args: Vec<String>) -> ExitCode {
    let argv0 = args.first().map(String::as_str).unwrap_or("riceguard");
    // As PID 1 (or when exec'd as /init) the binary is the appliance's init.
    if std::process::id() == 1 || argv0.ends_with("/init") || argv0 == "init" {
        return crate::init::main(&args[1..]);
    }
    let rest = &args[1.min(args.len())..];
    match rest.first().map(String::as_str) {
        None | Some("-h") | Some("--help") | Some("help") => {
            println!("{USAGE}");
            if rest.is_empty() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        Some("--version") | Some("-v") => {
            println!("riceguard {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some("genkey") => {
            println!(
                "{}",
                Key::generate_private(&mut rand_core::OsRng).to_base64()
            );
            ExitCode::SUCCESS
        }
        Some("pubkey") => pubkey(),
        Some("status") => crate::driver::daemon::status::status_main(&rest[1..]),
        Some("dhcp") => crate::driver::appliance::dhcp::main(&rest[1..]),
        Some("ntp") => crate::driver::appliance::ntp::main(&rest[1..]),
        Some("console") => crate::console::main(&rest[1..]),
        #[cfg(feature = "ssh")]
        Some("ssh") => crate::ssh::main(&rest[1..]),
        Some("log") => log_main(&rest[1..]),
        Some("init") => crate::init::main(&rest[1..]),
        Some("update") => crate::update::update_main(&rest[1..]),
        Some("rollback-slot") => crate::update::rollback_main(&rest[1..]),
        Some("udp2tcp") => crate::driver::tcp::relay::udp2tcp_main(&rest[1..]),
        Some("tcp2udp") => crate::driver::tcp::relay::tcp2udp_main(&rest[1..]),
        _ => crate::driver::daemon::process::main(rest),
    }
}

/// `riceguard log [--root DIR] [N] [peer NAME]`: what `show log` says, from a shell.
fn log_main(args: &[String]) -> ExitCode {
    let mut root = std::path::PathBuf::from(crate::perm::DIR);
    let mut words: Vec<&str> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match (a.as_str(), it.len()) {
            ("--root", n) if n > 0 => root = it.next().map(Into::into).unwrap_or(root),
            (w, _) => words.push(w),
        }
    }
    let mut cmd = vec!["show", "log"];
    cmd.extend(words);
    match crate::console::command::parse(&cmd.join(" ")) {
        Ok(crate::console::command::Command::ShowLog { n, peer }) => {
            for l in crate::perm::event_log::show(&root, n, peer.as_deref()) {
                println!("{l}");
            }
            ExitCode::SUCCESS
        }
        Ok(_) => ExitCode::from(2),
        Err(e) => {
            eprintln!(
                "riceguard log: {}",
                e.replace("show log", "riceguard log [--root DIR]")
            );
            ExitCode::from(2)
        }
    }
}

fn pubkey() -> ExitCode {
    let mut s = String::new();
    if std::io::stdin().take(4096).read_to_string(&mut s).is_err() {
        eprintln!("error: could not read a private key from standard input");
        return ExitCode::from(1);
    }
    match Key::from_base64(s.trim()) {
        Ok(k) => {
            let _ = writeln!(std::io::stdout(), "{}", k.public().to_base64());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: key is not the correct length or format: {e}");
            ExitCode::from(1)
        }
    }
}
