//! The host's forwarding switches that the jobs' nftables table turns on when it is made
//! and back off when it is removed (`sandbox::network::firewall`): IPv4 forwarding
//! (`net.ipv4.ip_forward`) and IPv6 forwarding of single uplinks
//! (`net.ipv6.conf.LINK.force_forwarding`, Linux >= 6.17; the host-wide IPv6 switch would
//! make the host ignore router advertisements on every link). Host-wide state: each
//! write is recorded by the caller (the table's comment, its `v6_uplinks` set) so that
//! whoever removes the table undoes it.

use super::error::{Error, Result};

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
/// The IPv6 settings of this namespace's links (`all`, `default`, one dir per link).
pub const IPV6_CONF: &str = "/proc/sys/net/ipv6/conf";

fn switch(on: bool) -> &'static str {
    if on {
        "1"
    } else {
        "0"
    }
}

/// net.ipv4.ip_forward is 0 (the host forwards no IPv4 of its own accord).
pub fn ipv4_forwarding_off() -> bool {
    std::fs::read_to_string(IP_FORWARD).is_ok_and(|v| v.trim() == "0")
}

/// net.ipv6.conf.all.forwarding is 1 (the host routes IPv6 on every link already).
pub fn ipv6_all_forwarding() -> bool {
    std::fs::read_to_string(format!("{IPV6_CONF}/all/forwarding")).is_ok_and(|v| v.trim() == "1")
}

/// The kernel has the per-link net.ipv6.conf.*.force_forwarding (Linux >= 6.17).
pub fn has_force_forwarding() -> bool {
    std::path::Path::new(IPV6_CONF).join("all/force_forwarding").exists()
}

/// A link's net.ipv6.conf.LINK.force_forwarding (None: no such link or setting).
pub fn uplink_force_forwarding(link: &str) -> Option<bool> {
    std::fs::read_to_string(format!("{IPV6_CONF}/{link}/force_forwarding")).ok().map(|v| v.trim() == "1")
}

/// Turns IPv4 forwarding on or off.
pub fn set_ipv4_forwarding(on: bool) -> Result<()> {
    std::fs::write(IP_FORWARD, switch(on)).map_err(|source| Error::Ipv4Forwarding { on, source })
}

/// Sets `net.ipv6.conf.LINK.force_forwarding`. `Ok(false)`: the link is gone (and its
/// setting with it), nothing to set.
pub fn set_uplink_force_forwarding(link: &str, on: bool) -> Result<bool> {
    if link.is_empty() || link.contains('/') || link.starts_with('.') {
        return Err(Error::UplinkName { link: link.into() });
    }
    match std::fs::write(format!("{IPV6_CONF}/{link}/force_forwarding"), switch(on)) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(Error::UplinkForceForwarding { link: link.into(), on, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_name_cannot_leave_the_conf_dir() {
        for bad in ["", "../all", "a/b", ".."] {
            let e = set_uplink_force_forwarding(bad, false).unwrap_err().to_string();
            assert!(e.contains("not a network link's name"), "{bad}: {e}");
        }
    }
}
