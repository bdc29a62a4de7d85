//! Where a sandbox's cgroup goes, and whether its limits can be enforced.
//!
//! As root: below `/azp-sandbox` (or `--cgroup-parent`). Rootless: only where an
//! administrator delegated a subtree to the user:
//! - cgroup v2 (systemd): the user's `user@UID.service` is delegated; jobs go below
//!   `<that>/azp-sandbox` when it offers the memory and pids controllers;
//! - cgroup v1: nothing is delegated by default; `scripts/delegate-cgroups.sh USER`
//!   pre-creates `/azp-sandbox/user-UID` in every controller hierarchy, owned by the user
//!   (libcontainer joins every mounted v1 hierarchy, so every one must be delegated).
//!
//! Without delegation the sandbox still runs (the pid namespace still kills every job
//! process at the end) but memory/pids/cpu limits are NOT enforced, and we say so loudly
//! at start and in `status` (youki would silently skip them).

use std::path::{Path, PathBuf};

/// The cgroup decision for this process's sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupPlacement {
    /// Jobs get `<parent>/<job id>` with their limits.
    Enforced { parent: PathBuf },
    /// Jobs get no cgroup; `why` says what is missing and how to fix it.
    NotEnforced { why: String },
}

impl CgroupPlacement {
    pub fn parent(&self) -> Option<&Path> {
        match self {
            CgroupPlacement::Enforced { parent } => Some(parent),
            CgroupPlacement::NotEnforced { .. } => None,
        }
    }
}

/// The default parent as root.
pub const ROOT_PARENT: &str = "/azp-sandbox";

/// The v1 parent an administrator delegates to `uid` (scripts/delegate-cgroups.sh).
pub fn v1_delegated_parent(uid: u32) -> PathBuf {
    PathBuf::from(format!("{ROOT_PARENT}/user-{uid}"))
}

/// What the host looks like, read once (a trait-free struct so tests build fake trees).
#[derive(Debug, Clone)]
pub struct CgroupHost {
    /// cgroup v2 only (mounted at `root`).
    pub unified: bool,
    /// v1: the mount points of the hierarchies a job's cgroup is made in (see
    /// [`v1_controller_mounts`]).
    pub v1_mounts: Vec<PathBuf>,
    /// The cgroup fs root (`/sys/fs/cgroup`).
    pub root: PathBuf,
    /// This process's v2 cgroup path (the `0::` line of /proc/self/cgroup).
    pub own_v2: Option<PathBuf>,
    /// This process's v1 cgroups: each hierarchy's controllers as /proc/self/cgroup
    /// names them (`cpu,cpuacct`), and the path in it.
    pub own_v1: Vec<(String, PathBuf)>,
    /// Where the cgroup2 hierarchy is mounted: `root` on a v2 host, `<root>/unified` on a
    /// hybrid one, None on a v1-only host.
    pub v2_mount: Option<PathBuf>,
}

impl CgroupHost {
    /// One read of /proc/self/mountinfo (libcgroups' helpers re-read it per controller,
    /// which shows up on the job start path).
    pub fn detect() -> CgroupHost {
        use libcgroups::common::CgroupSetup;
        let root = PathBuf::from(libcgroups::common::DEFAULT_CGROUP_ROOT);
        let unified = matches!(libcgroups::common::get_cgroup_setup(), Ok(CgroupSetup::Unified));
        let (v1_mounts, v2_mount) = if unified {
            (vec![], Some(root.clone()))
        } else {
            let info = crate::sys::procfile::read("/proc/self/mountinfo").unwrap_or_default();
            let v2 = cgroup2_mount(&info);
            // Without any cgroup2 mount libcontainer's own v1 manager makes the job's
            // cgroup, in every controller hierarchy: tear down what it made.
            let controllers = if v2.is_some() { JOB_V1_CONTROLLERS } else { ALL_V1_CONTROLLERS };
            (v1_controller_mounts(&info, controllers), v2)
        };
        let own = crate::sys::procfile::read("/proc/self/cgroup").unwrap_or_default();
        let own_v2 = own.lines().find_map(|l| l.strip_prefix("0::").map(PathBuf::from));
        let own_v1 = own_v1_cgroups(&own);
        CgroupHost { unified, v1_mounts, root, own_v2, own_v1, v2_mount }
    }
}

