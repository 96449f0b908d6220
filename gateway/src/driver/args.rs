//! Command-line arguments of both daemon forms (`riceguard [-f] IFNAME`, `riceguard up
//! --config FILE`) and their `[Gateway]` overrides.

use crate::core::config::OffloadMode;

/// Options of both daemon forms.
#[derive(Debug, Clone)]
pub(super) struct Opts {
    pub(super) ifname: String,
    pub(super) foreground: bool,
    pub(super) config_file: Option<String>,
    pub(super) workers: Option<usize>,
    /// Command-line overrides of the `[Gateway]` data-plane settings.
    pub(super) io_uring: Option<bool>,
    pub(super) offload: Option<OffloadMode>,
    pub(super) tun_offload: Option<bool>,
    pub(super) poll: Option<crate::core::config::PollMode>,
    pub(super) hugepages: Option<bool>,
    /// Test images only: SIGUSR2 freezes the worker heartbeats (see `Heartbeats`).
    pub(super) selftest_hang: bool,
}

pub(super) const USAGE: &str = "usage: riceguard [-f|--foreground] [OPTIONS] IFNAME
       riceguard up --config FILE [OPTIONS]
options (override [Gateway]): --workers N  --io-uring on|off  --offload auto|gso|mmsg|off
                              --tun-offload on|off  --hugepages on|off";

pub(super) fn parse_args(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        ifname: String::new(),
        foreground: false,
        config_file: None,
        workers: None,
        io_uring: None,
        offload: None,
        tun_offload: None,
        poll: None,
        hugepages: None,
        selftest_hang: false,
    };
    let mut it = args.iter();
    let mut up = false;
    if std::env::var("WG_PROCESS_FOREGROUND").as_deref() == Ok("1") {
        o.foreground = true;
    }
    while let Some(a) = it.next() {
        match a.as_str() {
            "up" if !up && o.ifname.is_empty() => {
                up = true;
                o.foreground = true;
            }
            "-f" | "--foreground" => o.foreground = true,
            "--config" | "-c" => {
                o.config_file = Some(it.next().ok_or("--config needs a file")?.clone())
            }
            "--workers" => {
                let n = it.next().ok_or("--workers needs a number")?;
                o.workers = Some(
                    n.parse()
                        .ok()
                        .filter(|&n: &usize| (1..=256).contains(&n))
                        .ok_or("--workers takes 1-256")?,
                );
            }
            "--io-uring" => o.io_uring = Some(on_off(it.next(), "--io-uring")?),
            "--tun-offload" => o.tun_offload = Some(on_off(it.next(), "--tun-offload")?),
            "--poll" => {
                o.poll = Some(
                    it.next()
                        .and_then(|v| crate::core::config::PollMode::parse(v))
                        .ok_or("--poll takes sleep, adaptive or busy")?,
                )
            }
            "--hugepages" => o.hugepages = Some(on_off(it.next(), "--hugepages")?),
            // Not in USAGE: init passes it on test images (`riceguard.selftest=hang`).
            "--selftest-hang" => o.selftest_hang = true,
            "--offload" => {
                o.offload = Some(match it.next().map(String::as_str) {
                    Some("auto") => OffloadMode::Auto,
                    Some("gso") => OffloadMode::Gso,
                    Some("mmsg") => OffloadMode::Mmsg,
                    Some("off") => OffloadMode::Off,
                    _ => return Err("--offload takes auto, gso, mmsg or off".into()),
                })
            }
            s if s.starts_with('-') => return Err(format!("unknown option `{s}`")),
            s if o.ifname.is_empty() && !up => o.ifname = s.to_string(),
            s => return Err(format!("unexpected argument `{s}`")),
        }
    }
    if up {
        if o.config_file.is_none() {
            return Err("`up` needs --config FILE".into());
        }
    } else if o.ifname.is_empty() {
        return Err("missing interface name".into());
    }
    Ok(o)
}

fn on_off(v: Option<&String>, flag: &str) -> Result<bool, String> {
    match v.map(String::as_str) {
        Some("on") => Ok(true),
        Some("off") => Ok(false),
        _ => Err(format!("{flag} takes on or off")),
    }
}
