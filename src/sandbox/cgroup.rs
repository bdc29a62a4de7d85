//! The job's cgroup, set up by the helper itself before libcontainer runs: created in
//! every hierarchy, limits (and, as root on cgroup v1, device rules) written, the helper
//! moved in, so the job's processes are born there. libcontainer then sees only a private
//! cgroup2 view rooted at the job (`Sys::hide_cgroupfs`).
//!
//! Why not libcontainer's own cgroup manager:
//! - rootless, its v1 manager always writes `devices.allow` (host root only) and joins
//!   every hierarchy;
//! - as root, it re-reads mountinfo through its hardened procfs once per controller, on
//!   create and again on delete: 24 reads, about a fifth of a whole `exec` cycle in the
//!   profile. Here the host is read once.
//!
//! The helper stays in the job's cgroup while the job runs: it counts as one process
//! towards the pids limit, and its few MB of memory towards the memory limit.

use super::plan::Limits;
use crate::rootless::cgroups::CgroupHost;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// CFS period used for `--cpus`.
const CPU_PERIOD_US: u64 = 100_000;

/// Controllers a job's v2 cgroup needs from its ancestors.
const V2_CONTROLLERS: [&str; 3] = ["+memory", "+pids", "+cpu"];

/// Who sets the cgroup up, which decides what besides the limits is set up.
#[derive(Debug, Clone)]
pub enum Setup {
    /// In a user namespace: no device rules (they can be neither written nor needed: a
    /// user namespace cannot create device nodes, so access is limited to the nodes bound
    /// in), and only the delegated hierarchies (the devices one is never delegated).
    Rootless,
    /// As root: `device_rules` as `devices.allow` lines (cgroup v1; everything else is
    /// denied first; on v2 device rules are an eBPF program, not written here). On a
    /// hybrid host the job's dir in the cgroup2 tree is joined too: the helper's private
    /// cgroup2 view, where libcontainer puts the job's init, is then the job's own dir
    /// and not shared with anyone.
    Root { device_rules: Vec<String> },
}

/// The files to write in one cgroup dir, in order, for `limits` (v1 or v2 names).
pub fn limit_writes(limits: &Limits, v2: bool, hierarchy: &str) -> Vec<(&'static str, String)> {
    let quota = limits.cpus_milli.map(|m| (m * CPU_PERIOD_US / 1000).max(1000));
    let mut w = vec![];
    if v2 {
        if let Some(b) = limits.memory_bytes {
            w.push(("memory.max", b.to_string()));
            w.push(("memory.swap.max", "0".to_string()));
        }
        if let Some(p) = limits.pids {
            w.push(("pids.max", p.to_string()));
        }
        if let Some(q) = quota {
            w.push(("cpu.max", format!("{q} {CPU_PERIOD_US}")));
        }
        return w;
    }
    let has = |c: &str| hierarchy.split(',').any(|h| h == c);
    if let (Some(b), true) = (limits.memory_bytes, has("memory")) {
        w.push(("memory.limit_in_bytes", b.to_string()));
    }
    if let (Some(p), true) = (limits.pids, has("pids")) {
        w.push(("pids.max", p.to_string()));
    }
    if let (Some(q), true) = (quota, has("cpu")) {
        w.push(("cpu.cfs_period_us", CPU_PERIOD_US.to_string()));
        w.push(("cpu.cfs_quota_us", q.to_string()));
    }
    w
}

/// One cgroup dir of the job: where, which hierarchy (v1 mount dir name, "" for v2), and
/// whether limits apply there (not in the controller-less v2 tree of a hybrid host).
struct JobDir {
    dir: PathBuf,
    hierarchy: String,
    v2: bool,
    limits: bool,
}

