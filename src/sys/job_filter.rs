//! The job's own nftables table, `inet azp-job`, made over netlink in the job's network
//! namespace by the process that owns it (the helper's user namespace owns the namespace;
//! the job's is below it: the job can neither see nor change the table).
//!
//! Why routes are not enough: a socket that names its output link (`SO_BINDTODEVICE`,
//! allowed to anyone since Linux 5.7, or `IP_PKTINFO` on `sendmsg`) makes the kernel take
//! a failed route lookup, a prohibit route's included, for "on the link": the packet
//! leaves anyway. Found by a red-team pass: rootless jobs read the metadata service and
//! the host's own pages through pasta, and a root-mode job reached the host's addresses
//! once a ruleset flush had taken the host's table away.
//!
//! A chain `output` (priority filter, policy accept), one rule per line:
//! - `meta oif != lo ip daddr 127.0.0.0/8 reject ...`, and `::1`: the job's loopback
//!   addresses are local in its namespace too, and a socket bound to `eth0` sends them
//!   out by it (the kernel takes the local route's failed lookup for "on the link");
//!   the host end's `route_localnet` (for the gateway's DNS forward) would take them in,
//!   and once a flush took the host's table away the host's loopback services got
//!   them (a red-team pass: TCP's SYN, the whole of a UDP datagram);
//! - `fib daddr type local accept`: the job's own addresses never leave it;
//! - `ip daddr NET accept` for each allowed network (the gateway, `network_allow`), and
//!   `ip daddr ADDR th dport PORT accept` for an address allowed on ports only;
//! - `ip daddr NET reject with icmpx type admin-prohibited`, and the same for IPv6, for
//!   each network the job's routes prohibit;
//! - `meta oif != lo ip daddr NET reject ...` for broadcast and multicast
//!   ([`JobFilter::reject_off_lo4`]), which routes cannot stop; rootless, IPv6
//!   multicast but ICMPv6 (`... ip6 daddr ff00::/8 meta l4proto != ipv6-icmp reject`:
//!   pasta sends a job's UDP from a host socket whatever its destination, and every
//!   link of the host is in ff02::1; its gateway is found by neighbour discovery).
//!
//! Rootless, a chain `input` (priority filter, policy accept), with one rule:
//! `meta iif != lo ct state new drop` ([`JobFilter::refuse_inbound`]). pasta sends a
//! job's UDP from a host socket bound to the job's source port on all the host's
//! addresses, and hands the job whatever that socket receives, from anyone: the
//! job's namespace itself must keep what it did not ask for out (a red-team pass,
//! then `t62`: 372 datagrams of the fake host's loopback, its address and the fake
//! internet reached a job that had sent one). Root mode's jobs get only what the
//! host's table forwards to them: answers. That state is conntrack's, in the job's
//! namespace, whose entries share the host's table: so, rootless too, a chain `notrack`
//! (output, priority raw) leaves the job's loopback untracked (`oif lo notrack`), and
//! the output chain's first two rules hold a flow's first packet (`ct state new ct
//! status & confirmed == 0`, as the host's table for root mode: a one-way stream is one
//! flow) to a rate past a burst (`limit rate over R/second burst N packets reject`) and
//! the flows the job tracks to its share of the host's table (`ct count over N
//! reject`): a review found a job that sent to loopback ports, or to new ports
//! anywhere, filling it. A kernel without `nft_ct`, `nf_conntrack`, `nft_limit` or
//! `nft_connlimit` starts no rootless `isolated` job (the table is refused, one line).
//!
//! Made over netlink, not by the `nft` binary: one batch (~0.1 ms) instead of a process
//! (~5 ms) on every job's start. Every message has a unit test of its shape; the root
//! test reads the table back with `nft list`.

use super::error::{Error, Result};
use super::net::{Ipv4Net, Ipv6Net};
use super::netlink::{Message, Proto, Socket, NLM_F_CREATE};