impl CgroupHost {
    /// [`CgroupHost::detect`], once per process: the cgroup mounts do not change under a
    /// running service. A forked helper inherits its runner's read, and the runner's
    /// teardown reuses it (one mountinfo read per `exec` instead of three, ~0.3 ms each).
    pub fn get() -> &'static CgroupHost {
        static HOST: std::sync::OnceLock<CgroupHost> = std::sync::OnceLock::new();
        HOST.get_or_init(CgroupHost::detect)
    }

    /// This process's own `cgroup.procs` in the cgroup2 hierarchy (None on a v1-only host,
    /// or where its path leaves the mount: `..` for a process outside its cgroup namespace).
    pub fn own_v2_procs(&self) -> Option<PathBuf> {
        Some(self.own_dir(self.v2_mount.as_deref()?)?.join("cgroup.procs"))
    }

    /// This process's own cgroup dir in `hierarchy` (the cgroup2 mount, or one of
    /// `v1_mounts`, named by its controllers). None where it is not known, or where its
    /// path leaves the mount (`..`: a process outside its cgroup namespace).
    pub fn own_dir(&self, hierarchy: &Path) -> Option<PathBuf> {
        use std::path::Component;
        let own = if Some(hierarchy) == self.v2_mount.as_deref() {
            self.own_v2.as_deref()?
        } else {
            fn controllers(names: &str) -> Vec<&str> {
                let mut v: Vec<&str> = names.split(',').collect();
                v.sort_unstable();
                v
            }
            let name = controllers(hierarchy.file_name()?.to_str()?);
            self.own_v1.iter().find(|(c, _)| controllers(c) == name)?.1.as_path()
        };
        let rel = own.strip_prefix("/").ok()?;
        rel.components().all(|c| matches!(c, Component::Normal(_))).then(|| hierarchy.join(rel))
    }

    /// cgroup v1 with swap accounting: the memory hierarchy has `memory.memsw.*` files
    /// (a kernel built without it, or booted with swapaccount=0, has none).
    pub fn v1_memsw(&self) -> bool {
        self.v1_memory_file("memory.memsw.limit_in_bytes")
    }

    /// Whether the v1 memory hierarchy has `file` (the kernel's features: swap
    /// accounting, a separate limit of socket buffers).
    pub fn v1_memory_file(&self, file: &str) -> bool {
        self.v1_memory_mount().is_some_and(|m| m.join(file).exists())
    }

    /// The v1 hierarchy of the memory controller, where one is mounted.
    pub fn v1_memory_mount(&self) -> Option<&Path> {
        self.v1_mounts
            .iter()
            .find(|m| m.file_name().is_some_and(|n| n.to_string_lossy().split(',').any(|c| c == "memory")))
            .map(PathBuf::as_path)
    }

    /// Every hierarchy a job's cgroup can have a dir in: the v1 mounts of the job's
    /// controllers ([`JOB_V1_CONTROLLERS`]) and the cgroup2 mount.
    pub fn hierarchies(&self) -> impl Iterator<Item = &Path> {
        self.v1_mounts.iter().map(PathBuf::as_path).chain(self.v2_mount.as_deref())
    }
}

/// The v1 lines of a /proc/self/cgroup (`ID:CONTROLLERS:PATH`; named hierarchies such
/// as `name=systemd` and the v2 line `0::` have no controllers of their own).
pub(crate) fn own_v1_cgroups(proc_self_cgroup: &str) -> Vec<(String, PathBuf)> {
    proc_self_cgroup
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            let named = controllers.is_empty() || controllers.starts_with("name=");
            (!named).then(|| (controllers.to_string(), PathBuf::from(path)))
        })
        .collect()
}

