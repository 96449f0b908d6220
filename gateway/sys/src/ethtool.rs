//! NIC offload features through the ethtool ioctl (`SIOCETHTOOL`): the names of the
//! `ETH_SS_FEATURES` string set and their available/requested/active/never-changed bits
//! (`ETHTOOL_GFEATURES`), and switching one on or off (`ETHTOOL_SFEATURES`).
//!
//! This is what `ethtool -k`/`-K` do; we need it to find out whether the egress NIC
//! segments UDP in hardware (`tx-udp-segmentation`) and to switch it on where the driver
//! offers it but leaves it off (virtio-net). The ioctl acts in the calling thread's
//! network namespace.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use riceguard_core::offload::{FeatureState, NicOffloads};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETHTOOL_GFEATURES: u32 = 0x3a;
const ETHTOOL_SFEATURES: u32 = 0x3b;
const ETH_SS_FEATURES: u32 = 4;
const ETH_GSTRING_LEN: usize = 32;
/// More feature names than any kernel has (about 70 in 6.x); guards against a bogus count.
const MAX_FEATURES: usize = 1024;

/// Why NIC features could not be read or changed.
#[derive(Debug)]
#[non_exhaustive]
pub enum EthtoolError {
    /// The interface name is empty or longer than 15 bytes.
    InvalidName(String),
    /// The control socket could not be opened.
    Socket(io::Error),
    /// The interface does not exist or the driver has no ethtool support.
    Ioctl {
        ifname: String,
        what: &'static str,
        source: io::Error,
    },
    /// The kernel answered with sizes that make no sense.
    Malformed { ifname: String, what: &'static str },
    /// No feature of that name on this kernel.
    UnknownFeature { ifname: String, feature: String },
    /// The driver does not let this feature change (`[fixed]`).
    Fixed { ifname: String, feature: String },
    /// The kernel accepted the request but the feature did not change.
    NotApplied { ifname: String, feature: String },
}

impl fmt::Display for EthtoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidName(n) => write!(f, "invalid interface name {n:?}"),
            Self::Socket(e) => write!(f, "cannot open a socket for ethtool: {e}"),
            Self::Ioctl {
                ifname,
                what,
                source,
            } => {
                write!(f, "{ifname}: ethtool {what} failed: {source}")
            }
            Self::Malformed { ifname, what } => {
                write!(
                    f,
                    "{ifname}: ethtool {what} returned an inconsistent answer"
                )
            }
            Self::UnknownFeature { ifname, feature } => {
                write!(f, "{ifname}: the kernel has no feature named {feature:?}")
            }
            Self::Fixed { ifname, feature } => {
                write!(
                    f,
                    "{ifname}: {feature} is fixed by the driver and cannot change"
                )
            }
            Self::NotApplied { ifname, feature } => write!(
                f,
                "{ifname}: {feature} was requested but the driver did not apply it"
            ),
        }
    }
}

impl std::error::Error for EthtoolError {}

/// `struct ifreq` with the `ifr_data` pointer member; padded past the kernel's size.
#[repr(C)]
struct IfReqData {
    name: [u8; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 24],
}

/// Bits of one feature, as `ETHTOOL_GFEATURES` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FeatureBits {
    /// The driver lets it change (`hw_features`).
    pub available: bool,
    pub requested: bool,
    pub active: bool,
    /// The core never lets it change.
    pub never_changed: bool,
}

impl FeatureBits {
    /// Whether `ethtool -k` would print `[fixed]`.
    pub fn fixed(&self) -> bool {
        !self.available || self.never_changed
    }

    pub fn state(&self) -> FeatureState {
        FeatureState {
            active: self.active,
            fixed: self.fixed(),
        }
    }
}

/// All feature names and bits of one interface.
#[derive(Clone, Debug)]
pub struct NicFeatures {
    ifname: String,
    names: Vec<String>,
    /// `[available, requested, active, never_changed]` per 32 features.
    blocks: Vec<[u32; 4]>,
}