/// What the table accepts and refuses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobFilter {
    pub accept4: Vec<Ipv4Net>,
    /// An address accepted on one TCP/UDP port (`network_allow = ["IP:PORT"]`); the
    /// address itself is in `reject4` too.
    pub accept_ports4: Vec<(std::net::Ipv4Addr, u16)>,
    pub reject4: Vec<Ipv4Net>,
    pub reject6: Vec<Ipv6Net>,
    /// Refused when they leave by a link other than loopback (a job's multicast on its
    /// own loopback stays its own): IPv4's limited broadcast and multicast, and (root
    /// mode, whose job links need no neighbour discovery) IPv6 multicast. The host would
    /// deliver them to its services on all addresses once a flush took its table away.
    pub reject_off_lo4: Vec<Ipv4Net>,
    pub reject_off_lo6: Vec<Ipv6Net>,
    /// As `reject_off_lo6`, but for ICMPv6 (rootless: neighbour discovery).
    pub reject_off_lo6_but_icmp: Vec<Ipv6Net>,
    /// Nothing comes in from outside the namespace but answers (conntrack's established
    /// and related), and what the job tracks is held: see the module's doc.
    pub refuse_inbound: Option<Tracked>,
}

/// What a rootless job may track in its own namespace (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tracked {
    /// Flows at once; also the burst of new ones.
    pub flows: u32,
    /// New flows a second past the burst.
    pub new_per_second: u32,
}

pub const TABLE: &str = "azp-job";
const CHAIN: &str = "output";
const INPUT: &str = "input";
const NOTRACK: &str = "notrack";
/// NF_IP_PRI_RAW: before conntrack.
const PRIORITY_RAW: i32 = -300;

// linux/netfilter/nf_tables.h, linux/netfilter.h, linux/rtnetlink.h.
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NLM_F_APPEND: u16 = 0x800;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NF_INET_LOCAL_IN: u32 = 1;
const NF_INET_LOCAL_OUT: u32 = 3;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_META_IIF: u32 = 4;
const NFT_META_OIF: u32 = 5;
const NFT_CT_STATE: u32 = 0;
const NFT_CT_STATUS: u32 = 2;
/// IPS_CONFIRMED: the entry is in the table (its flow's first packet went through).
const IPS_CONFIRMED: u32 = 1 << 3;
const NFT_LIMIT_PKTS: u32 = 0;
/// `limit rate over`.
const NFT_LIMIT_F_INV: u32 = 1;
/// `ct count over`: the connlimit expression's inverted match.
const NFT_CONNLIMIT_F_INV: u32 = 1;
/// `ct state new`: the bit of IP_CT_NEW (2) in conntrack's state mask (bit 0 is invalid).
const NF_CT_STATE_NEW_BIT: u32 = 1 << 3;
const NFT_META_NFPROTO: u32 = 15;
const NFT_META_L4PROTO: u32 = 16;
const IPPROTO_ICMPV6: u8 = 58;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
const LO_IFINDEX: u32 = 1;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
const NFTA_FIB_F_DADDR: u32 = 1 << 1;
const NFT_REJECT_ICMPX_UNREACH: u32 = 2;
const NFT_REJECT_ICMPX_ADMIN_PROHIBITED: u8 = 3;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const RTN_LOCAL: u32 = 2;

/// Makes the table in this thread's network namespace (a netlink socket talks to the
/// namespace its opener is in).
pub fn install(f: &JobFilter) -> Result<()> {
    let s = Socket::open(Proto::Netfilter).map_err(Error::NetlinkSocket)?;
    s.batch(messages(f)).map_err(|source| Error::JobFilter { table: TABLE, source })
}

