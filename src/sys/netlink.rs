//! Netlink, by hand: the few route-netlink (rtnetlink) requests and dumps of a job's
//! network (a link up, a veth pair, an address, routes, a neighbour; the host's links,
//! addresses and routes) and one nftables query (does our table exist).
//!
//! Why by hand: a request is a header and a few attributes; the crates that model all of
//! rtnetlink are async (rtnetlink) or emit some attributes in their dump layout, which
//! the kernel does not take in a request (`IFLA_INET_CONF`). Every message built here
//! has a unit test of its bytes.
//!
//! A netlink socket talks to the network namespace its opener was in when it was opened:
//! one opened before the helper's `unshare(CLONE_NEWNET)` keeps talking to the host's,
//! one opened after talks to the job's, without any `setns` back and forth.

use nix::errno::Errno;
use nix::sys::socket::{self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType};
use std::cell::Cell;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd};

// Message types and flags (linux/netlink.h, linux/rtnetlink.h).
pub const RTM_NEWLINK: u16 = 16;
pub const RTM_DELLINK: u16 = 17;
pub const RTM_GETLINK: u16 = 18;
pub const RTM_NEWADDR: u16 = 20;
pub const RTM_GETADDR: u16 = 22;
pub const RTM_NEWROUTE: u16 = 24;
pub const RTM_GETROUTE: u16 = 26;
pub const RTM_NEWNEIGH: u16 = 28;
pub const RTM_NEWRULE: u16 = 32;
// linux/sock_diag.h
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
/// linux/inet_diag.h: the size of `struct inet_diag_sockid`, which a dump's
/// `inet_diag_msg` holds from its byte 4 on.
pub const INET_DIAG_SOCKID_LEN: usize = 48;
/// Routing rules (linux/fib_rules.h): the destination, the priority, the "prohibit" action.
pub const FRA_DST: u16 = 1;
pub const FRA_PRIORITY: u16 = 6;
pub const FR_ACT_PROHIBIT: u8 = 8;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
/// In a dump's reply: what it lists changed while it was made (see [`Socket::call`]).
const NLM_F_DUMP_INTR: u16 = 0x10;
pub const NLM_F_REPLACE: u16 = 0x100;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
const NLMSG_HDRLEN: usize = 16;

// Link attributes (linux/if_link.h).
pub const IFLA_ADDRESS: u16 = 1;
pub const IFLA_IFNAME: u16 = 3;
pub const IFLA_LINKINFO: u16 = 18;
pub const IFLA_AF_SPEC: u16 = 26;
pub const IFLA_GROUP: u16 = 27;
pub const IFLA_NET_NS_FD: u16 = 28;
pub const IFLA_NUM_TX_QUEUES: u16 = 31;
pub const IFLA_NUM_RX_QUEUES: u16 = 32;
pub const IFLA_INFO_KIND: u16 = 1;
pub const IFLA_INFO_DATA: u16 = 2;
pub const VETH_INFO_PEER: u16 = 1;
pub const IFLA_INET_CONF: u16 = 1;
pub const IFLA_INET6_ADDR_GEN_MODE: u16 = 8;
pub const IN6_ADDR_GEN_MODE_NONE: u8 = 1;
/// Index (1-based) of `rp_filter` in the IPv4 per-device settings (`IPV4_DEVCONF_*`).
pub const IPV4_DEVCONF_RP_FILTER: u16 = 8;
/// Index of `route_localnet`.
pub const IPV4_DEVCONF_ROUTE_LOCALNET: u16 = 26;
pub const IFF_UP: u32 = 0x1;

// Address, route and neighbour attributes.
pub const IFA_ADDRESS: u16 = 1;
pub const IFA_LOCAL: u16 = 2;
pub const IFA_BROADCAST: u16 = 4;
/// `ifa_flags`: no duplicate address detection (the address is the job's alone on its link).
pub const IFA_F_NODAD: u8 = 0x02;
pub const RTA_DST: u16 = 1;
pub const RTA_OIF: u16 = 4;
pub const RTA_GATEWAY: u16 = 5;
pub const RTA_TABLE: u16 = 15;
pub const NDA_DST: u16 = 1;
pub const NDA_LLADDR: u16 = 2;
pub const RT_TABLE_DEFAULT: u32 = 253;
pub const RT_TABLE_MAIN: u8 = 254;
pub const RT_TABLE_LOCAL: u32 = 255;
/// Route types a host delivers to itself (`rtm_type`).
pub const RTN_LOCAL: u8 = 2;
pub const RTN_BROADCAST: u8 = 3;
pub const RTN_ANYCAST: u8 = 4;
pub const RTPROT_BOOT: u8 = 3;
pub const RT_SCOPE_UNIVERSE: u8 = 0;
pub const RT_SCOPE_HOST: u8 = 254;
pub const RT_SCOPE_LINK: u8 = 253;
pub const RTN_UNICAST: u8 = 1;
pub const RTN_PROHIBIT: u8 = 8;
pub const NUD_PERMANENT: u16 = 0x80;
pub const AF_INET: u8 = libc::AF_INET as u8;
pub const AF_INET6: u8 = libc::AF_INET6 as u8;

// nftables over nfnetlink (linux/netfilter/nfnetlink.h, nf_tables.h).
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// nfnetlink's multicast group of nftables' changes.
const NFNLGRP_NFTABLES: u32 = 7;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_HANDLE: u16 = 4;
/// linux/netlink.h (the libc crate has it for Android only).
const NETLINK_GET_STRICT_CHK: libc::c_int = 12;
const NFTA_TABLE_USERDATA: u16 = 6;
const NFPROTO_INET: u8 = 1;
/// ctnetlink (conntrack) and its messages and attributes.
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_ZONE: u16 = 18;
const CTA_ID: u16 = 12;
const CTA_TUPLE_IP: u16 = 1;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V6_SRC: u16 = 3;

