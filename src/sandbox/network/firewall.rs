//! The host's side of root-mode jobs' network: one nftables table, `inet azp-sandbox`,
//! made once when absent (by the first `exec` or `run` that needs it) and removed by
//! `gc` and at the end of `run` when no job link is left. It matches the jobs' host-end
//! links by their name prefix (`azp*`) and their allowed destinations by the link's
//! group, so a job's start changes nothing in it: no `nft` on the hot path.
//!
//! What it does (the job's own routes block the same destinations again inside its
//! namespace, so a table flushed by a firewall reload fails closed):
//! - masquerades the jobs' outbound traffic;
//! - forwards port 53 (and a proxy's port) at the gateway address to the host
//!   resolver on the host's loopback (`host_services`; `route_localnet` is set on each
//!   host end, and dies with it);
//! - drops everything from a job link to the host itself (any address, any port) but
//!   those forwarded ports and the destinations `network_allow` lists for that job. A
//!   forwarded connection passes only as the table's own: sent to the gateway and
//!   translated to one of its services (`service_targets`), not any connection some
//!   other DNAT rule of the host (kube-proxy, an operator's port forward) translated;
//! - drops what is new towards a job link (another job, the world: jobs are outbound
//!   only), and refuses what a job sends to link-local addresses (cloud metadata), to
//!   Azure's host endpoint ([`AZURE_HOST`]) and to the jobs' subnet (the gateway's other
//!   ports), unless allowed; the table's own forwarded services pass first (a host
//!   resolver on a link-local address, as on GCP, or on Azure's);
//! - holds each job to its share of the host's connection tracking ([`flows_per_job`])
//!   and, once it has opened that many, to [`NEW_FLOWS_PER_SECOND`] new ones: a new flow
//!   beyond either is refused (TCP connects fail at once with "No route to host", as far
//!   as the host's ICMP rate limit lets it answer: beyond that the SYN is dropped and
//!   retried a second later), and the kernel log says so, once a minute at most; and
//!   holds each job's packets and bytes to port 53 (queries after a flow's first ride
//!   it) to [`DNS_PACKETS_PER_SECOND`] and [`DNS_KBYTES_PER_SECOND`], dropping the rest;
//! - holds each job to a few new next hops (its router, or the host's LAN neighbours) at
//!   a time, so that it cannot fill the host's neighbour table, and drops what conntrack
//!   calls invalid from jobs (see [`super::nexthops`]);
//! - when it had to turn IPv4 forwarding on (net.ipv4.ip_forward was 0), drops forwarded
//!   IPv4 traffic that involves no job link (the host does not become a router for
//!   others), and the table's comment says so: whoever removes the table turns
//!   forwarding off again. After a reboot neither exists.
//! - IPv6 (see [`super::ipv6`]): drops what a job sends from an address that is not its
//!   own (the `fib` reverse-path check: IPv6 has no rp_filter), refuses what it sends to
//!   link-local addresses, the jobs' prefix and cloud metadata addresses; the host's
//!   uplinks whose `force_forwarding` the table turned on (set `v6_uplinks`, filled by
//!   [`ensure`] for a run or exec whose jobs get IPv6) forward nothing but to jobs, and
//!   whoever removes the table turns them back off.

use super::forward_record;
use crate::config::NetworkAllow;
use crate::sys::forwarding;
use crate::sys::net::Ipv4Net;
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

pub const TABLE: &str = "azp-sandbox";
/// Held exclusively while the table is made or removed; a helper holds it shared from
/// its check of the table to its link's creation (see `sys::net::Veth::lock`).
pub const LOCK: &str = "/run/azp-sandbox/network.lock";
/// Held shared by every process that made or found the table for its jobs (an `exec`, a
/// `run`), for its life: gc removes the table only when it can take it exclusively. The
/// job links alone do not say it: a job between its check of the table and its veth has
/// none yet, and a concurrent `gc` (or another run's end) would pull the table away.
/// One per network namespace (the table is the namespace's): `<this>-<netns inode>.lock`.
pub const USERS_LOCK: &str = "/run/azp-sandbox/network-users";
static TABLE_USE: std::sync::Mutex<Option<nix::fcntl::Flock<std::fs::File>>> = std::sync::Mutex::new(None);
const FORWARDING_WAS_OFF: &str = "ip_forward was 0";
/// The set of the uplinks whose IPv6 force_forwarding the table turned on.
const V6_UPLINKS: &str = "v6_uplinks";
/// In the comment of a table that has the IPv6 rules: one made by an older azp-sandbox
/// drops jobs' IPv6 (its jobs get IPv4 only until it is removed).
const HAS_IPV6_RULES: &str = "ipv6";
/// In the comment of a table whose input chain accepts only its own forwarded services;
/// one made before accepted any DNAT'd connection from a job link (see [`ensure`]).
const OWN_DNAT_ONLY: &str = "own-dnat";
/// In the comment of a table made with the per-job limit of tracked connections
/// ([`limit_flows`]); one made before lets a job fill the host's conntrack table.
const LIMITS_FLOWS: &str = "flows";
/// In the comment of a table that also holds how fast each job opens new flows
/// ([`NEW_FLOWS_PER_SECOND`]); one made before lets a job at its limit make the host
/// walk its connections on every tick.
const LIMITS_FLOW_RATE: &str = "flow-rate";
/// In the comment of a table that holds each job's DNS to [`DNS_PACKETS_PER_SECOND`] and
/// [`DNS_KBYTES_PER_SECOND`]; one made before lets a job keep the host's resolver busy.
const LIMITS_DNS_RATE: &str = "dns-rate";
/// A job may keep at most this share of the host's connection-tracking table
/// (`nf_conntrack_max`, shared by the host and every job: the table masquerades each
/// job's flows, so they are the host's entries). A full conntrack table drops every new
/// connection of the host and of the other slots; at this share it takes this many jobs
/// at their limit at once. Not more per job: the count is not free (see
/// [`NEW_FLOWS_PER_SECOND`]).
const FLOWS_SHARE: u64 = 64;
/// New flows a job may open per second once it has spent its burst (as many as its
/// limit of tracked connections: a job may open all of those at once). The kernel's
/// count of a job's connections (connlimit) walks the job's whole list, a conntrack
/// lookup per connection, at a new flow once per tick: a job holding its limit that kept
/// sending new flows made the host spend that walk on every tick, in softirq, charged to
/// no cgroup (measured: one job at 16384 sending 1000 new datagrams a second kept 0.8-1.5
/// of 2 CPUs busy, bench/NOTES.md). A new flow over this rate is refused before it is
/// counted, so the walks are at most this many a second per job once its burst is spent
/// (the bucket fills again at this rate, up to the job's limit).
pub(super) const NEW_FLOWS_PER_SECOND: u64 = 100;
/// A flow's first packet: `ct state new` alone is every packet of a flow until its first
/// reply, so a one-way UDP stream (statsd, syslog, RTP) would spend a token with each
/// datagram and be refused past the burst; its entry is confirmed once its first packet
/// has passed (a review; seen in scratch namespaces: 865 of a 1000-datagram stream
/// refused without this, none with it).
const FIRST_PACKET: &str = "ct state new ct status & confirmed == 0";
/// Packets a job may send a second to port 53 (the gateway's DNS, forwarded to the
/// host's resolver, or any resolver it reaches: the host's upstream ones are in its
/// resolv.conf when they are not on loopback), past a burst of [`DNS_BURST`]: every
/// query after a flow's first rides its flow, so neither the rate of new flows nor the
/// count sees them, and a job that sent tens of thousands a second from one socket had
/// the host's one resolver (the host's, the agents', every slot's) to itself (a
/// red-team pass, by reading). Over it, a packet is dropped (a refusal per query would
/// cost the host an ICMP error each).
const DNS_PACKETS_PER_SECOND: u64 = 200;
/// See [`DNS_PACKETS_PER_SECOND`].
const DNS_BURST: u64 = 1000;
/// Bytes a job may send a second to port 53, past a burst of [`DNS_BURST_KBYTES`]: a
/// packet may carry many queries (TCP's length-prefixed queries one after the other, a
/// segmentation-offloaded TCP or UDP send of up to 64 KiB that the host sees as one
/// packet), so packets alone do not bound them (a review). 32 KB/s is ~200 queries of
/// 160 bytes; the smallest queries (~30 bytes) still get ~1000 a second through.
const DNS_KBYTES_PER_SECOND: u64 = 32;
/// See [`DNS_KBYTES_PER_SECOND`].
const DNS_BURST_KBYTES: u64 = 128;
/// The set that holds each job link's rate of DNS packets (see [`flows_script`]).
const JOB_DNS: &str = "job_dns";
/// The set that holds each job link's rate of bytes to port 53 (see [`flows_script`]).
const JOB_DNS_BYTES: &str = "job_dns_bytes";
/// The set that holds each job link's rate of new flows (see [`flows_script`]).
const JOB_NEW_FLOWS: &str = "job_new_flows";
/// The set that counts each job link's tracked connections (see [`flows_script`]).
pub const JOB_FLOWS: &str = "job_flows";
/// The least a job gets, where an operator made the conntrack table very small.
const MIN_FLOWS: u64 = 256;
/// Exists once conntrack is loaded (making the table loads it).
pub(super) const CONNTRACK_MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";
/// Azure's host endpoint (WireServer, the host agent, Azure DNS): the Azure VM agent lets
/// only root on the VM reach it (an OUTPUT rule, which forwarded traffic never meets);
/// jobs are refused it as they are link-local addresses. DNS there is forwarded.
pub const AZURE_HOST: Ipv4Addr = Ipv4Addr::new(168, 63, 129, 16);