/// The batch: the table, its chain, its rules.
pub fn messages(f: &JobFilter) -> Vec<Message> {
    let mut out = Vec::new();
    let mut table = Message::nft(NFT_MSG_NEWTABLE, NLM_F_CREATE);
    table.attr_str(NFTA_TABLE_NAME, TABLE);
    out.push(table);
    out.push(base_chain(CHAIN, NF_INET_LOCAL_OUT, 0));
    if let Some(t) = f.refuse_inbound {
        out.extend(tracked_rules(t));
    }
    // Before the local destinations' accept: see the module's doc.
    out.push(net_rule(NFPROTO_IPV4, &[127, 0, 0, 0], 8, true, false));
    out.push(net_rule(NFPROTO_IPV6, &std::net::Ipv6Addr::LOCALHOST.octets(), 128, true, false));
    out.push(rule(|m| {
        fib_daddr_type(m);
        cmp(m, NFT_CMP_EQ, &RTN_LOCAL.to_ne_bytes());
        accept(m);
    }));
    // (family, network, prefix, only off loopback, accept?), in the chain's order.
    let nets = (f.accept4.iter().map(|n| (v4(n), false, true)))
        .chain(f.reject4.iter().map(|n| (v4(n), false, false)))
        .chain(f.reject6.iter().map(|n| (v6(n), false, false)))
        .chain(f.reject_off_lo4.iter().map(|n| (v4(n), true, false)))
        .chain(f.reject_off_lo6.iter().map(|n| (v6(n), true, false)));
    let mut rules: Vec<Message> = nets
        .map(|((family, net, prefix), off_lo, accepted)| net_rule(family, &net, prefix, off_lo, accepted))
        .collect();
    rules.extend(f.reject_off_lo6_but_icmp.iter().map(|n| {
        rule(|m| {
            oif_not_lo(m);
            let (family, net, prefix) = v6(n);
            daddr(m, family, &net, prefix);
            meta(m, NFT_META_L4PROTO, NFT_CMP_NEQ, &[IPPROTO_ICMPV6]);
            reject(m);
        })
    }));
    // The ports' accepts right after the networks' (before any reject).
    let at = f.accept4.len();
    rules.splice(at..at, f.accept_ports4.iter().map(|(addr, port)| port_rule(*addr, *port)));
    out.extend(rules);
    if f.refuse_inbound.is_some() {
        out.push(base_chain(INPUT, NF_INET_LOCAL_IN, 0));
        out.push(rule_in(INPUT, |m| {
            meta(m, NFT_META_IIF, NFT_CMP_NEQ, &LO_IFINDEX.to_ne_bytes());
            ct_state_new(m);
            verdict(m, NF_DROP);
        }));
    }
    out
}

/// Rootless: the `notrack` chain and its rule (`oif lo notrack`), and the output chain's
/// first two rules: a flow's first packet off loopback refused past `t`'s rate, then
/// past its count (see the module's doc).
fn tracked_rules(t: Tracked) -> [Message; 4] {
    let new_flow_refused = |limit: &dyn Fn(&mut Message)| {
        rule(|m| {
            oif_not_lo(m);
            first_packet(m);
            limit(m);
            reject(m);
        })
    };
    [
        base_chain(NOTRACK, NF_INET_LOCAL_OUT, PRIORITY_RAW),
        rule_in(NOTRACK, |m| {
            meta(m, NFT_META_OIF, NFT_CMP_EQ, &LO_IFINDEX.to_ne_bytes());
            expr(m, "notrack", |_| {});
        }),
        new_flow_refused(&|m| {
            expr(m, "limit", |m| {
                m.attr(1, &u64::from(t.new_per_second).to_be_bytes()).attr(2, &1u64.to_be_bytes());
                m.attr(3, &be(t.flows)).attr(4, &be(NFT_LIMIT_PKTS)).attr(5, &be(NFT_LIMIT_F_INV));
            })
        }),
        new_flow_refused(&|m| {
            expr(m, "connlimit", |m| {
                m.attr(1, &be(t.flows)).attr(2, &be(NFT_CONNLIMIT_F_INV));
            })
        }),
    ]
}

/// A flow's first packet: `ct state new ct status & confirmed == 0` (`ct state new`
/// alone is every packet of a flow until its first answer).
fn first_packet(m: &mut Message) {
    ct_state_new(m);
    ct_bits(m, NFT_CT_STATUS, IPS_CONFIRMED, NFT_CMP_EQ);
}

/// `ct state new`.
fn ct_state_new(m: &mut Message) {
    ct_bits(m, NFT_CT_STATE, NF_CT_STATE_NEW_BIT, NFT_CMP_NEQ);
}