/// Which netlink family a socket speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Route,
    Netfilter,
    SockDiag,
}

/// A netlink socket of this process's network namespace at the time it was opened.
pub struct Socket {
    fd: OwnedFd,
    seq: Cell<u32>,
}

impl Socket {
    pub fn open(proto: Proto) -> Result<Socket, Errno> {
        let protocol = match proto {
            Proto::Route => SockProtocol::NetlinkRoute,
            Proto::Netfilter => SockProtocol::NetlinkNetFilter,
            Proto::SockDiag => SockProtocol::NetlinkSockDiag,
        };
        let fd = socket::socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, protocol)?;
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        Ok(Socket { fd, seq: Cell::new(1) })
    }

    /// Asks the kernel to take a dump request's header as a filter
    /// (`NETLINK_GET_STRICT_CHK`, Linux 4.20+): a dump of one routing table then returns
    /// that table's routes only, not every table's (a host with a full routing table would
    /// have each job read all of it). False where the kernel is older: it then ignores the
    /// filter and dumps everything, which callers filter themselves.
    pub fn filter_dumps(&self) -> bool {
        let on: libc::c_int = 1;
        // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from `on`, an int alive for
        // the call; the fd is this socket's own.
        let set = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_NETLINK,
                NETLINK_GET_STRICT_CHK,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        set == 0
    }

    /// Sends `msg` (with an ack asked for) and returns the replies before the ack or the
    /// end of a dump; the kernel's error (a negative errno in the ack) as `Err`. A dump
    /// the kernel marks interrupted (`NLM_F_DUMP_INTR`: what it lists changed meanwhile,
    /// and an entry may have been skipped) is asked for again, [`DUMP_TRIES`] times at
    /// most, then refused with EINTR: a caller that decides by what is absent from a
    /// dump (a link, a route) must not decide on a partial one.
    pub fn call(&self, msg: Message) -> Result<Vec<Vec<u8>>, Errno> {
        if msg.flags & NLM_F_DUMP == NLM_F_DUMP {
            for _ in 1..DUMP_TRIES {
                if let Ok(r) = self.call_once(msg.clone()) {
                    return r;
                }
            }
        }
        self.call_once(msg).unwrap_or(Err(Errno::EINTR))
    }

    /// [`Socket::call`], once: `Err(Interrupted)` for a dump the kernel marked so.
    fn call_once(&self, msg: Message) -> Result<Result<Vec<Vec<u8>>, Errno>, Interrupted> {
        let seq = self.seq.get();
        self.seq.set(seq.wrapping_add(1));
        let dump = msg.flags & NLM_F_DUMP == NLM_F_DUMP;
        let bytes = msg.finish(seq, if dump { 0 } else { NLM_F_ACK });
        let sent = match socket::send(self.fd.as_raw_fd(), &bytes, MsgFlags::empty()) {
            Ok(n) => n,
            Err(e) => return Ok(Err(e)),
        };
        if sent != bytes.len() {
            return Ok(Err(Errno::EMSGSIZE));
        }
        let mut replies = Vec::new();
        let mut interrupted = false;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match socket::recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                Ok(n) => n,
                Err(e) => return Ok(Err(e)),
            };
            interrupted |= dump_interrupted(&buf[..n], seq);
            for (typ, msg_seq, payload) in messages(&buf[..n]) {
                if msg_seq != seq {
                    continue; // a late reply to an earlier request
                }
                match typ {
                    NLMSG_ERROR => {
                        let code = payload.get(..4).map(|b| i32::from_ne_bytes(b.try_into().unwrap())).unwrap_or(0);
                        return Ok(if code == 0 { Ok(replies) } else { Err(Errno::from_raw(-code)) });
                    }
                    NLMSG_DONE if interrupted => return Err(Interrupted),
                    NLMSG_DONE => return Ok(Ok(replies)),
                    _ => replies.push(payload.to_vec()),
                }
            }
        }
    }

    /// A request that returns nothing but its ack.
    pub fn request(&self, msg: Message) -> Result<(), Errno> {
        self.call(msg).map(|_| ())
    }

    /// nftables messages as one transaction (`NFNL_MSG_BATCH_BEGIN` ... `END`, one
    /// `send`): all of them or none. The kernel's first error as `Err`.
    pub fn batch(&self, msgs: Vec<Message>) -> Result<(), Errno> {
        let first = self.seq.get();
        let mut bytes = batch_mark(NFNL_MSG_BATCH_BEGIN, first);
        let mut acks = Vec::new();
        for (i, m) in msgs.into_iter().enumerate() {
            let seq = first.wrapping_add(1 + i as u32);
            acks.push(seq);
            bytes.extend(m.finish(seq, NLM_F_ACK));
        }
        let last = first.wrapping_add(1 + acks.len() as u32);
        bytes.extend(batch_mark(NFNL_MSG_BATCH_END, last));
        self.seq.set(last.wrapping_add(1));
        let sent = socket::send(self.fd.as_raw_fd(), &bytes, MsgFlags::empty())?;
        if sent != bytes.len() {
            return Err(Errno::EMSGSIZE);
        }
        // Ours: the batch's begin and end too (a kernel without nf_tables refuses the
        // begin, which asked for no ack: waiting for the others' acks would never end).
        let ours = |seq: u32| seq.wrapping_sub(first) <= last.wrapping_sub(first);
        let mut buf = vec![0u8; 64 * 1024];
        while !acks.is_empty() {
            let n = socket::recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
            for (typ, seq, payload) in messages(&buf[..n]) {
                if typ != NLMSG_ERROR || !ours(seq) {
                    continue;
                }
                let code = payload.get(..4).map(|b| i32::from_ne_bytes(b.try_into().unwrap())).unwrap_or(0);
                if code != 0 {
                    return Err(Errno::from_raw(-code));
                }
                acks.retain(|s| *s != seq);
            }
        }
        Ok(())
    }
}