impl NicFeatures {
    /// Read the features of `ifname` (in this thread's network namespace).
    pub fn read(ifname: &str) -> Result<NicFeatures, EthtoolError> {
        let ctl = Ctl::open(ifname)?;
        let names = ctl.feature_names()?;
        let blocks = ctl.feature_blocks(names.len())?;
        Ok(NicFeatures {
            ifname: ifname.to_string(),
            names,
            blocks,
        })
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// All feature names, in kernel bit order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    fn index(&self, name: &str) -> Option<usize> {
        let name = kernel_name(name);
        self.names.iter().position(|n| n == name)
    }

    /// The bits of `name`, if the kernel knows it.
    pub fn get(&self, name: &str) -> Option<FeatureBits> {
        let i = self.index(name)?;
        let b = self.blocks.get(i / 32)?;
        let m = 1u32 << (i % 32);
        Some(FeatureBits {
            available: b[0] & m != 0,
            requested: b[1] & m != 0,
            active: b[2] & m != 0,
            never_changed: b[3] & m != 0,
        })
    }

    /// The features the offload decision looks at.
    pub fn offloads(&self) -> NicOffloads {
        let st = |n: &str| self.get(n).map(|b| b.state());
        // "tx-checksumming" is ethtool's umbrella name: any of these does the job for UDP.
        let tx_csum = [
            "tx-checksum-ip-generic",
            "tx-checksum-ipv4",
            "tx-checksum-ipv6",
        ]
        .iter()
        .filter_map(|n| st(n))
        .reduce(|a, b| if a.active { a } else { b });
        NicOffloads {
            tx_udp_segmentation: st("tx-udp-segmentation"),
            tx_checksum: tx_csum,
            gro: st("generic-receive-offload"),
            rx_udp_gro_forwarding: st("rx-udp-gro-forwarding"),
            rx_gro_list: st("rx-gro-list"),
        }
    }
}

/// The kernel's name for one of the ethtool tool's legacy umbrella names (`ethtool -k`
/// prints `generic-receive-offload`, the kernel calls it `rx-gro`).
fn kernel_name(name: &str) -> &str {
    match name {
        "generic-receive-offload" => "rx-gro",
        "generic-segmentation-offload" => "tx-generic-segmentation",
        "large-receive-offload" => "rx-lro",
        "scatter-gather" => "tx-scatter-gather",
        "rx-checksumming" => "rx-checksum",
        "tcp-segmentation-offload" => "tx-tcp-segmentation",
        other => other,
    }
}

/// Switch feature `name` of `ifname` on or off; returns its state afterwards.
pub fn set_feature(ifname: &str, name: &str, on: bool) -> Result<FeatureState, EthtoolError> {
    let before = NicFeatures::read(ifname)?;
    let unknown = || EthtoolError::UnknownFeature {
        ifname: ifname.to_string(),
        feature: name.to_string(),
    };
    let i = before.index(name).ok_or_else(unknown)?;
    let bits = before.get(name).ok_or_else(unknown)?;
    if bits.active == on {
        return Ok(bits.state());
    }
    if bits.fixed() {
        return Err(EthtoolError::Fixed {
            ifname: ifname.to_string(),
            feature: name.to_string(),
        });
    }
    let ctl = Ctl::open(ifname)?;
    ctl.set_feature(before.blocks.len(), i, on)?;
    let after = NicFeatures::read(ifname)?.get(name).ok_or_else(unknown)?;
    if after.active != on {
        return Err(EthtoolError::NotApplied {
            ifname: ifname.to_string(),
            feature: name.to_string(),
        });
    }
    Ok(after.state())
}

/// Switch a feature on (the offload decision's `enable` hook).
pub fn enable(ifname: &str, name: &str) -> Result<FeatureState, EthtoolError> {
    set_feature(ifname, name, true)
}

/// An AF_INET datagram socket to aim the ioctls with.
struct Ctl {
    fd: OwnedFd,
    ifname: String,
}