/// Conntrack's `key` (a 32-bit mask) masked with `bits`, compared with 0 (`op`).
fn ct_bits(m: &mut Message, key: u32, bits: u32, op: u32) {
    expr(m, "ct", |m| {
        m.attr(1, &be(NFT_REG_1)).attr(2, &be(key));
    });
    expr(m, "bitwise", |m| {
        m.attr(1, &be(NFT_REG_1)).attr(2, &be(NFT_REG_1)).attr(3, &be(4));
        m.nest(4).attr(NFTA_DATA_VALUE, &bits.to_ne_bytes()).end();
        m.nest(5).attr(NFTA_DATA_VALUE, &[0u8; 4]).end();
    });
    cmp(m, op, &[0u8; 4]);
}

/// A chain of the table on `hook` at `priority` (policy accept).
fn base_chain(name: &str, hook: u32, priority: i32) -> Message {
    let mut chain = Message::nft(NFT_MSG_NEWCHAIN, NLM_F_CREATE);
    chain.attr_str(NFTA_CHAIN_TABLE, TABLE).attr_str(NFTA_CHAIN_NAME, name);
    chain.nest(NFTA_CHAIN_HOOK);
    chain.attr(NFTA_HOOK_HOOKNUM, &hook.to_be_bytes()).attr(NFTA_HOOK_PRIORITY, &priority.to_be_bytes());
    chain.end();
    chain.attr(NFTA_CHAIN_POLICY, &NF_ACCEPT.to_be_bytes()).attr_str(NFTA_CHAIN_TYPE, "filter");
    chain
}

/// `ip daddr ADDR th dport PORT accept` (TCP and UDP alike, as the host's table's
/// `allow_port`: the destination port is the transport header's bytes 2-3 in both).
fn port_rule(addr: std::net::Ipv4Addr, port: u16) -> Message {
    rule(|m| {
        daddr(m, NFPROTO_IPV4, &addr.octets(), 32);
        expr(m, "payload", |m| {
            m.attr(1, &be(NFT_REG_1)).attr(2, &be(NFT_PAYLOAD_TRANSPORT_HEADER)).attr(3, &be(2)).attr(4, &be(2));
        });
        cmp(m, NFT_CMP_EQ, &port.to_be_bytes());
        accept(m);
    })
}

/// Refuses `reject4` and `reject6` as well, in the table [`install`] made in this
/// thread's network namespace: rules appended to its chain, in one batch (see
/// `sys::address_watch`: host addresses that came after the job's start).
pub fn refuse_more(s: &Socket, reject4: &[Ipv4Net], reject6: &[Ipv6Net]) -> Result<()> {
    s.batch(more_rules(reject4, reject6)).map_err(|source| Error::JobFilterRule { table: TABLE, source })
}

fn more_rules(reject4: &[Ipv4Net], reject6: &[Ipv6Net]) -> Vec<Message> {
    let rules4 = reject4.iter().map(|n| net_rule(NFPROTO_IPV4, &v4(n).1, n.prefix, false, false));
    rules4.chain(reject6.iter().map(|n| net_rule(NFPROTO_IPV6, &v6(n).1, n.prefix, false, false))).collect()
}

fn v4(n: &Ipv4Net) -> (u8, Vec<u8>, u8) {
    (NFPROTO_IPV4, n.addr.octets().to_vec(), n.prefix)
}

fn v6(n: &Ipv6Net) -> (u8, Vec<u8>, u8) {
    (NFPROTO_IPV6, n.addr.octets().to_vec(), n.prefix)
}

/// `[meta oif != lo] ip[6] daddr NET accept|reject`.
fn net_rule(family: u8, net: &[u8], prefix: u8, off_lo: bool, accepted: bool) -> Message {
    rule(|m| {
        if off_lo {
            oif_not_lo(m);
        }
        daddr(m, family, net, prefix);
        if accepted {
            accept(m)
        } else {
            reject(m)
        }
    })
}

/// `meta oif != lo`: loopback is link 1 in every network namespace.
fn oif_not_lo(m: &mut Message) {
    meta(m, NFT_META_OIF, NFT_CMP_NEQ, &LO_IFINDEX.to_ne_bytes());
}