/// A host service on the host's loopback that jobs reach at their gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostService {
    pub proto: Proto,
    pub port: u16,
    pub target: Ipv4Addr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

/// Its element of the map `host_services`: the gateway's port and where it goes.
impl std::fmt::Display for HostService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} . {} : {}", self.proto_name(), self.port, self.target)
    }
}

impl HostService {
    fn proto_name(&self) -> &'static str {
        match self.proto {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }

    /// Its element of the set `service_targets`: what a connection forwarded to it looks
    /// like once translated.
    fn target_element(&self) -> String {
        format!("{} . {} . {}", self.proto_name(), self.port, self.target)
    }
}

/// DNS at `target` (TCP and UDP port 53).
pub fn dns(target: Ipv4Addr) -> [HostService; 2] {
    [Proto::Udp, Proto::Tcp].map(|proto| HostService { proto, port: 53, target })
}

/// What the transactions after the table's own added to it ([`limit_flows`],
/// [`limit_nexthops`]): its comment says so, and only so (see [`outdated`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// [`LIMITS_FLOWS`], [`LIMITS_FLOW_RATE`] and [`LIMITS_DNS_RATE`] (one transaction).
    pub flows: bool,
    /// [`super::nexthops::MARKER`].
    pub nexthops: bool,
}

impl Limits {
    pub const ALL: Limits = Limits { flows: true, nexthops: true };
}

