//! A job's guard against local destinations the host gets while the job runs
//! (see `sys::address_watch`): which of the watch's destinations the job's namespace must
//! refuse (those not refused yet, not the job's own loopback, not link-local, which is
//! refused as a whole, not an operator's allowed destination), refused as they come, and
//! a line in the log for each batch.

use super::{ipv6, refusable, LINK_LOCAL};
use crate::config::NetworkAllow;
use crate::sys::address_watch::HostAddresses;
use crate::sys::net::{Ipv4Net, Ipv6Net, LocalNet};
use anyhow::{Context, Result};
use std::net::{Ipv4Addr, Ipv6Addr};

pub struct HostAddressGuard {
    watch: Box<dyn HostAddresses>,
    /// Refused already: what the job's routes and table refuse from its start, then each
    /// destination refused since.
    refused: Vec<LocalNet>,
    allowed: Vec<Ipv4Addr>,
    job: String,
}

impl std::fmt::Debug for HostAddressGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostAddressGuard").field("refused", &self.refused).field("job", &self.job).finish()
    }
}

impl HostAddressGuard {
    /// `refused`: what the job's routes and table refuse from the start.
    pub fn new(
        watch: Box<dyn HostAddresses>,
        refused: Vec<LocalNet>,
        allow: &[NetworkAllow],
        job: &str,
    ) -> HostAddressGuard {
        HostAddressGuard { watch, refused, allowed: allow.iter().map(|a| a.addr).collect(), job: job.to_string() }
    }

    /// In the job's namespace, before the job starts (see `HostAddresses::arm`).
    pub fn arm(&mut self) -> Result<()> {
        self.watch.arm().context("the job's guard against new host addresses")
    }

    /// Refuses in the job's namespace what came since: after each of the watch's signals
    /// (and once before the job starts). An error means the job cannot be kept from a
    /// destination of the host: the caller stops it.
    pub fn tend(&mut self) -> Result<()> {
        let added = self.watch.added()?;
        let new = self.to_refuse(added);
        if new.is_empty() {
            return Ok(());
        }
        let v4: Vec<Ipv4Net> = new.iter().filter_map(LocalNet::v4).collect();
        let v6: Vec<Ipv6Net> = new.iter().filter_map(LocalNet::v6).collect();
        let list = new.iter().map(short).collect::<Vec<_>>().join(", ");
        self.watch.refuse(&v4, &v6).with_context(|| {
            format!("job {}: the host got the address {list}, which the job's network cannot refuse", self.job)
        })?;
        tracing::info!(job = %self.job, "the host got the address {list} while the job runs: refused to the job");
        self.refused.extend(new);
        Ok(())
    }

    /// What of `added` the job's namespace does not refuse yet.
    fn to_refuse(&self, added: Vec<LocalNet>) -> Vec<LocalNet> {
        let mut out: Vec<LocalNet> = Vec::new();
        // 127/8 is the job's own loopback: a network around it, in its pieces beside it.
        let added = added.into_iter().flat_map(|n| match n {
            LocalNet::V4(v4) => refusable(v4).into_iter().map(LocalNet::V4).collect(),
            v6 => vec![v6],
        });
        for n in added {
            let done = self.refused.iter().chain(out.iter()).any(|r| r.covers(&n));
            let covered = match n {
                // Link-local is refused as a whole; the limited broadcast by the job's
                // table; an allowed address is the operator's.
                LocalNet::V4(v4) => {
                    LINK_LOCAL.covers(&v4)
                        || v4 == Ipv4Net::host(Ipv4Addr::BROADCAST)
                        || (v4.prefix == 32 && self.allowed.contains(&v4.addr))
                }
                LocalNet::V6(v6) => v6.addr == Ipv6Addr::LOCALHOST || ipv6::LINK_LOCAL.covers(&v6),
            };
            if !done && !covered {
                out.push(n);
            }
        }
        out
    }
}

