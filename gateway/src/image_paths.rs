//! The image's own read-only files under `/etc/riceguard/`, written by `image/build.sh`
//! into every slot's root: not state the boots share (that is [`crate::perm`]) and never
//! written on the appliance, so they are named here, once, apart from `perm/`.

/// The board file (`board/*/board.conf`): arch, modules, consoles, cores, ... (init,
/// the updater's board check).
pub const BOARD_CONF: &str = "/etc/riceguard/board.conf";
/// The update-bundle signing public key.
pub const UPDATE_PUB: &str = "/etc/riceguard/update.pub";
/// The running root's build number (`core::bundle`'s downgrade check).
pub const BUILD: &str = "/etc/riceguard/build";
/// The image's build time, a floor for the clock at boot.
pub const BUILD_TIME: &str = "/etc/riceguard/build-time";
/// The first boot's configuration template (`@PRIVATE_KEY@` replaced).
pub const DEFAULT_CONFIG: &str = "/etc/riceguard/default.conf";
/// The image's version line (`show version`).
pub const VERSION: &str = "/etc/riceguard/version";