/// Route netlink's multicast groups of route changes (linux/rtnetlink.h, `RTMGRP_*`).
pub const RTMGRP_IPV4_ROUTE: u32 = 0x40;
pub const RTMGRP_IPV6_ROUTE: u32 = 0x400;

/// A route netlink socket subscribed to multicast groups: the kernel's notifications
/// of the namespace it was opened in, read without blocking.
pub struct Listener {
    fd: OwnedFd,
}

/// What [`Listener::drain`] read.
#[derive(Debug, Default)]
pub struct Drained {
    /// `(type, payload)` of each notification.
    pub notifications: Vec<(u16, Vec<u8>)>,
    /// Some were lost (ENOBUFS: the socket's buffer was full): whoever reads them must
    /// read the state they describe afresh.
    pub overrun: bool,
}

impl Listener {
    pub fn open(groups: u32) -> Result<Listener, Errno> {
        let flags = SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK;
        let fd = socket::socket(AddressFamily::Netlink, SockType::Raw, flags, SockProtocol::NetlinkRoute)?;
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups))?;
        Ok(Listener { fd })
    }

    /// A netfilter socket subscribed to nftables' changes (`NFNLGRP_NFTABLES`): one
    /// notification per object a committed transaction added or deleted, then its
    /// generation. Root only (CAP_NET_ADMIN over the namespace).
    pub fn nftables() -> Result<Listener, Errno> {
        let flags = SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK;
        let fd = socket::socket(AddressFamily::Netlink, SockType::Raw, flags, SockProtocol::NetlinkNetFilter)?;
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 1 << (NFNLGRP_NFTABLES - 1)))?;
        Ok(Listener { fd })
    }

    /// Everything received so far.
    pub fn drain(&self) -> Result<Drained, Errno> {
        let mut out = Drained::default();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match socket::recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                Ok(0) | Err(Errno::EAGAIN) => return Ok(out),
                Ok(n) => out.notifications.extend(messages(&buf[..n]).into_iter().map(|(t, _, p)| (t, p.to_vec()))),
                Err(Errno::ENOBUFS) => out.overrun = true,
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl std::os::fd::AsFd for Listener {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A batch's begin or end: `nfgenmsg` with the nftables subsystem as its resource id.
fn batch_mark(typ: u16, seq: u32) -> Vec<u8> {
    let mut m = Message::new(typ, 0, &[0, 0, 0, NFNL_SUBSYS_NFTABLES as u8]);
    m.flags = NLM_F_REQUEST;
    m.finish(seq, 0)
}

/// How many times [`Socket::call`] asks for a dump the kernel marks interrupted.
const DUMP_TRIES: usize = 5;

/// A dump the kernel marked `NLM_F_DUMP_INTR` (see [`Socket::call`]).
struct Interrupted;

/// Whether a message of request `seq` in `buf` carries `NLM_F_DUMP_INTR`.
fn dump_interrupted(buf: &[u8], seq: u32) -> bool {
    headers(buf).into_iter().any(|(_, flags, s, _)| s == seq && flags & NLM_F_DUMP_INTR != 0)
}

/// `(type, seq, payload)` of each message in a received buffer.
fn messages(buf: &[u8]) -> Vec<(u16, u32, &[u8])> {
    headers(buf).into_iter().map(|(typ, _, seq, payload)| (typ, seq, payload)).collect()
}

/// `(type, flags, seq, payload)` of each message in a received buffer.
fn headers(mut buf: &[u8]) -> Vec<(u16, u16, u32, &[u8])> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(buf[0..4].try_into().unwrap()) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            break;
        }
        let typ = u16::from_ne_bytes(buf[4..6].try_into().unwrap());
        let flags = u16::from_ne_bytes(buf[6..8].try_into().unwrap());
        let seq = u32::from_ne_bytes(buf[8..12].try_into().unwrap());
        out.push((typ, flags, seq, &buf[NLMSG_HDRLEN..len]));
        buf = &buf[align(len).min(buf.len())..];
    }
    out
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// One netlink message being built: the family header, then attributes (nested ones
/// between [`Message::nest`] and [`Message::end`]).
#[derive(Debug, Clone)]
pub struct Message {
    typ: u16,
    flags: u16,
    buf: Vec<u8>,
    nests: Vec<usize>,
}

impl Message {
    fn new(typ: u16, flags: u16, header: &[u8]) -> Message {
        let mut buf = vec![0u8; NLMSG_HDRLEN];
        buf.extend_from_slice(header);
        buf.resize(align(buf.len()), 0);
        Message { typ, flags: flags | NLM_F_REQUEST, buf, nests: vec![] }
    }

    /// `RTM_NEWLINK` (or GETLINK, DELLINK) with an `ifinfomsg`: family, index, flags and the
    /// flags that change.
    pub fn link(typ: u16, flags: u16, index: i32, ifi_flags: u32, change: u32) -> Message {
        Message::new(typ, flags, &ifinfomsg(index, ifi_flags, change))
    }

    /// `RTM_NEWADDR` with an `ifaddrmsg`.
    pub fn addr(typ: u16, flags: u16, family: u8, prefix: u8, scope: u8, index: u32) -> Message {
        Message::addr_flags(typ, flags, family, prefix, 0, scope, index)
    }

    /// `RTM_NEWADDR` with an `ifaddrmsg` and its `ifa_flags` (IFA_F_*).
    pub fn addr_flags(typ: u16, flags: u16, family: u8, prefix: u8, ifa_flags: u8, scope: u8, index: u32) -> Message {
        let mut h = vec![family, prefix, ifa_flags, scope];
        h.extend_from_slice(&index.to_ne_bytes());
        Message::new(typ, flags, &h)
    }

