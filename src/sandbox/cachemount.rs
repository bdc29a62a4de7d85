//! The helper's cache step: each cache of the plan mounted as a copy-on-write view of its
//! current snapshot (see [`crate::cache`]): an overlay whose lower is the snapshot
//! (idmapped with the job's ids in root mode, as the rootfs layers are), whose upper is
//! job-private in the job's layer dir (thrown away with it, under its disk quota), mounted
//! at `<mount point>-caches/<k>` (a tmpfs the job's own ids can pass) for the spec to bind at the cache's path. Mounting costs the
//! same whatever the cache's size: nothing is copied.

use super::jobdir::JobDir;
use super::JobPlan;
use crate::cache::store::{self, SnapshotLease};
use crate::sys::{Overlay, Sys};
use anyhow::{Context, Result};
use std::os::fd::BorrowedFd;
use std::path::PathBuf;

/// Where cache `k`'s upper and work dirs are (in the job's layer dir).
pub fn upper(job: &JobDir, k: usize) -> PathBuf {
    job.layers.join("caches").join(k.to_string()).join("upper")
}

fn work(job: &JobDir, k: usize) -> PathBuf {
    job.layers.join("caches").join(k.to_string()).join("work")
}

/// Where cache `k`'s overlay is mounted (in the helper's mount namespace).
pub fn mounted(job: &JobDir, k: usize) -> PathBuf {
    job.caches_dir().join(k.to_string())
}

fn idmapped(job: &JobDir, k: usize) -> PathBuf {
    job.caches_dir().join(format!("{k}-lower"))
}

/// Mounts every cache of `plan`; the returned leases hold their snapshots until the
/// helper exits with the job. `owner`: the job user's outside ids (the cache's root dir
/// becomes theirs); `userns`: the job's namespace when its layers are idmapped.
pub fn mount_all(
    plan: &JobPlan,
    job: &JobDir,
    sys: &dyn Sys,
    userns: Option<BorrowedFd>,
    owner: (u32, u32),
) -> Result<Vec<SnapshotLease>> {
    let mut leases = vec![];
    if plan.caches.is_empty() {
        return Ok(leases);
    }
    let dir = job.caches_dir();
    super::jobdir::create_mount_point(&dir)?;
    sys.mount_cache_dir(&dir)?;
    for (k, cache) in plan.caches.iter().enumerate() {
        let lease =
            store::lease_current(&cache.store).with_context(|| format!("cannot open cache '{}'", cache.name))?;
        let (up, wk, target) = (upper(job, k), work(job, k), mounted(job, k));
        for d in [&up, &wk, &target] {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}: disk full?", d.display()))?;
        }
        let mut lower = lease.dir.clone();
        if let (Some(ns), true) = (userns, plan.userns.as_ref().is_some_and(|i| i.idmap_layers)) {
            let at = idmapped(job, k);
            std::fs::create_dir_all(&at).with_context(|| format!("cannot create {}", at.display()))?;
            sys.idmap_layer(&lower, ns, &at)?;
            lower = at;
        }
        sys.chown(&up, owner.0, owner.1)?;
        sys.mount_overlay(&Overlay { lower: vec![lower], upper: up, work: wk, target, userxattr: plan.rootless })
            .map_err(|e| no_overlay_hint(e, &cache.name, &cache.store))?;
        leases.push(lease);
    }
    Ok(leases)
}

/// A cache dir on a filesystem overlayfs cannot use as a lower layer: say which.
fn no_overlay_hint(e: crate::sys::Error, name: &str, store: &std::path::Path) -> anyhow::Error {
    anyhow::Error::new(e).context(format!(
        "cannot mount cache '{name}': its dir {} must be on a filesystem overlayfs supports (ext4, xfs, btrfs; \
         not NFS, overlay or FUSE): move the home",
        store.display()
    ))
}

/// The spec's binds of the mounted caches, after the job's other mounts.
pub fn spec_mounts(plan: &JobPlan, job: &JobDir) -> Result<Vec<oci_spec::runtime::Mount>> {
    let opts: Vec<String> = ["rbind", "nosuid", "nodev", "rprivate"].map(String::from).to_vec();
    plan.caches
        .iter()
        .enumerate()
        .map(|(k, c)| {
            Ok(oci_spec::runtime::MountBuilder::default()
                .destination(&c.container)
                .typ("bind")
                .source(mounted(job, k))
                .options(opts.clone())
                .build()?)
        })
        .collect()
}
