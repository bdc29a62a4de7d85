//! A job's network (issue 23): by default (`--network isolated`) every job gets a
//! network namespace of its own with outbound IPv4 and DNS, and nothing of the host
//! (its loopback services, its abstract unix sockets, its addresses), of the other jobs
//! or of link-local addresses (cloud metadata services) unless `network_allow` names a
//! destination. `none` is loopback only; `host` is the host's namespace (opt-in, loud).
//!
//! The helper makes the namespace before libcontainer creates the container, so it
//! belongs to the helper's user namespace (the initial one in root mode): the job, which
//! has no CAP_NET_ADMIN there (not even as root of a user namespace of its own), cannot
//! change its addresses, routes or neighbours. The helper also mounts a sysfs of that
//! namespace for the spec to bind (see [`enter`]).
//!
//! - Root mode: a veth pair per job. The host end (`azp` + 12 hex digits, from the job's
//!   id and the helper's pid) has no address; the job's end `eth0` gets one address
//!   from the subnet (default 10.87.0.0/16, `network_subnet`), claimed through its host
//!   route (`sys::net`), and a default route via the gateway, the subnet's first address,
//!   which the host end answers for (a permanent neighbour entry). The host's side is
//!   one nftables table made once ([`firewall`]): nothing per job on the host but the link
//!   and its route, which the kernel removes with the namespace. Why not pasta here too:
//!   a veth forwards in the kernel at the host's speed (bench: iperf3), pasta copies
//!   every byte through a process.
//! - Rootless: pasta (Debian `passt`) on the host's side, attached to the namespace, with
//!   no port of either side forwarded to the other (`-t/-u/-T/-U none`), the gateway not
//!   mapped to the host's loopback (`--no-map-gw`) and DNS at the gateway forwarded to the
//!   host's resolver (`--dns-forward`). Why not slirp4netns: pasta needs no TCP stack of
//!   its own (it maps the job's connections onto host sockets, faster) and is what
//!   Podman uses by default since 5.0.
//! - In both, the job's own routes prohibit link-local addresses, the host's addresses
//!   and (root mode) the jobs' subnet, with a route through the gateway for each allowed
//!   destination: what the host's table drops is refused in the job's namespace already
//!   (a table flushed by a firewall reload fails closed), and in rootless mode, where
//!   pasta would connect to any address from the host, the routes are the block.
//!
//! IPv6 ([`ipv6`], `network_ipv6 = auto|on|off`): jobs get outbound IPv6 too where the
//! host has an IPv6 default route. Root mode, where the host can forward IPv6 for them
//! alone (per link `force_forwarding`, Linux >= 6.17, or a host that routes IPv6
//! already): an address of a unique local /64 beside the IPv4 one on the same veth,
//! masqueraded by the same table. Rootless: pasta, with the host's address and gateway,
//! link-local addresses prohibited by a routing rule. Elsewhere and with `off`, IPv4
//! only (no address but loopback's).

pub mod dns;
pub mod firewall;
pub mod forget;
pub mod forward_record;
pub mod ipv6;
pub mod job;
pub mod nexthops;
pub mod table_keeper;
pub mod watch;

pub use job::{HostPorts, JobNetwork, DEFAULT_SUBNET};
pub use watch::HostAddressGuard;

use super::jobdir::JobDir;
use super::plan::JobPlan;
use crate::config::{Ipv6, Network, NetworkAllow};
use crate::sys::net::{Ipv4Net, Ipv6Net, JobFilter, JobRoute, LocalNet, Made, Pasta, Setup, Veth, Veth6};
use crate::sys::Sys;
use anyhow::{bail, Context, Result};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// Job links on the host: `azp` and 12 hex digits.
const LINK_PREFIX: &str = "azp";
/// The host end's MAC (locally administered): every job's gateway has it.
const HOST_MAC: [u8; 6] = [0x02, 0x61, 0x7a, 0x70, 0x00, 0x01];
/// The job's end's MAC (locally administered; each job is alone on its link).
const JOB_MAC: [u8; 6] = [0x02, 0x61, 0x7a, 0x70, 0x00, 0x02];
const LINK_LOCAL: Ipv4Net = Ipv4Net { addr: Ipv4Addr::new(169, 254, 0, 0), prefix: 16 };
/// The job's own loopback (see [`refusable`]).
const LOOPBACK: Ipv4Net = Ipv4Net { addr: Ipv4Addr::new(127, 0, 0, 0), prefix: 8 };

/// What of `n`, a local network of the host, a job is refused: all of it but
/// the job's own loopback, 127/8. The job's table refuses a network on every link,
/// loopback's too, so a network around 127/8 (`ip route add local 64.0.0.0/2 dev lo`)
/// is refused as the pieces of it beside 127/8 (here 64/3, 96/4, ... 126/8): skipped
/// whole, the rest of it stayed open to the job.
pub fn refusable(n: Ipv4Net) -> Vec<Ipv4Net> {
    if LOOPBACK.covers(&n) {
        return vec![];
    }
    if !n.overlaps(&LOOPBACK) {
        return vec![n];
    }
    // n holds 127/8: at each prefix from n's down to /8, the half that does not.
    let lo = u32::from(LOOPBACK.addr);
    (n.prefix + 1..=LOOPBACK.prefix)
        .map(|p| {
            let bit = 1u32 << (32 - p);
            let half = (lo & !(bit - 1)) ^ bit;
            Ipv4Net::new(Ipv4Addr::from(half), p)
        })
        .collect()
}