/// The table's text for `nft -f`, its comment naming `limits`.
pub fn script(
    subnet: Ipv4Net,
    gateway: Ipv4Addr,
    services: &[HostService],
    forwarding_was_off: bool,
    limits: Limits,
) -> String {
    let elements = if services.is_empty() {
        String::new()
    } else {
        format!(" elements = {{ {} }}", services.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "))
    };
    let targets = if services.is_empty() {
        String::new()
    } else {
        format!(" elements = {{ {} }}", services.iter().map(|s| s.target_element()).collect::<Vec<_>>().join(", "))
    };
    let blocked = format!("{{ 169.254.0.0/16, {AZURE_HOST}, {subnet} }}");
    // A connection the table itself forwarded: sent to the gateway, translated to one of
    // its services.
    let own_dnat = format!(
        "iifname \"azp*\" ct status dnat ct original ip daddr {gateway} meta l4proto . th dport . ip daddr @service_targets accept"
    );
    let mut blocked6 = vec![super::ipv6::LINK_LOCAL, super::ipv6::PREFIX];
    blocked6.extend(super::ipv6::METADATA);
    let blocked6 = format!("{{ {} }}", blocked6.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", "));
    let mut s = format!(
        r#"table inet {TABLE} {{
  comment "{}"
  map host_services {{ type inet_proto . inet_service : ipv4_addr;{elements}
  }}
  set service_targets {{ type inet_proto . inet_service . ipv4_addr;{targets}
  }}
  set allow_port {{ type devgroup . ipv4_addr . inet_service;
  }}
  set allow_addr {{ type devgroup . ipv4_addr;
  }}
  set {V6_UPLINKS} {{ type ifname;
  }}
  chain prerouting {{ type nat hook prerouting priority dstnat; policy accept;
    iifname "azp*" ip daddr {gateway} dnat ip to meta l4proto . th dport map @host_services
  }}
  chain postrouting {{ type nat hook postrouting priority srcnat; policy accept;
    iifname "azp*" oifname != "azp*" masquerade
  }}
  chain input {{ type filter hook input priority filter; policy accept;
    {own_dnat}
    iifname "azp*" meta iifgroup . ip daddr . th dport @allow_port accept
    iifname "azp*" meta iifgroup . ip daddr @allow_addr accept
    iifname "azp*" drop
  }}
  chain forward {{ type filter hook forward priority filter; policy accept;
    oifname "azp*" ct state established,related accept
    oifname "azp*" drop
    iifname "azp*" meta nfproto ipv6 fib saddr . iif oif missing drop
    {own_dnat}
    iifname "azp*" ip daddr {blocked} meta iifgroup . ip daddr . th dport @allow_port accept
    iifname "azp*" ip daddr {blocked} meta iifgroup . ip daddr @allow_addr accept
    iifname "azp*" ip daddr {blocked} reject with icmpx type admin-prohibited
    iifname "azp*" ip6 daddr {blocked6} reject with icmpx type admin-prohibited
    iifname @{V6_UPLINKS} oifname != "azp*" drop
"#,
        comment(subnet, forwarding_was_off, limits)
    );
    if forwarding_was_off {
        s.push_str("    meta nfproto ipv4 iifname != \"azp*\" oifname != \"azp*\" drop\n");
    }
    s.push_str("  }\n}\n");
    s
}

fn comment(subnet: Ipv4Net, forwarding_was_off: bool, limits: Limits) -> String {
    let mut c = format!("azp-sandbox jobs: subnet {subnet}, {HAS_IPV6_RULES}, {OWN_DNAT_ONLY}");
    if limits.flows {
        c.push_str(&format!(", {LIMITS_FLOWS}, {LIMITS_FLOW_RATE}, {LIMITS_DNS_RATE}"));
    }
    if limits.nexthops {
        c.push_str(&format!(", {}", super::nexthops::MARKER));
    }
    if forwarding_was_off {
        c.push_str(&format!(", {FORWARDING_WAS_OFF}"));
    }
    c
}

/// Whether a table's comment has `marker` (its words are separated by ", ").
fn has_marker(comment: &str, marker: &str) -> bool {
    comment.split(", ").any(|w| w == marker)
}

/// The subnet a table's comment names.
fn subnet_of(comment: &str) -> Option<&str> {
    comment.split("subnet ").nth(1)?.split([',', ' ']).next()
}

/// `nft add element` commands for services and the allowed destinations of group `group`.
pub fn elements(services: &[HostService], group: u32, allow: &[NetworkAllow]) -> String {
    let mut s = String::new();
    for svc in services {
        s.push_str(&format!("add element inet {TABLE} host_services {{ {svc} }}\n"));
        s.push_str(&format!("add element inet {TABLE} service_targets {{ {} }}\n", svc.target_element()));
    }
    for a in allow {
        match a.port {
            Some(p) => s.push_str(&format!("add element inet {TABLE} allow_port {{ {group} . {} . {p} }}\n", a.addr)),
            None => s.push_str(&format!("add element inet {TABLE} allow_addr {{ {group} . {} }}\n", a.addr)),
        }
    }
    s
}

/// How many tracked connections (conntrack entries) one job may keep at once on a host
/// whose table holds `conntrack_max`: its [`FLOWS_SHARE`], at least [`MIN_FLOWS`].
/// Closed TCP connections (`TIME_WAIT`) do not count; a UDP flow counts until conntrack
/// forgets it (30 s, or 120 s once both sides spoke).
pub(super) fn flows_per_job(conntrack_max: u64) -> u64 {
    (conntrack_max / FLOWS_SHARE).max(MIN_FLOWS)
}

/// The sets, chains and rules that hold each job link to `limit` tracked connections
/// and, past a burst of `limit`, to [`NEW_FLOWS_PER_SECOND`] new ones: keyed by the
/// link's name (one per job); counted by the kernel's connlimit (the count set's element
/// goes once its link's last connection has), rated by a token bucket per link (refilled
/// at the rate up to `limit`; its element expires an hour after the link's last flow met
/// it, so the set does not fill with the links of jobs long gone, and a job that keeps
/// opening flows never gets a full bucket back: `update`, not `add`, which would let it
/// expire an hour after it was made). Only a flow's first packet meets
/// either ([`FIRST_PACKET`]). The rate comes first: a flow it refuses costs no count.
/// In `input` (what is forwarded to a host service) and `forward` (the rest), first in
/// both: a flow's first packet meets one of them. Not in prerouting: Linux before 5.11
/// refuses `reject` there. Each refusal is counted (`nft list table inet azp-sandbox`
/// shows how many). Then each job's packets and bytes to port 53, to
/// [`DNS_PACKETS_PER_SECOND`] and [`DNS_KBYTES_PER_SECOND`] (first too, before the
/// table's own forwarded connections are accepted).
fn flows_script(limit: u64) -> String {
    // The count set's elements go with their link's last connection; the token buckets'
    // expire (`timeout`).
    let mut s = format!("add set inet {TABLE} {JOB_FLOWS} {{ type ifname; flags dynamic; size 65535; }}\n");
    for set in [JOB_NEW_FLOWS, JOB_DNS, JOB_DNS_BYTES] {
        s += &format!("add set inet {TABLE} {set} {{ type ifname; flags dynamic,timeout; timeout 1h; size 65535; }}\n");
    }
    const REJECT: &str = "reject with icmpx type admin-prohibited";
    s += &refusal_chain("over_flows", format!("is at its limit of {limit} connections"), REJECT);
    s += &refusal_chain("over_rate", format!("opens more than {NEW_FLOWS_PER_SECOND} connections a second"), REJECT);
    let why = format!("sends more than {DNS_PACKETS_PER_SECOND} DNS packets or {DNS_KBYTES_PER_SECOND} KB a second");
    s += &refusal_chain("over_dns", why, "drop");
    let to_dns = "iifname \"azp*\" meta l4proto { tcp, udp } th dport 53";
    // Each is inserted first in both chains, so the last of these comes first there.
    let rules = [
        format!("iifname \"azp*\" {FIRST_PACKET} add @{JOB_FLOWS} {{ iifname ct count over {limit} }} jump over_flows"),
        format!(
            "iifname \"azp*\" {FIRST_PACKET} update @{JOB_NEW_FLOWS} \
             {{ iifname limit rate over {NEW_FLOWS_PER_SECOND}/second burst {limit} packets }} jump over_rate"
        ),
        format!(
            "{to_dns} update @{JOB_DNS} \
             {{ iifname limit rate over {DNS_PACKETS_PER_SECOND}/second burst {DNS_BURST} packets }} jump over_dns"
        ),
        format!(
            "{to_dns} update @{JOB_DNS_BYTES} \
             {{ iifname limit rate over {DNS_KBYTES_PER_SECOND} kbytes/second burst {DNS_BURST_KBYTES} kbytes }} \
             jump over_dns"
        ),
    ];
    for rule in &rules {
        for chain in ["input", "forward"] {
            s += &format!("insert rule inet {TABLE} {chain} {rule}\n");
        }
    }
    s
}

/// A chain that refuses (`verdict`) what jumps to it, counted, and says so in the kernel
/// log once a minute at most: "azp-sandbox: a job {why}: ".
pub(super) fn refusal_chain(chain: &str, why: String, verdict: &str) -> String {
    format!(
        "add chain inet {TABLE} {chain}\n\
         add rule inet {TABLE} {chain} limit rate 1/minute burst 1 packets \
         log prefix \"azp-sandbox: a job {why}: \" level warn\n\
         add rule inet {TABLE} {chain} counter {verdict}\n"
    )
}

/// One transaction: the table just made replaced by `table` (its comment without the
/// limits that failed), with the limits that did not (`flows`: [`limit_flows`]'s limit,
/// `nexthops`: [`limit_nexthops`]'s result).
fn remake_script(table: &str, flows: Option<u64>, nexthops: bool) -> String {
    let mut s = format!("delete table inet {TABLE}\n{table}");
    if let Some(limit) = flows {
        s += &flows_script(limit);
    }
    if nexthops {
        s += &super::nexthops::script();
    }
    s
}

/// Adds [`super::nexthops::script`] to the table just made. Whether it could: a kernel
/// that refuses it keeps the rest of the table, and the warning says what is missing.
fn limit_nexthops(nft: &Path) -> bool {
    run_nft(nft, &super::nexthops::script())
        .map_err(|e| {
            tracing::warn!(
                "jobs' network: how many of the host's neighbours a job makes it resolve is not limited ({e:#}): \
                 one job can fill the host's neighbour table; the kernel needs nft_limit (CONFIG_NFT_LIMIT) \
                 and nftables' rt expression; once it has them, stop the jobs and run `azp-sandbox gc`"
            )
        })
        .is_ok()
}

/// Adds [`flows_script`] to the table just made (which loaded conntrack: its maximum is
/// known only then). The limit, or None where the kernel cannot count (no
/// `nft_connlimit`; the DNS rates, in the same transaction, are missing then too): the
/// table works without them, the warning says what is missing, and the table is made
/// again without [`LIMITS_FLOWS`] in its comment (see [`ensure`]): every later run says
/// so too ([`warn_if_outdated`]).
fn limit_flows(nft: &Path) -> Option<u64> {
    let limit = std::fs::read_to_string(CONNTRACK_MAX).ok().and_then(|m| m.trim().parse().ok()).map(flows_per_job);
    let result = match limit {
        Some(limit) => run_nft(nft, &flows_script(limit)).map(|()| limit),
        None => Err(anyhow::anyhow!("{CONNTRACK_MAX} is missing")),
    };
    result
        .map_err(|e| {
            tracing::warn!(
                "jobs' network: jobs' connections and DNS are not limited ({e:#}): one job can fill the \
                 host's connection tracking and keep its resolver busy; the kernel needs nft_connlimit and \
                 nft_limit (CONFIG_NFT_CONNLIMIT, CONFIG_NFT_LIMIT); once it has them, stop the jobs and run \
                 `azp-sandbox gc`"
            )
        })
        .ok()
}

/// The `nft` binary, or a one-line error naming the package.
pub fn nft() -> Result<PathBuf> {
    crate::sandbox::network::find_program("nft", &["/usr/sbin/nft", "/sbin/nft"]).context(
        "nft not found: jobs' own network (--network isolated, the default) in root mode needs it: \
         install the Debian package nftables (or use --network none)",
    )
}

fn run_nft(nft: &Path, input: &str) -> Result<()> {
    let mut child = std::process::Command::new(nft)
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", nft.display()))?;
    child.stdin.take().context("nft's stdin")?.write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().find(|l| l.contains("Error")).unwrap_or(err.lines().next().unwrap_or("")).trim();
        bail!("nft could not set up the table inet {TABLE} for jobs' network: {first}");
    }
    Ok(())
}

fn open_users_lock() -> Result<std::fs::File> {
    let path = format!("{}.lock", super::per_netns(USERS_LOCK));
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {path}"))
}

/// This process uses the table from now on (see [`USERS_LOCK`]); once per process.
fn begin_table_use() -> Result<()> {
    let mut held = TABLE_USE.lock().unwrap_or_else(|e| e.into_inner());
    if held.is_none() {
        if let Some(dir) = Path::new(USERS_LOCK).parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let f = open_users_lock()?;
        let shared = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockShared)
            .map_err(|(_, e)| anyhow::anyhow!("cannot lock {USERS_LOCK}-*.lock: {e}"))?;
        *held = Some(shared);
    }
    Ok(())
}

