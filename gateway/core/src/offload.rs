//! The offload decision, made once at start: from the configured [`OffloadMode`], the
//! egress NIC's features and what the UDP socket probed, pick how datagrams leave
//! (hardware USO -> kernel software GSO -> batched `sendmmsg` -> one per syscall) and
//! whether UDP GRO is used on receive, with one line saying why.
//!
//! Pure: switching a NIC feature on is the caller's `enable` hook (`sys::ethtool::enable`),
//! so every branch is testable without a NIC.

use std::fmt;

use crate::config::OffloadMode;

/// One NIC feature as `ethtool -k` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeatureState {
    pub active: bool,
    /// The driver does not let it change (`[fixed]`).
    pub fixed: bool,
}

impl fmt::Display for FeatureState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.active { "on" } else { "off" })?;
        if self.fixed {
            f.write_str(" [fixed]")?;
        }
        Ok(())
    }
}

/// The NIC features the decision reads; `None` where the kernel or driver does not say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NicOffloads {
    pub tx_udp_segmentation: Option<FeatureState>,
    /// Any of `tx-checksum-ip-generic`/`-ipv4`/`-ipv6` (`tx-checksumming`), active first.
    pub tx_checksum: Option<FeatureState>,
    /// `generic-receive-offload`: without it the stack never builds UDP GRO trains.
    pub gro: Option<FeatureState>,
    pub rx_udp_gro_forwarding: Option<FeatureState>,
    pub rx_gro_list: Option<FeatureState>,
}

/// What the UDP socket probed at bind time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SocketProbe {
    /// `UDP_SEGMENT` works (kernel 4.18+).
    pub udp_segment: bool,
    /// `UDP_GRO` could be switched on (kernel 5.0+).
    pub udp_gro: bool,
}

/// How encrypted datagrams leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UdpTx {
    /// `UDP_SEGMENT` sends that the NIC segments.
    HardwareUso,
    /// `UDP_SEGMENT` sends that the kernel segments in software (still one syscall and
    /// one trip through the stack per batch).
    SoftwareGso,
    /// Batches of separate datagrams through `sendmmsg`.
    Mmsg,
    /// One datagram per syscall.
    Single,
}

impl UdpTx {
    /// Whether sends may carry a `UDP_SEGMENT` size.
    pub fn uses_gso(self) -> bool {
        matches!(self, UdpTx::HardwareUso | UdpTx::SoftwareGso)
    }
}

impl fmt::Display for UdpTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UdpTx::HardwareUso => "hardware USO",
            UdpTx::SoftwareGso => "software GSO",
            UdpTx::Mmsg => "sendmmsg batches",
            UdpTx::Single => "single datagrams",
        })
    }
}

/// The decision and the line to log once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffloadDecision {
    pub udp_tx: UdpTx,
    pub udp_rx_gro: bool,
    /// e.g. `eth0: tx-udp-segmentation off [fixed] -> software GSO; UDP GRO on`.
    pub reason: String,
}

/// The feature the decision switches on when it can.
pub const USO_FEATURE: &str = "tx-udp-segmentation";

