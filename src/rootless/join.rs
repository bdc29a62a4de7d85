//! Rootless jobs with a delegated cgroup: the helper creates the job's cgroup itself,
//! writes the limits and moves itself in, before libcontainer runs; the job's processes
//! inherit it. libcontainer's own v1 manager cannot be used rootless: it always writes
//! `devices.allow`, which needs CAP_SYS_ADMIN on the host, and joins every hierarchy.
//!
//! The devices hierarchy is left alone (a user namespace cannot create device nodes, so
//! access is limited to the nodes bound in). The helper counts towards the job's pids
//! limit (one process).

use crate::sandbox::plan::Limits;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// CFS period used for `--cpus` (the same as in root mode).
const CPU_PERIOD_US: u64 = 100_000;

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

/// Creates `cgroup` (relative to the cgroup root) in every hierarchy but devices, writes
/// the limits and moves the calling process in.
pub fn join_job_cgroup(cgroup: &Path, limits: &Limits) -> Result<()> {
    let host = super::cgroups::CgroupHost::detect();
    let rel = cgroup.strip_prefix("/").unwrap_or(cgroup);
    let dirs: Vec<(PathBuf, String)> = if host.unified {
        vec![(host.root.join(rel), String::new())]
    } else {
        host.v1_mounts
            .iter()
            .filter(|m| !m.ends_with("devices"))
            .map(|m| (m.join(rel), m.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()))
            .collect()
    };
    if host.unified {
        // The parent must pass the controllers down (the delegated dir above it does).
        if let Some(parent) = dirs[0].0.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("cannot create cgroup {}", parent.display()))?;
            for c in ["+memory", "+pids", "+cpu"] {
                let _ = std::fs::write(parent.join("cgroup.subtree_control"), c);
            }
        }
    }
    for (dir, hierarchy) in &dirs {
        create_levels(dir, hierarchy.contains("cpuset"))?;
        for (file, value) in limit_writes(limits, host.unified, hierarchy) {
            let path = dir.join(file);
            if file == "memory.swap.max" && !path.exists() {
                continue; // swap accounting off: memory.max alone is the limit
            }
            std::fs::write(&path, &value).with_context(|| format!("cannot set {} to {value}", path.display()))?;
        }
    }
    let me = std::process::id().to_string();
    for (dir, _) in &dirs {
        let procs = dir.join("cgroup.procs");
        std::fs::write(&procs, &me).with_context(|| format!("cannot move the helper into {}", procs.display()))?;
    }
    Ok(())
}

/// mkdir -p of a job's cgroup; every new v1 cpuset level gets its parent's cpus/mems.
fn create_levels(dir: &Path, cpuset: bool) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_levels(parent, cpuset)?;
    }
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(e).with_context(|| format!("cannot create the job's cgroup {}", dir.display()));
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
}