/// This process is done with the table (the end of `run`, before its gc).
pub fn end_table_use() {
    TABLE_USE.lock().unwrap_or_else(|e| e.into_inner()).take();
}

fn lock() -> Result<nix::fcntl::Flock<std::fs::File>> {
    if let Some(dir) = Path::new(LOCK).parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK)
        .with_context(|| format!("cannot open {LOCK}"))?;
    lock_naming_holders(f, Path::new(LOCK), LOCK_PATIENCE, |holders| {
        tracing::warn!("waiting for {LOCK}, held by {holders}");
    })
}

/// How long [`lock`] waits quietly: others hold the lock for milliseconds (a helper from
/// its check of the table to its link, another process making or removing the table).
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Locks `file` (open on `path`) exclusively. Held by others for longer than `patience`,
/// `waiting` is told who holds it (see [`holders_of`]) once, and the wait goes on: a
/// `gc` or a job that hangs here says what it waits for (a process left behind by a
/// bug held it for ever once; see `sys::process::clone_waiting`).
fn lock_naming_holders(
    mut file: std::fs::File,
    path: &Path,
    patience: std::time::Duration,
    waiting: impl FnOnce(&str),
) -> Result<nix::fcntl::Flock<std::fs::File>> {
    use nix::fcntl::{Flock, FlockArg};
    let failed = |e: nix::errno::Errno| anyhow::anyhow!("cannot lock {}: {e}", path.display());
    let deadline = std::time::Instant::now() + patience;
    while std::time::Instant::now() < deadline {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => return Ok(locked),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) => file = f,
            Err((_, e)) => return Err(failed(e)),
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    waiting(&holders_of(path, std::os::fd::AsRawFd::as_raw_fd(&file)));
    Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| failed(e))
}

/// The processes with `path` open, as `pid 12 (comm), ...` (from /proc/PID/fd: as root
/// every process's, as a user only its own), but for our own `waiting_fd`, or "no
/// process this one can see".
fn holders_of(path: &Path, waiting_fd: std::os::fd::RawFd) -> String {
    let ours = (std::process::id(), waiting_fd.to_string());
    let mut found = vec![];
    for proc_dir in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = proc_dir.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let fds = std::fs::read_dir(proc_dir.path().join("fd")).into_iter().flatten().flatten();
        let holds = |fd: &std::fs::DirEntry| {
            (pid, fd.file_name().to_string_lossy().into_owned()) != ours
                && std::fs::read_link(fd.path()).is_ok_and(|target| target == path)
        };
        if fds.into_iter().any(|fd| holds(&fd)) {
            let comm = std::fs::read_to_string(proc_dir.path().join("comm")).unwrap_or_default();
            found.push(format!("pid {pid} ({})", comm.trim()));
        }
    }
    if found.is_empty() {
        "no process this one can see".to_string()
    } else {
        found.join(", ")
    }
}