/// `meta KEY` compared with `value` (`op`: NFT_CMP_*).
fn meta(m: &mut Message, key: u32, op: u32, value: &[u8]) {
    expr(m, "meta", |m| {
        m.attr(1, &be(NFT_REG_1)).attr(2, &be(key));
    });
    cmp(m, op, value);
}

/// A rule appended to the output chain, its expressions written by `exprs`.
fn rule(exprs: impl FnOnce(&mut Message)) -> Message {
    rule_in(CHAIN, exprs)
}

/// A rule appended to `chain`.
fn rule_in(chain: &str, exprs: impl FnOnce(&mut Message)) -> Message {
    let mut m = Message::nft(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND);
    m.attr_str(NFTA_RULE_TABLE, TABLE).attr_str(NFTA_RULE_CHAIN, chain);
    m.nest(NFTA_RULE_EXPRESSIONS);
    exprs(&mut m);
    m.end();
    m
}

/// One expression: its name, then its attributes written by `data`.
fn expr(m: &mut Message, name: &str, data: impl FnOnce(&mut Message)) {
    m.nest(NFTA_LIST_ELEM).attr_str(NFTA_EXPR_NAME, name).nest(NFTA_EXPR_DATA);
    data(m);
    m.end().end();
}

fn be(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

/// `meta nfproto FAMILY`, then the destination address (network header offset 16 or 24)
/// masked to `prefix` bits, equal to `net`.
fn daddr(m: &mut Message, family: u8, net: &[u8], prefix: u8) {
    meta(m, NFT_META_NFPROTO, NFT_CMP_EQ, &[family]);
    let offset = if family == NFPROTO_IPV4 { 16 } else { 24 };
    let len = net.len() as u32;
    expr(m, "payload", |m| {
        m.attr(1, &be(NFT_REG_1)).attr(2, &be(NFT_PAYLOAD_NETWORK_HEADER)).attr(3, &be(offset)).attr(4, &be(len));
    });
    if (prefix as usize) < net.len() * 8 {
        let mask = mask(net.len(), prefix);
        expr(m, "bitwise", |m| {
            m.attr(1, &be(NFT_REG_1)).attr(2, &be(NFT_REG_1)).attr(3, &be(len));
            m.nest(4).attr(NFTA_DATA_VALUE, &mask).end();
            m.nest(5).attr(NFTA_DATA_VALUE, &vec![0u8; net.len()]).end();
        });
    }
    let masked: Vec<u8> = net.iter().zip(mask(net.len(), prefix)).map(|(b, k)| b & k).collect();
    cmp(m, NFT_CMP_EQ, &masked);
}

/// The first `prefix` bits of `len` bytes set.
fn mask(len: usize, prefix: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let bits = (prefix as usize).saturating_sub(i * 8).min(8);
            if bits == 0 {
                0
            } else {
                0xffu8 << (8 - bits)
            }
        })
        .collect()
}

fn fib_daddr_type(m: &mut Message) {
    expr(m, "fib", |m| {
        m.attr(1, &be(NFT_REG_1)).attr(2, &be(NFT_FIB_RESULT_ADDRTYPE)).attr(3, &be(NFTA_FIB_F_DADDR));
    });
}

/// Register 1 compared with `value` (`op`: NFT_CMP_*).
fn cmp(m: &mut Message, op: u32, value: &[u8]) {
    expr(m, "cmp", |m| {
        m.attr(1, &be(NFT_REG_1)).attr(2, &be(op));
        m.nest(3).attr(NFTA_DATA_VALUE, value).end();
    });
}

fn accept(m: &mut Message) {
    verdict(m, NF_ACCEPT)
}

fn verdict(m: &mut Message, code: u32) {
    expr(m, "immediate", |m| {
        m.attr(1, &be(NFT_REG_VERDICT));
        m.nest(2).nest(NFTA_DATA_VERDICT).attr(NFTA_VERDICT_CODE, &be(code)).end().end();
    });
}