    /// A dump request of `typ` (links, addresses, routes) for one address family (0: all).
    pub fn dump(typ: u16, family: u8) -> Message {
        let header: Vec<u8> = match typ {
            RTM_GETLINK => ifinfomsg(0, 0, 0).to_vec(),
            RTM_GETADDR => vec![family, 0, 0, 0, 0, 0, 0, 0],
            _ => rtmsg(family, 0, 0, 0, 0).to_vec(),
        };
        let mut m = Message::new(typ, NLM_F_DUMP, &header);
        if typ == RTM_GETLINK {
            m.buf[NLMSG_HDRLEN] = family;
        }
        m
    }

    /// A dump of the sockets of `family` and IP `protocol` (a [`Proto::SockDiag`] socket's
    /// namespace's) in the states of the bit mask `states` (1 << TCP_*): an
    /// `inet_diag_req_v2`.
    pub fn inet_diag_dump(family: u8, protocol: u8, states: u32) -> Message {
        Message::new(
            SOCK_DIAG_BY_FAMILY,
            NLM_F_DUMP,
            &inet_diag_req(family, protocol, states, &[0; INET_DIAG_SOCKID_LEN]),
        )
    }

    /// `SOCK_DESTROY` of the socket a dump named `id` (its `inet_diag_sockid`, cookie
    /// included): the kernel aborts it, as `ss -K` does.
    pub fn inet_diag_destroy(family: u8, protocol: u8, id: &[u8]) -> Message {
        Message::new(SOCK_DESTROY, 0, &inet_diag_req(family, protocol, u32::MAX, id))
    }

    /// A dump of the routes of one `family` in `table` alone on a socket that
    /// [filters dumps](Socket::filter_dumps) (every table's elsewhere). The header's
    /// other fields are zero: there the kernel takes the protocol and type as filters too,
    /// and refuses a dump whose prefix lengths, TOS or scope are not zero.
    pub fn dump_routes(family: u8, table: u8) -> Message {
        Self::dump_routes_of_type(family, table, 0)
    }

    /// The same, of route type `kind` (RTN_*) alone where the kernel filters (every
    /// type's elsewhere); `table` 0: of every table.
    pub fn dump_routes_of_type(family: u8, table: u8, kind: u8) -> Message {
        Message::new(RTM_GETROUTE, NLM_F_DUMP, &[family, 0, 0, 0, table, 0, 0, kind, 0, 0, 0, 0])
    }

    /// `RTM_NEWROUTE` (IPv4) in the main table: `dst/dst_len`, of `kind` (RTN_*), `scope`.
    pub fn route(flags: u16, dst_len: u8, scope: u8, kind: u8) -> Message {
        Message::new(RTM_NEWROUTE, flags, &rtmsg(AF_INET, dst_len, RT_TABLE_MAIN, scope, kind))
    }

    /// [`Message::route`] of IPv6.
    pub fn route6(flags: u16, dst_len: u8, scope: u8, kind: u8) -> Message {
        Message::new(RTM_NEWROUTE, flags, &rtmsg(AF_INET6, dst_len, RT_TABLE_MAIN, scope, kind))
    }

    /// `RTM_NEWNEIGH` with an `ndmsg`: a neighbour entry on link `index` in `state`.
    pub fn neigh(flags: u16, family: u8, index: i32, state: u16) -> Message {
        let mut h = vec![family, 0, 0, 0];
        h.extend_from_slice(&index.to_ne_bytes());
        h.extend_from_slice(&state.to_ne_bytes());
        h.extend_from_slice(&[0, 0]);
        Message::new(RTM_NEWNEIGH, flags, &h)
    }

    /// `RTM_NEWRULE` with a `fib_rule_hdr`: a routing rule of `family` for destinations
    /// of `dst_len` bits, with `action` (FR_ACT_*).
    pub fn rule(flags: u16, family: u8, dst_len: u8, action: u8) -> Message {
        Message::new(RTM_NEWRULE, flags, &[family, dst_len, 0, 0, 0, 0, 0, action, 0, 0, 0, 0])
    }

    /// An nftables message of `msg` (NFT_MSG_*) for the inet family, to go in a batch
    /// ([`Socket::batch`]).
    pub fn nft(msg: u16, flags: u16) -> Message {
        Message::new((NFNL_SUBSYS_NFTABLES << 8) | msg, flags, &[NFPROTO_INET, 0, 0, 0])
    }