/// A host end of a job's veth pair (`azp` and 12 hex digits).
pub fn is_job_link(name: &str) -> bool {
    name.len() == LINK_PREFIX.len() + 12
        && name.starts_with(LINK_PREFIX)
        && name[LINK_PREFIX.len()..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// `<stem>-<inode of this process's network namespace>`: the name of a file kept per
/// namespace (the table and the forwarding settings are the namespace's). The kernel
/// reuses an inode number once its namespace is gone: readers allow for stale files.
fn per_netns(stem: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    let netns = std::fs::metadata("/proc/self/ns/net").map(|m| m.ino()).unwrap_or(0);
    format!("{stem}-{netns}")
}

fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// The host end of job `id`'s link, made by helper `pid`: a phase's next helper makes a
/// new link while the kernel may still be removing the last one.
pub fn link_name(id: &str, pid: u32) -> String {
    format!("{LINK_PREFIX}{:012x}", fnv64(format!("{id}/{pid}").as_bytes()) & 0xffff_ffff_ffff)
}

/// The link group that keys the allowed destinations of `allow` in the host's table
/// (0: none). The same list gets the same group, so a run registers it once.
pub fn allow_group(allow: &[NetworkAllow]) -> u32 {
    if allow.is_empty() {
        return 0;
    }
    let mut entries: Vec<String> = allow.iter().map(|a| a.to_string()).collect();
    entries.sort();
    1 + (fnv64(entries.join(",").as_bytes()) % 0x7fff_fffe) as u32
}

/// The job's routes besides its default route: link-local, Azure's host endpoint, the
/// host's `local` destinations (its addresses among them; see `sys::address_watch`) and
/// (`subnet`, root mode) the other jobs prohibited; each allowed destination inside them
/// through the gateway.
pub fn job_routes(local: &[Ipv4Net], subnet: Option<Ipv4Net>, allow: &[NetworkAllow]) -> Vec<JobRoute> {
    let mut blocked = vec![LINK_LOCAL, Ipv4Net::host(firewall::AZURE_HOST)];
    blocked.extend(subnet);
    for n in local.iter().copied().flat_map(refusable) {
        if !blocked.iter().any(|b| b.covers(&n)) {
            blocked.push(n);
        }
    }
    // A blocked address allowed itself (a host address, Azure's) gets the allowed route
    // alone: the kernel keeps one route per prefix, and the prohibit came first.
    let allowed: Vec<Ipv4Net> = allow.iter().map(|a| Ipv4Net::host(a.addr)).collect();
    let mut routes: Vec<JobRoute> =
        blocked.iter().filter(|b| !allowed.contains(b)).map(|b| JobRoute::Prohibit(*b)).collect();
    for a in allow {
        let n = Ipv4Net::host(a.addr);
        if blocked.iter().any(|b| b.contains(a.addr)) && !routes.contains(&JobRoute::Allow(n)) {
            routes.push(JobRoute::Allow(n));
        }
    }
    routes
}

/// The job's own table (see `sys::job_filter`): what its routes prohibit, refused again
/// for the sockets that pass routes by; the allowed networks and `gateway` (root mode:
/// its forwarded services; the host's table minds the ports) accepted first. An address
/// `allow` lists with ports only is accepted on those ports, and refused on the others:
/// its route cannot say ports, and once a flush took the host's table away the job's
/// table is what holds them (found by a red-team pass).
pub fn job_filter(
    routes: &[JobRoute],
    gateway: Option<Ipv4Addr>,
    blocked6: &[Ipv6Net],
    allow: &[NetworkAllow],
) -> JobFilter {
    let mut f = JobFilter::default();
    f.accept4.extend(gateway.map(Ipv4Net::host));
    for r in routes {
        match r {
            JobRoute::Allow(n) => {
                let entries: Vec<&NetworkAllow> = allow.iter().filter(|a| n.contains(a.addr)).collect();
                let ports: Vec<u16> = entries.iter().filter_map(|a| a.port).collect();
                if entries.is_empty() || ports.len() < entries.len() {
                    f.accept4.push(*n);
                } else {
                    f.accept_ports4.extend(ports.into_iter().map(|p| (n.addr, p)));
                    f.reject4.push(*n);
                }
            }
            JobRoute::Prohibit(n) => f.reject4.push(*n),
        }
    }
    f.reject6.extend(blocked6.iter().filter(|n| **n != ipv6::LINK_LOCAL));
    // Broadcast and multicast, which routes cannot stop: the host delivers them to its
    // services on all addresses once a flush took its table away. IPv6 multicast but
    // ICMPv6 rootless: a rootless job finds pasta's gateway by neighbour discovery
    // (multicast); a veth job's neighbours are permanent entries both ways.
    f.reject_off_lo4 = vec![Ipv4Net::host(Ipv4Addr::BROADCAST), Ipv4Net::new(Ipv4Addr::new(224, 0, 0, 0), 4)];
    let multicast6 = vec![Ipv6Net::new(Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8)];
    if gateway.is_some() {
        f.reject_off_lo6 = multicast6;
    } else {
        // pasta sends a job's UDP from a host socket whatever its destination: to ff02::1
        // it reached every host service on `[::]` (a red-team pass, then t63).
        f.reject_off_lo6_but_icmp = multicast6;
    }
    // Rootless (pasta's gateway, not ours): pasta hands the job whatever reaches the host
    // socket it sends the job's UDP from; only answers may come in (see sys::job_filter).
    f.refuse_inbound = gateway.is_none().then(rootless_tracked);
    f
}

/// What a rootless job may track in its own namespace (see `sys::job_filter`): as a
/// root-mode job on the host's table, its share of the host's connection-tracking
/// table (`firewall::flows_per_job`) and [`firewall::NEW_FLOWS_PER_SECOND`] new flows a
/// second past that many. Where the table's size cannot be read yet (conntrack not
/// loaded: the job's table loads it), the share of the kernel's smallest default table
/// (65536 entries, a host of up to 4 GiB).
fn rootless_tracked() -> crate::sys::job_filter::Tracked {
    let max = std::fs::read_to_string(firewall::CONNTRACK_MAX).ok().and_then(|m| m.trim().parse().ok());
    crate::sys::job_filter::Tracked {
        flows: firewall::flows_per_job(max.unwrap_or(65_536)).min(u32::MAX as u64) as u32,
        new_per_second: firewall::NEW_FLOWS_PER_SECOND as u32,
    }
}

/// The job's address behind pasta (the same in every job: each has its own pasta).
fn pasta_address(net: &JobNetwork) -> Ipv4Addr {
    net.subnet().nth(2)
}

/// pasta's options: the job's address, the gateway, DNS at the gateway, no port
/// forwarded either way but the host's loopback services the job may use, the gateway
/// not mapped to the host, IPv4 only (IPv6 too: the host's address and gateway, as
/// pasta copies them, with its NDP answers for the gateway's MAC), no DHCP server or
/// router advertisements (the namespace is configured directly), in the foreground and
/// quiet.
fn pasta_args(net: &JobNetwork) -> Vec<String> {
    let gateway = net.gateway().to_string();
    let ns_to_host = if net.host_ports.is_empty() {
        "none".to_string()
    } else {
        net.host_ports.iter().map(|(p, _)| p.to_string()).collect::<Vec<_>>().join(",")
    };
    let mut a: Vec<String> = ["--foreground", "--quiet", "--config-net", "--ns-ifname", crate::sys::net::JOB_IFNAME]
        .map(String::from)
        .to_vec();
    if !net.ipv6 {
        a.push("--ipv4-only".into());
    }
    a.extend(["--address".into(), pasta_address(net).to_string(), "--netmask".into(), "30".into()]);
    a.extend(["-g".into(), gateway.clone(), "--dns-forward".into(), gateway, "--no-map-gw".into()]);
    a.extend(["-t", "none", "-u", "none", "-T"].map(String::from));
    a.push(ns_to_host);
    a.extend(["-U", "none", "--no-dhcp", "--no-dhcpv6", "--no-ra"].map(String::from));
    if !net.ipv6 {
        a.push("--no-ndp".into());
    }
    a
}

/// A program of the host: the first of `candidates` that exists, or `name` on PATH.
pub fn find_program(name: &str, candidates: &[&str]) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).map(|d| d.join(name)).collect::<Vec<_>>());
    candidates.iter().map(PathBuf::from).chain(on_path.into_iter().flatten()).find(|p| p.is_file())
}

