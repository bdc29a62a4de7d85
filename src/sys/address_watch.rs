//! Host addresses that appear while a rootless job runs (issue 23). A rootless job's
//! network is pasta, which connects to whatever address the job names, from the host's
//! own namespace: the job's routes and its own table refuse the host's addresses as they
//! were when the job started. One the host gets later (DHCP, a VPN, a bridge coming up,
//! an operator's `ip addr add`) would otherwise be open to the job until its end, with
//! every service of the host bound to all addresses behind it.
//!
//! So the helper watches the host's address notifications, on a netlink socket of the
//! host's namespace subscribed before the host's addresses are read (none falls between
//! the read and the watch), and refuses each new one in the job's namespace as it comes:
//! a prohibit route and a rule of the job's table (see [`super::job_filter`]). In root
//! mode there is nothing to watch: the host's table drops whatever a job link sends to any
//! local address of the host.
//!
//! The socket raises SIGURG when a notification comes (`O_ASYNC` with `F_SETSIG`): the
//! helper's wait for its job takes it among the job's signals, single-threaded. SIGURG's
//! default action is to ignore it, so one raised while the helper does not wait for it
//! (before the job starts) is dropped harmlessly: the wait drains the socket once first.
//!
//! Steps: [`Watch::subscribe`] (host's namespace, before the addresses are read),
//! [`HostAddresses::arm`] (in the job's namespace, before the job starts), then per
//! signal [`HostAddresses::added`] and [`HostAddresses::refuse`].

use super::error::{Error, Result};
use super::net::{AddressEntry, Ipv4Net, Ipv6Net, JobRoute};
use super::netlink::{self as nl, Listener, Proto, Socket};
use nix::errno::Errno;
use std::net::{IpAddr, Ipv4Addr};
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
    /// Starts the signals and opens what [`HostAddresses::refuse`] needs: in the job's
    /// namespace.
    fn arm(&mut self) -> Result<()>;
    /// The host's addresses that came since the last call (every address of the host
    /// when notifications were lost): each address with the broadcast addresses it
    /// brings (IPv4), IPv6 ones but loopback's and link-local ones.
    fn added(&mut self) -> Result<Vec<IpAddr>>;
    /// Refuses `v4` and `v6` in the job's namespace: a prohibit route each and a rule
    /// each of the job's table.
    fn refuse(&mut self, v4: &[Ipv4Net], v6: &[Ipv6Net]) -> Result<()>;
}

/// The real thing.
pub struct Watch {
    listener: Listener,
    /// A socket of the host's namespace too, to read every address afresh when
    /// notifications were lost.
    host: Socket,
    ipv6: bool,
    /// The job's namespace's route and nftables sockets, from [`HostAddresses::arm`].
    job: Option<(Socket, Socket)>,
}

