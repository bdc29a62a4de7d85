//! A rootless job's guard against host addresses that come while it runs (see
//! `sys::address_watch`): which of the watch's addresses the job's namespace must refuse
//! (those not refused yet, not the job's own loopback, not an operator's allowed
//! destination), refused as they come, and a line in the log for each.

use super::{ipv6, LINK_LOCAL};
use crate::config::NetworkAllow;
use crate::sys::address_watch::HostAddresses;
use crate::sys::net::{Ipv4Net, Ipv6Net};
use anyhow::{Context, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub struct HostAddressGuard {
    watch: Box<dyn HostAddresses>,
    /// Refused already: the host's addresses at the job's start, then each refused since.
    refused: Vec<IpAddr>,
    allowed: Vec<Ipv4Addr>,
    job: String,
}

impl std::fmt::Debug for HostAddressGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostAddressGuard").field("refused", &self.refused).field("job", &self.job).finish()
    }
}

impl HostAddressGuard {
    /// `host4`, `host6`: the host's addresses the job's routes and table refuse already.
    pub fn new(
        watch: Box<dyn HostAddresses>,
        host4: &[Ipv4Addr],
        host6: &[Ipv6Addr],
        allow: &[NetworkAllow],
        job: &str,
    ) -> HostAddressGuard {
        let refused = host4.iter().map(|a| IpAddr::V4(*a)).chain(host6.iter().map(|a| IpAddr::V6(*a))).collect();
        HostAddressGuard { watch, refused, allowed: allow.iter().map(|a| a.addr).collect(), job: job.to_string() }
    }

    /// In the job's namespace, before the job starts (see `HostAddresses::arm`).
    pub fn arm(&mut self) -> Result<()> {
        self.watch.arm().context("the job's guard against new host addresses")
    }

    /// Refuses in the job's namespace what came since: after each of the watch's signals
    /// (and once before the job starts). An error means the job cannot be kept from an
    /// address of the host: the caller stops it.
    pub fn tend(&mut self) -> Result<()> {
        let added = self.watch.added()?;
        let new = self.to_refuse(added);
        if new.is_empty() {
            return Ok(());
        }
        let v4: Vec<Ipv4Net> = new.iter().filter_map(|a| as_v4(*a)).map(Ipv4Net::host).collect();
        let v6: Vec<Ipv6Net> = new.iter().filter_map(|a| as_v6(*a)).map(Ipv6Net::host).collect();
        let list = new.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ");
        self.watch
            .refuse(&v4, &v6)
            .with_context(|| format!("the host got the address {list}, which the job's network cannot refuse"))?;
        tracing::info!(job = %self.job, "the host got the address {list} while the job runs: refused to the job");
        self.refused.extend(new);
        Ok(())
    }

    /// What of `added` the job's namespace does not refuse yet.
    fn to_refuse(&self, added: Vec<IpAddr>) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = Vec::new();
        for a in added {
            let done = self.refused.contains(&a) || out.contains(&a);
            let covered = match a {
                // 127/8 is the job's own loopback; link-local is refused as a whole.
                IpAddr::V4(v4) => {
                    v4.is_loopback() || LINK_LOCAL.contains(v4) || v4.is_broadcast() || self.allowed.contains(&v4)
                }
                IpAddr::V6(v6) => v6.is_loopback() || ipv6::LINK_LOCAL.contains(v6),
            };
            if !done && !covered {
                out.push(a);
            }
        }
        out
    }
}

fn as_v4(a: IpAddr) -> Option<Ipv4Addr> {
    match a {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(_) => None,
    }
}

fn as_v6(a: IpAddr) -> Option<Ipv6Addr> {
    match a {
        IpAddr::V6(v6) => Some(v6),
        IpAddr::V4(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// Hands out `batches` one per call of `added`, and records what it is told to refuse.
    struct Scripted {
        batches: Vec<Vec<IpAddr>>,
        refused: Rc<RefCell<Vec<String>>>,
        fail: bool,
    }

    impl HostAddresses for Scripted {
        fn arm(&mut self) -> crate::sys::Result<()> {
            Ok(())
        }
        fn added(&mut self) -> crate::sys::Result<Vec<IpAddr>> {
            Ok(if self.batches.is_empty() { vec![] } else { self.batches.remove(0) })
        }
        fn refuse(&mut self, v4: &[Ipv4Net], v6: &[Ipv6Net]) -> crate::sys::Result<()> {
            if self.fail {
                return Err(crate::sys::Error::JobFilter { table: "azp-job", source: nix::errno::Errno::ENOMEM });
            }
            let all = v4.iter().map(|n| n.to_string()).chain(v6.iter().map(|n| n.to_string()));
            self.refused.borrow_mut().push(all.collect::<Vec<_>>().join(" "));
            Ok(())
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn guard(batches: Vec<Vec<&str>>, fail: bool) -> (HostAddressGuard, Rc<RefCell<Vec<String>>>) {
        let refused = Rc::new(RefCell::new(vec![]));
        let batches = batches.into_iter().map(|b| b.into_iter().map(ip).collect()).collect();
        let watch = Scripted { batches, refused: refused.clone(), fail };
        let allow: NetworkAllow = "203.0.113.7".parse().unwrap();
        let host4 = [Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 3)];
        let host6 = ["2001:db8::1".parse().unwrap()];
        (HostAddressGuard::new(Box::new(watch), &host4, &host6, &[allow], "j1"), refused)
    }

    #[test]
    fn new_host_addresses_are_refused_once_and_the_rest_left_alone() {
        let (mut g, refused) = guard(
            vec![
                // Known at the start, the job's loopback, link-local, allowed, limited broadcast.
                vec!["198.18.0.1", "127.0.0.2", "169.254.1.1", "203.0.113.7", "255.255.255.255", "fe80::1", "::1"],
                vec!["192.0.2.9", "192.0.2.255", "2001:db8::9", "192.0.2.9"],
                vec!["192.0.2.9", "198.18.0.3"],
                vec!["2001:db8::1", "2001:db8::a"],
            ],
            false,
        );
        for _ in 0..4 {
            g.tend().unwrap();
        }
        assert_eq!(*refused.borrow(), ["192.0.2.9/32 192.0.2.255/32 2001:db8::9/128", "2001:db8::a/128"]);
    }

    #[test]
    fn an_address_that_cannot_be_refused_is_an_error_that_names_it() {
        let (mut g, _) = guard(vec![vec!["192.0.2.9"]], true);
        let e = format!("{:#}", g.tend().unwrap_err());
        assert!(e.starts_with("the host got the address 192.0.2.9, which the job's network cannot refuse"), "{e}");
        // Not counted as refused: the next signal tries again.
        assert_eq!(g.refused.len(), 3);
    }
}