/// The cgroup v1 controllers whose hierarchies a job's cgroup is made in: those
/// azp-sandbox sets something in (limits, device rules; hugetlb as root only, see
/// [`ROOT_ONLY_V1_CONTROLLERS`]). In the other hierarchies (cpuset, blkio, freezer,
/// perf_event, net_cls, `name=systemd`, ...) the job stays in the service's cgroup, as a
/// systemd unit does for controllers it does not enable. Each hierarchy costs a mkdir, a
/// join and an rmdir per job (cpuset also a rebuild of the scheduler domains): ~0.3 ms
/// each on the test VM.
const JOB_V1_CONTROLLERS: &[&str] = &["cpu", "devices", "hugetlb", "memory", "pids"];

/// The v1 hierarchies of [`JOB_V1_CONTROLLERS`] a rootless job has no dir in: devices
/// (never delegated: a user namespace makes no device nodes anyway) and hugetlb (its
/// limit is root mode's, see `sandbox::limits::node::Hugetlb`; a host that mounted it
/// after `delegate-cgroups.sh` ran would otherwise lose its rootless limits altogether).
pub const ROOT_ONLY_V1_CONTROLLERS: &[&str] = &["devices", "hugetlb"];

/// Whether v1 hierarchy `mount` (named by its controllers) is one a rootless job has no
/// dir in.
pub fn root_only_v1(mount: &Path) -> bool {
    ROOT_ONLY_V1_CONTROLLERS.iter().any(|c| v1_has(mount, c))
}

/// Whether v1 hierarchy `mount` (its dir named by its controllers, `cpu,cpuacct`) has
/// `controller`, co-mounted ones included.
pub fn v1_has(mount: &Path, controller: &str) -> bool {
    mount.file_name().is_some_and(|n| n.to_string_lossy().split(',').any(|c| c == controller))
}

/// Every cgroup v1 controller (named hierarchies like `name=systemd` have none).
const ALL_V1_CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "hugetlb",
    "memory",
    "pids",
    "perf_event",
    "blkio",
    "net_cls",
    "net_prio",
    "freezer",
    "rdma",
    "misc",
];

/// Mount points of the v1 hierarchies with any of `controllers` in a mountinfo text,
/// sorted (`cpu,cpuacct` counts for `cpu`).
pub fn v1_controller_mounts(mountinfo: &str, controllers: &[&str]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mut post = post.split(' ');
            if post.next()? != "cgroup" {
                return None;
            }
            let opts = post.nth(1)?;
            let at = pre.split(' ').nth(4)?;
            opts.split(',').any(|o| controllers.contains(&o)).then(|| PathBuf::from(at))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The first mount point of the cgroup2 hierarchy in a mountinfo text.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split(' ').next()? != "cgroup2" {
            return None;
        }
        pre.split(' ').nth(4).map(PathBuf::from)
    })
}

/// Decides where jobs' cgroups go. `requested` is `--cgroup-parent`; `rootless` says
/// whether we depend on delegation; `host` is looked at only then (root mode needs no
/// look at the host's cgroups, and this runs before every exec); `writable` tells
/// whether a directory can be written by us (both injected for tests).
pub fn place(
    host: &dyn Fn() -> CgroupHost,
    requested: Option<&Path>,
    rootless: bool,
    uid: u32,
    writable: &dyn Fn(&Path) -> bool,
) -> CgroupPlacement {
    if !rootless {
        return CgroupPlacement::Enforced {
            parent: requested.map(Path::to_path_buf).unwrap_or_else(|| ROOT_PARENT.into()),
        };
    }
    let host = &host();
    if host.unified {
        place_v2(host, requested, writable)
    } else {
        let parent = requested.map(Path::to_path_buf).unwrap_or_else(|| v1_delegated_parent(uid));
        let rel = parent.strip_prefix("/").unwrap_or(&parent).to_path_buf();
        let missing: Vec<String> = host
            .v1_mounts
            .iter()
            .filter(|m| !v1_has(m, "hugetlb"))
            .map(|m| m.join(&rel))
            .filter(|d| !(d.is_dir() && writable(d)))
            .map(|d| d.display().to_string())
            .collect();
        if host.v1_mounts.is_empty() {
            return CgroupPlacement::NotEnforced { why: "no cgroup v1 controller is mounted".into() };
        }
        if missing.is_empty() {
            CgroupPlacement::Enforced { parent }
        } else {
            CgroupPlacement::NotEnforced {
                why: format!(
                    "no delegated cgroup ({}{} missing or not writable): an administrator runs \
                     `scripts/delegate-cgroups.sh {uid}` (cgroup v1) or enables systemd delegation (cgroup v2)",
                    missing[0],
                    if missing.len() > 1 { format!(" and {} more", missing.len() - 1) } else { String::new() }
                ),
            }
        }
    }
}

