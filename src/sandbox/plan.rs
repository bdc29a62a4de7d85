//! What one job's sandbox must look like: everything the helper needs, decided by the
//! caller (exec or the agent manager) before any privileged work starts.

use crate::config::{Network, Volume};
use crate::edits::ContainerEdits;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The limits a job runs with, each None when it has none (said `unlimited`, or not
/// enforceable here). Decided before the job starts (see [`super::limits::resolve`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Memory (and, where the kernel accounts swap, memory + swap: no swap beyond it).
    pub memory_bytes: Option<u64>,
    pub pids: Option<i64>,
    /// CPUs as a fraction (e.g. 1.5); enforced as a CFS quota.
    pub cpus_milli: Option<u64>,
    /// Project quota on the job's writable layer (upper and work dirs), in bytes.
    #[serde(default)]
    pub disk_bytes: Option<u64>,
    /// ... and in inodes (files and dirs), so that no job can use up the home's inodes.
    #[serde(default)]
    pub disk_inodes: Option<u64>,
    /// How the home's filesystem enforces `disk_bytes` (None with a limit: a project
    /// quota, as plans written before btrfs qgroups).
    #[serde(default)]
    pub disk_mechanism: Option<crate::sys::Mechanism>,
    /// Size of the job's `/tmp` tmpfs (None: the kernel's default, half the RAM).
    #[serde(default)]
    pub tmp_bytes: Option<u64>,
    /// Size of the job's `/dev/shm` tmpfs (None: 1 GiB).
    #[serde(default)]
    pub shm_bytes: Option<u64>,
    /// The job's socket buffers (TCP and UDP), where its cgroup can limit them apart
    /// from its memory (cgroup v1; see `limits::defaults`). None: no limit of their own.
    #[serde(default)]
    pub socket_bytes: Option<u64>,
    /// The most pseudo-terminals the job's devpts gives (its `max=`): a share of the
    /// node's, which every container's devpts draws from (see `limits::defaults`).
    #[serde(default)]
    pub ptys: Option<u64>,
    /// The job's huge pages (`MAP_HUGETLB`, hugetlbfs), where its cgroup can limit them
    /// (the hugetlb controller): none by default, as they count in no memory limit (see
    /// `limits::defaults`). None: no limit.
    #[serde(default)]
    pub huge_pages: Option<HugePages>,
}

/// A limit on a job's huge pages: at most `bytes` of each of the node's page `sizes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HugePages {
    pub bytes: u64,
    pub sizes: HugePageSizes,
}

/// The node's huge page sizes, as a set: bit n is a size of 2^n KiB (every size Linux has
/// is a power of two, from 64 KiB to 16 GiB), so that [`Limits`] stays `Copy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HugePageSizes(pub u32);

