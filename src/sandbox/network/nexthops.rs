//! How many of the host's neighbours a job can make the host resolve (root mode).
//!
//! Jobs reach what the host routes to, its LAN included. Every address of a prefix on
//! one of the host's links (an IPv4 LAN or cloud subnet, an IPv6 /64 from router
//! advertisements) is a neighbour the host resolves before it forwards to it (ARP, or
//! neighbour discovery: a broadcast or solicitation on that LAN each). A job that sent a
//! datagram to each of 300 unused addresses of such a prefix had the host resolve all
//! 300, and resending on the same flows (neither rated nor counted after their first
//! packet) keeps them unresolved and fresh. The kernel's neighbour tables are shared by
//! every namespace of the host (`gc_thresh3`, 1024 entries by default, per family) and
//! an entry younger than 5 s is not collected: once full, the host cannot reach new
//! neighbours, its own router's entry included once it went stale, and neither can any
//! slot (a red-team pass; `t58`).
//!
//! What bounds it: each job's forwarded packets that are still `new` to conntrack (a
//! flow's first packet, and every packet of a flow that had no reply yet, so resends
//! too), or untracked, and leave by a link that resolves its neighbours (Ethernet and
//! what looks like it: bridges, bonds, VLANs; InfiniBand) meet a set of the next hops
//! (`rt ip nexthop`: the router for what is routed, the address itself on the host's
//! own links) the job sent to in the last [`REMEMBERED_SECS`]. A next hop not in it
//! costs a token of the job's bucket ([`BURST`], refilled at [`PER_SECOND`]); without one
//! the packet is dropped, counted, and the kernel log says so once a minute. So a job
//! keeps at most `BURST + PER_SECOND * REMEMBERED_SECS` of the host's neighbours busy
//! at a time. A job's traffic to the internet is one next hop (the router: a token once
//! per 30 s at most), and connections that had a reply never meet the set. Links without
//! neighbours (a default route on WireGuard, tun or PPP, where every address would be a
//! next hop of its own) are left out: nothing to fill there. Dropped, not refused: a
//! refusal per packet would spend the host's ICMP budget for every slot. First in the
//! forward chain, before the rate of new flows: a packet dropped here is never
//! confirmed, and each resend would spend a token of that rate too.
//!
//! And what conntrack calls invalid (a packet of no connection it can track: an SCTP
//! ABORT of an association whose INIT was dropped, a TCP segment outside the window) is
//! dropped: it would meet neither the flows' limits nor the set, and it would leave
//! unmasqueraded, from the job's own address (Kubernetes' kube-proxy drops it as well).
//!
//! Left: rootless jobs (pasta's sockets are the host user's own; no host table); the
//! bound is per job, so a node with more than `gc_thresh3 / 62` slots that all do it
//! wants a larger `gc_thresh3`.

use super::firewall::{refusal_chain, TABLE};

/// In the comment of a table made with these rules; one made before lets a job fill the
/// host's neighbour table.
pub const MARKER: &str = "nexthops";
/// New next hops a job may send to at once.
const BURST: u64 = 32;
/// New next hops a job may send to per second once its burst is spent.
const PER_SECOND: u64 = 1;
/// How long a next hop a job sent to stays known without costing a token again. Not
/// refreshed by later packets: a job that kept every next hop it ever reached alive would
/// grow its share without bound.
const REMEMBERED_SECS: u64 = 30;
/// The sets of the next hops each job sent to (`ifname . address`), and their chains.
const SET4: &str = "job_nexthops4";
const SET6: &str = "job_nexthops6";
const CHAIN4: &str = "nexthops4";
const CHAIN6: &str = "nexthops6";
/// The set that holds each job link's bucket of new next hops. Refreshed by every
/// packet that meets it (`update`): an element that expired an hour after it was made
/// would come back full under a job that kept using it.
const BUCKETS: &str = "job_new_nexthops";
/// The chain of a packet over the bucket.
const OVER: &str = "over_nexthops";
/// Link types whose neighbours the kernel resolves: Ethernet (and bridges, bonds,
/// VLANs, macvlans on it) and InfiniBand (IPoIB, 32: nft has no name for it).
const RESOLVING_LINKS: &str = "{ ether, 32 }";

