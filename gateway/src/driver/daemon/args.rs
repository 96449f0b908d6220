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
    /// `--cores LIST`: the cores workers are pinned to, in worker order.
    pub(super) cores: Option<Vec<usize>>,
    /// Command-line overrides of the `[Gateway]` data-plane settings.
    pub(super) io_uring: Option<bool>,
    pub(super) offload: Option<OffloadMode>,
    pub(super) tun_offload: Option<bool>,
    pub(super) poll: Option<crate::core::config::PollMode>,
    pub(super) hugepages: Option<bool>,
    /// Test images only: SIGUSR2 freezes the worker heartbeats (see `Heartbeats`).
    pub(super) selftest_hang: bool,
    /// `--event-log DIR`: the perm directory whose event log gets the daemon's events.
    pub(super) event_log: Option<std::path::PathBuf>,
    /// `--spread on|off`: one peer's received trains spread over the workers (default on;
    /// nothing to spread with one worker).
    pub(super) spread: bool,
}

pub(super) const USAGE: &str = "usage: riceguard [-f|--foreground] [OPTIONS] IFNAME
       riceguard up --config FILE [OPTIONS]
options (override [Gateway]): --workers N  --cores LIST  --io-uring on|off
                              --offload auto|gso|mmsg|off  --tun-offload on|off
                              --poll sleep|adaptive|busy  --hugepages on|off
       --spread on|off: one peer's received traffic over every worker (default on)
       --event-log DIR: record peer events in DIR's event log (init passes /perm)";

pub(super) fn parse_args(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        ifname: String::new(),
        foreground: false,
        config_file: None,
        workers: None,
        cores: None,
        io_uring: None,
        offload: None,
        tun_offload: None,
        poll: None,
        hugepages: None,
        selftest_hang: false,
        event_log: None,
        spread: true,
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
            "--cores" => {
                let v = it.next().ok_or("--cores needs a list such as 0,1 or 0-3")?;
                let cores = crate::core::ini::cores(v).map_err(|e| format!("--cores: {e}"))?;
                if let Some(d) = cores
                    .iter()
                    .enumerate()
                    .find(|(i, c)| cores[..*i].contains(c))
                {
                    return Err(format!("--cores: core {} named twice", d.1));
                }
                o.cores = Some(cores);
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
            "--spread" => o.spread = on_off(it.next(), "--spread")?,
            // Not in USAGE: init passes it on test images (`riceguard.selftest=hang`).
            "--selftest-hang" => o.selftest_hang = true,
            "--event-log" => {
                o.event_log = Some(it.next().ok_or("--event-log needs a directory")?.into())
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Result<Opts, String> {
        parse_args(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn cores_override_in_worker_order() {
        let o = args(&["-f", "wg0", "--cores", "1,0"]).unwrap();
        assert_eq!(o.cores, Some(vec![1, 0]));
        assert_eq!(
            args(&["wg0", "--cores", "0-2"]).unwrap().cores,
            Some(vec![0, 1, 2])
        );
        assert_eq!(
            args(&["wg0", "--cores", "all"]).unwrap().cores,
            Some(vec![])
        );
        for bad in ["x", "1,1", "3-1", "0-9999"] {
            let e = args(&["wg0", "--cores", bad]).unwrap_err();
            assert!(e.starts_with("--cores"), "{bad:?}: {e}");
        }
        assert!(args(&["wg0", "--cores"]).is_err());
    }
}