fn pasta_program() -> Result<PathBuf> {
    find_program("pasta", &["/usr/bin/pasta", "/usr/local/bin/pasta"]).context(
        "pasta not found: jobs' own network (--network isolated, the default) in rootless mode needs it: \
         install the Debian package passt (or use --network none)",
    )
}

/// The host's resolver configuration (in the helper: the runner's mount namespace's).
const HOST_RESOLV_CONF: &str = "/etc/resolv.conf";

/// The helper's step (after its private mount namespace, before the container): the
/// job's own network namespace, a sysfs of it and (isolated) its resolv.conf, recorded
/// in the plan for the job's tree. `host` mode: nothing. What it returns must be entered
/// ([`Entered::enter`]) before the tree's bind of that sysfs and the container, and
/// finished ([`Entered::finish`]) before the job starts: a child of the helper may still
/// be making the namespace and its veth.
///
/// `begun`: what [`begin`] made already (a `none` job's namespace, made by an early
/// helper before the plan existed).
pub fn enter(
    mut plan: JobPlan,
    job: &JobDir,
    sys: &dyn Sys,
    begun: Option<Made>,
) -> Result<(JobPlan, Option<Entered>)> {
    if plan.network == Network::Host {
        return Ok((plan, None));
    }
    let mut resolv = None;
    let mut guard = None;
    let setup = match plan.network {
        Network::Isolated => {
            // Subscribed before anything of the host's is read, so that no local
            // destination the host gets from now on is missed; what it delivers to
            // itself now (more than its addresses) is refused from the start (see
            // `sys::address_watch`). Rootless, pasta connects from the host; root mode,
            // it is what the job's own routes and table hold once a firewall reload
            // flushed the host's table away.
            let mut watch = sys.watch_host_addresses(plan.net.ipv6)?;
            let local = watch.current()?;
            let local4: Vec<Ipv4Net> = local.iter().filter_map(LocalNet::v4).collect();
            let local6: Vec<Ipv6Net> = local.iter().filter_map(LocalNet::v6).collect();
            // Its own addresses are among them (no dump of its addresses besides): the
            // resolver's check needs them; routes and tables take all of `local`.
            let host = crate::sys::net::own_addresses(&local);
            let host_resolv = std::fs::read_to_string(HOST_RESOLV_CONF).unwrap_or_default();
            resolv = Some(dns::for_job(&host_resolv, plan.net.gateway(), &host, plan.rootless).resolv_conf);
            let setup = if plan.rootless {
                let routes = job_routes(&local4, None, &plan.net.allow);
                let log = job.bundle().join("pasta.log");
                let ipv6_blocked = plan.net.ipv6.then(|| ipv6::blocked_rootless(&local6));
                let args = pasta_args(&plan.net);
                let filter = job_filter(&routes, None, ipv6_blocked.as_deref().unwrap_or_default(), &plan.net.allow);
                Setup::Pasta(Pasta { program: pasta_program()?, args, routes, log, ipv6_blocked, filter })
            } else {
                let v6 = plan.net.ipv6.then(|| veth6(&local6, !crate::sys::forwarding::ipv6_all_forwarding()));
                Setup::Veth(veth(&plan, &local4, v6, std::process::id()))
            };
            guard = Some(HostAddressGuard::new(watch, refused_from_start(&setup), &plan.net.allow, &plan.id));
            setup
        }
        _ => Setup::Loopback,
    };
    let dir = job.net_dir();
    let made = match begun {
        Some(made) => made,
        None => isolate(&setup, &dir, sys)?,
    };
    plan.net.sysfs = Some(dir.join("sys"));
    if let Some(text) = resolv {
        let path = dir.join("resolv.conf");
        std::fs::write(&path, text).with_context(|| format!("cannot write the job's {}", path.display()))?;
        plan.net.resolv_conf = Some(path);
    }
    let host_link = match setup {
        Setup::Veth(v) => Some(v.host_name),
        _ => None,
    };
    // Rootless, the helper's own namespace is the host's, which its user namespace may
    // not enter again (setns: EPERM): it stays in the job's.
    let leave = !plan.rootless;
    Ok((plan, Some(Entered { made, host_link, leave, guard, socket_counts: None })))
}

/// The part of [`enter`] that needs no plan, for a helper forked before its job was
/// planned (see `runner::EarlyHelper`): a `none` job's namespace, loopback only, and its
/// sysfs in `dir` (see [`crate::sandbox::jobdir::net_dir`]). Nothing for the other
/// modes: a veth needs the job's id and addresses, pasta its ports. `started`: the
/// helper's end of the socket of a `none` namespace its runner makes meanwhile (see
/// `sys::net::loopback_maker`), adopted instead of made.
pub fn begin(mode: Network, dir: &Path, sys: &dyn Sys, started: Option<OwnedFd>) -> Result<Option<Made>> {
    match (mode, started) {
        (Network::None, Some(ready)) => {
            super::jobdir::create_mount_point(dir)?;
            sys.mount_job_net_dir(dir)?;
            Ok(Some(sys.adopt_network(ready, &dir.join("sys"))?))
        }
        (Network::None, None) => Ok(Some(isolate(&Setup::Loopback, dir, sys)?)),
        (Network::Isolated | Network::Host, _) => Ok(None),
    }
}