fn reject(m: &mut Message) {
    expr(m, "reject", |m| {
        m.attr(1, &be(NFT_REJECT_ICMPX_UNREACH)).attr(2, &[NFT_REJECT_ICMPX_ADMIN_PROHIBITED]);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn filter() -> JobFilter {
        JobFilter {
            accept4: vec![Ipv4Net::host(Ipv4Addr::new(10, 87, 0, 1))],
            accept_ports4: vec![(Ipv4Addr::new(169, 254, 169, 254), 80)],
            reject4: vec![
                Ipv4Net::new(Ipv4Addr::new(169, 254, 0, 0), 16),
                Ipv4Net::new(Ipv4Addr::new(10, 87, 0, 0), 16),
            ],
            reject6: vec![Ipv6Net { addr: Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), prefix: 10 }],
            reject_off_lo4: vec![Ipv4Net::host(Ipv4Addr::BROADCAST)],
            reject_off_lo6: vec![Ipv6Net { addr: Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), prefix: 8 }],
            reject_off_lo6_but_icmp: vec![Ipv6Net { addr: Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), prefix: 8 }],
            refuse_inbound: Some(Tracked { flows: 4096, new_per_second: 100 }),
        }
    }

    #[test]
    fn masks() {
        assert_eq!(mask(4, 16), [255, 255, 0, 0]);
        assert_eq!(mask(4, 12), [255, 240, 0, 0]);
        assert_eq!(mask(4, 32), [255; 4]);
        assert_eq!(mask(16, 10)[..3], [255, 192, 0]);
    }

    #[test]
    fn one_message_per_rule_after_the_table_and_chain() {
        let has = |b: &[u8], needle: &[u8]| b.windows(needle.len()).any(|w| w == needle);
        let finish = |msgs: Vec<Message>| -> Vec<Vec<u8>> { msgs.into_iter().map(|m| m.finish(1, 0)).collect() };
        // Root mode: table, chain, the loopbacks off lo, local, one accept, one port's
        // accept, two IPv4 rejects, one IPv6 reject, two off lo, one off lo but ICMPv6.
        let bytes = finish(messages(&JobFilter { refuse_inbound: None, ..filter() }));
        assert_eq!(bytes.len(), 13);
        assert!(has(&bytes[1], b"filter\0") && has(&bytes[1], &be(NF_INET_LOCAL_OUT)), "the output hook");
        assert!(has(&bytes[2], &[127, 0, 0, 0]) && has(&bytes[2], b"reject\0"), "127/8 first: refused");
        assert!(has(&bytes[4], b"fib\0") && has(&bytes[4], b"immediate\0"), "local: accept");
        assert!(has(&bytes[5], &[10, 87, 0, 1]) && !has(&bytes[5], b"bitwise\0"), "a /32: no mask");
        assert!(has(&bytes[6], &[169, 254, 169, 254]) && has(&bytes[6], &80u16.to_be_bytes()), "a port's accept");
        assert!(has(&bytes[6], &be(NFT_PAYLOAD_TRANSPORT_HEADER)) && has(&bytes[6], b"immediate\0"));
        assert!(has(&bytes[7], &[255, 255, 0, 0]) && has(&bytes[7], b"reject\0"), "a /16: masked, refused");
        assert!(has(&bytes[9], &[0xfe, 0x80]) && has(&bytes[9], &[NFPROTO_IPV6]), "IPv6");
        assert!(has(&bytes[12], &be(NFT_META_L4PROTO)) && has(&bytes[12], &[IPPROTO_ICMPV6]), "but ICMPv6");
        // The expression name "ct" as its attribute (length 7, NFTA_EXPR_NAME): "reject" ends in "ct" too.
        const CT: &[u8] = b"\x07\x00\x01\x00ct\x00";
        assert!(!bytes.iter().any(|b| has(b, CT)), "root mode: nothing tracked in the job's namespace");
        // Rootless: the notrack chain and its rule, the rate and the count first in the
        // output chain (a flow's first packet), the input chain and its rule.
        let bytes = finish(messages(&filter()));
        assert_eq!(bytes.len(), 19);
        assert!(has(&bytes[2], b"notrack\0") && has(&bytes[2], &PRIORITY_RAW.to_be_bytes()), "raw priority");
        assert!(has(&bytes[3], b"notrack\0") && has(&bytes[3], &LO_IFINDEX.to_ne_bytes()), "loopback: untracked");
        assert!(has(&bytes[4], b"limit\0") && has(&bytes[4], &100u64.to_be_bytes()), "the rate, first");
        assert!(has(&bytes[4], &be(4096)) && has(&bytes[4], b"reject\0"), "its burst; over it: refused");
        assert!(has(&bytes[5], b"connlimit\0") && has(&bytes[5], &be(4096)), "then the count");
        assert!(has(&bytes[5], &be(NFT_CONNLIMIT_F_INV)) && has(&bytes[5], b"reject\0"), "over it: refused");
        for b in &bytes[4..6] {
            assert!(has(b, &IPS_CONFIRMED.to_ne_bytes()) && has(b, &be(NFT_CT_STATUS)), "a flow's first packet");
        }
        assert!(has(&bytes[6], &[127, 0, 0, 0]), "then the rules of root mode");
        assert!(has(&bytes[17], b"input\0") && has(&bytes[17], &be(NF_INET_LOCAL_IN)), "the input hook");
        assert!(has(&bytes[18], CT) && has(&bytes[18], &NF_CT_STATE_NEW_BIT.to_ne_bytes()), "new: dropped");
    }

    /// A batch the kernel refuses is one error, not a wait: the chain without its table.
    #[test]
    #[cfg_attr(not(test_as_root), ignore = "needs root: a network namespace")]
    fn a_refused_batch_is_an_error() {
        let got = super::super::netlink::in_fresh_namespace(|| {
            let s = Socket::open(Proto::Netfilter).unwrap();
            s.batch(messages(&filter()).split_off(1))
        });
        assert_eq!(got, Err(nix::errno::Errno::ENOENT));
    }

    /// Made in a network namespace of this test thread's own, then read back by `nft`.
    #[test]
    #[cfg_attr(not(test_as_root), ignore = "needs root: a network namespace")]
    fn the_table_reads_back_as_written() {
        let Some(nft) = ["/usr/sbin/nft", "/sbin/nft"].into_iter().find(|p| std::path::Path::new(p).exists()) else {
            eprintln!("SKIPPED: nft is not installed: the table is not read back");
            return;
        };
        let listed = super::super::netlink::in_fresh_namespace(move || {
            install(&filter()).unwrap();
            let out = std::process::Command::new(nft).args(["list", "table", "inet", TABLE]).output().unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        });
        let rules: Vec<&str> = listed.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        assert_eq!(
            rules,
            [
                "table inet azp-job {",
                "chain output {",
                "type filter hook output priority filter; policy accept;",
                "oif != \"lo\" ct state new ct status ! confirmed limit rate over 100/second burst 4096 packets reject with icmpx admin-prohibited",
                "oif != \"lo\" ct state new ct status ! confirmed ct count over 4096 reject with icmpx admin-prohibited",
                "oif != \"lo\" ip daddr 127.0.0.0/8 reject with icmpx admin-prohibited",
                "oif != \"lo\" ip6 daddr ::1 reject with icmpx admin-prohibited",
                "fib daddr type local accept",
                "ip daddr 10.87.0.1 accept",
                "ip daddr 169.254.169.254 th dport 80 accept",
                "ip daddr 169.254.0.0/16 reject with icmpx admin-prohibited",
                "ip daddr 10.87.0.0/16 reject with icmpx admin-prohibited",
                "ip6 daddr fe80::/10 reject with icmpx admin-prohibited",
                "oif != \"lo\" ip daddr 255.255.255.255 reject with icmpx admin-prohibited",
                "oif != \"lo\" ip6 daddr ff00::/8 reject with icmpx admin-prohibited",
                "oif != \"lo\" ip6 daddr ff00::/8 meta l4proto != ipv6-icmp reject with icmpx admin-prohibited",
                "}",
                "chain notrack {",
                "type filter hook output priority raw; policy accept;",
                "oif \"lo\" notrack",
                "}",
                "chain input {",
                "type filter hook input priority filter; policy accept;",
                "iif != \"lo\" ct state new drop",
                "}",
                "}",
            ],
            "{listed}"
        );
    }
}