fn place_v2(host: &CgroupHost, requested: Option<&Path>, writable: &dyn Fn(&Path) -> bool) -> CgroupPlacement {
    let abs = |p: &Path| host.root.join(p.strip_prefix("/").unwrap_or(p));
    let delegated = match requested {
        Some(p) => {
            // The requested parent, or its nearest existing ancestor, must be ours.
            let mut at = p.to_path_buf();
            while !abs(&at).is_dir() && at.pop() {}
            (writable(&abs(&at)) && at != Path::new("/")).then(|| (at, p.to_path_buf()))
        }
        None => {
            // The topmost ancestor of our own cgroup that we may write: systemd's
            // user@UID.service when it delegates to the user.
            let own = host.own_v2.clone().unwrap_or_default();
            let mut best = None;
            let mut at = own.clone();
            loop {
                if at.as_os_str().is_empty() || at == Path::new("/") {
                    break;
                }
                if writable(&abs(&at)) {
                    best = Some(at.clone());
                } else if best.is_some() {
                    break;
                }
                if !at.pop() {
                    break;
                }
            }
            best.map(|b| (b.clone(), b.join("azp-sandbox")))
        }
    };
    let Some((owned, parent)) = delegated else {
        return CgroupPlacement::NotEnforced {
            why: "no delegated cgroup v2 subtree (none of this process's cgroup ancestors is writable): \
                  run under a systemd user service with Delegate=yes, or pass --cgroup-parent"
                .into(),
        };
    };
    let controllers = std::fs::read_to_string(abs(&owned).join("cgroup.controllers")).unwrap_or_default();
    let have: Vec<&str> = controllers.split_whitespace().collect();
    let lacking: Vec<&str> = ["memory", "pids", "cpu"].into_iter().filter(|c| !have.contains(c)).collect();
    if lacking.is_empty() {
        CgroupPlacement::Enforced { parent }
    } else {
        CgroupPlacement::NotEnforced {
            why: format!(
                "the delegated cgroup {} lacks the {} controller(s): set Delegate=memory pids cpu for user@.service",
                owned.display(),
                lacking.join(", ")
            ),
        }
    }
}

/// Where a root service's jobs go under systemd on a cgroup v2 host (see
/// [`service_cgroup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceCgroup {
    /// The unit delegates its cgroup (`Delegate=yes`): the manager moves itself into
    /// `manager_leaf` (cgroup v2 lets no process sit in a cgroup whose controllers are
    /// passed down) and the jobs' cgroups go below `unit`, so the unit's MemoryMax=,
    /// TasksMax= and `systemctl stop` cover them.
    Below { unit: PathBuf, manager_leaf: PathBuf },
    /// A systemd unit on cgroup v2 that does not delegate: jobs go below [`ROOT_PARENT`],
    /// outside the unit.
    NotDelegated { unit: PathBuf },
    /// Not cgroup v2 only, or not in a unit: the default layout.
    Elsewhere,
}

/// The leaf of a delegated unit's cgroup that the manager moves into.
pub const MANAGER_LEAF: &str = "manager";