/// Makes the table when it is absent (turning IPv4 forwarding on when it is off), and
/// adds `extra` elements (a run's proxy port, a job's allowed destinations) unless this
/// process added them to this very table already (see [`REGISTERED`]: a run calls this
/// for every job, and its elements come back after a firewall reload). A table of
/// another subnet is an error: two subnets would need two gateways in one table.
/// `ipv6`: jobs get IPv6: the uplinks forward for them (see [`uplinks_to_turn_on`]).
/// Returns whether the table has the IPv6 rules (false: made by an older azp-sandbox).
pub fn ensure(
    subnet: Ipv4Net,
    gateway: Ipv4Addr,
    services: impl FnOnce() -> Vec<HostService>,
    extra: &str,
    ipv6: bool,
) -> Result<bool> {
    begin_table_use()?;
    let has_v6 = |c: &str| has_marker(c, HAS_IPV6_RULES);
    if let Some((c, handle)) = existing(subnet)? {
        warn_if_outdated(&c);
        let v6_pending = || ipv6 && has_v6(&c) && !uplinks_to_turn_on(&super::ipv6::Host::probe()).is_empty();
        let register = to_register(&registered(), handle, extra);
        if !register && !v6_pending() {
            return Ok(has_v6(&c));
        }
    }
    let nft = nft()?;
    let _lock = lock()?;
    // What an earlier table turned on and a firewall reload took the record of.
    let record = forward_record::read();
    if existing(subnet)?.is_none() {
        let turn_on = forwarding::ipv4_forwarding_off();
        let forwarding_was_off = turn_on || record.ip_forward;
        if turn_on && !record.ip_forward {
            forward_record::add_ip_forward()?;
        }
        let services = services();
        run_nft(&nft, &script(subnet, gateway, &services, forwarding_was_off, Limits::ALL))?;
        let flows = limit_flows(&nft);
        let nexthops = limit_nexthops(&nft);
        let got = Limits { flows: flows.is_some(), nexthops };
        if got != Limits::ALL {
            // Its comment must not name what it lacks: every later run says so then. One
            // transaction: where it fails (a firewall reload took the table meanwhile),
            // the table stays as it was, and jobs run as before.
            let remade = remake_script(&script(subnet, gateway, &services, forwarding_was_off, got), flows, nexthops);
            if let Err(e) = run_nft(&nft, &remade) {
                tracing::warn!(
                    "jobs' network: could not make the table inet {TABLE} again without the limits the kernel \
                     refused ({e:#}): its comment names them, and later runs will not say they are missing"
                );
            }
        }
        if turn_on {
            forwarding::set_ipv4_forwarding(true)?;
        }
        tracing::info!(
            "jobs' network: made the nftables table inet {TABLE} (subnet {subnet}{}{}{})",
            flows
                .map(|f| format!(
                    "; {f} tracked connections per job, {NEW_FLOWS_PER_SECOND} new a second past that many"
                ))
                .unwrap_or_default(),
            if nexthops { format!("; {}", super::nexthops::summary()) } else { String::new() },
            if forwarding_was_off { "; IPv4 forwarding turned on until it is removed" } else { "" }
        );
    }
    let v6_rules = existing(subnet)?.is_some_and(|(c, _)| has_v6(&c));
    if v6_rules {
        // Uplinks an earlier table turned on: in the set again, so they forward nothing
        // but to jobs, and are turned off with it.
        for link in &record.uplinks {
            add_v6_uplink(&nft, link)?;
        }
    }
    if ipv6 && v6_rules {
        // Under the lock, looked at again: another run may have done it meanwhile.
        for link in uplinks_to_turn_on(&super::ipv6::Host::probe()) {
            // Recorded first: a crash in between leaves a record, not a setting nobody undoes.
            if !record.uplinks.contains(&link) {
                forward_record::add_uplink(&link)?;
            }
            add_v6_uplink(&nft, &link)?;
            if !forwarding::set_uplink_force_forwarding(&link, true)? {
                bail!("the host's IPv6 uplink {link} went away while the jobs' table was made: start again");
            }
            tracing::info!(
                "jobs' network: net.ipv6.conf.{link}.force_forwarding turned on (jobs' IPv6 replies come in there) \
                 until the table inet {TABLE} is removed"
            );
        }
    }
    // Under the lock, looked at again: the table may be another one by now.
    let table = existing(subnet)?;
    let handle = table.as_ref().and_then(|(_, h)| *h);
    let mut registered = registered();
    if to_register(&registered, handle, extra) {
        // An older table has no `service_targets` (it lets any DNAT'd connection in, and
        // warns so): its elements would fail the whole transaction.
        let own_dnat = table.is_some_and(|(c, _)| has_marker(&c, OWN_DNAT_ONLY));
        let lines: String = extra
            .lines()
            .filter(|l| own_dnat || !l.contains(" service_targets "))
            .map(|l| l.to_string() + "\n")
            .collect();
        run_nft(&nft, &lines)?;
        *registered = Some((handle, extra.to_string()));
    }
    Ok(v6_rules)
}

/// A table made by an azp-sandbox before [`OWN_DNAT_ONLY`] lets a job reach host
/// services that any other DNAT rule of the host translates to (a Kubernetes node's
/// ClusterIPs, an operator's port forward), one before [`LIMITS_FLOWS`] lets a job fill
/// the host's connection tracking, one before [`LIMITS_FLOW_RATE`] lets a job at its
/// limit keep the host walking its connections, and one made on a kernel that refused a
/// limit (see [`ensure`]) lacks it: said once per process, with the fix. It is
/// not replaced under running jobs (their runs' elements would go with it); `gc`, the
/// end of the last run, or a reboot removes it, and the next job makes the current one.
/// One older still, without the IPv6 rules, is said so where IPv6 is decided, with the
/// same fix: one line is enough.
fn warn_if_outdated(comment: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    if let Some(what) = outdated(comment) {
        SAID.call_once(|| {
            tracing::warn!(
                "jobs' network: the nftables table inet {TABLE} {what} (it was made by an older azp-sandbox, \
                 or on a kernel that refused a limit, said when it was made): run `azp-sandbox gc` once no \
                 jobs run (and the kernel has what the limit needs)"
            )
        });
    }
}

/// What a table with `comment` lacks, in words (None: nothing this process cares about).
fn outdated(comment: &str) -> Option<String> {
    if !has_marker(comment, HAS_IPV6_RULES) {
        return None;
    }
    let mut lacks = vec![];
    if !has_marker(comment, OWN_DNAT_ONLY) {
        lacks.push("lets jobs reach host services other DNAT rules forward to");
    }
    if !has_marker(comment, LIMITS_FLOWS) {
        lacks.push("does not limit each job's tracked connections, how fast it opens them, or its DNS queries");
    } else if !has_marker(comment, LIMITS_FLOW_RATE) {
        lacks.push("does not limit how fast each job opens connections (a job at its limit can keep a CPU busy)");
    }
    if has_marker(comment, LIMITS_FLOWS) && !has_marker(comment, LIMITS_DNS_RATE) {
        lacks.push("does not limit each job's DNS queries (a job can keep the host's resolver busy)");
    }
    if !has_marker(comment, super::nexthops::MARKER) {
        lacks.push("does not limit how many of the host's neighbours each job makes it resolve (a job can fill its neighbour table)");
    }
    (!lacks.is_empty()).then(|| lacks.join(", and "))
}