/// The dirs of `cgroup` (relative to the cgroup root) the job uses on this host.
fn job_dirs(host: &CgroupHost, cgroup: &Path, setup: &Setup) -> Vec<JobDir> {
    let rel = cgroup.strip_prefix("/").unwrap_or(cgroup);
    if host.unified {
        return vec![JobDir { dir: host.root.join(rel), hierarchy: String::new(), v2: true, limits: true }];
    }
    let mut dirs: Vec<JobDir> = host
        .v1_mounts
        .iter()
        .filter(|m| matches!(setup, Setup::Root { .. }) || !m.ends_with("devices"))
        .map(|m| JobDir {
            dir: m.join(rel),
            hierarchy: m.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            v2: false,
            limits: true,
        })
        .collect();
    if let (Setup::Root { .. }, Some(v2)) = (setup, &host.v2_mount) {
        dirs.push(JobDir { dir: v2.join(rel), hierarchy: String::new(), v2: true, limits: false });
    }
    dirs
}

/// Creates `cgroup` (relative to the cgroup root) in every hierarchy the job uses, writes
/// the device rules and limits, and moves the calling process in.
pub fn join_job_cgroup(host: &CgroupHost, cgroup: &Path, limits: &Limits, setup: &Setup) -> Result<()> {
    let dirs = job_dirs(host, cgroup, setup);
    if host.unified {
        // Every ancestor must pass the controllers down. Levels that are not ours (above
        // a delegated subtree) or that already do are left as they are.
        let rel = cgroup.strip_prefix("/").unwrap_or(cgroup);
        let mut at = host.root.clone();
        for part in rel.parent().into_iter().flat_map(|p| p.components()) {
            let _ = std::fs::create_dir(at.join(part));
            enable_v2_controllers(&at);
            at.push(part);
        }
        enable_v2_controllers(&at);
    }
    for d in &dirs {
        create_levels(&d.dir, d.hierarchy.contains("cpuset"))?;
        if let (Setup::Root { device_rules }, true) = (setup, d.hierarchy.split(',').any(|h| h == "devices")) {
            write_device_rules(&d.dir, device_rules)?;
        }
        if !d.limits {
            continue;
        }
        for (file, value) in limit_writes(limits, d.v2, &d.hierarchy) {
            let path = d.dir.join(file);
            if file == "memory.swap.max" && !path.exists() {
                continue; // swap accounting off: memory.max alone is the limit
            }
            std::fs::write(&path, &value).with_context(|| format!("cannot set {} to {value}", path.display()))?;
        }
    }
    let me = std::process::id().to_string();
    for d in &dirs {
        let procs = d.dir.join("cgroup.procs");
        std::fs::write(&procs, &me).with_context(|| format!("cannot move the helper into {}", procs.display()))?;
    }
    Ok(())
}

fn enable_v2_controllers(dir: &Path) {
    for c in V2_CONTROLLERS {
        let _ = std::fs::write(dir.join("cgroup.subtree_control"), c);
    }
}

/// Deny everything, then allow the job's rules. Done before any process is in the cgroup.
fn write_device_rules(dir: &Path, rules: &[String]) -> Result<()> {
    let deny = dir.join("devices.deny");
    std::fs::write(&deny, "a").with_context(|| format!("cannot deny all devices in {}", deny.display()))?;
    let allow = dir.join("devices.allow");
    for r in rules {
        std::fs::write(&allow, r).with_context(|| format!("cannot allow device '{r}' in {}", allow.display()))?;
    }
    Ok(())
}

/// mkdir -p of a job's cgroup. Retried: the teardown of another job of the same home
/// removes the (then empty) home level, possibly between our two mkdirs.
fn create_levels(dir: &Path, cpuset: bool) -> Result<()> {
    let mut tries = 0;
    loop {
        match create_levels_once(dir, cpuset) {
            Err(e)
                if tries < 3
                    && e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound) =>
            {
                tries += 1
            }
            r => return r,
        }
    }
}

/// mkdir -p of a job's cgroup; every new v1 cpuset level gets its parent's cpus/mems.
fn create_levels_once(dir: &Path, cpuset: bool) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_levels_once(parent, cpuset)?;
    }
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(anyhow::Error::new(e).context(format!("cannot create the job's cgroup {}", dir.display())));
        }
        _ => {}
    }
    if cpuset {
        inherit_cpuset(dir)?;
    }
    Ok(())
}