/// Decides [`ServiceCgroup`] from this process's /proc/self/cgroup, the mount table and
/// whether a cgroup dir is delegated (systemd marks one with the `trusted.delegate` or
/// `user.delegate` xattr; read by [`crate::sys::cgroup::delegated`]). Pure.
pub fn service_cgroup(proc_self_cgroup: &str, mountinfo: &str, delegated: &dyn Fn(&Path) -> bool) -> ServiceCgroup {
    let root = Path::new(libcgroups::common::DEFAULT_CGROUP_ROOT);
    let unified = cgroup2_mount(mountinfo).as_deref() == Some(root)
        && v1_controller_mounts(mountinfo, ALL_V1_CONTROLLERS).is_empty();
    let own = proc_self_cgroup.lines().find_map(|l| l.strip_prefix("0::")).map(Path::new);
    let Some(own) = own.filter(|o| unified && *o != Path::new("/")) else { return ServiceCgroup::Elsewhere };
    let abs = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    // Already in the leaf (a manager started again in it): the unit is its parent.
    let unit = match (own.file_name(), own.parent()) {
        (Some(n), Some(parent)) if n == MANAGER_LEAF && delegated(&abs(parent)) => parent,
        _ => own,
    };
    if delegated(&abs(unit)) {
        return ServiceCgroup::Below { unit: unit.to_path_buf(), manager_leaf: unit.join(MANAGER_LEAF) };
    }
    let is_unit = unit.file_name().is_some_and(|n| {
        let n = n.to_string_lossy();
        n.ends_with(".service") || n.ends_with(".scope")
    });
    if is_unit {
        ServiceCgroup::NotDelegated { unit: unit.to_path_buf() }
    } else {
        ServiceCgroup::Elsewhere
    }
}

