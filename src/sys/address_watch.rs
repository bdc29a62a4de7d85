//! Host addresses that appear while a job runs (issue 23). A rootless job's network is
//! pasta, which connects to whatever address the job names, from the host's own
//! namespace; a root-mode job's is a veth, and once a firewall reload flushed the host's
//! table away (which drops whatever a job link sends to any local destination of the
//! host), the host delivers to itself what the job sends there. In both, the job's
//! routes and its own table refuse what the host delivers to itself as it was when the
//! job started. An address the host gets later (DHCP, a VPN, a
//! bridge coming up, an operator's `ip addr add`) would otherwise be open to the job
//! until its end, with every service of the host bound to all addresses behind it.
//!
//! What the host delivers to itself is its local routing table's local, broadcast and
//! anycast routes ([`super::net::local_routes_on`]): its addresses, its subnets'
//! broadcasts, the whole prefix of an address on loopback, a network made local with no
//! address (`ip route add local`). So the helper watches the host's route notifications,
//! on a netlink socket of the host's namespace subscribed before the job's blocks are
//! read (none falls between), and refuses each new local destination in the job's
//! namespace as it comes: a prohibit route and a rule of the job's table (see
//! [`super::job_filter`]).
//!
//! The socket raises SIGURG when a notification comes (`O_ASYNC` with `F_SETSIG`): the
//! helper's wait for its job takes it among the job's signals, single-threaded. SIGURG's
//! default action is to ignore it, so one raised while the helper does not wait for it
//! (before the job starts) is dropped harmlessly: the wait drains the socket once first.
//!
//! Steps: [`Watch::subscribe`] (host's namespace, first), [`HostAddresses::current`]
//! (what the job's routes and table refuse from the start), [`HostAddresses::arm`] (in
//! the job's namespace, before the job starts), then per signal
//! [`HostAddresses::added`] and [`HostAddresses::refuse`].

use super::error::{Error, Result};
use super::net::{Ipv4Net, Ipv6Net, JobRoute, LocalNet};
use super::netlink::{self as nl, Listener, Proto, Socket};
use nix::errno::Errno;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd};

/// The signal an address notification raises.
pub const SIGNAL: nix::sys::signal::Signal = nix::sys::signal::Signal::SIGURG;

// linux/fcntl.h (asm-generic: x86_64, arm64; the libc crate has these for musl only).
const F_SETOWN_EX: libc::c_int = 15;
const F_OWNER_TID: libc::c_int = 0;
const F_SETSIG: libc::c_int = 10;

/// `struct f_owner_ex`.
#[repr(C)]
struct OwnerEx {
    kind: libc::c_int,
    pid: libc::pid_t,
}

/// What the helper does with a watch (the real one below; the tests' in `sys::Recorder`).
pub trait HostAddresses {
    /// What the host delivers to itself now (see [`super::net::local_routes_on`]), read
    /// after the subscription: the job's routes and table refuse it from the start.
    fn current(&mut self) -> Result<Vec<LocalNet>>;
    /// Starts the signals and opens what [`HostAddresses::refuse`] needs: in the job's
    /// namespace.
    fn arm(&mut self) -> Result<()>;
    /// The host's local destinations that came since the last call (all of them when
    /// notifications were lost).
    fn added(&mut self) -> Result<Vec<LocalNet>>;
    /// Refuses `v4` and `v6` in the job's namespace: a prohibit route each and a rule
    /// each of the job's table.
    fn refuse(&mut self, v4: &[Ipv4Net], v6: &[Ipv6Net]) -> Result<()>;
}

/// The real thing.
pub struct Watch {
    listener: Listener,
    /// A socket of the host's namespace too, for its local routes at the start and
    /// afresh when notifications were lost.
    host: Socket,
    ipv6: bool,
    /// The job's namespace's route and nftables sockets, from [`HostAddresses::arm`].
    job: Option<(Socket, Socket)>,
}