/// A new v1 cpuset has empty cpus/mems, and no task can join it until they are set.
fn inherit_cpuset(dir: &Path) -> Result<()> {
    for f in ["cpuset.cpus", "cpuset.mems"] {
        let own = dir.join(f);
        if std::fs::read_to_string(&own).map(|s| s.trim().is_empty()).unwrap_or(true) {
            let parent = dir.parent().map(|p| p.join(f)).context("cpuset has no parent")?;
            let value =
                std::fs::read_to_string(&parent).with_context(|| format!("cannot read {}", parent.display()))?;
            std::fs::write(&own, value.trim()).with_context(|| format!("cannot set {}", own.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_files_per_hierarchy() {
        let l = Limits { memory_bytes: Some(64 << 20), pids: Some(100), cpus_milli: Some(1500) };
        assert_eq!(limit_writes(&l, false, "memory"), vec![("memory.limit_in_bytes", (64u64 << 20).to_string())]);
        assert_eq!(limit_writes(&l, false, "pids"), vec![("pids.max", "100".to_string())]);
        assert_eq!(
            limit_writes(&l, false, "cpu,cpuacct"),
            vec![("cpu.cfs_period_us", "100000".to_string()), ("cpu.cfs_quota_us", "150000".to_string())]
        );
        assert!(limit_writes(&l, false, "cpuacct").is_empty());
        assert!(limit_writes(&l, false, "blkio").is_empty());
        let v2 = limit_writes(&l, true, "");
        assert_eq!(
            v2.iter().map(|(f, _)| *f).collect::<Vec<_>>(),
            ["memory.max", "memory.swap.max", "pids.max", "cpu.max"]
        );
        assert_eq!(v2[3].1, "150000 100000");
        assert!(limit_writes(&Limits::default(), true, "").is_empty());
    }

    fn hybrid() -> CgroupHost {
        CgroupHost {
            unified: false,
            v1_mounts: ["cpu,cpuacct", "devices", "memory"].map(|m| PathBuf::from("/cg").join(m)).to_vec(),
            root: "/cg".into(),
            own_v2: None,
            v2_mount: Some("/cg/unified".into()),
        }
    }

    fn names(dirs: &[JobDir]) -> Vec<String> {
        dirs.iter().map(|d| format!("{}{}", d.dir.display(), if d.limits { "" } else { " (no limits)" })).collect()
    }

    #[test]
    fn rootless_skips_devices_and_the_v2_tree() {
        let d = job_dirs(&hybrid(), Path::new("/a/j"), &Setup::Rootless);
        assert_eq!(names(&d), ["/cg/cpu,cpuacct/a/j", "/cg/memory/a/j"]);
    }

    #[test]
    fn root_joins_devices_and_the_hybrid_v2_tree_without_limits() {
        let setup = Setup::Root { device_rules: vec!["c 1:3 rwm".into()] };
        let d = job_dirs(&hybrid(), Path::new("/a/j"), &setup);
        assert_eq!(
            names(&d),
            ["/cg/cpu,cpuacct/a/j", "/cg/devices/a/j", "/cg/memory/a/j", "/cg/unified/a/j (no limits)"]
        );
        let v2 = CgroupHost { unified: true, v1_mounts: vec![], v2_mount: Some("/cg".into()), ..hybrid() };
        assert_eq!(names(&job_dirs(&v2, Path::new("/a/j"), &setup)), ["/cg/a/j"]);
    }

    #[test]
    fn device_rules_deny_all_first() {
        let t = tempfile::tempdir().unwrap();
        // A plain dir stands in for a cgroup: each write replaces the file, so the
        // deny file keeps "a" and the allow file the last rule.
        write_device_rules(t.path(), &["c 1:3 rwm".into(), "c 136:* rwm".into()]).unwrap();
        assert_eq!(std::fs::read_to_string(t.path().join("devices.deny")).unwrap(), "a");
        assert_eq!(std::fs::read_to_string(t.path().join("devices.allow")).unwrap(), "c 136:* rwm");
    }
}