    /// The element of the inet set `set` of table `table` whose key is `key` (ENOENT when
    /// there is none; Linux 4.15+). A lookup: a dump of the set walks every bucket of its
    /// hash, 131072 for a set of size 65535 whatever it holds (~0.5 ms of the helper's CPU
    /// at every job's end, seen in a profile).
    pub fn nft_get_set_element(table: &str, set: &str, key: &[u8]) -> Message {
        let mut m = Message::new((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETSETELEM, 0, &[NFPROTO_INET, 0, 0, 0]);
        m.attr_str(NFTA_SET_ELEM_LIST_TABLE, table).attr_str(NFTA_SET_ELEM_LIST_SET, set);
        m.nest(NFTA_SET_ELEM_LIST_ELEMENTS).nest(NFTA_LIST_ELEM).nest(NFTA_SET_ELEM_KEY);
        m.attr(NFTA_DATA_VALUE, key).end().end().end();
        m
    }

    /// nftables `GETTABLE` of `name` in the inet family.
    pub fn nft_get_table(name: &str) -> Message {
        // nfgenmsg: family, version, res_id (big endian: the subsystem's resource id).
        let mut m = Message::new((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE, 0, &[NFPROTO_INET, 0, 0, 0]);
        m.attr_str(NFTA_TABLE_NAME, name);
        m
    }

    pub fn attr(&mut self, typ: u16, data: &[u8]) -> &mut Message {
        let len = 4 + data.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&typ.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.buf.resize(align(self.buf.len()), 0);
        self
    }

    pub fn attr_u32(&mut self, typ: u16, v: u32) -> &mut Message {
        self.attr(typ, &v.to_ne_bytes())
    }

    /// A NUL-terminated string attribute (interface names, the link kind, table names).
    pub fn attr_str(&mut self, typ: u16, s: &str) -> &mut Message {
        let mut b = s.as_bytes().to_vec();
        b.push(0);
        self.attr(typ, &b)
    }

    pub fn attr_ipv4(&mut self, typ: u16, a: Ipv4Addr) -> &mut Message {
        self.attr(typ, &a.octets())
    }

    pub fn attr_ipv6(&mut self, typ: u16, a: Ipv6Addr) -> &mut Message {
        self.attr(typ, &a.octets())
    }

    /// Starts a nested attribute; [`Message::end`] closes the innermost one.
    pub fn nest(&mut self, typ: u16) -> &mut Message {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&typ.to_ne_bytes());
        self
    }

    /// Raw bytes inside the current nest (e.g. the peer's `ifinfomsg` of a veth).
    pub fn raw(&mut self, data: &[u8]) -> &mut Message {
        self.buf.extend_from_slice(data);
        self.buf.resize(align(self.buf.len()), 0);
        self
    }

    pub fn end(&mut self) -> &mut Message {
        if let Some(start) = self.nests.pop() {
            let len = (self.buf.len() - start) as u16;
            self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        }
        self
    }

    /// The bytes to send: the header filled in (length, type, flags, `seq`).
    pub(crate) fn finish(mut self, seq: u32, extra_flags: u16) -> Vec<u8> {
        while !self.nests.is_empty() {
            self.end();
        }
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[4..6].copy_from_slice(&self.typ.to_ne_bytes());
        self.buf[6..8].copy_from_slice(&(self.flags | extra_flags).to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
    }
}

/// `struct ifinfomsg`: family AF_UNSPEC, type, index, flags, change.
pub fn ifinfomsg(index: i32, flags: u32, change: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    h[8..12].copy_from_slice(&flags.to_ne_bytes());
    h[12..16].copy_from_slice(&change.to_ne_bytes());
    h
}

/// `struct rtmsg` with protocol `boot` (as `ip route add`).
/// `struct inet_diag_req_v2`: family, protocol, no extensions, the states, the socket id.
fn inet_diag_req(family: u8, protocol: u8, states: u32, id: &[u8]) -> Vec<u8> {
    let mut h = vec![family, protocol, 0, 0];
    h.extend_from_slice(&states.to_ne_bytes());
    h.extend_from_slice(id);
    h.resize(8 + INET_DIAG_SOCKID_LEN, 0);
    h
}

fn rtmsg(family: u8, dst_len: u8, table: u8, scope: u8, kind: u8) -> [u8; 12] {
    [family, dst_len, 0, 0, table, RTPROT_BOOT, scope, kind, 0, 0, 0, 0]
}

/// The attributes of a reply's payload after its `header_len`-byte family header:
/// `(type without the nested/byte-order bits, data)`.
pub fn attributes(payload: &[u8], header_len: usize) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut rest = payload.get(align(header_len)..).unwrap_or_default();
    while rest.len() >= 4 {
        let len = u16::from_ne_bytes(rest[0..2].try_into().unwrap()) as usize;
        let typ = u16::from_ne_bytes(rest[2..4].try_into().unwrap()) & 0x3fff;
        if len < 4 || len > rest.len() {
            break;
        }
        out.push((typ, &rest[4..len]));
        rest = &rest[align(len).min(rest.len())..];
    }
    out
}

/// The whole attribute of type `typ` (its header, flags and padding included) of a
/// payload after its `header_len`-byte family header: for a request that names it again.
fn raw_attribute(payload: &[u8], header_len: usize, typ: u16) -> Option<&[u8]> {
    let mut rest = payload.get(align(header_len)..)?;
    while rest.len() >= 4 {
        let len = u16::from_ne_bytes(rest[0..2].try_into().unwrap()) as usize;
        if len < 4 || len > rest.len() {
            return None;
        }
        if u16::from_ne_bytes(rest[2..4].try_into().unwrap()) & 0x3fff == typ {
            return Some(&rest[..len]);
        }
        rest = &rest[align(len).min(rest.len())..];
    }
    None
}

impl Message {
    /// A dump of this namespace's conntrack table, every family.
    pub fn conntrack_dump() -> Message {
        Message::new((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET, NLM_F_DUMP, &[0, 0, 0, 0])
    }
}

/// A conntrack entry of a [`Message::conntrack_dump`] reply: its original source address,
/// and the request that deletes it (its original tuple, zone and id, as the dump gave
/// them: with the id the kernel deletes that entry only, not one made since with the
/// same tuple, such as a new job's on the same address).
pub fn conntrack_entry(payload: &[u8]) -> Option<(std::net::IpAddr, Message)> {
    let family = *payload.first()?;
    let orig = raw_attribute(payload, 4, CTA_TUPLE_ORIG)?;
    let ip = attributes(orig, 4).into_iter().find(|(t, _)| *t == CTA_TUPLE_IP)?.1;
    let src = attributes(ip, 0).into_iter().find_map(|(t, d)| match t {
        CTA_IP_V4_SRC => <[u8; 4]>::try_from(d).ok().map(std::net::IpAddr::from),
        CTA_IP_V6_SRC => <[u8; 16]>::try_from(d).ok().map(std::net::IpAddr::from),
        _ => None,
    })?;
    let mut delete = Message::new((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE, 0, &[family, 0, 0, 0]);
    delete.raw(orig);
    for attr in [CTA_ZONE, CTA_ID] {
        if let Some(a) = raw_attribute(payload, 4, attr) {
            delete.raw(a);
        }
    }
    Some((src, delete))
}

/// An interface name as the key of an nftables set of `ifname`s: IFNAMSIZ (16) bytes,
/// NUL-padded, as the kernel's `iifname` compares it. Names are at most 15 bytes (the
/// kernel's limit, and every job link's length).
pub fn ifname_key(name: &str) -> [u8; 16] {
    debug_assert!(name.len() <= 15, "{name}: an interface name has at most 15 bytes");
    let mut key = [0u8; 16];
    let n = name.len().min(15);
    key[..n].copy_from_slice(&name.as_bytes()[..n]);
    key
}

/// Whether an nftables notification (`typ`, `payload`, as [`Listener::drain`] reads them)
/// deletes something of the inet table `table`: the table, or one of its chains, rules,
/// sets or set elements (each such message names its table in attribute 1).
pub fn nft_deletes_from(typ: u16, payload: &[u8], table: &str) -> bool {
    const DELETIONS: [u16; 5] =
        [NFT_MSG_DELTABLE, NFT_MSG_DELCHAIN, NFT_MSG_DELRULE, NFT_MSG_DELSET, NFT_MSG_DELSETELEM];
    typ >> 8 == NFNL_SUBSYS_NFTABLES
        && DELETIONS.contains(&(typ & 0xff))
        && payload.first() == Some(&NFPROTO_INET)
        && attributes(payload, 4).into_iter().any(|(t, d)| t == 1 && attr_text(d) == table)
}

/// A NUL-terminated string attribute's text.
pub fn attr_text(data: &[u8]) -> String {
    String::from_utf8_lossy(data.split(|b| *b == 0).next().unwrap_or_default()).into_owned()
}

/// The comment of an nftables table from its `GETTABLE` reply, if it has one (the
/// user data is TLVs of libnftnl: type 0 = the comment).
pub fn nft_table_comment(reply: &[u8]) -> Option<String> {
    let data = attributes(reply, 4).into_iter().find(|(t, _)| *t == NFTA_TABLE_USERDATA)?.1;
    let mut rest = data;
    while rest.len() >= 2 {
        let (typ, len) = (rest[0], rest[1] as usize);
        let value = rest.get(2..2 + len)?;
        if typ == 0 {
            return Some(attr_text(value));
        }
        rest = &rest[2 + len..];
    }
    None
}

/// The handle of an nftables table from its `GETTABLE` reply: the kernel gives each
/// table made in a namespace a new one, so a table made again has another.
pub fn nft_table_handle(reply: &[u8]) -> Option<u64> {
    let data = attributes(reply, 4).into_iter().find(|(t, _)| *t == NFTA_TABLE_HANDLE)?.1;
    Some(u64::from_be_bytes(data.try_into().ok()?))
}

/// Runs `f` on a thread of its own, alone in a fresh network namespace whose loopback is
/// up (root tests; the namespace goes with the thread), and returns what it returned.
#[cfg(test)]
pub(crate) fn in_fresh_namespace<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        Socket::open(Proto::Route).unwrap().request(Message::link(RTM_NEWLINK, 0, 1, IFF_UP, IFF_UP)).unwrap();
        f()
    })
    .join()
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_the_kernel_marks_interrupted_is_seen_per_request() {
        let msg = |flags: u16, seq: u32| {
            let mut m = Vec::new();
            m.extend_from_slice(&20u32.to_ne_bytes());
            m.extend_from_slice(&RTM_NEWLINK.to_ne_bytes());
            m.extend_from_slice(&flags.to_ne_bytes());
            m.extend_from_slice(&seq.to_ne_bytes());
            m.extend_from_slice(&0u32.to_ne_bytes());
            m.extend_from_slice(&[0u8; 4]);
            m
        };
        const MULTI: u16 = 0x2;
        let plain = [msg(MULTI, 7), msg(MULTI, 7)].concat();
        assert!(!dump_interrupted(&plain, 7));
        let marked = [msg(MULTI, 7), msg(MULTI | NLM_F_DUMP_INTR, 7)].concat();
        assert!(dump_interrupted(&marked, 7));
        // Another request's (a late reply) does not count.
        assert!(!dump_interrupted(&marked, 8));
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn one_element_of_a_set_is_asked_for_by_its_key() {
        let key = ifname_key("azp0123456789ab");
        assert_eq!(&key[..15], b"azp0123456789ab");
        assert_eq!(key[15], 0, "NUL-terminated within IFNAMSIZ");
        assert_eq!(ifname_key("azp1"), *b"azp1\0\0\0\0\0\0\0\0\0\0\0\0");
        let m = Message::nft_get_set_element("azp-sandbox", "job_flows", &key).finish(7, NLM_F_ACK);
        // No NLM_F_DUMP: the kernel looks the key up instead of walking the set.
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETSETELEM);
        assert_eq!(u16::from_ne_bytes([m[6], m[7]]), NLM_F_REQUEST | NLM_F_ACK);
        let payload = &m[NLMSG_HDRLEN..];
        assert_eq!(payload[..4], [NFPROTO_INET, 0, 0, 0]);
        let attrs = attributes(payload, 4);
        assert_eq!(attrs[0], (NFTA_SET_ELEM_LIST_TABLE, &b"azp-sandbox\0"[..]));
        assert_eq!(attrs[1], (NFTA_SET_ELEM_LIST_SET, &b"job_flows\0"[..]));
        assert_eq!(attrs[2].0, NFTA_SET_ELEM_LIST_ELEMENTS);
        assert_eq!(attrs.len(), 3);
        let elem = attributes(attrs[2].1, 0);
        assert_eq!(elem.len(), 1);
        assert_eq!(elem[0].0, NFTA_LIST_ELEM);
        let k = attributes(elem[0].1, 0);
        assert_eq!(k.len(), 1);
        assert_eq!(k[0].0, NFTA_SET_ELEM_KEY);
        assert_eq!(attributes(k[0].1, 0), [(NFTA_DATA_VALUE, &key[..])]);
    }

