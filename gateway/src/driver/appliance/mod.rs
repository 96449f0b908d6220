//! What only the appliance runs around the data plane: its network configuration
//! (`netconf`) and firewall (`firewall`, also installed by init at boot), and the
//! supervised `riceguard dhcp` and `riceguard ntp` processes. The drop-in
//! `riceguard IFNAME` uses none of it. Nothing here imports the rest of `driver`.

pub mod dhcp;
pub mod firewall;
pub mod netconf;
pub mod ntp;