/// An address alone (`/32`, `/128`), a network with its prefix.
fn short(n: &LocalNet) -> String {
    match n {
        LocalNet::V4(v) if v.prefix == 32 => v.addr.to_string(),
        LocalNet::V6(v) if v.prefix == 128 => v.addr.to_string(),
        _ => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// Hands out `batches` one per call of `added`, and records what it is told to refuse.
    struct Scripted {
        batches: Vec<Vec<LocalNet>>,
        refused: Rc<RefCell<Vec<String>>>,
        fail: bool,
    }

    impl HostAddresses for Scripted {
        fn current(&mut self) -> crate::sys::Result<Vec<LocalNet>> {
            Ok(vec![])
        }
        fn arm(&mut self) -> crate::sys::Result<()> {
            Ok(())
        }
        fn added(&mut self) -> crate::sys::Result<Vec<LocalNet>> {
            Ok(if self.batches.is_empty() { vec![] } else { self.batches.remove(0) })
        }
        fn refuse(&mut self, v4: &[Ipv4Net], v6: &[Ipv6Net]) -> crate::sys::Result<()> {
            if self.fail {
                return Err(crate::sys::Error::JobFilterRule { table: "azp-job", source: nix::errno::Errno::ENOMEM });
            }
            let all = v4.iter().map(|n| n.to_string()).chain(v6.iter().map(|n| n.to_string()));
            self.refused.borrow_mut().push(all.collect::<Vec<_>>().join(" "));
            Ok(())
        }
    }

    /// `a.b.c.d/n` or `x::y/n`; an address alone is a /32 or /128.
    fn net(s: &str) -> LocalNet {
        let (a, p) = s.split_once('/').unwrap_or((s, ""));
        match a.parse::<std::net::IpAddr>().unwrap() {
            std::net::IpAddr::V4(v) => LocalNet::V4(Ipv4Net::new(v, p.parse().unwrap_or(32))),
            std::net::IpAddr::V6(v) => LocalNet::V6(Ipv6Net::new(v, p.parse().unwrap_or(128))),
        }
    }

    fn guard(batches: Vec<Vec<&str>>, fail: bool) -> (HostAddressGuard, Rc<RefCell<Vec<String>>>) {
        let refused = Rc::new(RefCell::new(vec![]));
        let batches = batches.into_iter().map(|b| b.into_iter().map(net).collect()).collect();
        let watch = Scripted { batches, refused: refused.clone(), fail };
        let allow: NetworkAllow = "203.0.113.7".parse().unwrap();
        let at_start = ["198.18.0.1", "198.18.0.3", "10.60.0.0/16", "2001:db8::1"].map(net).to_vec();
        (HostAddressGuard::new(Box::new(watch), at_start, &[allow], "j1"), refused)
    }

    #[test]
    fn new_host_destinations_are_refused_once_and_the_rest_left_alone() {
        let (mut g, refused) = guard(
            vec![
                // Refused at the start (inside a network too), the job's loopback,
                // link-local, allowed, the limited broadcast, IPv6 link-local and loopback.
                vec!["198.18.0.1", "10.60.3.4", "127.0.0.0/8", "169.254.1.1", "203.0.113.7", "255.255.255.255"],
                vec!["fe80::1", "::1"],
                // New: an address, its broadcast, a prefix on loopback, an IPv6 address.
                vec!["192.0.2.9", "192.0.2.255", "10.50.0.0/16", "2001:db8::9", "192.0.2.9"],
                // Inside what was refused just before.
                vec!["192.0.2.9", "10.50.1.1", "198.18.0.3"],
                // Around the job's loopback: the pieces beside it.
                vec!["96.0.0.0/3"],
                vec!["2001:db8::1", "2001:db8::a"],
            ],
            false,
        );
        for _ in 0..6 {
            g.tend().unwrap();
        }
        assert_eq!(
            *refused.borrow(),
            [
                "192.0.2.9/32 192.0.2.255/32 10.50.0.0/16 2001:db8::9/128",
                "96.0.0.0/4 112.0.0.0/5 120.0.0.0/6 124.0.0.0/7 126.0.0.0/8",
                "2001:db8::a/128"
            ]
        );
    }

    #[test]
    fn a_destination_that_cannot_be_refused_is_an_error_that_names_it() {
        let (mut g, _) = guard(vec![vec!["192.0.2.9", "10.50.0.0/16"]], true);
        let e = format!("{:#}", g.tend().unwrap_err());
        let want = "job j1: the host got the address 192.0.2.9, 10.50.0.0/16, which the job's network cannot \
                    refuse: cannot add a rule to the job's own nftables table azp-job";
        assert!(e.starts_with(want), "{e}");
        // Not counted as refused: the next signal tries again.
        assert_eq!(g.refused.len(), 4);
    }
}
