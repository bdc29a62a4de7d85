//! `azp-sandbox exec` as data: what the command line asks for ([`ExecRequest`]) and the
//! job plan it becomes. Shared by the plain `exec` and by setuid mode, where the request
//! is parsed by the unprivileged side and checked against site policy before this runs.

use super::plan::{JobPlan, Limits};
use crate::config::{Home, Network, Volume};
use crate::gpu::{self, Capabilities, DiscoverOptions, GpuRequest};
use crate::rootfs::{RootfsLease, Store};
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    pub rootfs: String,
    pub volumes: Vec<Volume>,
    pub env: Vec<(String, String)>,
    pub limits: Limits,
    pub network: Network,
    /// `--gpus` as given (all, none, indexes, UUIDs, CDI names).
    pub gpus: String,
    /// `--gpu-capabilities` as given.
    pub gpu_capabilities: String,
    pub cdi_spec: Option<PathBuf>,
    pub name: Option<String>,
    pub workdir: PathBuf,
    pub user: Option<(u32, u32)>,
    pub command: Vec<String>,
}

/// Resolves the rootfs (leased for the job's life), discovers the GPUs' edits and builds
/// the job plan.
pub fn prepare(home: &Home, driver_root: &Path, req: &ExecRequest) -> Result<(JobPlan, RootfsLease)> {
    let store = Store::new(home);
    let rootfs_name = if req.rootfs == "auto" {
        use crate::gpu::GpuInventory;
        let inv = gpu::NvmlInventory::load(driver_root, &DiscoverOptions::default().extra_lib_dirs);
        crate::rootfs::select::resolve(&store, "auto", inv.cuda_driver_version().ok())?
    } else {
        req.rootfs.clone()
    };
    let lease = store.lease(&rootfs_name)?;
    let gpu_opts = DiscoverOptions {
        driver_root: driver_root.to_path_buf(),
        cdi_spec: req.cdi_spec.clone(),
        ..Default::default()
    };
    let gpus = GpuRequest::parse(&req.gpus)?;
    let caps: Capabilities = req.gpu_capabilities.parse()?;
    let edits = gpu::job_edits(&gpu_opts, &gpus, &caps, Some(lease.path()))?;
    let id = req.name.clone().unwrap_or_else(|| super::jobdir::new_job_id("exec"));
    if home.jobs_dir().join(&id).exists() {
        bail!("a job named '{id}' is already running: choose another --name");
    }
    let plan = JobPlan {
        id: id.clone(),
        lower: vec![lease.path().to_path_buf()],
        args: req.command.clone(),
        env: req.env.clone(),
        cwd: req.workdir.clone(),
        uid: req.user.map(|u| u.0).unwrap_or(0),
        gid: req.user.map(|u| u.1).unwrap_or(0),
        hostname: id.clone(),
        volumes: req.volumes.clone(),
        limits: req.limits.clone(),
        network: req.network,
        edits,
        cgroup_path: super::teardown::cgroup_path_for(&id),
        owned_dirs: vec![],
        rootless: false,
    };
    Ok((plan, lease))
}