    #[test]
    fn an_nftables_deletion_is_ours_when_it_names_our_inet_table() {
        // (type, payload) as a notification comes: nfgenmsg, then attribute 1, the table.
        let note = |msg: u16, family: u8, table: &str| {
            let mut m = Message::new((NFNL_SUBSYS_NFTABLES << 8) | msg, 0, &[family, 0, 0, 0]);
            m.attr_str(1, table);
            ((NFNL_SUBSYS_NFTABLES << 8) | msg, m.finish(0, 0)[NLMSG_HDRLEN..].to_vec())
        };
        for msg in [NFT_MSG_DELTABLE, NFT_MSG_DELCHAIN, NFT_MSG_DELRULE, NFT_MSG_DELSET, NFT_MSG_DELSETELEM] {
            let (t, p) = note(msg, NFPROTO_INET, "azp-sandbox");
            assert!(nft_deletes_from(t, &p, "azp-sandbox"), "{msg}");
        }
        let not_ours = [
            note(0, NFPROTO_INET, "azp-sandbox"),            // a table made
            note(NFT_MSG_DELTABLE, NFPROTO_INET, "other"),   // another table
            note(NFT_MSG_DELTABLE, 2, "azp-sandbox"),        // ip, not inet
            note(NFT_MSG_DELRULE, NFPROTO_INET, "azp-sand"), // a prefix of the name
        ];
        for (t, p) in not_ours {
            assert!(!nft_deletes_from(t, &p, "azp-sandbox"), "{p:?}");
        }
        let (_, p) = note(NFT_MSG_DELTABLE, NFPROTO_INET, "azp-sandbox");
        assert!(!nft_deletes_from(RTM_NEWROUTE, &p, "azp-sandbox"), "another subsystem's message");
    }