impl Ctl {
    fn open(ifname: &str) -> Result<Ctl, EthtoolError> {
        if ifname.is_empty() || ifname.len() >= libc::IFNAMSIZ || ifname.contains('\0') {
            return Err(EthtoolError::InvalidName(ifname.to_string()));
        }
        // SAFETY: plain socket() call; the result is checked.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(EthtoolError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: raw is a fresh fd owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Ctl {
            fd,
            ifname: ifname.to_string(),
        })
    }

    /// Run one ethtool command whose struct is `buf` (u64 words keep it aligned).
    fn ioctl(&self, what: &'static str, buf: &mut [u64]) -> Result<libc::c_int, EthtoolError> {
        let mut req = IfReqData {
            name: [0; libc::IFNAMSIZ],
            data: buf.as_mut_ptr().cast(),
            _pad: [0; 24],
        };
        req.name[..self.ifname.len()].copy_from_slice(self.ifname.as_bytes());
        // SAFETY: SIOCETHTOOL reads the ifreq (valid, #[repr(C)], larger than the kernel's)
        // and reads/writes the command struct at ifr_data; every caller sizes `buf` for
        // the command and the counts it put in it.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), SIOCETHTOOL as _, &mut req) };
        if rc < 0 {
            return Err(EthtoolError::Ioctl {
                ifname: self.ifname.clone(),
                what,
                source: io::Error::last_os_error(),
            });
        }
        Ok(rc)
    }

    fn malformed(&self, what: &'static str) -> EthtoolError {
        EthtoolError::Malformed {
            ifname: self.ifname.clone(),
            what,
        }
    }

    fn feature_names(&self) -> Result<Vec<String>, EthtoolError> {
        // struct ethtool_sset_info { u32 cmd, reserved; u64 sset_mask; u32 data[1]; }
        let mut info = [0u64; 3];
        set_u32(&mut info, 0, ETHTOOL_GSSET_INFO);
        info[1] = 1u64 << ETH_SS_FEATURES;
        self.ioctl("GSSET_INFO", &mut info)?;
        if info[1] & (1u64 << ETH_SS_FEATURES) == 0 {
            return Err(self.malformed("GSSET_INFO"));
        }
        let count = get_u32(&info, 16) as usize;
        if count == 0 || count > MAX_FEATURES {
            return Err(self.malformed("GSSET_INFO"));
        }
        // struct ethtool_gstrings { u32 cmd, string_set, len; u8 data[len * 32]; }
        let bytes = 12 + count * ETH_GSTRING_LEN;
        let mut g = vec![0u64; bytes.div_ceil(8)];
        set_u32(&mut g, 0, ETHTOOL_GSTRINGS);
        set_u32(&mut g, 4, ETH_SS_FEATURES);
        set_u32(&mut g, 8, count as u32);
        self.ioctl("GSTRINGS", &mut g)?;
        if get_u32(&g, 8) as usize != count {
            return Err(self.malformed("GSTRINGS"));
        }
        let raw: Vec<u8> = g.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let names = raw[12..bytes]
            .chunks(ETH_GSTRING_LEN)
            .map(|c| {
                let end = c.iter().position(|b| *b == 0).unwrap_or(c.len());
                String::from_utf8_lossy(&c[..end]).into_owned()
            })
            .collect();
        Ok(names)
    }

    fn feature_blocks(&self, count: usize) -> Result<Vec<[u32; 4]>, EthtoolError> {
        let nblocks = count.div_ceil(32);
        // struct ethtool_gfeatures { u32 cmd, size; struct { u32 x4 } features[size]; }
        let bytes = 8 + nblocks * 16;
        let mut g = vec![0u64; bytes.div_ceil(8)];
        set_u32(&mut g, 0, ETHTOOL_GFEATURES);
        set_u32(&mut g, 4, nblocks as u32);
        self.ioctl("GFEATURES", &mut g)?;
        if get_u32(&g, 4) as usize != nblocks {
            return Err(self.malformed("GFEATURES"));
        }
        Ok((0..nblocks)
            .map(|b| {
                let at = 8 + b * 16;
                [
                    get_u32(&g, at),
                    get_u32(&g, at + 4),
                    get_u32(&g, at + 8),
                    get_u32(&g, at + 12),
                ]
            })
            .collect())
    }

    fn set_feature(&self, nblocks: usize, index: usize, on: bool) -> Result<(), EthtoolError> {
        // struct ethtool_sfeatures { u32 cmd, size; struct { u32 valid, requested; } [size]; }
        let bytes = 8 + nblocks * 8;
        let mut s = vec![0u64; bytes.div_ceil(8)];
        set_u32(&mut s, 0, ETHTOOL_SFEATURES);
        set_u32(&mut s, 4, nblocks as u32);
        let at = 8 + (index / 32) * 8;
        let m = 1u32 << (index % 32);
        set_u32(&mut s, at, m);
        set_u32(&mut s, at + 4, if on { m } else { 0 });
        // A positive return says not everything stuck (ETHTOOL_F_WISH etc.): the caller
        // re-reads the state to find out.
        self.ioctl("SFEATURES", &mut s)?;
        Ok(())
    }
}