/// What the job's routes and table refuse from its start, for its guard against host
/// addresses that come later (which refuses only what is not among them).
fn refused_from_start(setup: &Setup) -> Vec<LocalNet> {
    let (routes, blocked6) = match setup {
        Setup::Pasta(p) => (&p.routes, p.ipv6_blocked.as_deref().unwrap_or_default()),
        Setup::Veth(v) => (&v.routes, v.v6.as_ref().map(|v6| v6.blocked.as_slice()).unwrap_or_default()),
        Setup::Loopback => return vec![],
    };
    let refused = routes.iter().filter_map(|r| match r {
        JobRoute::Prohibit(n) => Some(LocalNet::V4(*n)),
        JobRoute::Allow(_) => None,
    });
    refused.chain(blocked6.iter().map(|n| LocalNet::V6(*n))).collect()
}

/// The dir of the job's network files, mounted, and the namespace made as `setup` says.
fn isolate(setup: &Setup, dir: &Path, sys: &dyn Sys) -> Result<Made> {
    super::jobdir::create_mount_point(dir)?;
    sys.mount_job_net_dir(dir)?;
    Ok(sys.isolate_network(setup, &dir.join("sys"))?)
}

/// The job's network as [`enter`] left it.
#[derive(Debug)]
pub struct Entered {
    made: Made,
    /// A veth's host end.
    host_link: Option<String>,
    /// Whether the helper goes back to its own namespace (see [`Entered::finish`]).
    leave: bool,
    /// `isolated`: the guard against host addresses that come while the job runs.
    guard: Option<HostAddressGuard>,
    /// A veth's: the TCP socket counts of the job's namespace (see
    /// [`Entered::outliving_connections`]).
    socket_counts: Option<crate::sys::sockstat::SocketCounts>,
}

impl Entered {
    /// The job's pasta (rootless `isolated`), for its cgroup and its end.
    pub fn pasta_pid(&self) -> Option<i32> {
        self.made.pasta_pid
    }

    /// Moves the helper into the job's namespace (made meanwhile by a child of the
    /// helper, see `sys::net::isolate`): before the job's tree binds its sysfs.
    pub fn enter(&mut self, sys: &dyn Sys) -> Result<()> {
        Ok(sys.enter_network(&mut self.made)?)
    }

    /// Once the job's container exists: the guard against new host addresses armed
    /// (its sockets are the namespace the helper is in: the job's, so this comes
    /// first), the helper back in its own namespace (the job's processes hold the
    /// job's now, and it goes with the last of them: its teardown, ~1.4 ms of the
    /// kernel's CPU and `rtnl_lock` here, then overlaps the end of this job rather than
    /// the start of the next, whose namespace needs that lock), what is still under way
    /// waited for (a veth's configuration, in a child of the helper), and what the job
    /// got logged. Before the job starts. Returns the armed guard (`isolated`), for the
    /// helper's wait to tend.
    pub fn finish(&mut self, job_id: &str, sys: &dyn Sys) -> Result<Option<HostAddressGuard>> {
        if let Some(g) = self.guard.as_mut() {
            g.arm()?;
        }
        if self.host_link.is_some() || self.made.pasta_pid.is_some() {
            // Opened in the job's namespace, read after the job (rootless, the helper
            // stays in it). Without them the job's link is left to the kernel, as before.
            self.socket_counts = sys
                .job_socket_counts()
                .map_err(|e| tracing::warn!(job = %job_id, "{}: a connection that outlives the job keeps its link until it ends", e.with_causes()))
                .ok();
        }
        if self.leave {
            sys.leave_network(&mut self.made)?;
        }
        sys.finish_network(&mut self.made)?;
        let made = &self.made;
        match (&self.host_link, made.address, made.pasta_pid) {
            (Some(link), Some(a), _) => match made.address6 {
                Some(a6) => tracing::debug!(job = %job_id, "network: {a} and {a6} on {link} (host end)"),
                None => tracing::debug!(job = %job_id, "network: {a} on {link} (host end)"),
            },
            (_, _, Some(pid)) => tracing::debug!(job = %job_id, "network: pasta (pid {pid})"),
            _ => tracing::debug!(job = %job_id, "network: loopback only"),
        }
        Ok(self.guard.take())
    }

    /// Once the job's processes are gone: how many of its TCP connections outlive it
    /// (see `sys::sockstat`), each holding its namespace and so its link, a place in the
    /// node's budget of orphans and its buffers; where any do, they are aborted. None
    /// where not counted. Counted once: the counts, which hold the namespace too, go here.
    pub fn outliving_connections(&mut self, job_id: &str, sys: &dyn Sys) -> Option<Outliving> {
        let counts = self.socket_counts.take()?;
        let left = sys
            .job_tcp_sockets(&counts)
            .map_err(|e| tracing::warn!(job = %job_id, "{}: the job's link goes with its namespace", e.with_causes()))
            .ok()?;
        let aborted = match left {
            0 => true,
            _ => sys
                .abort_job_tcp(&counts)
                .map_err(|e| tracing::warn!(job = %job_id, "{}: they live on until they time out", e.with_causes()))
                .is_ok(),
        };
        Some(Outliving { left, aborted })
    }

    /// The job's connections the host's table masqueraded (root mode's veth; once
    /// [`Entered::finish`]ed): its conntrack entries, to forget at its end, and where
    /// their marker goes (see [`forget`]).
    pub fn tracked(&self, net: &JobNetwork) -> Option<forget::Tracked> {
        let link = self.host_link.clone()?;
        let v4 = self.made.address.map(std::net::IpAddr::from);
        let sources = v4.into_iter().chain(self.made.address6.map(std::net::IpAddr::from)).collect();
        Some(forget::Tracked { connections: job_connections(link, sources), markers: net.connection_markers.clone() })
    }
}

/// What [`Entered::outliving_connections`] found: `left` TCP sockets of the job's, and
/// whether they were aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outliving {
    pub left: u64,
    pub aborted: bool,
}

/// A job's connections as the host's table counts them: by its host link, from its
/// addresses (see [`Entered::tracked`]).
pub fn job_connections(link: String, sources: Vec<std::net::IpAddr>) -> crate::sys::net::JobConnections {
    crate::sys::net::JobConnections { table: firewall::TABLE, set: firewall::JOB_FLOWS, link, sources, heir: None }
}