/// `link` in the table's set of uplinks it turned on (they forward nothing but to jobs).
fn add_v6_uplink(nft: &Path, link: &str) -> Result<()> {
    run_nft(nft, &format!("add element inet {TABLE} {V6_UPLINKS} {{ \"{link}\" }}\n"))
}

/// The host's IPv6 uplinks that must forward jobs' replies and do not yet: none when the
/// host forwards IPv6 on all links already.
fn uplinks_to_turn_on(host: &super::ipv6::Host) -> Vec<String> {
    if host.forwarding {
        return vec![];
    }
    host.uplinks.iter().filter(|l| forwarding::uplink_force_forwarding(l) == Some(false)).cloned().collect()
}

/// The quoted elements of `nft list set`'s text (interface names).
fn quoted_elements(text: &str) -> Vec<String> {
    let Some((_, rest)) = text.split_once("elements = {") else { return vec![] };
    let rest = rest.split('}').next().unwrap_or("");
    rest.split('"').skip(1).step_by(2).map(String::from).collect()
}

/// The uplinks the table turned IPv6 forwarding on for (read before it is removed).
fn v6_uplinks(nft: &Path) -> Vec<String> {
    let out = std::process::Command::new(nft).args(["list", "set", "inet", TABLE, V6_UPLINKS]).output();
    out.map(|o| quoted_elements(&String::from_utf8_lossy(&o.stdout))).unwrap_or_default()
}

/// The table when it exists: its comment and handle (for `subnet`: else an error that
/// says what to change).
fn existing(subnet: Ipv4Net) -> Result<Option<(String, Option<u64>)>> {
    let Some(table) = crate::sys::net::nft_table(TABLE)? else { return Ok(None) };
    let theirs = table.comment.as_deref().and_then(subnet_of).unwrap_or("?");
    if theirs != subnet.to_string() {
        bail!(
            "jobs on this host already use network_subnet {theirs} (nftables table inet {TABLE}): \
             use the same network_subnet, or stop them and run `azp-sandbox gc`"
        );
    }
    Ok(Some((table.comment.unwrap_or_default(), table.handle)))
}

/// The elements this process added, and the handle of the table it added them to: a
/// firewall reload (`nft flush ruleset`) takes them with the table, and whoever makes
/// the table again makes it without them, so this process adds its own again.
static REGISTERED: std::sync::Mutex<Option<(Option<u64>, String)>> = std::sync::Mutex::new(None);

/// [`REGISTERED`], whatever a thread that panicked holding it left (a record to compare,
/// at worst a stale one: the elements are added again).
fn registered() -> std::sync::MutexGuard<'static, Option<(Option<u64>, String)>> {
    REGISTERED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `extra` must be added to the table with `handle`: not when this process added
/// the same to the same table (a table without a handle, never: kernels before 4.16 omit
/// it, and there each job adds the elements again, which `add element` allows).
fn to_register(registered: &Option<(Option<u64>, String)>, handle: Option<u64>, extra: &str) -> bool {
    !extra.is_empty() && (handle.is_none() || registered.as_ref() != Some(&(handle, extra.to_string())))
}