impl Watch {
    /// Step 1, in the host's network namespace, before anything of it is read: the
    /// subscription to its route changes (IPv6 too when `ipv6`).
    pub fn subscribe(ipv6: bool) -> Result<Watch> {
        let groups = nl::RTMGRP_IPV4_ROUTE | if ipv6 { nl::RTMGRP_IPV6_ROUTE } else { 0 };
        let listener = Listener::open(groups).map_err(Error::WatchAddresses)?;
        let host = Socket::open(Proto::Route).map_err(Error::NetlinkSocket)?;
        // Its dumps of the local table: that table alone where the kernel can filter.
        host.filter_dumps();
        Ok(Watch { listener, host, ipv6, job: None })
    }
}

impl HostAddresses for Watch {
    /// Step 2, in the job's namespace: its sockets, then the socket's owner (this
    /// thread: the helper is single-threaded, and a test's thread gets its own), its
    /// signal and `O_ASYNC`.
    fn arm(&mut self) -> Result<()> {
        let route = Socket::open(Proto::Route).map_err(Error::NetlinkSocket)?;
        let nft = Socket::open(Proto::Netfilter).map_err(Error::NetlinkSocket)?;
        self.job = Some((route, nft));
        let fd = self.listener.as_fd().as_raw_fd();
        let owner = OwnerEx { kind: F_OWNER_TID, pid: nix::unistd::gettid().as_raw() };
        // SAFETY: F_SETOWN_EX reads one `struct f_owner_ex`, which `owner` is (repr(C),
        // the kernel's layout), alive for the call; the fd is this struct's own.
        let owned = unsafe { libc::fcntl(fd, F_SETOWN_EX, &owner as *const OwnerEx) };
        Errno::result(owned).map_err(Error::ArmAddressWatch)?;
        // SAFETY: fcntl on the same fd with an integer argument (a signal number).
        let signalled = unsafe { libc::fcntl(fd, F_SETSIG, SIGNAL as libc::c_int) };
        Errno::result(signalled).map_err(Error::ArmAddressWatch)?;
        // SAFETY: as above, no argument.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        let flags = Errno::result(flags).map_err(Error::ArmAddressWatch)?;
        // SAFETY: as above, an integer argument (O_NONBLOCK, set at the socket's creation, kept).
        let set = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_ASYNC | libc::O_NONBLOCK) };
        Errno::result(set).map(drop).map_err(Error::ArmAddressWatch)
    }

    fn current(&mut self) -> Result<Vec<LocalNet>> {
        super::net::local_routes_on(&self.host, self.ipv6)
    }

    fn added(&mut self) -> Result<Vec<LocalNet>> {
        let drained = self.listener.drain().map_err(Error::ReadAddressWatch)?;
        if drained.overrun {
            return self.current();
        }
        Ok(new_local_routes(&drained.notifications))
    }

    fn refuse(&mut self, v4: &[Ipv4Net], v6: &[Ipv6Net]) -> Result<()> {
        let Some((route, nft)) = &self.job else {
            return Err(Error::AddressWatchNotArmed);
        };
        let routes: Vec<JobRoute> = v4.iter().map(|n| JobRoute::Prohibit(*n)).collect();
        super::net::add_routes(route, &routes, Ipv4Addr::UNSPECIFIED)?;
        super::net::prohibit6(route, v6)?;
        super::job_filter::refuse_more(nft, v4, v6)
    }
}