/// A job's IPv6 (see [`ipv6`]): `host` the host's own IPv6 addresses; `force_forwarding`:
/// the host end must forward (the host does not on all links).
fn veth6(local: &[Ipv6Net], force_forwarding: bool) -> Veth6 {
    Veth6 { prefix: ipv6::PREFIX, gateway: ipv6::GATEWAY, force_forwarding, blocked: ipv6::blocked(local) }
}

fn veth(plan: &JobPlan, local: &[Ipv4Net], v6: Option<Veth6>, pid: u32) -> Veth {
    let subnet = plan.net.subnet();
    let routes = job_routes(local, Some(subnet), &plan.net.allow);
    Veth {
        host_name: link_name(&plan.id, pid),
        host_mac: HOST_MAC,
        job_mac: JOB_MAC,
        group: allow_group(&plan.net.allow),
        gateway: plan.net.gateway(),
        pool: subnet,
        // Spread over the pool: the first try is free unless the pool fills up.
        first_try: (fnv64(format!("{}/{pid}", plan.id).as_bytes()) % subnet.size()) as u32,
        avoid: plan.net.connection_markers.as_deref().map(forget::marked).unwrap_or_default(),
        routes: routes.clone(),
        lock: PathBuf::from(firewall::LOCK),
        table: firewall::TABLE.into(),
        filter: job_filter(
            &routes,
            Some(plan.net.gateway()),
            v6.as_ref().map(|v| v.blocked.as_slice()).unwrap_or_default(),
            &plan.net.allow,
        ),
        v6,
    }
}

/// What `exec` and `run` check once at start, before any job: the programs, the
/// subnet against the host's routes (root), the device pasta needs and allowed ports
/// (rootless); `host` mode gets its warning line.
pub fn check_host(mode: Network, net: &JobNetwork, rootless: bool) -> Result<()> {
    match mode {
        Network::Host => {
            tracing::warn!("{}", Network::HOST_WARNING);
            Ok(())
        }
        Network::None => Ok(()),
        Network::Isolated if rootless => {
            pasta_program()?;
            if let Some(a) = net.allow.iter().find(|a| a.port.is_some()) {
                bail!(
                    "network_allow {a}: rootless jobs' allowed destinations cannot be limited to a port \
                     (pasta reaches any port of an allowed address): give the address alone ({})",
                    a.addr
                );
            }
            if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/net/tun") {
                bail!(
                    "pasta needs /dev/net/tun for jobs' own network and cannot open it ({e}): give it mode 0666 \
                     (as Debian's udev does: chmod 0666 /dev/net/tun), or use --network none"
                );
            }
            Ok(())
        }
        Network::Isolated => {
            firewall::nft()?;
            check_subnet(net.subnet())
        }
    }
}

/// Whether jobs in `mode` get IPv6 on this host as `ask` says (see [`ipv6::resolve`]):
/// `on` where it cannot be is a one-line error.
pub fn resolve_ipv6(mode: Network, ask: Ipv6, rootless: bool) -> Result<bool> {
    if mode != Network::Isolated {
        return Ok(false);
    }
    ipv6::resolve(ask, rootless, &ipv6::Host::probe())
}

/// What jobs get of IPv6 on this host, in words (`check`, `run`'s start).
pub fn ipv6_note(ask: Ipv6, rootless: bool) -> String {
    ipv6::note(ask, rootless, &ipv6::Host::probe())
}

/// The subnet must not overlap a route or address of the host's (but the jobs' own).
fn check_subnet(subnet: Ipv4Net) -> Result<()> {
    // Jobs of another run may start and end meanwhile, so the routes are listed
    // before the links: a route whose link is gone by then went with it. A link the
    // dump lacks is asked for alone (a dump cut short by a removal must not hide one).
    let routes = crate::sys::net::routes()?;
    let mut links = crate::sys::net::links()?;
    let mut missing: Vec<i32> =
        routes.iter().filter_map(|r| r.oif).filter(|i| !links.iter().any(|(x, _)| x == i)).collect();
    missing.sort_unstable();
    missing.dedup();
    for index in missing {
        if let Some(name) = crate::sys::net::link_name(index)? {
            links.push((index, name));
        }
    }
    if let Some((dst, dev)) = subnet_conflict(subnet, &routes, &links) {
        bail!(
            "jobs' network_subnet {subnet} overlaps the host's route {dst} (dev {dev}): set network_subnet in the \
             config file to a free range, e.g. {}",
            if subnet == DEFAULT_SUBNET { "10.88.0.0/16" } else { "10.87.0.0/16" }
        );
    }
    Ok(())
}

/// The first of `routes` (listed before `links`) that `subnet` overlaps, with its
/// device's name: default routes, jobs' own links and links gone since are not.
fn subnet_conflict(
    subnet: Ipv4Net,
    routes: &[crate::sys::net::HostRoute],
    links: &[(i32, String)],
) -> Option<(Ipv4Net, String)> {
    let link = |i: i32| links.iter().find(|(x, _)| *x == i).map(|(_, n)| n.as_str());
    routes.iter().find_map(|r| {
        let dev = match r.oif {
            Some(i) => link(i)?,
            None => "?",
        };
        (r.dst.prefix != 0 && !is_job_link(dev) && r.dst.overlaps(&subnet)).then(|| (r.dst, dev.to_string()))
    })
}

