//! Jobs' IPv6: whether jobs get it on this host (`network_ipv6`, `--ipv6`),
//! and what a job's IPv6 is made of.
//!
//! Jobs get outbound IPv6 where the host has an IPv6 default route and can forward IPv6
//! for jobs alone: either it forwards IPv6 already (net.ipv6.conf.all.forwarding = 1, a
//! router: nothing is changed), or the kernel has the per-link `force_forwarding`
//! (Linux 6.17 and later), set on each job's host end (with the link, gone with it) and on the host's
//! uplinks (the links of its IPv6 default routes, where the replies come in) while the
//! host's nftables table exists. Why not all.forwarding: it makes the host stop taking
//! router advertisements on every link (its own default route and addresses from SLAAC),
//! while force_forwarding keeps them.
//!
//! Rootless jobs get IPv6 from pasta where the host has an IPv6 default route (pasta
//! maps their connections to the host's sockets: nothing forwards, nothing changes on
//! the host); pasta gives the job the host's address and gateway.
//!
//! A (root-mode) job's IPv6 address is in [`PREFIX`] (a unique local /64, RFC 4193), its last 32 bits
//! the job's IPv4 address (unique: claimed by its IPv4 host route), masqueraded by the
//! host's table to the host's address as IPv4 is. DNS stays IPv4 at the gateway (the
//! host's resolver answers AAAA). `network_allow` is IPv4 only.

use crate::config::Ipv6;
use crate::sys::forwarding;
use crate::sys::net::Ipv6Net;
use anyhow::{bail, Result};
use std::net::Ipv6Addr;

/// The jobs' IPv6 network: RFC 4193 unique local addresses, global id 61:7a70:7362
/// ("azpsb"), subnet 0.
pub const PREFIX: Ipv6Net = Ipv6Net { addr: Ipv6Addr::new(0xfd61, 0x7a70, 0x7362, 0, 0, 0, 0, 0), prefix: 64 };
/// The jobs' IPv6 gateway: link-local, answered by the host end (a permanent neighbour
/// entry in the job at the host end's MAC).
pub const GATEWAY: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
/// Link-local (cloud metadata, the host's own link addresses).
pub const LINK_LOCAL: Ipv6Net = Ipv6Net { addr: Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), prefix: 10 };
/// Cloud metadata services at unique local IPv6 addresses: AWS's (fd00:ec2::254) and
/// Google Cloud's (fd20:ce::254).
pub const METADATA: [Ipv6Net; 2] = [
    Ipv6Net { addr: Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254), prefix: 128 },
    Ipv6Net { addr: Ipv6Addr::new(0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254), prefix: 128 },
];

const IPV6_ROUTE: &str = "/proc/net/ipv6_route";

/// What this host has of IPv6 for jobs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    /// The links of its usable IPv6 default routes (empty: none).
    pub uplinks: Vec<String>,
    /// net.ipv6.conf.all.forwarding is 1.
    pub forwarding: bool,
    /// The kernel has the per-link net.ipv6.conf.*.force_forwarding (>= 6.17).
    pub force_forwarding: bool,
}

impl Host {
    /// This namespace's.
    pub fn probe() -> Host {
        Host {
            uplinks: uplinks(&std::fs::read_to_string(IPV6_ROUTE).unwrap_or_default()),
            forwarding: forwarding::ipv6_all_forwarding(),
            force_forwarding: forwarding::has_force_forwarding(),
        }
    }
}

/// Why jobs get no IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Without {
    Off,
    NoDefaultRoute,
    NoForwarding,
}

impl Without {
    fn why(self) -> &'static str {
        match self {
            Without::Off => "network_ipv6 = off",
            Without::NoDefaultRoute => "this host has no IPv6 default route",
            Without::NoForwarding => {
                "this kernel has no per-link net.ipv6.conf.*.force_forwarding (Linux >= 6.17) and \
                 net.ipv6.conf.all.forwarding is 0"
            }
        }
    }
    fn fix(self) -> &'static str {
        match self {
            Without::Off => "",
            Without::NoDefaultRoute => "give the host an IPv6 default route",
            Without::NoForwarding => {
                "run Linux >= 6.17, or set net.ipv6.conf.all.forwarding=1 (the host then ignores router \
                 advertisements: give it a static IPv6 default route)"
            }
        }
    }
}