/// For the line that says the table was made.
pub fn summary() -> String {
    format!("{BURST} new next hops per job, {PER_SECOND} a second past that many")
}

/// The sets, chains and rules: one chain per family, jumped to first in the forward
/// chain, and the drop of what conntrack calls invalid before it. One transaction of its
/// own, after the table's and the flows' (whose rules it goes before): a kernel that
/// refuses it loses only this.
pub fn script() -> String {
    let mut s =
        format!("add set inet {TABLE} {BUCKETS} {{ type ifname; flags dynamic,timeout; timeout 1h; size 65535; }}\n");
    s += &refusal_chain(
        OVER,
        format!("sends to more than {BURST} new next hops, {PER_SECOND} a second past that"),
        "drop",
    );
    for (family, nfproto, set, chain, addr) in
        [("ip", "ipv4", SET4, CHAIN4, "ipv4_addr"), ("ip6", "ipv6", SET6, CHAIN6, "ipv6_addr")]
    {
        let hop = format!("iifname . rt {family} nexthop");
        s += &format!(
            "add set inet {TABLE} {set} {{ type ifname . {addr}; flags dynamic,timeout; timeout {REMEMBERED_SECS}s; size 65535; }}\n\
             add chain inet {TABLE} {chain}\n\
             add rule inet {TABLE} {chain} {hop} @{set} return\n\
             add rule inet {TABLE} {chain} update @{BUCKETS} {{ iifname limit rate over {PER_SECOND}/second burst {BURST} packets }} jump {OVER}\n\
             add rule inet {TABLE} {chain} add @{set} {{ {hop} }}\n\
             insert rule inet {TABLE} forward iifname \"azp*\" ct state {{ new, untracked }} meta oiftype {RESOLVING_LINKS} meta nfproto {nfproto} jump {chain}\n"
        );
    }
    // Inserted last: first of all.
    s += &format!("insert rule inet {TABLE} forward iifname \"azp*\" ct state invalid counter drop\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_new_next_hops_are_rated_and_remembered() {
        let s = script();
        // Each family: known next hops pass, a new one costs a token (or is dropped) and
        // is remembered 30 s; the chain is jumped to by every packet still new to
        // conntrack (or untracked) that leaves by a link with neighbours.
        for (family, nfproto, set, chain) in
            [("ip", "ipv4", "job_nexthops4", "nexthops4"), ("ip6", "ipv6", "job_nexthops6", "nexthops6")]
        {
            let rules = [
                format!("add rule inet azp-sandbox {chain} iifname . rt {family} nexthop @{set} return\n"),
                format!(
                    "add rule inet azp-sandbox {chain} update @job_new_nexthops \
                     {{ iifname limit rate over 1/second burst 32 packets }} jump over_nexthops\n"
                ),
                format!("add rule inet azp-sandbox {chain} add @{set} {{ iifname . rt {family} nexthop }}\n"),
            ];
            let at: Vec<usize> =
                rules.iter().map(|r| s.find(r.as_str()).unwrap_or_else(|| panic!("{r}: {s}"))).collect();
            assert!(at.windows(2).all(|w| w[0] < w[1]), "in this order: {s}");
            let addr = if family == "ip" { "ipv4_addr" } else { "ipv6_addr" };
            assert!(
                s.contains(&format!(
                    "add set inet azp-sandbox {set} {{ type ifname . {addr}; flags dynamic,timeout; timeout 30s; size 65535; }}\n"
                )),
                "{s}"
            );
            assert!(!s.contains(&format!("update @{set}")), "a later packet must not keep a next hop known: {s}");
            assert!(
                s.contains(&format!(
                    "insert rule inet azp-sandbox forward iifname \"azp*\" ct state {{ new, untracked }} \
                     meta oiftype {{ ether, 32 }} meta nfproto {nfproto} jump {chain}\n"
                )),
                "first in forward, before the rate of new flows: {s}"
            );
        }
        assert!(s.contains("add rule inet azp-sandbox over_nexthops counter drop\n"), "{s}");
        // What conntrack calls invalid is dropped before anything else.
        let invalid = "insert rule inet azp-sandbox forward iifname \"azp*\" ct state invalid counter drop\n";
        assert!(s.ends_with(invalid), "inserted last, so first: {s}");
    }
}