/// Root mode, isolated: the host's table exists (made when absent, with the DNS and
/// host ports of `net`). `register`: also add `net`'s host ports and allowed
/// destinations (once per table and process: a job's sandbox checks it cheaply).
/// A table made by an older azp-sandbox (no IPv6 rules: it drops jobs' IPv6) leaves
/// `net` IPv4 only, with a warning (`ask` on: an error).
pub fn ensure_table(net: &mut JobNetwork, register: bool, ask: Ipv6) -> Result<()> {
    let ports: Vec<firewall::HostService> = net
        .host_ports
        .iter()
        .map(|(port, target)| firewall::HostService { proto: firewall::Proto::Tcp, port: *port, target: *target })
        .collect();
    let services = || {
        let host_resolv = std::fs::read_to_string(HOST_RESOLV_CONF).unwrap_or_default();
        let host = crate::sys::net::addresses().unwrap_or_default();
        let mut services: Vec<firewall::HostService> = Vec::new();
        if let Some(t) = dns::for_job(&host_resolv, net.gateway(), &host, false).forward_to {
            services.extend(firewall::dns(t));
        }
        services.extend(ports.iter().copied());
        services
    };
    let extra = if register { firewall::elements(&ports, allow_group(&net.allow), &net.allow) } else { String::new() };
    let v6_rules = firewall::ensure(net.subnet(), net.gateway(), services, &extra, net.ipv6)?;
    if net.ipv6 && !v6_rules {
        let why = format!(
            "the nftables table inet {} was made by an older azp-sandbox, without IPv6 rules: \
             stop its jobs and run `azp-sandbox gc`",
            firewall::TABLE
        );
        if ask == Ipv6::On {
            bail!("network_ipv6 = on (--ipv6 on), but {why}");
        }
        tracing::warn!("jobs get IPv4 only: {why}");
        net.ipv6 = false;
    }
    net.connection_markers = Some(forget::markers_dir());
    Ok(())
}

/// The service's proxy variables as a job gets them, and the host ports the job
/// reaches for them: a proxy on the host's loopback (`http://127.0.0.1:3128`) is at the
/// gateway in root mode (its port forwarded by the host's table) and at the job's own
/// loopback rootless (pasta forwards that port to the host's). Other values unchanged.
pub fn proxy_env(vars: &[(String, String)], net: &JobNetwork, rootless: bool) -> (Vec<(String, String)>, HostPorts) {
    let mut ports = Vec::new();
    let env = vars
        .iter()
        .map(|(k, v)| {
            if k.eq_ignore_ascii_case("NO_PROXY") {
                return (k.clone(), v.clone());
            }
            match loopback_proxy(v) {
                Some((host, port, addr)) => {
                    if !ports.contains(&(port, addr)) {
                        ports.push((port, addr));
                    }
                    let value = if rootless { v.clone() } else { v.replacen(host, &net.gateway().to_string(), 1) };
                    (k.clone(), value)
                }
                None => (k.clone(), v.clone()),
            }
        })
        .collect();
    (env, ports)
}

/// `exec`'s job environment: its proxy variables (`http_proxy`, `HTTPS_PROXY`,
/// `ALL_PROXY`, any case) as [`proxy_env`] makes them, the rest as it is (a
/// `DATABASE_URL=http://127.0.0.1:5432` opens nothing).
pub fn job_proxy_env(env: &[(String, String)], net: &JobNetwork, rootless: bool) -> (Vec<(String, String)>, HostPorts) {
    let is_proxy = |k: &str| ["http_proxy", "https_proxy", "all_proxy"].iter().any(|p| k.eq_ignore_ascii_case(p));
    let proxies: Vec<(String, String)> = env.iter().filter(|(k, _)| is_proxy(k)).cloned().collect();
    let (mut mapped, ports) = proxy_env(&proxies, net, rootless);
    mapped.reverse();
    let env = env.iter().map(|(k, v)| {
        if is_proxy(k) {
            mapped.pop().unwrap_or((k.clone(), v.clone()))
        } else {
            (k.clone(), v.clone())
        }
    });
    (env.collect(), ports)
}

/// `scheme://[user@]HOST[:PORT][/...]` with HOST on the host's loopback: the host text,
/// the port (the scheme's default when none) and the address.
fn loopback_proxy(url: &str) -> Option<(&str, u16, Ipv4Addr)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split('/').next()?;
    let hostport = authority.rsplit('@').next()?;
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().ok()?),
        None => (hostport, if scheme.eq_ignore_ascii_case("https") { 443 } else { 80 }),
    };
    let addr = match host {
        "localhost" => Ipv4Addr::LOCALHOST,
        h => h.parse::<Ipv4Addr>().ok().filter(|a| a.is_loopback())?,
    };
    Some((host, port, addr))
}

