//! The reading side of a UAPI client: the `get` and `set` answers (unknown keys skipped,
//! a nonzero errno returned as an error), read by `show peers` and `riceguard status`.

use super::{
    hex_key, invalid, parse_prefix, parse_uint, read_line, DeviceStatus, PeerStatus, UapiError,
    MAX_REQUEST_BYTES,
};
use std::io::BufRead;

/// Parse the answer to `get=1` (up to and including `errno=`). Unknown keys are skipped
/// so newer daemons' extra fields do not break the console; a nonzero errno is
/// returned as [`UapiError::Remote`].
pub fn parse_get_response(text: &str) -> Result<DeviceStatus, UapiError> {
    let mut st = DeviceStatus::default();
    let mut errno: Option<i32> = None;
    for line in text.split('\n') {
        if line.is_empty() {
            if errno.is_some() {
                break;
            }
            continue;
        }
        let (k, v) = line.split_once('=').ok_or_else(|| {
            UapiError::Protocol(format!(
                "failed to parse line {:?}",
                line.chars().take(80).collect::<String>()
            ))
        })?;
        let num = |what: &str| parse_uint::<u64>(v).ok_or_else(|| invalid(what, v));
        match k {
            "private_key" => {
                st.private_key = Some(hex_key(v, "private_key")?).filter(|k| !k.is_zero())
            }
            "listen_port" => {
                st.listen_port = parse_uint(v).ok_or_else(|| invalid("bad listen_port", v))?
            }
            "fwmark" => {
                st.fwmark = Some(parse_uint::<u32>(v).ok_or_else(|| invalid("bad fwmark", v))?)
                    .filter(|m| *m != 0)
            }
            "public_key" => st.peers.push(PeerStatus::new(hex_key(v, "public_key")?)),
            "errno" => {
                let e = v.parse::<i32>().map_err(|_| invalid("bad errno", v))?;
                if e != 0 {
                    return Err(UapiError::Remote(e));
                }
                errno = Some(e);
            }
            _ => {
                let Some(p) = st.peers.last_mut() else {
                    continue;
                };
                match k {
                    "preshared_key" => {
                        p.preshared_key =
                            Some(hex_key(v, "preshared_key")?).filter(|k| !k.is_zero())
                    }
                    "protocol_version" => {
                        p.protocol_version =
                            parse_uint(v).ok_or_else(|| invalid("bad protocol_version", v))?
                    }
                    "endpoint" => {
                        p.endpoint = Some(v.parse().map_err(|_| invalid("bad endpoint", v))?)
                    }
                    "last_handshake_time_sec" => {
                        let s = num("bad last_handshake_time_sec")?;
                        let n = p.last_handshake.map_or(0, |(_, n)| n);
                        p.last_handshake = Some((s, n));
                    }
                    "last_handshake_time_nsec" => {
                        let n = parse_uint::<u32>(v)
                            .filter(|n| *n < 1_000_000_000)
                            .ok_or_else(|| invalid("bad last_handshake_time_nsec", v))?;
                        let s = p.last_handshake.map_or(0, |(s, _)| s);
                        p.last_handshake = Some((s, n));
                    }
                    "tx_bytes" => p.tx_bytes = num("bad tx_bytes")?,
                    "rx_bytes" => p.rx_bytes = num("bad rx_bytes")?,
                    "persistent_keepalive_interval" => {
                        let k: u16 = parse_uint(v)
                            .ok_or_else(|| invalid("bad persistent_keepalive_interval", v))?;
                        p.persistent_keepalive = (k != 0).then_some(k);
                    }
                    "allowed_ip" => p.allowed_ips.push(parse_prefix(v)?),
                    _ => {}
                }
            }
        }
    }
    if errno.is_none() {
        return Err(UapiError::Protocol("answer ended without errno=".into()));
    }
    for p in &mut st.peers {
        if p.last_handshake == Some((0, 0)) {
            p.last_handshake = None;
        }
    }
    Ok(st)
}

/// Read a `get` answer from a socket (bounded like requests) and parse it.
pub fn read_get_response(r: &mut impl BufRead) -> Result<DeviceStatus, UapiError> {
    let mut budget = MAX_REQUEST_BYTES;
    let mut text = String::new();
    let mut seen_errno = false;
    while let Some((line, _)) = read_line(r, &mut budget)? {
        if line.is_empty() && seen_errno {
            break;
        }
        seen_errno |= line.starts_with("errno=");
        text.push_str(&line);
        text.push('\n');
    }
    parse_get_response(&text)
}

/// Read the `errno=N` answer to a set request; `Ok(())` for 0.
pub fn read_set_response(r: &mut impl BufRead) -> Result<(), UapiError> {
    let mut budget = MAX_REQUEST_BYTES;
    while let Some((line, _)) = read_line(r, &mut budget)? {
        if let Some(v) = line.strip_prefix("errno=") {
            let e = v.parse::<i32>().map_err(|_| invalid("bad errno", v))?;
            return if e == 0 {
                Ok(())
            } else {
                Err(UapiError::Remote(e))
            };
        }
    }
    Err(UapiError::Io("connection closed before errno=".into()))
}