/// Whether jobs get IPv6: Ok(None) yes, Ok(Some(why)) no.
pub fn decide(ask: Ipv6, rootless: bool, host: &Host) -> Option<Without> {
    if ask == Ipv6::Off {
        return Some(Without::Off);
    }
    if host.uplinks.is_empty() {
        return Some(Without::NoDefaultRoute);
    }
    // pasta maps the job's connections to the host's own sockets: nothing forwards.
    if !rootless && !host.forwarding && !host.force_forwarding {
        return Some(Without::NoForwarding);
    }
    None
}

/// Whether jobs get IPv6 (`on` on a host without it: one line that says what is missing).
pub fn resolve(ask: Ipv6, rootless: bool, host: &Host) -> Result<bool> {
    match decide(ask, rootless, host) {
        None => Ok(true),
        Some(w) if ask == Ipv6::On => {
            let fix = w.fix();
            let fix = if fix.is_empty() { String::new() } else { format!("{fix}, or ") };
            bail!(
                "network_ipv6 = on (--ipv6 on), but {}: {fix}set network_ipv6 = auto (IPv4 only here) or off",
                w.why()
            )
        }
        Some(_) => Ok(false),
    }
}

/// What jobs get of IPv6, in one line (`check`, `run`'s start).
pub fn note(ask: Ipv6, rootless: bool, host: &Host) -> String {
    match decide(ask, rootless, host) {
        None if rootless => "jobs get IPv4 and IPv6 (IPv6 through pasta, from the host's own sockets)".into(),
        None => format!(
            "jobs get IPv4 and IPv6 (IPv6 from {PREFIX}, masqueraded to the host's address on {}{})",
            host.uplinks.join(", "),
            if host.forwarding { "" } else { "; force_forwarding on that link while jobs' table exists" }
        ),
        Some(w) => {
            let fix = w.fix();
            if fix.is_empty() {
                format!("jobs get IPv4 only: {}", w.why())
            } else {
                format!("jobs get IPv4 only: {}: for IPv6, {fix}", w.why())
            }
        }
    }
}

/// The links of the usable IPv6 default routes in the text of `/proc/net/ipv6_route`:
/// destination ::/0, up (RTF_UP), not a reject route (RTF_REJECT: the kernel's own
/// "unreachable" default), not on `lo`.
pub fn uplinks(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let flags = f.get(8).and_then(|x| u32::from_str_radix(x, 16).ok()).unwrap_or(0);
        let default = f.len() == 10
            && f[0].bytes().all(|b| b == b'0')
            && f[1] == "00"
            && flags & 0x1 != 0
            && flags & 0x200 == 0
            && f[9] != "lo";
        if default && !out.iter().any(|o| o == f[9]) {
            out.push(f[9].to_string());
        }
    }
    out
}

/// Rootless (pasta): link-local, cloud metadata and the host's `local` destinations, its
/// own addresses among them (pasta would connect to them from the host; see
/// `sys::address_watch`). The job's address is the host's, as pasta copies it: its
/// prohibit route does not hide the job's own address (local first).
pub fn blocked_rootless(local: &[Ipv6Net]) -> Vec<Ipv6Net> {
    with_local(vec![LINK_LOCAL, METADATA[0], METADATA[1]], local)
}

/// The networks a job's own routes prohibit: link-local, the jobs' prefix (the other
/// jobs), cloud metadata and the host's `local` destinations, its own addresses among
/// them (what the host's table refuses, and these routes once a flush took it away).
pub fn blocked(local: &[Ipv6Net]) -> Vec<Ipv6Net> {
    with_local(vec![LINK_LOCAL, PREFIX, METADATA[0], METADATA[1]], local)
}