impl HugePageSizes {
    /// The set of `kib` sizes (others than powers of two from 1 KiB to 2 TiB are left out).
    pub fn of(kib: impl IntoIterator<Item = u64>) -> HugePageSizes {
        HugePageSizes(kib.into_iter().filter(|k| k.is_power_of_two() && *k < 1 << 31).fold(0, |set, k| set | k as u32))
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Each size as the hugetlb controller names it in its files (`hugetlb.2MB.max`): in
    /// GB, MB or KB, the largest unit that divides it (the kernel's `mem_fmt`).
    pub fn cgroup_names(self) -> impl Iterator<Item = String> {
        (0..31).filter(move |n| self.0 & (1 << n) != 0).map(|n| {
            let kib = 1u64 << n;
            match kib {
                k if k >= 1 << 20 => format!("{}GB", k >> 20),
                k if k >= 1 << 10 => format!("{}MB", k >> 10),
                k => format!("{k}KB"),
            }
        })
    }
}

impl std::fmt::Display for Limits {
    /// One line for logs and `status`: `memory 4.0G, pids 4096, cpus 2, disk 50.0G, /tmp
    /// 4.0G, /dev/shm 2.0G[, socket buffers 1.0G][, ptys 1536][, huge pages 0]`, "unlimited"
    /// where a limit is absent.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let size = |b: Option<u64>| b.map(crate::config::human_size).unwrap_or_else(|| "unlimited".into());
        let cpus = self.cpus_milli.map(|m| format!("{}", m as f64 / 1000.0)).unwrap_or_else(|| "unlimited".into());
        let pids = self.pids.map(|p| p.to_string()).unwrap_or_else(|| "unlimited".into());
        write!(f, "memory {}, pids {pids}, cpus {cpus}, disk {}", size(self.memory_bytes), size(self.disk_bytes))?;
        if let Some(i) = self.disk_inodes {
            write!(f, " ({i} inodes)")?;
        }
        if let (Some(_), Some(m @ crate::sys::Mechanism::BtrfsQgroup)) = (self.disk_bytes, self.disk_mechanism) {
            write!(f, " ({})", m.name())?;
        }
        let tmp = self.tmp_bytes.map(crate::config::human_size).unwrap_or_else(|| "half the RAM".into());
        let shm = self.shm_bytes.map(crate::config::human_size).unwrap_or_else(|| "1.0G".into());
        write!(f, ", /tmp {tmp}, /dev/shm {shm}")?;
        if let Some(b) = self.socket_bytes {
            write!(f, ", socket buffers {}", crate::config::human_size(b))?;
        }
        if let Some(n) = self.ptys {
            write!(f, ", ptys {n}")?;
        }
        match self.huge_pages {
            Some(h) => write!(f, ", huge pages {}", crate::config::human_size(h.bytes)),
            None => Ok(()),
        }
    }
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
    /// The network's settings, and what the helper made for the spec (see
    /// [`super::network`]).
    #[serde(default)]
    pub net: super::network::job::JobNetwork,
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
    /// How the command runs: under the jobs' init, with or without a terminal.
    #[serde(default)]
    pub process: ProcessPlan,
    /// The job's own user namespace and host ids (see [`crate::identity`]), set by
    /// `Sandbox::create`; None: host ids (`--userns host`).
    #[serde(default)]
    pub userns: Option<crate::identity::JobIds>,
    /// A host dir of the job's own, bound read-write (the agent's work folder on a scratch
    /// filesystem; see [`ScratchDir`]).
    #[serde(default)]
    pub scratch: Option<ScratchDir>,
    /// Caches mounted as copy-on-write views of their snapshots (see [`crate::cache`]).
    #[serde(default)]
    pub caches: Vec<crate::cache::CacheMount>,
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

/// How a job's command runs (see [`super::init`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessPlan {
    /// The init on the host ([`super::init::ensure`]), bound read-only into the job and run
    /// as its pid 1 with the command as its arguments; it also installs the job's seccomp
    /// filter. Set by `Sandbox::create`; a plan without it has no spec and no tree
    /// (see [`JobPlan::init`]).
    pub init: Option<PathBuf>,
    /// A pseudo-terminal of the job's own (`exec -t`, `shell`): its master comes to the
    /// runner through the job's console socket and is relayed to the user's terminal.
    pub terminal: bool,
}

impl JobPlan {
    /// The init on the host: a plan without it is refused (no job runs without its
    /// seccomp filter).
    pub fn init(&self) -> anyhow::Result<&std::path::Path> {
        let init = self.process.init.as_deref();
        init.ok_or_else(|| anyhow::anyhow!("a job needs its init (azp-init), which installs its seccomp filter"))
    }

    /// In a user namespace of its own or the process's (rootless): device nodes are bound,
    /// /sys is the host's (a fresh sysfs needs a network namespace the job's user
    /// namespace owns).
    pub fn in_user_namespace(&self) -> bool {
        self.rootless || self.userns.is_some()
    }
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
        net: Default::default(),
        edits: Default::default(),
        cgroup_path: cgroup_path.into(),
        owned_dirs: vec![],
        rootless: false,
        // What `Sandbox::create` sets (a spec needs it); the doubles never run it.
        process: ProcessPlan { init: Some("/home/cache/init/azp-init-test".into()), terminal: false },
        userns: None,
        scratch: None,
        caches: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_page_sizes_named_as_the_hugetlb_controller_names_them() {
        let every = HugePageSizes::of([64, 2048, 32768, 1 << 20, 16 << 20]);
        assert_eq!(every.cgroup_names().collect::<Vec<_>>(), ["64KB", "2MB", "32MB", "1GB", "16GB"]);
        assert!(HugePageSizes::of([3000, 0, 1 << 40]).is_empty(), "no size of Linux's");
        assert!(HugePageSizes::default().is_empty());
        assert_eq!(HugePageSizes::of([2048, 2048]), HugePageSizes::of([2048]));
    }
}