/// The local destinations of the `RTM_NEWROUTE` notifications among `(type, payload)`.
pub fn new_local_routes(notifications: &[(u16, Vec<u8>)]) -> Vec<LocalNet> {
    let mut out: Vec<LocalNet> = Vec::new();
    for (_, payload) in notifications.iter().filter(|(t, _)| *t == nl::RTM_NEWROUTE) {
        if let Some(n) = super::net::local_route(payload) {
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::netlink::Message;
    use super::*;
    use std::net::Ipv6Addr;

    /// The payload of a message as the kernel sends it: the netlink header cut off.
    fn notification(typ: u16, m: Message) -> (u16, Vec<u8>) {
        (typ, m.finish(0, 0)[16..].to_vec())
    }

    /// An `RTM_NEWROUTE` of `family` to `dst`/`prefix`, of type `kind`, in `table` (the
    /// local table's number, 255, does not fit the header's byte only for tables above
    /// 255: this one does).
    fn route(family: u8, dst: &[u8], prefix: u8, kind: u8, table: u8) -> (u16, Vec<u8>) {
        let mut m = if family == nl::AF_INET {
            Message::route(0, prefix, 0, kind)
        } else {
            Message::route6(0, prefix, 0, kind)
        };
        m.attr(nl::RTA_DST, dst).attr_u32(nl::RTA_TABLE, table as u32);
        notification(nl::RTM_NEWROUTE, m)
    }

    #[test]
    fn local_routes_every_lookup_reaches_are_what_the_host_delivers_to_itself() {
        const RTM_DELROUTE: u16 = 25;
        let v6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7).octets();
        let mut gone = route(nl::AF_INET, &[192, 0, 2, 10], 32, nl::RTN_LOCAL, 255);
        gone.0 = RTM_DELROUTE;
        let got = new_local_routes(&[
            route(nl::AF_INET, &[198, 18, 200, 1], 32, nl::RTN_LOCAL, 255),
            route(nl::AF_INET, &[198, 18, 200, 255], 32, nl::RTN_BROADCAST, 255),
            // An address on loopback: its whole prefix is local.
            route(nl::AF_INET, &[10, 50, 0, 0], 16, nl::RTN_LOCAL, 255),
            route(nl::AF_INET6, &v6, 128, nl::RTN_LOCAL, 255),
            route(nl::AF_INET6, &v6, 64, nl::RTN_ANYCAST, 255),
            // An operator's local route in the main table: every lookup reaches it.
            route(nl::AF_INET, &[192, 0, 2, 9], 32, nl::RTN_LOCAL, 254),
            // Not delivered to everyone: a unicast route, a deletion, a local route of a
            // table that a policy rule chooses (TPROXY's `local default ... table 100`).
            route(nl::AF_INET, &[198, 18, 200, 0], 24, nl::RTN_UNICAST, 254),
            // (the main table's local routes alone, as a filtered dump gives them)
            route(nl::AF_INET, &[192, 0, 2, 255], 32, nl::RTN_BROADCAST, 254),
            gone,
            route(nl::AF_INET, &[0, 0, 0, 0], 0, nl::RTN_LOCAL, 100),
            route(nl::AF_INET, &[198, 18, 200, 1], 32, nl::RTN_LOCAL, 255),
        ]);
        let want = [
            LocalNet::V4(Ipv4Net::host(Ipv4Addr::new(198, 18, 200, 1))),
            LocalNet::V4(Ipv4Net::host(Ipv4Addr::new(198, 18, 200, 255))),
            LocalNet::V4(Ipv4Net::new(Ipv4Addr::new(10, 50, 0, 0), 16)),
            LocalNet::V6(Ipv6Net::host(Ipv6Addr::from(v6))),
            LocalNet::V6(Ipv6Net::new(Ipv6Addr::from(v6), 64)),
            LocalNet::V4(Ipv4Net::host(Ipv4Addr::new(192, 0, 2, 9))),
        ];
        assert_eq!(got, want);
    }

    /// A real subscription sees the local route of an address added in its namespace,
    /// and, armed, raises the signal in the thread that armed it; what it refuses is
    /// refused.
    #[test]
    #[cfg_attr(not(test_as_root), ignore = "needs root: a network namespace")]
    fn a_subscription_signals_an_address_added_and_refuses_it() {
        let (sig, current, added, refused) = nl::in_fresh_namespace(|| {
            let s = Socket::open(Proto::Route).unwrap();
            super::super::job_filter::install(&Default::default()).unwrap();
            let mut w = Watch::subscribe(false).unwrap();
            let current = w.current().unwrap();
            let mut set = nix::sys::signal::SigSet::empty();
            set.add(SIGNAL);
            set.thread_block().unwrap();
            w.arm().unwrap();
            // On loopback, with a prefix: the whole /24 becomes local.
            let a = Ipv4Addr::new(192, 0, 2, 77);
            let mut m = Message::addr(nl::RTM_NEWADDR, nl::NLM_F_CREATE | nl::NLM_F_EXCL, nl::AF_INET, 24, 0, 1);
            m.attr_ipv4(nl::IFA_LOCAL, a).attr_ipv4(nl::IFA_ADDRESS, a);
            s.request(m).unwrap();
            let sig = set.wait().unwrap();
            let added = w.added().unwrap();
            // Refused (a network not local here: this one namespace plays both the host
            // and the job): a route lookup now fails as a prohibit route does.
            w.refuse(&[Ipv4Net::new(Ipv4Addr::new(198, 51, 100, 0), 24)], &[]).unwrap();
            let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let refused = sock.connect("198.51.100.5:9").map_err(|e| e.raw_os_error());
            (sig, current, added, refused)
        });
        assert_eq!(sig, SIGNAL);
        // A new namespace's loopback: 127.0.0.0/8, 127.0.0.1 and its broadcast.
        let lo = |n: &LocalNet| matches!(n, LocalNet::V4(v) if Ipv4Net::new(Ipv4Addr::new(127, 0, 0, 0), 8).contains(v.addr));
        assert!(!current.is_empty() && current.iter().all(lo), "{current:?}");
        let net = LocalNet::V4(Ipv4Net::new(Ipv4Addr::new(192, 0, 2, 0), 24));
        assert!(added.contains(&net), "{added:?}");
        assert_eq!(refused, Err(Some(libc::EACCES)));
    }

    /// Notifications lost while the socket's buffer was full (ENOBUFS) leave no gap:
    /// [`HostAddresses::added`] then reads the whole local table again, so every
    /// destination that came is there, those whose notification was dropped too.
    #[test]
    #[cfg_attr(not(test_as_root), ignore = "needs root: a network namespace")]
    fn an_overrun_subscription_reads_the_whole_local_table_again() {
        let wanted: Vec<Ipv4Addr> = (0..64).map(|i| Ipv4Addr::new(10, 77, i, 1)).collect();
        let want = wanted.clone();
        let added = nl::in_fresh_namespace(move || {
            let s = Socket::open(Proto::Route).unwrap();
            let mut w = Watch::subscribe(false).unwrap();
            // The smallest receive buffer (the kernel makes it 2304 bytes at least): a
            // few notifications fill it, and the rest are dropped.
            nix::sys::socket::setsockopt(&w.listener.as_fd(), nix::sys::socket::sockopt::RcvBuf, &1024).unwrap();
            for a in want {
                let mut m = Message::addr(nl::RTM_NEWADDR, nl::NLM_F_CREATE | nl::NLM_F_EXCL, nl::AF_INET, 32, 0, 1);
                m.attr_ipv4(nl::IFA_LOCAL, a).attr_ipv4(nl::IFA_ADDRESS, a);
                s.request(m).unwrap();
            }
            w.added().unwrap()
        });
        // Loopback's routes came before the subscription: only a read of the whole
        // table returns them, so the overrun's path was taken.
        assert!(added.contains(&LocalNet::V4(Ipv4Net::host(Ipv4Addr::LOCALHOST))), "{added:?}");
        for a in wanted {
            assert!(added.contains(&LocalNet::V4(Ipv4Net::host(a))), "{a} missing from {added:?}");
        }
    }
}