/// How long gc waits for the links of jobs just ended before it leaves the table to the
/// next gc. The kernel removes a link with its namespace, in one worker that tears down
/// every namespace of the host in turn: on a busy host (the escape suite, four tests at
/// a time, some of whose namespaces hold thousands of tracked connections) a job killed
/// by gc still had its link after the next gc's 2 s (`t16`, once in a CI run). A job
/// whose TCP connections outlive it keeps its namespace for minutes: its helper removes
/// its link itself (`t65`; a CI rehearsal of
/// `a_firewall_reload_keeps_the_runs_allowed_destinations` saw a `run`'s last job keep
/// its link past this wait before). It only waits while a job's link is there.
const LINKS_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// gc's part (and the end of `run`'s): the host's table when no job link is left, and
/// the tracked connections of killed jobs whose links are gone (see [`forget::sweep`]).
pub fn gc() -> Result<Option<String>> {
    // This process's own jobs are over (`gc`, or the end of `run`).
    firewall::end_table_use();
    let removed = firewall::remove_if_unused(LINKS_GRACE)?;
    // Killed jobs' connections whose clean-up could not be sure of them, after the
    // wait for dying links above.
    let swept = if crate::rootless::mode().rootless { None } else { forget::gc(removed.is_some()) };
    Ok(match (swept, removed) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(s: &[&str]) -> Vec<NetworkAllow> {
        s.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn a_subnet_conflicts_with_host_routes_but_not_jobs_or_links_gone_since() {
        use crate::sys::net::HostRoute;
        let net = |a: [u8; 4], prefix| Ipv4Net { addr: Ipv4Addr::from(a), prefix };
        let job = link_name("host-0-1", 7);
        let links = vec![(1, "lo".to_string()), (2, "eth0".to_string()), (9, job)];
        let route = |dst, oif| HostRoute { dst, oif, table: 254 };
        let routes = vec![
            route(net([0, 0, 0, 0], 0), Some(2)),
            route(net([10, 87, 1, 2], 32), Some(9)),
            // Another run's job that ended after the routes were listed: its link
            // (index 11) was gone when the links were.
            route(net([10, 87, 204, 30], 32), Some(11)),
        ];
        assert_eq!(subnet_conflict(DEFAULT_SUBNET, &routes, &links), None);
        let mut taken = routes.clone();
        taken.push(route(net([10, 87, 3, 0], 24), Some(2)));
        assert_eq!(subnet_conflict(DEFAULT_SUBNET, &taken, &links), Some((net([10, 87, 3, 0], 24), "eth0".into())));
        let blackhole = vec![route(net([10, 0, 0, 0], 8), None)];
        assert_eq!(subnet_conflict(DEFAULT_SUBNET, &blackhole, &links), Some((net([10, 0, 0, 0], 8), "?".into())));
        assert_eq!(subnet_conflict(net([10, 88, 0, 0], 16), &taken, &links), None);
    }

    #[test]
    fn link_names_and_groups() {
        let n = link_name("host-0-17", 4242);
        assert!(is_job_link(&n) && n.len() == 15, "{n}: an interface name has at most 15 bytes");
        assert_ne!(n, link_name("host-0-17", 4243), "a phase's next helper makes a new link");
        assert!(!is_job_link("azp") && !is_job_link("azpXYZ123456789") && !is_job_link("eth0"));
        assert_eq!(allow_group(&[]), 0);
        let g = allow_group(&allow(&["169.254.169.254:80", "10.0.0.1"]));
        assert!(g > 0);
        assert_eq!(g, allow_group(&allow(&["10.0.0.1", "169.254.169.254:80"])), "the order does not matter");
        assert_ne!(g, allow_group(&allow(&["169.254.169.254:80"])));
    }

    #[test]
    fn a_local_network_around_loopback_is_refused_beside_it() {
        let show = |n: &str| {
            let (a, p) = n.split_once('/').unwrap();
            refusable(Ipv4Net::new(a.parse().unwrap(), p.parse().unwrap()))
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            show("64.0.0.0/2"),
            ["64.0.0.0/3", "96.0.0.0/4", "112.0.0.0/5", "120.0.0.0/6", "124.0.0.0/7", "126.0.0.0/8"]
        );
        assert_eq!(
            show("0.0.0.0/0"),
            [
                "128.0.0.0/1",
                "0.0.0.0/2",
                "64.0.0.0/3",
                "96.0.0.0/4",
                "112.0.0.0/5",
                "120.0.0.0/6",
                "124.0.0.0/7",
                "126.0.0.0/8"
            ]
        );
        assert!(show("127.0.0.0/8").is_empty() && show("127.1.0.0/16").is_empty(), "the job's own loopback");
        assert_eq!(show("10.50.0.0/16"), ["10.50.0.0/16"]);
        // Rootless, at the start: the pieces are prohibited like any local network.
        let r = job_routes(&[Ipv4Net::new(Ipv4Addr::new(64, 0, 0, 0), 2)], None, &[]);
        assert!(r.contains(&JobRoute::Prohibit(Ipv4Net::new(Ipv4Addr::new(126, 0, 0, 0), 8))), "{r:?}");
        assert!(!r.iter().any(|r| matches!(r, JobRoute::Prohibit(n) if n.overlaps(&LOOPBACK))), "{r:?}");
    }

    #[test]
    fn the_jobs_routes_block_link_local_the_host_and_other_jobs_but_what_is_allowed() {
        // The host's local destinations: loopback's, its address, a link-local one.
        let host = [Ipv4Addr::LOCALHOST, Ipv4Addr::new(192, 0, 2, 2), Ipv4Addr::new(169, 254, 1, 1)].map(Ipv4Net::host);
        let r = job_routes(&host, Some(DEFAULT_SUBNET), &allow(&["169.254.169.254:80", "192.0.2.2", "8.8.8.8"]));
        let show: Vec<String> = r.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            show,
            [
                "prohibit 169.254.0.0/16",
                "prohibit 168.63.129.16/32",
                "prohibit 10.87.0.0/16",
                "169.254.169.254/32 via the gateway",
                "192.0.2.2/32 via the gateway",
            ],
            "8.8.8.8 is not blocked: no route for it; 169.254.1.1 is inside link-local; the host address \
             192.0.2.2, allowed, has the allowed route only (one route per prefix)"
        );
        let r = job_routes(&host, None, &[]);
        assert_eq!(r.len(), 3, "rootless: no jobs' subnet to block: {r:?}");
        let routes = job_routes(&host, Some(DEFAULT_SUBNET), &allow(&["169.254.169.254", "192.0.2.2"]));
        let f = job_filter(&routes, Some(Ipv4Addr::new(10, 87, 0, 1)), &[], &allow(&["169.254.169.254", "192.0.2.2"]));
        let show = |nets: &[Ipv4Net]| nets.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(
            show(&f.accept4),
            ["10.87.0.1/32", "169.254.169.254/32", "192.0.2.2/32"],
            "the gateway, the allowed"
        );
        assert_eq!(
            show(&f.reject4),
            ["169.254.0.0/16", "168.63.129.16/32", "10.87.0.0/16"],
            "what the routes prohibit"
        );
        assert!(f.reject6.is_empty(), "link-local is refused by routing itself, scoped or not: {:?}", f.reject6);
        assert_eq!(show(&f.reject_off_lo4), ["255.255.255.255/32", "224.0.0.0/4"]);
        assert_eq!(f.reject_off_lo6.len(), 1, "root mode: IPv6 multicast too");
        assert_eq!(f.refuse_inbound, None, "root mode: the host's table forwards only answers");
        assert!(f.reject_off_lo6_but_icmp.is_empty());
        let rootless = job_filter(&routes, None, &[], &[]);
        assert!(rootless.reject_off_lo6.is_empty(), "rootless: pasta's NDP is multicast");
        let multicast6: Vec<String> = rootless.reject_off_lo6_but_icmp.iter().map(|n| n.to_string()).collect();
        assert_eq!(multicast6, ["ff00::/8"], "the rest of IPv6 multicast is refused");
        let tracked = rootless.refuse_inbound.expect("rootless: only answers come in");
        assert!(tracked.flows >= 256 && tracked.new_per_second == 100, "{tracked:?}");
        // An address allowed on a port only: accepted there, refused on the others.
        let allowed = allow(&["169.254.169.254:80", "192.0.2.2"]);
        let routes = job_routes(&host, Some(DEFAULT_SUBNET), &allowed);
        let f = job_filter(&routes, Some(Ipv4Addr::new(10, 87, 0, 1)), &[], &allowed);
        assert_eq!(show(&f.accept4), ["10.87.0.1/32", "192.0.2.2/32"]);
        assert_eq!(f.accept_ports4, [(Ipv4Addr::new(169, 254, 169, 254), 80)]);
        assert!(f.reject4.contains(&Ipv4Net::host(Ipv4Addr::new(169, 254, 169, 254))), "{:?}", f.reject4);
        let r = job_routes(&[], None, &allow(&["168.63.129.16:80"]));
        let azure = Ipv4Net::host(firewall::AZURE_HOST);
        assert!(r.contains(&JobRoute::Allow(azure)) && !r.contains(&JobRoute::Prohibit(azure)), "allowed: {r:?}");
    }

    #[test]
    fn pasta_forwards_nothing_but_dns_and_the_hosts_loopback_services_asked_for() {
        let net = JobNetwork::default();
        let a = pasta_args(&net).join(" ");
        assert!(a.contains("-t none -u none -T none -U none"), "{a}");
        assert!(
            a.contains("--no-map-gw") && a.contains("--dns-forward 10.87.0.1") && a.contains("-g 10.87.0.1"),
            "{a}"
        );
        assert!(a.contains("--address 10.87.0.2") && a.contains("--ipv4-only"), "{a}");
        let net = JobNetwork { host_ports: vec![(3128, Ipv4Addr::LOCALHOST)], ..Default::default() };
        assert!(pasta_args(&net).join(" ").contains("-T 3128 -U none"));
        assert!(a.contains("--no-ndp"), "{a}");
        let a = pasta_args(&JobNetwork { ipv6: true, ..Default::default() }).join(" ");
        assert!(!a.contains("--ipv4-only") && !a.contains("--no-ndp"), "IPv6: NDP for the gateway: {a}");
        assert!(a.contains("--no-map-gw") && a.contains("--no-ra") && a.contains("--no-dhcpv6"), "{a}");
    }

    #[test]
    fn a_proxy_on_the_hosts_loopback_is_at_the_gateway() {
        let net = JobNetwork::default();
        let vars = vec![
            ("HTTP_PROXY".to_string(), "http://127.0.0.1:3128".to_string()),
            ("https_proxy".to_string(), "http://user:pw@localhost:3128/".to_string()),
            ("HTTPS_PROXY".to_string(), "http://proxy.corp:8080".to_string()),
            ("NO_PROXY".to_string(), "localhost,127.0.0.1".to_string()),
        ];
        let (env, ports) = proxy_env(&vars, &net, false);
        assert_eq!(env[0].1, "http://10.87.0.1:3128");
        assert_eq!(env[1].1, "http://user:pw@10.87.0.1:3128/");
        assert_eq!(env[2].1, "http://proxy.corp:8080");
        assert_eq!(env[3].1, "localhost,127.0.0.1");
        assert_eq!(ports, vec![(3128, Ipv4Addr::LOCALHOST)]);
        let (env, ports) = proxy_env(&vars, &net, true);
        assert_eq!((env[0].1.as_str(), ports.len()), ("http://127.0.0.1:3128", 1), "rootless: pasta forwards it");
        assert_eq!(loopback_proxy("https://127.0.0.2"), Some(("127.0.0.2", 443, Ipv4Addr::new(127, 0, 0, 2))));
        assert_eq!(loopback_proxy("http://10.0.0.1:3128"), None);
    }

    #[test]
    fn execs_proxy_variables_only_open_the_hosts_loopback() {
        let env: Vec<(String, String)> = [
            ("A", "1"),
            ("http_proxy", "http://127.0.0.1:3128"),
            ("DATABASE_URL", "http://127.0.0.1:5432"),
            ("ALL_PROXY", "socks5://localhost:1080"),
            ("HTTPS_PROXY", "http://proxy.corp:8080"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (out, ports) = job_proxy_env(&env, &JobNetwork::default(), false);
        let values: Vec<&str> = out.iter().map(|(_, v)| v.as_str()).collect();
        assert_eq!(
            values,
            [
                "1",
                "http://10.87.0.1:3128",
                "http://127.0.0.1:5432",
                "socks5://10.87.0.1:1080",
                "http://proxy.corp:8080"
            ]
        );
        assert_eq!(out.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>()[1..3], ["http_proxy", "DATABASE_URL"]);
        assert_eq!(ports, vec![(3128, Ipv4Addr::LOCALHOST), (1080, Ipv4Addr::LOCALHOST)]);
        let (out, ports) = job_proxy_env(&env, &JobNetwork::default(), true);
        assert_eq!((out, ports.len()), (env.clone(), 2), "rootless: the same values, pasta forwards the ports");
        assert_eq!(job_proxy_env(&env[..1], &JobNetwork::default(), false).1, vec![]);
    }

    #[test]
    fn a_veth_job_plan() {
        let mut plan = super::super::plan::test_plan("job-1", vec![], "/cg");
        plan.net.allow = allow(&["169.254.169.254:80"]);
        // A prefix on the host's loopback (all of it the host's), held by the job's own
        // routes once a flush took the host's table away.
        let local = [
            Ipv4Net::new(Ipv4Addr::new(198, 51, 100, 0), 24),
            Ipv4Net::new(Ipv4Addr::LOCALHOST, 8),
            Ipv4Net::host(Ipv4Addr::new(192, 0, 2, 2)),
        ];
        let v = veth(&plan, &local, None, 99);
        assert!(v.routes.contains(&JobRoute::Prohibit(local[0])), "{:?}", v.routes);
        assert!(v.filter.reject4.contains(&local[0]), "{:?}", v.filter);
        assert!(!v.routes.iter().any(|r| matches!(r, JobRoute::Prohibit(n) if n.contains(Ipv4Addr::LOCALHOST))));
        assert_eq!(
            (v.host_name.as_str(), v.gateway, v.pool),
            (link_name("job-1", 99).as_str(), Ipv4Addr::new(10, 87, 0, 1), DEFAULT_SUBNET)
        );
        assert_eq!(v.group, allow_group(&plan.net.allow));
        assert!(v.first_try < 65536);
        assert!(v.routes.contains(&JobRoute::Allow(Ipv4Net::host(Ipv4Addr::new(169, 254, 169, 254)))));
        assert_eq!(v.v6, None);
        let v6 = veth6(&[Ipv6Net::host("2001:db8::2".parse().unwrap())], true);
        assert_eq!((v6.prefix, v6.gateway, v6.force_forwarding), (ipv6::PREFIX, ipv6::GATEWAY, true));
        assert_eq!(v6.blocked.last().map(|n| n.to_string()).as_deref(), Some("2001:db8::2/128"));
    }
}