/// `access(W_OK)` for the real process.
pub fn writable(p: &Path) -> bool {
    nix::unistd::access(p, nix::unistd::AccessFlags::W_OK).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v1_host(root: &Path) -> CgroupHost {
        let mounts = ["memory", "pids", "cpu,cpuacct"].map(|c| root.join(c)).to_vec();
        for m in &mounts {
            std::fs::create_dir_all(m).unwrap();
        }
        CgroupHost {
            unified: false,
            v1_mounts: mounts,
            root: root.into(),
            own_v2: None,
            own_v1: vec![],
            v2_mount: None,
        }
    }

    #[test]
    fn own_cgroup_procs_in_the_cgroup2_hierarchy() {
        let host = |own: Option<&str>, v2: Option<&str>| CgroupHost {
            unified: false,
            v1_mounts: vec![],
            root: "/sys/fs/cgroup".into(),
            own_v2: own.map(PathBuf::from),
            own_v1: vec![],
            v2_mount: v2.map(PathBuf::from),
        };
        let hybrid = host(Some("/"), Some("/sys/fs/cgroup/unified"));
        assert_eq!(hybrid.own_v2_procs(), Some("/sys/fs/cgroup/unified/cgroup.procs".into()));
        let v2 = host(Some("/system.slice/azp.service/manager"), Some("/sys/fs/cgroup"));
        assert_eq!(v2.own_v2_procs(), Some("/sys/fs/cgroup/system.slice/azp.service/manager/cgroup.procs".into()));
        assert_eq!(host(None, None).own_v2_procs(), None, "v1 only: no cgroup2 file to write");
        assert_eq!(host(Some("/"), None).own_v2_procs(), None);
        assert_eq!(host(Some("/../../other"), Some("/sys/fs/cgroup")).own_v2_procs(), None, "outside the mount");
    }

    #[test]
    fn own_cgroup_dirs_in_each_hierarchy() {
        let own = "12:pids:/user.slice/user-0.slice\n\
                   11:cpu,cpuacct:/user.slice\n\
                   4:memory:/../../escaped\n\
                   1:name=systemd:/user.slice/user-0.slice/session-1.scope\n\
                   0::/user.slice/user-0.slice/session-1.scope\n";
        let cg = Path::new("/sys/fs/cgroup");
        let host = CgroupHost {
            unified: false,
            v1_mounts: ["cpuacct,cpu", "memory", "pids", "devices"].map(|m| cg.join(m)).to_vec(),
            root: cg.into(),
            own_v2: own.lines().find_map(|l| l.strip_prefix("0::").map(PathBuf::from)),
            own_v1: own_v1_cgroups(own),
            v2_mount: Some(cg.join("unified")),
        };
        assert_eq!(host.own_v1.len(), 3, "{:?}: no named hierarchy, no v2 line", host.own_v1);
        assert_eq!(host.own_dir(&cg.join("pids")), Some(cg.join("pids/user.slice/user-0.slice")));
        assert_eq!(host.own_dir(&cg.join("cpuacct,cpu")), Some(cg.join("cpuacct,cpu/user.slice")), "any order");
        assert_eq!(host.own_dir(&cg.join("unified")), Some(cg.join("unified/user.slice/user-0.slice/session-1.scope")));
        assert_eq!(host.own_dir(&cg.join("memory")), None, "outside the mount");
        assert_eq!(host.own_dir(&cg.join("devices")), None, "no line for it");
    }

    #[test]
    fn v1_mounts_from_mountinfo() {
        let mi = "35 25 0:30 / /sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,xattr,name=systemd\n\
                  36 25 0:31 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n\
                  37 25 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n\
                  38 25 0:33 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n\
                  39 25 0:34 / /tmp rw - tmpfs tmpfs rw,memory\n\
                  40 25 0:35 / /sys/fs/cgroup/blkio rw,nosuid - cgroup cgroup rw,blkio\n\
                  41 25 0:36 / /sys/fs/cgroup/cpuset rw,nosuid - cgroup cgroup rw,cpuset\n";
        // Only the hierarchies of the job's controllers (cpu, devices, memory, pids).
        assert_eq!(
            v1_controller_mounts(mi, JOB_V1_CONTROLLERS),
            [PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"), "/sys/fs/cgroup/memory".into()]
        );
        // All of them (libcontainer's v1 manager, on a host without cgroup2).
        assert_eq!(v1_controller_mounts(mi, ALL_V1_CONTROLLERS).len(), 4);
        assert_eq!(cgroup2_mount(mi), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(cgroup2_mount(&mi.replace("cgroup2", "tmpfs")), None);
    }

    #[test]
    fn root_mode_uses_the_default_or_requested_parent() {
        let h = CgroupHost {
            unified: false,
            v1_mounts: vec![],
            root: "/x".into(),
            own_v2: None,
            own_v1: vec![],
            v2_mount: None,
        };
        assert_eq!(place(&|| h.clone(), None, false, 0, &|_| false).parent(), Some(Path::new("/azp-sandbox")));
        assert_eq!(
            place(&|| h.clone(), Some(Path::new("/slurm/job1")), false, 0, &|_| false).parent(),
            Some(Path::new("/slurm/job1"))
        );
    }

    #[test]
    fn rootless_v1_needs_every_hierarchy_delegated() {
        let t = tempfile::tempdir().unwrap();
        let h = v1_host(t.path());
        let p = place(&|| h.clone(), None, true, 1001, &|_| true);
        let CgroupPlacement::NotEnforced { why } = p else { panic!("{p:?}") };
        assert!(
            why.contains("memory/azp-sandbox/user-1001 and 2 more") && why.contains("delegate-cgroups.sh 1001"),
            "{why}"
        );
        for m in &h.v1_mounts[..2] {
            std::fs::create_dir_all(m.join("azp-sandbox/user-1001")).unwrap();
        }
        let CgroupPlacement::NotEnforced { why } = place(&|| h.clone(), None, true, 1001, &|_| true) else { panic!() };
        assert!(why.contains("cpu,cpuacct/azp-sandbox/user-1001 missing") && !why.contains("more"), "{why}");
        std::fs::create_dir_all(h.v1_mounts[2].join("azp-sandbox/user-1001")).unwrap();
        assert_eq!(
            place(&|| h.clone(), None, true, 1001, &|_| true).parent(),
            Some(Path::new("/azp-sandbox/user-1001"))
        );
        // Present but not ours: not delegated.
        assert!(place(&|| h.clone(), None, true, 1001, &|p| !p.ends_with("user-1001")).parent().is_none());
    }

    const V2_MOUNTS: &str = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec - cgroup2 cgroup2 rw,nsdelegate\n\
                             24 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n";
    const HYBRID_MOUNTS: &str = "35 25 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                                 38 25 0:33 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";

    #[test]
    fn a_delegated_service_on_cgroup_v2_keeps_its_jobs_below_itself() {
        let svc = "0::/system.slice/azp-sandbox.service\n";
        let unit = Path::new("/sys/fs/cgroup/system.slice/azp-sandbox.service");
        let delegated = |p: &Path| p == unit;
        assert_eq!(
            service_cgroup(svc, V2_MOUNTS, &delegated),
            ServiceCgroup::Below {
                unit: "/system.slice/azp-sandbox.service".into(),
                manager_leaf: "/system.slice/azp-sandbox.service/manager".into(),
            }
        );
        // Started again inside the leaf: the same unit.
        let again = "0::/system.slice/azp-sandbox.service/manager\n";
        assert_eq!(service_cgroup(again, V2_MOUNTS, &delegated), service_cgroup(svc, V2_MOUNTS, &delegated));
        // Delegate= missing from the unit: jobs stay outside it (and the start line says so).
        assert_eq!(
            service_cgroup(svc, V2_MOUNTS, &|_| false),
            ServiceCgroup::NotDelegated { unit: "/system.slice/azp-sandbox.service".into() }
        );
        // A login shell (a session scope, never delegated), the root cgroup, a hybrid or
        // v1 host, no cgroup line: the default layout.
        let shell = "0::/user.slice/user-0.slice/session-4.scope\n";
        assert!(matches!(service_cgroup(shell, V2_MOUNTS, &|_| false), ServiceCgroup::NotDelegated { .. }));
        assert_eq!(service_cgroup("0::/\n", V2_MOUNTS, &|_| true), ServiceCgroup::Elsewhere);
        assert_eq!(service_cgroup("0::/a/b\n", V2_MOUNTS, &|_| false), ServiceCgroup::Elsewhere, "not a unit");
        let hybrid = "4:memory:/system.slice/azp-sandbox.service\n0::/system.slice/azp-sandbox.service\n";
        assert_eq!(service_cgroup(hybrid, HYBRID_MOUNTS, &|_| true), ServiceCgroup::Elsewhere, "v1: today's layout");
        assert_eq!(service_cgroup("", V2_MOUNTS, &|_| true), ServiceCgroup::Elsewhere);
    }

    #[test]
    fn rootless_v2_uses_the_topmost_writable_ancestor() {
        let t = tempfile::tempdir().unwrap();
        let svc = t.path().join("user.slice/user-1001.slice/user@1001.service");
        std::fs::create_dir_all(svc.join("app.slice/term.scope")).unwrap();
        std::fs::write(svc.join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
        let h = CgroupHost {
            unified: true,
            v1_mounts: vec![],
            root: t.path().into(),
            own_v2: Some("/user.slice/user-1001.slice/user@1001.service/app.slice/term.scope".into()),
            own_v1: vec![],
            v2_mount: Some(t.path().into()),
        };
        let ours = |p: &Path| p.starts_with(&svc);
        assert_eq!(
            place(&|| h.clone(), None, true, 1001, &ours).parent(),
            Some(Path::new("/user.slice/user-1001.slice/user@1001.service/azp-sandbox"))
        );
        std::fs::write(svc.join("cgroup.controllers"), "cpu\n").unwrap();
        let CgroupPlacement::NotEnforced { why } = place(&|| h.clone(), None, true, 1001, &ours) else { panic!() };
        assert!(why.contains("memory, pids"), "{why}");
        let CgroupPlacement::NotEnforced { why } = place(&|| h.clone(), None, true, 1001, &|_| false) else { panic!() };
        assert!(why.contains("Delegate=yes"), "{why}");
    }
}