/// `out` and each of the host's `local` destinations not inside it, but loopback's.
fn with_local(mut out: Vec<Ipv6Net>, local: &[Ipv6Net]) -> Vec<Ipv6Net> {
    for n in local.iter().filter(|n| !n.addr.is_loopback()) {
        if !out.iter().any(|b| b.covers(n)) {
            out.push(*n);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const Z: &str = "00000000000000000000000000000000";

    fn host(uplinks: &[&str], forwarding: bool, force_forwarding: bool) -> Host {
        Host { uplinks: uplinks.iter().map(|s| s.to_string()).collect(), forwarding, force_forwarding }
    }

    #[test]
    fn the_default_routes_links_are_found_in_proc() {
        let unreachable = format!("{Z} 00 {Z} 00 {Z} ffffffff 00000001 00000000 00200200       lo\n");
        let via = |dev: &str| {
            format!("{Z} 00 {Z} 00 fe800000000000000000000000000001 00000400 00000001 00000000 00450003 {dev}\n")
        };
        let link =
            format!("fe800000000000000000000000000000 40 {Z} 00 {Z} 00000100 00000001 00000000 00000001     eth0\n");
        assert!(uplinks(&format!("{link}{unreachable}")).is_empty());
        assert_eq!(uplinks(&format!("{link}{}{}{}", via("eth0"), via("eth1"), via("eth0"))), ["eth0", "eth1"]);
    }

    #[test]
    fn jobs_get_ipv6_where_the_host_has_it_and_on_says_what_is_missing() {
        let good = host(&["eth0"], false, true);
        assert!(resolve(Ipv6::Auto, false, &good).unwrap());
        assert!(resolve(Ipv6::On, false, &good).unwrap());
        assert!(!resolve(Ipv6::Off, false, &good).unwrap());
        assert!(resolve(Ipv6::Auto, false, &host(&["eth0"], true, false)).unwrap(), "a router already");
        let old_kernel = host(&["eth0"], false, false);
        assert!(resolve(Ipv6::On, true, &old_kernel).unwrap(), "rootless: pasta needs no forwarding");
        assert!(!resolve(Ipv6::Off, true, &good).unwrap());
        for (h, rootless, want) in [
            (host(&[], false, true), false, "but this host has no IPv6 default route: give the host an IPv6 default route, or set network_ipv6 = auto"),
            (host(&["eth0"], false, false), false, "(Linux >= 6.17) and net.ipv6.conf.all.forwarding is 0: run Linux >= 6.17, or set net.ipv6.conf.all.forwarding=1"),
            (host(&[], true, true), true, "but this host has no IPv6 default route"),
        ] {
            assert!(!resolve(Ipv6::Auto, rootless, &h).unwrap());
            let e = resolve(Ipv6::On, rootless, &h).unwrap_err().to_string();
            assert!(e.starts_with("network_ipv6 = on (--ipv6 on), but ") && e.contains(want) && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn the_note_says_what_jobs_get_and_why() {
        assert_eq!(
            note(Ipv6::Auto, false, &host(&["eth0"], false, true)),
            "jobs get IPv4 and IPv6 (IPv6 from fd61:7a70:7362::/64, masqueraded to the host's address on eth0; \
             force_forwarding on that link while jobs' table exists)"
        );
        assert_eq!(
            note(Ipv6::Auto, false, &host(&["eth0"], true, false)),
            "jobs get IPv4 and IPv6 (IPv6 from fd61:7a70:7362::/64, masqueraded to the host's address on eth0)"
        );
        assert_eq!(note(Ipv6::Off, false, &host(&["eth0"], true, true)), "jobs get IPv4 only: network_ipv6 = off");
        assert_eq!(
            note(Ipv6::Auto, true, &host(&["eth0"], false, false)),
            "jobs get IPv4 and IPv6 (IPv6 through pasta, from the host's own sockets)"
        );
        assert_eq!(
            note(Ipv6::Auto, false, &host(&[], true, true)),
            "jobs get IPv4 only: this host has no IPv6 default route: for IPv6, give the host an IPv6 default route"
        );
    }

    #[test]
    fn a_jobs_blocks_and_address() {
        let net = |a: &str, p: u8| Ipv6Net::new(a.parse().unwrap(), p);
        let host = [net("2001:db8::2", 128), net("fd61:7a70:7362::1", 128)];
        let b: Vec<String> = blocked(&host).iter().map(|n| n.to_string()).collect();
        assert_eq!(
            b,
            ["fe80::/10", "fd61:7a70:7362::/64", "fd00:ec2::254/128", "fd20:ce::254/128", "2001:db8::2/128"],
            "a host address inside a blocked network is not listed again"
        );
        // The host's other local destinations too (held once a flush took the host's
        // table away), but loopback and what is refused already.
        let mut local = host.to_vec();
        local.extend([net("::1", 128), net("2001:db8:5::", 64), net("2001:db8::2", 128), net("fe80::1", 128)]);
        let b: Vec<String> = blocked(&local).iter().map(|n| n.to_string()).collect();
        assert_eq!(b[5..], ["2001:db8:5::/64"]);
        let b: Vec<String> = blocked_rootless(&host).iter().map(|n| n.to_string()).collect();
        assert_eq!(
            b,
            ["fe80::/10", "fd00:ec2::254/128", "fd20:ce::254/128", "2001:db8::2/128", "fd61:7a70:7362::1/128"]
        );
        let v6 = crate::sys::net::Veth6 { prefix: PREFIX, gateway: GATEWAY, force_forwarding: true, blocked: vec![] };
        assert_eq!(v6.address(std::net::Ipv4Addr::new(10, 87, 1, 5)).to_string(), "fd61:7a70:7362::a57:105");
    }
}