/// Removes the table when no job link exists (waiting up to `grace` for the links of
/// jobs just ended: the kernel removes them with their namespace, asynchronously), and
/// turns IPv4 forwarding back off when the table turned it on. What was removed, or None.
pub fn remove_if_unused(grace: std::time::Duration) -> Result<Option<String>> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    // A process that cannot list this namespace's tables (root of a user namespace of its
    // own: a rootless gc) has nothing here to undo, whatever the record says.
    let Ok(table) = crate::sys::net::nft_table(TABLE) else { return Ok(None) };
    if table.is_none() && forward_record::read().is_empty() {
        return Ok(None);
    }
    let _lock = lock()?;
    // Looked up again under the lock: a concurrent gc may have removed it meanwhile. A
    // record without a table: a firewall reload removed the table, not the settings.
    let table = crate::sys::net::nft_table(TABLE).unwrap_or(None);
    let record = forward_record::read();
    if table.is_none() && record.is_empty() {
        return Ok(None);
    }
    let comment = table.clone().and_then(|t| t.comment);
    // No process that uses the table may be alive (an `exec`, a `run`, their helpers).
    let users = match nix::fcntl::Flock::lock(open_users_lock()?, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
            tracing::debug!("jobs' network: the table is in use by a running azp-sandbox: it stays");
            return Ok(None);
        }
        Err((_, e)) => anyhow::bail!("cannot lock {USERS_LOCK}-*.lock: {e}"),
    };
    let deadline = std::time::Instant::now() + grace;
    loop {
        let links = job_links()?;
        if links.is_empty() {
            break;
        }
        if std::time::Instant::now() >= deadline {
            tracing::debug!("jobs' network: {} job link(s) left ({}): the table stays", links.len(), links.join(", "));
            return Ok(None);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut what = String::new();
    let mut uplinks = record.uplinks.clone();
    if table.is_some() {
        let nft = nft()?;
        for link in v6_uplinks(&nft) {
            if !uplinks.contains(&link) {
                uplinks.push(link);
            }
        }
        run_nft(&nft, &format!("delete table inet {TABLE}\n"))?;
        what = format!("nftables table inet {TABLE}");
    } else {
        what.push_str("the jobs' host forwarding (a firewall reload removed their table)");
    }
    if record.ip_forward || comment.as_deref().is_some_and(|c| c.contains(FORWARDING_WAS_OFF)) {
        forwarding::set_ipv4_forwarding(false)?;
        what.push_str(" (IPv4 forwarding turned back off)");
    }
    let mut turned_off = vec![];
    for link in uplinks {
        // A link that is gone took its setting with it.
        if forwarding::set_uplink_force_forwarding(&link, false)? {
            turned_off.push(link);
        }
    }
    if !turned_off.is_empty() {
        what.push_str(&format!(" (IPv6 force_forwarding turned back off on {})", turned_off.join(", ")));
    }
    forward_record::remove()?;
    drop(users);
    Ok(Some(what))
}

/// The host ends of jobs' veth pairs in this namespace.
pub fn job_links() -> Result<Vec<String>> {
    Ok(crate::sys::net::links()?.into_iter().map(|(_, n)| n).filter(|n| super::is_job_link(n)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by another open file (this process's: flock locks belong to open files), the
    /// lock is waited for quietly for `patience`, then the wait names the holders (this
    /// process) and goes on until the holder lets go.
    #[test]
    fn a_long_wait_for_the_lock_names_who_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("network.lock");
        let open = || std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).unwrap();
        let held = nix::fcntl::Flock::lock(open(), nix::fcntl::FlockArg::LockShared).unwrap();
        let (told_tx, told_rx) = std::sync::mpsc::channel::<String>();
        let waiter = {
            let (file, path) = (open(), path.clone());
            std::thread::spawn(move || {
                lock_naming_holders(file, &path, std::time::Duration::from_millis(50), |h| {
                    told_tx.send(h.to_string()).unwrap()
                })
                .map(|_| ())
            })
        };
        let told = told_rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the wait said who holds the lock");
        assert!(told.contains(&format!("pid {} (", std::process::id())), "{told}");
        assert!(!waiter.is_finished(), "it waits on after saying so");
        drop(held);
        waiter.join().unwrap().expect("locked once the holder let go");
    }

    /// Free, the lock is taken at once, with nothing said.
    #[test]
    fn a_free_lock_is_taken_without_a_word() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("network.lock");
        let file = std::fs::File::create(&path).unwrap();
        let locked = lock_naming_holders(file, &path, std::time::Duration::from_secs(5), |h| {
            panic!("told of holders of a free lock: {h}")
        });
        assert!(locked.is_ok());
    }

    fn net() -> Ipv4Net {
        Ipv4Net::new(Ipv4Addr::new(10, 87, 0, 0), 16)
    }

    #[test]
    fn the_table_text() {
        let s = script(net(), Ipv4Addr::new(10, 87, 0, 1), &dns(Ipv4Addr::new(127, 0, 0, 53)), true, Limits::ALL);
        assert!(
            s.starts_with(
                "table inet azp-sandbox {\n  comment \"azp-sandbox jobs: subnet 10.87.0.0/16, ipv6, own-dnat, flows, flow-rate, dns-rate, nexthops, ip_forward was 0\"\n"
            ),
            "{s}"
        );
        assert!(s.contains("elements = { udp . 53 : 127.0.0.53, tcp . 53 : 127.0.0.53 }"), "{s}");
        assert!(s.contains("iifname \"azp*\" ip daddr 10.87.0.1 dnat ip to meta l4proto . th dport map @host_services"));
        assert!(
            s.contains("iifname \"azp*\" ip daddr { 169.254.0.0/16, 168.63.129.16, 10.87.0.0/16 } reject with icmpx")
        );
        // Only the table's own forwarded connections pass to the host (input) and past
        // the blocked destinations (forward: a resolver on a link-local address).
        assert!(s.contains("set service_targets { type inet_proto . inet_service . ipv4_addr; elements = { udp . 53 . 127.0.0.53, tcp . 53 . 127.0.0.53 }"), "{s}");
        let own = "iifname \"azp*\" ct status dnat ct original ip daddr 10.87.0.1 meta l4proto . th dport . ip daddr @service_targets accept";
        assert_eq!(s.matches(own).count(), 2, "{s}");
        assert!(!s.contains("iifname \"azp*\" ct status dnat accept"), "{s}");
        let (input, forward) = (s.find("chain input").unwrap(), s.find("chain forward").unwrap());
        let in_input = &s[input..forward];
        assert!(in_input.find(own).unwrap() < in_input.find("iifname \"azp*\" drop").unwrap(), "{s}");
        let in_forward = &s[forward..];
        assert!(in_forward.find(own).unwrap() < in_forward.find("reject").unwrap(), "{s}");
        assert!(
            s.contains("meta nfproto ipv4 iifname != \"azp*\" oifname != \"azp*\" drop"),
            "IPv4 forwarding was off: only ours is forwarded (IPv6 routing of a host that routes it untouched)"
        );
        assert!(s.contains("iifname \"azp*\" meta nfproto ipv6 fib saddr . iif oif missing drop"), "{s}");
        assert!(
            s.contains(
                "iifname \"azp*\" ip6 daddr { fe80::/10, fd61:7a70:7362::/64, fd00:ec2::254/128, fd20:ce::254/128 } \
                 reject with icmpx type admin-prohibited"
            ),
            "{s}"
        );
        assert!(s.contains("iifname @v6_uplinks oifname != \"azp*\" drop"), "{s}");
        assert!(!s.contains("nfproto ipv6 drop"), "{s}");
        assert!(s.ends_with("  }\n}\n"));
        let s = script(net(), Ipv4Addr::new(10, 87, 0, 1), &[], false, Limits::ALL);
        assert!(!s.contains("elements") && !s.contains("iifname != \"azp*\" oifname"), "{s}");
        assert_eq!(subnet_of("azp-sandbox jobs: subnet 10.87.0.0/16, ip_forward was 0"), Some("10.87.0.0/16"));
        assert_eq!(subnet_of("azp-sandbox jobs: subnet 10.9.0.0/16"), Some("10.9.0.0/16"));
        assert_eq!(subnet_of("azp-sandbox jobs: subnet 10.9.0.0/16, ipv6"), Some("10.9.0.0/16"));
    }

    #[test]
    fn each_job_gets_its_share_of_connection_tracking() {
        assert_eq!(flows_per_job(262_144), 4_096);
        assert_eq!(flows_per_job(65_536), 1_024);
        assert_eq!(flows_per_job(1_000), MIN_FLOWS, "a very small table still leaves a job room");
        let s = flows_script(4_096);
        assert!(s.contains("add set inet azp-sandbox job_flows { type ifname; flags dynamic; size 65535; }\n"), "{s}");
        // In both chains a job's new flow meets (after the rate, below): to the host's forwarded services
        // (input) and to the world (forward).
        for chain in ["input", "forward"] {
            let rule = format!(
                "insert rule inet azp-sandbox {chain} iifname \"azp*\" ct state new ct status & confirmed == 0 \
                 add @job_flows {{ iifname ct count over 4096 }} jump over_flows\n"
            );
            assert!(s.contains(&rule), "{s}");
        }
        assert!(!s.contains("prerouting"), "Linux before 5.11 refuses reject there: {s}");
        // Past a burst of its limit, a job's new flows are rated before they are counted
        // (each count walks the job's connections): the rate's insert comes last, so it
        // is first in both chains.
        assert!(
            s.contains("add set inet azp-sandbox job_new_flows { type ifname; flags dynamic,timeout; timeout 1h; size 65535; }\n"),
            "{s}"
        );
        for chain in ["input", "forward"] {
            let rate = format!(
                "insert rule inet azp-sandbox {chain} iifname \"azp*\" ct state new ct status & confirmed == 0 update @job_new_flows \
                 {{ iifname limit rate over 100/second burst 4096 packets }} jump over_rate\n"
            );
            let count = format!(
                "insert rule inet azp-sandbox {chain} iifname \"azp*\" ct state new ct status & confirmed == 0 add @job_flows"
            );
            assert!(s.find(&count).unwrap() < s.find(&rate).unwrap(), "{s}");
        }
        for (chain, why) in [
            ("over_flows", "is at its limit of 4096 connections"),
            ("over_rate", "opens more than 100 connections a second"),
        ] {
            let log = s.find(&format!("add rule inet azp-sandbox {chain} limit rate 1/minute burst 1 packets log prefix \"azp-sandbox: a job {why}: \"")).unwrap();
            let reject = s
                .find(&format!("add rule inet azp-sandbox {chain} counter reject with icmpx type admin-prohibited\n"))
                .unwrap();
            assert!(log < reject, "said, at most once a minute, then refused and counted: {s}");
        }
        // A job's packets and bytes to port 53, each (not only a flow's first), first in
        // both chains: dropped past the rate, and counted.
        assert!(
            s.contains(
                "add set inet azp-sandbox job_dns { type ifname; flags dynamic,timeout; timeout 1h; size 65535; }\n"
            ),
            "{s}"
        );
        for chain in ["input", "forward"] {
            let dns = format!(
                "insert rule inet azp-sandbox {chain} iifname \"azp*\" \
                 meta l4proto {{ tcp, udp }} th dport 53 update @job_dns {{ iifname limit rate over 200/second burst 1000 packets }} \
                 jump over_dns\n"
            );
            let rate = format!("insert rule inet azp-sandbox {chain} iifname \"azp*\" ct state new ct status & confirmed == 0 update @job_new_flows");
            let bytes = format!(
                "insert rule inet azp-sandbox {chain} iifname \"azp*\" meta l4proto {{ tcp, udp }} th dport 53 \
                 update @job_dns_bytes {{ iifname limit rate over 32 kbytes/second burst 128 kbytes }} jump over_dns\n"
            );
            assert!(s.find(&rate).unwrap() < s.find(&dns).unwrap(), "{s}");
            assert!(s.find(&dns).unwrap() < s.find(&bytes).unwrap(), "{s}");
        }
        assert!(s.contains("add rule inet azp-sandbox over_dns counter drop\n"), "{s}");
    }

    #[test]
    fn an_older_table_is_said_with_what_it_lacks() {
        let now = comment(net(), false, Limits::ALL);
        assert_eq!(outdated(&now), None);
        const NEIGHBOURS: &str = "does not limit how many of the host's neighbours each job makes it resolve \
                                  (a job can fill its neighbour table)";
        assert_eq!(
            outdated("azp-sandbox jobs: subnet 10.87.0.0/16, ipv6, own-dnat").as_deref(),
            Some(
                format!(
                    "does not limit each job's tracked connections, how fast it opens them, or its DNS queries, \
                     and {NEIGHBOURS}"
                )
                .as_str()
            )
        );
        assert_eq!(
            outdated("azp-sandbox jobs: subnet 10.87.0.0/16, ipv6, own-dnat, flows").as_deref(),
            Some(
                format!(
                    "does not limit how fast each job opens connections (a job at its limit can keep a CPU busy), \
                     and does not limit each job's DNS queries (a job can keep the host's resolver busy), and {NEIGHBOURS}"
                )
                .as_str()
            )
        );
        assert_eq!(
            outdated("azp-sandbox jobs: subnet 10.87.0.0/16, ipv6, own-dnat, flows, flow-rate").as_deref(),
            Some(
                format!(
                    "does not limit each job's DNS queries (a job can keep the host's resolver busy), and {NEIGHBOURS}"
                )
                .as_str()
            )
        );
        assert_eq!(
            outdated("azp-sandbox jobs: subnet 10.87.0.0/16, ipv6, own-dnat, flows, flow-rate, dns-rate").as_deref(),
            Some(NEIGHBOURS)
        );
        let both = outdated("azp-sandbox jobs: subnet 10.87.0.0/16, ipv6").unwrap();
        assert!(both.starts_with("lets jobs reach host services other DNAT rules forward to, and does not"), "{both}");
        assert_eq!(outdated("azp-sandbox jobs: subnet 10.87.0.0/16"), None, "said where IPv6 is decided");
    }

    #[test]
    fn a_table_whose_limits_failed_says_so_in_its_comment_and_is_made_again_without_them() {
        let no_flows = comment(net(), false, Limits { flows: false, nexthops: true });
        assert_eq!(no_flows, "azp-sandbox jobs: subnet 10.87.0.0/16, ipv6, own-dnat, nexthops");
        assert_eq!(
            outdated(&no_flows).as_deref(),
            Some("does not limit each job's tracked connections, how fast it opens them, or its DNS queries")
        );
        let neither = comment(net(), true, Limits { flows: false, nexthops: false });
        assert_eq!(neither, "azp-sandbox jobs: subnet 10.87.0.0/16, ipv6, own-dnat, ip_forward was 0");
        assert!(outdated(&neither).unwrap().ends_with("(a job can fill its neighbour table)"), "{neither}");
        // One transaction: the table replaced, with what did not fail.
        let table = script(net(), Ipv4Addr::new(10, 87, 0, 1), &[], false, Limits { flows: true, nexthops: false });
        let s = remake_script(&table, Some(4_096), false);
        assert!(s.starts_with(&format!("delete table inet azp-sandbox\n{table}")), "{s}");
        assert!(s.ends_with(&flows_script(4_096)), "{s}");
        assert!(!s.contains("nexthop"), "{s}");
        let s = remake_script(&table, None, true);
        assert!(s.ends_with(&crate::sandbox::network::nexthops::script()), "{s}");
        assert!(!s.contains("ct count"), "{s}");
    }

    #[test]
    fn the_uplinks_are_read_back_from_the_set() {
        let text = "table inet azp-sandbox {\n\tset v6_uplinks {\n\t\ttype ifname\n\t\telements = { \"eth0\",\n\t\t\t     \"wlan1\" }\n\t}\n}\n";
        assert_eq!(quoted_elements(text), ["eth0", "wlan1"]);
        assert!(quoted_elements("table inet azp-sandbox {\n\tset v6_uplinks {\n\t\ttype ifname\n\t}\n}\n").is_empty());
    }

    #[test]
    fn elements_of_a_run() {
        let proxy = HostService { proto: Proto::Tcp, port: 3128, target: Ipv4Addr::LOCALHOST };
        let allow: Vec<NetworkAllow> = vec!["169.254.169.254:80".parse().unwrap(), "10.1.1.1".parse().unwrap()];
        assert_eq!(
            elements(&[proxy], 77, &allow),
            "add element inet azp-sandbox host_services { tcp . 3128 : 127.0.0.1 }\n\
             add element inet azp-sandbox service_targets { tcp . 3128 . 127.0.0.1 }\n\
             add element inet azp-sandbox allow_port { 77 . 169.254.169.254 . 80 }\n\
             add element inet azp-sandbox allow_addr { 77 . 10.1.1.1 }\n"
        );
    }

    #[test]
    fn a_runs_elements_are_added_once_per_table() {
        let extra = "add element inet azp-sandbox allow_addr { 77 . 10.1.1.1 }\n";
        assert!(to_register(&None, Some(7), extra), "the first time");
        let done = Some((Some(7), extra.to_string()));
        assert!(!to_register(&done, Some(7), extra), "the same table: nothing to add (every job asks)");
        assert!(to_register(&done, Some(9), extra), "a table made again after a firewall reload");
        assert!(to_register(&done, Some(7), "add element inet azp-sandbox allow_addr { 78 . 10.1.1.2 }\n"));
        assert!(to_register(&done, None, extra), "a table whose handle is unknown");
        assert!(!to_register(&None, Some(7), ""), "nothing to add");
    }
}