    #[test]
    fn a_link_up_request() {
        let m = Message::link(RTM_NEWLINK, 0, 1, IFF_UP, IFF_UP);
        let b = m.finish(7, NLM_F_ACK);
        // len 32, type 16, flags REQUEST|ACK, seq 7, pid 0; ifinfomsg: index 1, up/up.
        assert_eq!(hex(&b), "20000000100005000700000000000000000000000100000001000000 01000000".replace(' ', ""));
    }

    #[test]
    fn nested_attributes_get_their_lengths_and_padding() {
        let mut m = Message::link(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, 0, 0, 0);
        m.attr_str(IFLA_IFNAME, "azp1").nest(IFLA_LINKINFO).attr_str(IFLA_INFO_KIND, "veth").nest(IFLA_INFO_DATA);
        m.nest(VETH_INFO_PEER).raw(&ifinfomsg(2, 0, 0)).attr_str(IFLA_IFNAME, "eth0").attr_u32(IFLA_NET_NS_FD, 9);
        let b = m.finish(1, NLM_F_ACK);
        let attrs = attributes(&b[NLMSG_HDRLEN..], 16);
        assert_eq!(attrs.len(), 2);
        assert_eq!((attrs[0].0, attr_text(attrs[0].1).as_str()), (IFLA_IFNAME, "azp1"));
        assert_eq!(attrs[0].1.len(), 5, "the name and its NUL, padded after");
        let info = attributes(attrs[1].1, 0);
        assert_eq!((info[0].0, attr_text(info[0].1).as_str()), (IFLA_INFO_KIND, "veth"));
        let data = attributes(info[1].1, 0);
        let peer = data[0].1;
        assert_eq!(data[0].0, VETH_INFO_PEER);
        assert_eq!(&peer[..16], &ifinfomsg(2, 0, 0));
        let peer_attrs = attributes(peer, 16);
        assert_eq!(attr_text(peer_attrs[0].1), "eth0");
        assert_eq!(peer_attrs[1], (IFLA_NET_NS_FD, &9u32.to_ne_bytes()[..]));
        assert_eq!(u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize, b.len());
        assert_eq!(b.len() % 4, 0);
    }

    #[test]
    fn route_and_address_headers() {
        let mut m = Message::route(NLM_F_CREATE | NLM_F_EXCL, 32, RT_SCOPE_LINK, RTN_UNICAST);
        m.attr_ipv4(RTA_DST, Ipv4Addr::new(10, 87, 0, 5)).attr_u32(RTA_OIF, 42);
        let b = m.finish(3, NLM_F_ACK);
        assert_eq!(&b[16..28], &[AF_INET, 32, 0, 0, 254, 3, 253, 1, 0, 0, 0, 0]);
        assert_eq!(attributes(&b[16..], 12), vec![(RTA_DST, &[10, 87, 0, 5][..]), (RTA_OIF, &42u32.to_ne_bytes()[..])]);
        let b = Message::addr(RTM_NEWADDR, 0, AF_INET, 32, 0, 2).finish(1, 0);
        assert_eq!(&b[16..24], &[AF_INET, 32, 0, 0, 2, 0, 0, 0]);
        let b = Message::neigh(NLM_F_CREATE, AF_INET, 2, NUD_PERMANENT).finish(1, 0);
        assert_eq!(&b[16..28], &[AF_INET, 0, 0, 0, 2, 0, 0, 0, 0x80, 0, 0, 0]);
    }

