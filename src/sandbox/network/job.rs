//! A job's network settings as its plan carries them: plain data, apart from the
//! network's logic in [`super`] (which reads the plan, so the plan must not read it).

use crate::config::NetworkAllow;
use crate::sys::net::Ipv4Net;
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::path::PathBuf;

/// Where jobs' addresses come from by default (root mode).
pub const DEFAULT_SUBNET: Ipv4Net = Ipv4Net { addr: Ipv4Addr::new(10, 87, 0, 0), prefix: 16 };
/// TCP ports on the host's loopback jobs reach: `(port, host address)`.
pub type HostPorts = Vec<(u16, Ipv4Addr)>;

/// A job's network settings (in its plan), and what the helper made for its spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobNetwork {
    /// Blocked destinations the job may reach.
    #[serde(default)]
    pub allow: Vec<NetworkAllow>,
    /// None: [`DEFAULT_SUBNET`].
    #[serde(default)]
    pub subnet: Option<Ipv4Net>,
    /// TCP ports of services on the host's loopback (a proxy) the job reaches: root mode
    /// at its gateway, rootless at its own loopback (pasta `-T`). `(port, host address)`.
    #[serde(default)]
    pub host_ports: HostPorts,
    /// Outbound IPv6 too (root mode; decided once per exec or run: see `super::ipv6`).
    #[serde(default)]
    pub ipv6: bool,
    /// The dir of the host namespace's markers of addresses whose tracked connections
    /// are not forgotten yet (root mode, isolated; see `super::forget`): set with the
    /// host's table, in the host's namespace.
    #[serde(default)]
    pub connection_markers: Option<PathBuf>,
    /// Made by the helper: a sysfs of the job's namespace, and the job's resolv.conf.
    #[serde(default)]
    pub sysfs: Option<PathBuf>,
    #[serde(default)]
    pub resolv_conf: Option<PathBuf>,
}

impl JobNetwork {
    pub fn subnet(&self) -> Ipv4Net {
        self.subnet.unwrap_or(DEFAULT_SUBNET)
    }
    /// The jobs' gateway: the subnet's first address (never a job's).
    pub fn gateway(&self) -> Ipv4Addr {
        self.subnet().nth(1)
    }
}