/// Decide. `nic` is `None` when the egress NIC is unknown or its features unreadable;
/// `enable(feature)` is only called in `Auto` mode for a changeable, switched-off
/// `tx-udp-segmentation`, and returns the feature's state afterwards or why not.
pub fn decide(
    ifname: &str,
    mode: OffloadMode,
    nic: Option<&NicOffloads>,
    sock: SocketProbe,
    mut enable: impl FnMut(&str) -> Result<FeatureState, String>,
) -> OffloadDecision {
    let gro_nic_ok = nic.and_then(|n| n.gro).is_none_or(|g| g.active);
    let rx_gro = sock.udp_gro && gro_nic_ok;
    let gro_note = match (sock.udp_gro, gro_nic_ok) {
        (true, true) => "UDP GRO on",
        (true, false) => "UDP GRO off (generic-receive-offload off)",
        (false, _) => "UDP GRO off (socket option unsupported)",
    };
    let done = |tx: UdpTx, gro: bool, why: String| {
        // Mmsg/Off keep GRO off on purpose; every other mode uses what was found.
        let gro_txt = if matches!(mode, OffloadMode::Mmsg | OffloadMode::Off) {
            "UDP GRO off"
        } else {
            gro_note
        };
        OffloadDecision {
            udp_tx: tx,
            udp_rx_gro: gro,
            reason: format!("{ifname}: {why} -> {tx}; {gro_txt}"),
        }
    };

    match mode {
        OffloadMode::Off => return done(UdpTx::Single, false, "Offload = off".into()),
        OffloadMode::Mmsg => return done(UdpTx::Mmsg, false, "Offload = mmsg".into()),
        OffloadMode::Gso | OffloadMode::Auto if !sock.udp_segment => {
            return done(
                UdpTx::Mmsg,
                rx_gro,
                "UDP_SEGMENT unsupported by the kernel".into(),
            )
        }
        OffloadMode::Gso => {
            return done(
                UdpTx::SoftwareGso,
                rx_gro,
                "Offload = gso (NIC untouched)".into(),
            )
        }
        OffloadMode::Auto => {}
    }

    let Some(nic) = nic else {
        return done(UdpTx::SoftwareGso, rx_gro, "NIC features unknown".into());
    };
    let Some(uso) = nic.tx_udp_segmentation else {
        return done(UdpTx::SoftwareGso, rx_gro, format!("{USO_FEATURE} unknown"));
    };
    // The NIC can only segment what it can checksum; without that the kernel falls back
    // to software segmentation anyway.
    if let Some(c) = nic.tx_checksum {
        if !c.active {
            return done(
                UdpTx::SoftwareGso,
                rx_gro,
                format!("{USO_FEATURE} {uso}, tx-checksumming {c}"),
            );
        }
    }
    if uso.active {
        return done(UdpTx::HardwareUso, rx_gro, format!("{USO_FEATURE} {uso}"));
    }
    if uso.fixed {
        return done(UdpTx::SoftwareGso, rx_gro, format!("{USO_FEATURE} {uso}"));
    }
    match enable(USO_FEATURE) {
        Ok(after) if after.active => done(
            UdpTx::HardwareUso,
            rx_gro,
            format!("{USO_FEATURE} off, switched on"),
        ),
        Ok(after) => done(
            UdpTx::SoftwareGso,
            rx_gro,
            format!("{USO_FEATURE} off, still {after} after enabling"),
        ),
        Err(e) => done(
            UdpTx::SoftwareGso,
            rx_gro,
            format!("{USO_FEATURE} off, enabling failed ({e})"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ON: FeatureState = FeatureState {
        active: true,
        fixed: false,
    };
    const OFF: FeatureState = FeatureState {
        active: false,
        fixed: false,
    };
    const OFF_FIXED: FeatureState = FeatureState {
        active: false,
        fixed: true,
    };
    const BOTH: SocketProbe = SocketProbe {
        udp_segment: true,
        udp_gro: true,
    };

    fn nic(uso: Option<FeatureState>) -> NicOffloads {
        NicOffloads {
            tx_udp_segmentation: uso,
            tx_checksum: Some(ON),
            gro: Some(ON),
            ..Default::default()
        }
    }

    fn never(_: &str) -> Result<FeatureState, String> {
        panic!("must not touch the NIC")
    }

    #[test]
    fn fixed_off_falls_back_to_software_gso() {
        let d = decide(
            "eth0",
            OffloadMode::Auto,
            Some(&nic(Some(OFF_FIXED))),
            BOTH,
            never,
        );
        assert_eq!(d.udp_tx, UdpTx::SoftwareGso);
        assert!(d.udp_rx_gro);
        assert_eq!(
            d.reason,
            "eth0: tx-udp-segmentation off [fixed] -> software GSO; UDP GRO on"
        );
    }

    #[test]
    fn active_uso_is_hardware() {
        let d = decide("eth0", OffloadMode::Auto, Some(&nic(Some(ON))), BOTH, never);
        assert_eq!(d.udp_tx, UdpTx::HardwareUso);
        assert!(d.udp_tx.uses_gso());
    }

    #[test]
    fn changeable_off_is_enabled_then_hardware() {
        let mut asked = Vec::new();
        let d = decide(
            "eth0",
            OffloadMode::Auto,
            Some(&nic(Some(OFF))),
            BOTH,
            |f| {
                asked.push(f.to_string());
                Ok(ON)
            },
        );
        assert_eq!(asked, [USO_FEATURE]);
        assert_eq!(d.udp_tx, UdpTx::HardwareUso);
        assert!(
            d.reason.contains("switched on -> hardware USO"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn enabling_that_fails_or_does_not_stick_is_software() {
        let d = decide(
            "eth0",
            OffloadMode::Auto,
            Some(&nic(Some(OFF))),
            BOTH,
            |_| Err("EPERM".into()),
        );
        assert_eq!(d.udp_tx, UdpTx::SoftwareGso);
        assert!(d.reason.contains("enabling failed (EPERM)"));
        let d = decide(
            "eth0",
            OffloadMode::Auto,
            Some(&nic(Some(OFF))),
            BOTH,
            |_| Ok(OFF),
        );
        assert_eq!(d.udp_tx, UdpTx::SoftwareGso);
    }

    #[test]
    fn no_tx_checksum_means_software() {
        let mut n = nic(Some(ON));
        n.tx_checksum = Some(OFF_FIXED);
        let d = decide("eth0", OffloadMode::Auto, Some(&n), BOTH, never);
        assert_eq!(d.udp_tx, UdpTx::SoftwareGso);
        assert!(d.reason.contains("tx-checksumming off [fixed]"));
    }

    #[test]
    fn unknown_nic_and_old_kernel() {
        let d = decide("eth0", OffloadMode::Auto, None, BOTH, never);
        assert_eq!(d.udp_tx, UdpTx::SoftwareGso);
        let d = decide("eth0", OffloadMode::Auto, Some(&nic(None)), BOTH, never);
        assert_eq!(d.udp_tx, UdpTx::SoftwareGso);
        let old = SocketProbe {
            udp_segment: false,
            udp_gro: false,
        };
        let d = decide("eth0", OffloadMode::Auto, Some(&nic(Some(ON))), old, never);
        assert_eq!(d.udp_tx, UdpTx::Mmsg);
        assert!(!d.udp_rx_gro);
        assert!(d
            .reason
            .ends_with("UDP GRO off (socket option unsupported)"));
    }

    #[test]
    fn gro_needs_nic_gro() {
        let mut n = nic(Some(ON));
        n.gro = Some(OFF);
        let d = decide("eth0", OffloadMode::Auto, Some(&n), BOTH, never);
        assert!(!d.udp_rx_gro);
        assert!(d.reason.contains("generic-receive-offload off"));
    }

    #[test]
    fn configured_modes_never_touch_the_nic() {
        let n = nic(Some(OFF));
        let d = decide("eth0", OffloadMode::Gso, Some(&n), BOTH, never);
        assert_eq!(d.udp_tx, UdpTx::SoftwareGso);
        assert!(d.udp_rx_gro);
        let d = decide("eth0", OffloadMode::Mmsg, Some(&n), BOTH, never);
        assert_eq!((d.udp_tx, d.udp_rx_gro), (UdpTx::Mmsg, false));
        let d = decide("eth0", OffloadMode::Off, Some(&n), BOTH, never);
        assert_eq!((d.udp_tx, d.udp_rx_gro), (UdpTx::Single, false));
        assert_eq!(
            d.reason,
            "eth0: Offload = off -> single datagrams; UDP GRO off"
        );
    }
}
