//! The job's `/etc/resolv.conf`: the host's, with the resolvers a job cannot reach
//! itself (on the host's loopback, such as systemd-resolved's 127.0.0.53, on a link-local
//! address, on Azure's host endpoint, or on one of the host's own addresses) replaced by
//! the jobs' gateway, which
//! forwards port 53 to the first of them (root mode: a DNAT in the host's table;
//! rootless: pasta's `--dns-forward`).

use std::net::{IpAddr, Ipv4Addr};

/// What a job gets for name resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobDns {
    /// The job's resolv.conf.
    pub resolv_conf: String,
    /// The host resolver the gateway forwards port 53 to (root mode's DNAT target).
    pub forward_to: Option<Ipv4Addr>,
}

/// From the host's resolv.conf text. `host_addresses`: the host's own IPv4 addresses
/// (input from a job to them is dropped). `always_gateway`: the job asks the gateway
/// only (pasta, which forwards to the host's first resolver whatever it is).
pub fn for_job(host: &str, gateway: Ipv4Addr, host_addresses: &[Ipv4Addr], always_gateway: bool) -> JobDns {
    let mut lines = Vec::new();
    let mut forward_to = None;
    let mut gateway_listed = false;
    for line in host.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("nameserver") {
            lines.push(line.to_string());
            continue;
        }
        let Some(addr) = words.next().and_then(|a| a.split('%').next()?.parse::<IpAddr>().ok()) else { continue };
        let direct = match addr {
            // Jobs have IPv4 only.
            IpAddr::V6(_) => continue,
            IpAddr::V4(a) => {
                !(always_gateway
                    || a.is_loopback()
                    || a.is_link_local()
                    || a == super::firewall::AZURE_HOST
                    || host_addresses.contains(&a))
            }
        };
        if direct {
            lines.push(format!("nameserver {addr}"));
            continue;
        }
        if !gateway_listed {
            // Only the first such resolver can be forwarded to: the gateway has one port 53.
            if let IpAddr::V4(a) = addr {
                forward_to = Some(a);
            }
            lines.push(format!("nameserver {gateway}"));
            gateway_listed = true;
        }
    }
    if always_gateway && !gateway_listed {
        lines.push(format!("nameserver {gateway}"));
    }
    let mut resolv_conf = lines.join("\n");
    resolv_conf.push('\n');
    JobDns { resolv_conf, forward_to }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: Ipv4Addr = Ipv4Addr::new(10, 87, 0, 1);

    #[test]
    fn a_loopback_resolver_is_reached_at_the_gateway() {
        let host = "# managed by resolved\nnameserver 127.0.0.53\noptions edns0 trust-ad\nsearch corp.example\n";
        let d = for_job(host, G, &[], false);
        assert_eq!(
            d.resolv_conf,
            "# managed by resolved\nnameserver 10.87.0.1\noptions edns0 trust-ad\nsearch corp.example\n"
        );
        assert_eq!(d.forward_to, Some(Ipv4Addr::new(127, 0, 0, 53)));
    }

    #[test]
    fn reachable_resolvers_stay_and_unreachable_ones_become_the_gateway_once() {
        let host = "nameserver 192.0.2.53\nnameserver 169.254.169.253\nnameserver ::1\nnameserver 10.0.0.5\nnameserver 127.0.0.1\n";
        let d = for_job(host, G, &[Ipv4Addr::new(10, 0, 0, 5)], false);
        assert_eq!(d.resolv_conf, "nameserver 192.0.2.53\nnameserver 10.87.0.1\n");
        assert_eq!(d.forward_to, Some(Ipv4Addr::new(169, 254, 169, 253)), "the first one the job cannot reach");
        let d = for_job("nameserver 8.8.8.8\n", G, &[], false);
        assert_eq!((d.resolv_conf.as_str(), d.forward_to), ("nameserver 8.8.8.8\n", None));
    }

    #[test]
    fn azures_resolver_is_reached_at_the_gateway() {
        // Azure DNS is the host endpoint jobs are refused (WireServer's address): only its
        // port 53, through the gateway's forward.
        let d = for_job("nameserver 168.63.129.16\nsearch reddog.microsoft.com\n", G, &[], false);
        assert_eq!(d.resolv_conf, "nameserver 10.87.0.1\nsearch reddog.microsoft.com\n");
        assert_eq!(d.forward_to, Some(Ipv4Addr::new(168, 63, 129, 16)));
    }

    #[test]
    fn pasta_jobs_ask_the_gateway_only() {
        let d = for_job("nameserver 8.8.8.8\nsearch x\n", G, &[], true);
        assert_eq!(d.resolv_conf, "nameserver 10.87.0.1\nsearch x\n");
        let d = for_job("", G, &[], true);
        assert_eq!(d.resolv_conf, "nameserver 10.87.0.1\n");
    }
}
