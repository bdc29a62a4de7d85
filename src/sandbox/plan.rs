//! What one job's sandbox must look like: everything the helper needs, decided by the
//! caller (exec or the agent manager) before any privileged work starts.

use crate::config::{Network, Volume};
use crate::edits::ContainerEdits;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub memory_bytes: Option<u64>,
    pub pids: Option<i64>,
    /// CPUs as a fraction (e.g. 1.5); enforced as a CFS quota.
    pub cpus_milli: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPlan {
    /// Unique job id; also the container id and the cgroup leaf name.
    pub id: String,
    /// Read-only lower layers, topmost first (e.g. [agent package, rootfs tree]).
    pub lower: Vec<PathBuf>,
    pub args: Vec<String>,
    /// Environment (`KEY`, `VALUE`) in order; later entries override earlier ones.
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub hostname: String,
    pub volumes: Vec<Volume>,
    pub limits: Limits,
    pub network: Network,
    /// Device, mount and env edits from GPU discovery or CDI.
    pub edits: ContainerEdits,
    /// Cgroup path relative to the cgroup root (v1: below each controller).
    pub cgroup_path: PathBuf,
    /// Dirs (container paths, existing in a lower layer) the job's user must own, e.g. the
    /// agent's root: chowned in the job's upper layer (a metadata-only copy-up) before start.
    #[serde(default)]
    pub owned_dirs: Vec<PathBuf>,
    /// Created inside a user namespace (rootless mode): set by `Sandbox::create` from
    /// [`crate::rootless::mode`]. Changes the overlay options and the spec (see spec.rs).
    #[serde(default)]
    pub rootless: bool,
    /// A host dir of the job's own, bound read-write (the agent's work folder on a scratch
    /// filesystem; see [`ScratchDir`]).
    #[serde(default)]
    pub scratch: Option<ScratchDir>,
}

/// A per-job host dir bound read-write into the sandbox, e.g. the agent's `_work` on a
/// node's local NVMe: made empty by `Sandbox::create` (its parent must exist), given to
/// the job's user by the helper, removed by the teardown, and by gc after a crash (the
/// job's record names it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScratchDir {
    /// On the host; its name is the job's (`<parent>/<job id>`).
    pub host: PathBuf,
    /// Where the job sees it.
    pub container: PathBuf,
}

/// Default PATH, as Docker sets it.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A plan for unit tests: `args` is `true`, as the calling user, no cgroup limits.
#[cfg(test)]
pub(crate) fn test_plan(id: &str, lower: Vec<PathBuf>, cgroup_path: &str) -> JobPlan {
    JobPlan {
        id: id.into(),
        lower,
        args: vec!["true".into()],
        env: vec![],
        cwd: "/".into(),
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
        hostname: id.into(),
        volumes: vec![],
        limits: Limits::default(),
        network: Default::default(),
        edits: Default::default(),
        cgroup_path: cgroup_path.into(),
        owned_dirs: vec![],
        rootless: false,
        scratch: None,
    }
}