/// Native-endian u32 at byte offset `at` of a word buffer.
fn get_u32(buf: &[u64], at: usize) -> u32 {
    let w = buf[at / 8].to_ne_bytes();
    let o = at % 8;
    u32::from_ne_bytes([w[o], w[o + 1], w[o + 2], w[o + 3]])
}

fn set_u32(buf: &mut [u64], at: usize, v: u32) {
    let mut w = buf[at / 8].to_ne_bytes();
    let o = at % 8;
    w[o..o + 4].copy_from_slice(&v.to_ne_bytes());
    buf[at / 8] = u64::from_ne_bytes(w);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{in_new_netns, ip};

    #[test]
    fn word_buffer_helpers() {
        let mut b = [0u64; 2];
        set_u32(&mut b, 4, 0xdead_beef);
        set_u32(&mut b, 8, 7);
        assert_eq!(get_u32(&b, 4), 0xdead_beef);
        assert_eq!(get_u32(&b, 8), 7);
        assert_eq!(get_u32(&b, 0), 0);
    }

    #[test]
    fn bad_names_and_missing_interfaces() {
        assert!(matches!(
            NicFeatures::read(""),
            Err(EthtoolError::InvalidName(_))
        ));
        assert!(matches!(
            NicFeatures::read("much-too-long-name"),
            Err(EthtoolError::InvalidName(_))
        ));
        assert!(matches!(
            NicFeatures::read("rg-nonexist9"),
            Err(EthtoolError::Ioctl { .. })
        ));
    }

    #[test]
    #[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
    fn veth_features_read_and_toggle() {
        in_new_netns(|| {
            ip(&[
                "link", "add", "rgeva", "type", "veth", "peer", "name", "rgevb",
            ]);
            let f = NicFeatures::read("rgeva").expect("read");
            assert!(f.names().count() > 30);
            let uso = f.get("tx-udp-segmentation").expect("kernel knows USO");
            assert!(!uso.fixed(), "veth lets tx-udp-segmentation change");
            // Loopback-like facts that hold for veth on every kernel we target.
            assert!(f.get("tx-checksum-ipv4").expect("csum4").fixed());
            // ethtool's umbrella name maps to the kernel's.
            assert_eq!(f.get("generic-receive-offload"), f.get("rx-gro"));
            assert!(f.get("rx-gro").is_some());
            let o = f.offloads();
            assert!(o.tx_udp_segmentation.is_some() && o.tx_checksum.is_some_and(|c| c.active));
            assert!(matches!(
                set_feature("rgeva", "no-such-feature", true),
                Err(EthtoolError::UnknownFeature { .. })
            ));
            assert!(matches!(
                set_feature("rgeva", "tx-checksum-ipv4", true),
                Err(EthtoolError::Fixed { .. })
            ));

            let off = set_feature("rgeva", "tx-udp-segmentation", false).expect("off");
            assert!(!off.active && !off.fixed);
            let now = NicFeatures::read("rgeva").expect("read");
            assert!(!now.get("tx-udp-segmentation").expect("uso").active);
            let on = enable("rgeva", "tx-udp-segmentation").expect("on");
            assert!(on.active);
            // Agrees with the ethtool tool.
            let out = std::process::Command::new("ethtool")
                .args(["-k", "rgeva"])
                .output()
                .expect("ethtool");
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("tx-udp-segmentation: on"), "{text}");
        });
    }
}