impl Watch {
    /// Step 1, in the host's network namespace, before its addresses are read: the
    /// subscription (IPv6 too when `ipv6`).
    pub fn subscribe(ipv6: bool) -> Result<Watch> {
        let groups = nl::RTMGRP_IPV4_IFADDR | if ipv6 { nl::RTMGRP_IPV6_IFADDR } else { 0 };
        let listener = Listener::open(groups).map_err(Error::WatchAddresses)?;
        let host = Socket::open(Proto::Route).map_err(Error::NetlinkSocket)?;
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

    fn added(&mut self) -> Result<Vec<IpAddr>> {
        let drained = self.listener.drain().map_err(Error::ReadAddressWatch)?;
        if drained.overrun {
            let mut all: Vec<IpAddr> =
                super::net::delivered_addresses_on(&self.host)?.into_iter().map(IpAddr::V4).collect();
            if self.ipv6 {
                all.extend(super::net::global_addresses6_on(&self.host)?.into_iter().map(IpAddr::V6));
            }
            return Ok(all);
        }
        Ok(new_addresses(&drained.notifications))
    }

    fn refuse(&mut self, v4: &[Ipv4Net], v6: &[Ipv6Net]) -> Result<()> {
        let Some((route, nft)) = &self.job else {
            return Err(Error::ArmAddressWatch(Errno::ENOTCONN));
        };
        let routes: Vec<JobRoute> = v4.iter().map(|n| JobRoute::Prohibit(*n)).collect();
        super::net::add_routes(route, &routes, Ipv4Addr::UNSPECIFIED)?;
        super::net::prohibit6(route, v6)?;
        super::job_filter::refuse_more(nft, v4, v6)
    }
}

/// The addresses of the `RTM_NEWADDR` notifications among `(type, payload)`.
pub fn new_addresses(notifications: &[(u16, Vec<u8>)]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::new();
    for (_, payload) in notifications.iter().filter(|(t, _)| *t == nl::RTM_NEWADDR) {
        let found: Vec<IpAddr> = match payload.first() {
            Some(&nl::AF_INET) => {
                let entry = AddressEntry::parse(payload);
                entry.map(|e| e.delivered()).unwrap_or_default().into_iter().map(IpAddr::V4).collect()
            }
            Some(&nl::AF_INET6) => super::net::global_address6(payload).into_iter().map(IpAddr::V6).collect(),
            _ => vec![],
        };
        for a in found {
            if !out.contains(&a) {
                out.push(a);
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

    /// The payload of an `RTM_NEWADDR` (or another type) as the kernel sends it: the
    /// netlink header cut off.
    fn notification(typ: u16, m: Message) -> (u16, Vec<u8>) {
        (typ, m.finish(0, 0)[16..].to_vec())
    }

    fn v4(prefix: u8, a: Ipv4Addr) -> Message {
        let mut m = Message::addr(nl::RTM_NEWADDR, 0, nl::AF_INET, prefix, 0, 3);
        m.attr_ipv4(nl::IFA_ADDRESS, a).attr_ipv4(nl::IFA_LOCAL, a);
        m
    }

    fn v6(a: Ipv6Addr) -> Message {
        let mut m = Message::addr(nl::RTM_NEWADDR, 0, nl::AF_INET6, 64, 0, 3);
        m.attr_ipv6(nl::IFA_ADDRESS, a);
        m
    }

    #[test]
    fn an_address_notification_brings_the_address_and_its_broadcasts() {
        const RTM_DELADDR: u16 = 21;
        let got = new_addresses(&[
            notification(nl::RTM_NEWADDR, v4(24, Ipv4Addr::new(198, 18, 200, 1))),
            notification(nl::RTM_NEWADDR, v4(32, Ipv4Addr::new(192, 0, 2, 9))),
            notification(nl::RTM_NEWADDR, v6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7))),
            notification(nl::RTM_NEWADDR, v6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 7))),
            notification(nl::RTM_NEWADDR, v6(Ipv6Addr::LOCALHOST)),
            notification(RTM_DELADDR, v4(32, Ipv4Addr::new(192, 0, 2, 10))),
        ]);
        let want: Vec<IpAddr> = vec![
            Ipv4Addr::new(198, 18, 200, 1).into(),
            Ipv4Addr::new(198, 18, 200, 255).into(),
            Ipv4Addr::new(192, 0, 2, 9).into(),
            Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7).into(),
        ];
        assert_eq!(got, want);
    }

    /// A real subscription sees an address added in its namespace, and, armed, raises
    /// the signal in the thread that armed it; what it refuses is refused.
    #[test]
    #[cfg_attr(not(test_as_root), ignore = "needs root: a network namespace")]
    fn a_subscription_signals_an_address_added_and_refuses_it() {
        let (sig, added, refused) = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let s = Socket::open(Proto::Route).unwrap();
            s.request(Message::link(nl::RTM_NEWLINK, 0, 1, nl::IFF_UP, nl::IFF_UP)).unwrap();
            super::super::job_filter::install(&Default::default()).unwrap();
            let mut w = Watch::subscribe(false).unwrap();
            let mut set = nix::sys::signal::SigSet::empty();
            set.add(SIGNAL);
            set.thread_block().unwrap();
            w.arm().unwrap();
            let a = Ipv4Addr::new(192, 0, 2, 77);
            let mut m = Message::addr(nl::RTM_NEWADDR, nl::NLM_F_CREATE | nl::NLM_F_EXCL, nl::AF_INET, 32, 0, 1);
            m.attr_ipv4(nl::IFA_LOCAL, a).attr_ipv4(nl::IFA_ADDRESS, a);
            s.request(m).unwrap();
            let sig = set.wait().unwrap();
            let added = w.added().unwrap();
            // Refused: a route lookup from this namespace now fails as a prohibit route does.
            w.refuse(&[Ipv4Net::new(Ipv4Addr::new(192, 0, 2, 0), 24)], &[]).unwrap();
            let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let refused = sock.connect("192.0.2.5:9").map_err(|e| e.raw_os_error());
            (sig, added, refused)
        })
        .join()
        .unwrap();
        assert_eq!(sig, SIGNAL);
        assert_eq!(added, [IpAddr::V4(Ipv4Addr::new(192, 0, 2, 77))]);
        assert_eq!(refused, Err(Some(libc::EACCES)));
    }
}