    #[test]
    fn a_conntrack_entry_is_deleted_by_its_tuple_zone_and_id() {
        // A dump reply's payload: nfgenmsg, the original tuple (its IP nest first), the
        // reply tuple, the id, the zone.
        let tuple = |m: &mut Message, src: [u8; 4]| {
            m.nest(CTA_TUPLE_IP).attr(CTA_IP_V4_SRC, &src).attr(2, &[198, 19, 0, 1]).end();
        };
        let mut m = Message::new(0, 0, &[AF_INET, 0, 0, 0]);
        m.nest(CTA_TUPLE_ORIG);
        tuple(&mut m, [10, 87, 0, 5]);
        m.end().nest(2);
        tuple(&mut m, [198, 19, 0, 1]);
        m.end().attr(CTA_ID, &0x0a0b_0c0du32.to_be_bytes()).attr(CTA_ZONE, &7u16.to_be_bytes());
        let payload = m.finish(1, 0)[NLMSG_HDRLEN..].to_vec();
        let (src, delete) = conntrack_entry(&payload).unwrap();
        assert_eq!(src, std::net::IpAddr::from([10, 87, 0, 5]));
        let b = delete.finish(2, NLM_F_ACK);
        assert_eq!(u16::from_ne_bytes([b[4], b[5]]), (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE);
        let attrs = attributes(&b[NLMSG_HDRLEN..], 4);
        let types: Vec<u16> = attrs.iter().map(|(t, _)| *t).collect();
        assert_eq!(types, [CTA_TUPLE_ORIG, CTA_ZONE, CTA_ID]);
        assert_eq!(attrs[0].1, &raw_attribute(&payload, 4, CTA_TUPLE_ORIG).unwrap()[4..]);
        assert_eq!(attrs[2].1, &0x0a0b_0c0du32.to_be_bytes()[..]);
        // No zone or id in the reply (an older kernel): the tuple alone.
        let mut m = Message::new(0, 0, &[AF_INET, 0, 0, 0]);
        m.nest(CTA_TUPLE_ORIG);
        tuple(&mut m, [10, 87, 0, 6]);
        m.end();
        let (_, delete) = conntrack_entry(&m.finish(1, 0)[NLMSG_HDRLEN..]).unwrap();
        let b = delete.finish(2, NLM_F_ACK);
        assert_eq!(attributes(&b[NLMSG_HDRLEN..], 4).len(), 1);
    }

    #[test]
    fn a_prohibit_rule() {
        let mut m = Message::rule(NLM_F_CREATE | NLM_F_EXCL, AF_INET6, 10, FR_ACT_PROHIBIT);
        let ll: Ipv6Addr = "fe80::".parse().unwrap();
        m.attr_ipv6(FRA_DST, ll).attr_u32(FRA_PRIORITY, 100);
        let b = m.finish(1, NLM_F_ACK);
        assert_eq!(u16::from_ne_bytes([b[4], b[5]]), RTM_NEWRULE);
        assert_eq!(&b[16..28], &[AF_INET6, 10, 0, 0, 0, 0, 0, FR_ACT_PROHIBIT, 0, 0, 0, 0]);
        assert_eq!(
            attributes(&b[16..], 12),
            vec![(FRA_DST, &ll.octets()[..]), (FRA_PRIORITY, &100u32.to_ne_bytes()[..])]
        );
    }

    #[test]
    fn ipv6_route_and_address_headers() {
        let mut m = Message::route6(NLM_F_CREATE | NLM_F_EXCL, 128, RT_SCOPE_UNIVERSE, RTN_UNICAST);
        let a: Ipv6Addr = "fd61:7a70::a57:5".parse().unwrap();
        m.attr_ipv6(RTA_DST, a);
        let b = m.finish(3, NLM_F_ACK);
        assert_eq!(&b[16..28], &[AF_INET6, 128, 0, 0, 254, 3, 0, 1, 0, 0, 0, 0]);
        assert_eq!(attributes(&b[16..], 12), vec![(RTA_DST, &a.octets()[..])]);
        let b = Message::addr_flags(RTM_NEWADDR, 0, AF_INET6, 128, IFA_F_NODAD, 0, 2).finish(1, 0);
        assert_eq!(&b[16..24], &[AF_INET6, 128, IFA_F_NODAD, 0, 2, 0, 0, 0]);
    }

    #[test]
    fn replies_are_split_and_a_table_comment_is_read() {
        let mut buf = Message::link(RTM_NEWLINK, 0, 3, 0, 0).finish(9, 0);
        buf.extend(Message::link(RTM_NEWLINK, 0, 4, 0, 0).finish(9, 0));
        let msgs = messages(&buf);
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs[1].0, RTM_NEWLINK);
        assert_eq!(&msgs[1].2[4..8], &4i32.to_ne_bytes());
        // A GETTABLE reply: nfgenmsg, name, user data with a comment TLV.
        let mut reply = vec![NFPROTO_INET, 0, 0, 0];
        let mut ud = vec![0u8, 6];
        ud.extend_from_slice(b"hello\0");
        let mut m = Message::new(0, 0, &reply);
        m.attr_str(NFTA_TABLE_NAME, "azp-sandbox").attr(NFTA_TABLE_USERDATA, &ud);
        m.attr(NFTA_TABLE_HANDLE, &0x0102_0304_0506_0708u64.to_be_bytes());
        reply = m.finish(1, 0)[NLMSG_HDRLEN..].to_vec();
        assert_eq!(nft_table_comment(&reply).as_deref(), Some("hello"));
        assert_eq!(nft_table_handle(&reply), Some(0x0102_0304_0506_0708), "big-endian, as the kernel sends it");
        assert_eq!(nft_table_comment(&[1, 0, 0, 0]), None);
        assert_eq!(nft_table_handle(&[1, 0, 0, 0]), None);
    }
}
