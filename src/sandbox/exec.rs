//! `azp-sandbox exec` as data: what the command line asks for ([`ExecRequest`]) and the
//! job plan it becomes. Shared by the plain `exec` and by setuid mode, where the request
//! is parsed by the unprivileged side and checked against site policy before this runs.

use super::plan::{JobPlan, Limits};
use crate::config::{Home, Network, Volume};
use crate::gpu::{self, Capabilities, DiscoverOptions, GpuRequest};
use crate::rootfs::{RootfsLease, Store};
use anyhow::{bail, Context, Result};
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

/// `--name`: it becomes a directory name, the container id and the hostname.
pub fn parse_job_name(s: &str) -> Result<String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !ok {
        bail!("bad --name '{s}': use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit");
    }
    Ok(s.to_string())
}

impl ExecRequest {
    /// The checks the command line makes, again: a request that arrives as JSON (setuid
    /// mode) did not go through the parsers.
    pub fn validate(&self) -> Result<()> {
        if let Some(n) = &self.name {
            parse_job_name(n)?;
        }
        for v in &self.volumes {
            let text = format!(
                "{}:{}{}",
                v.host.display(),
                v.container.display(),
                v.env.as_deref().map(|e| format!(":{e}")).unwrap_or_default()
            );
            if text.parse::<Volume>().ok().as_ref() != Some(v) {
                bail!("malformed volume in the request: {text}");
            }
        }
        if let Some((k, _)) = self.env.iter().find(|(k, _)| !crate::config::is_env_name(k)) {
            bail!("malformed environment variable name in the request: '{k}'");
        }
        if self.command.is_empty() {
            bail!("no command given: use `azp-sandbox exec [OPTIONS] -- CMD [ARGS...]`");
        }
        Ok(())
    }
}

/// The whole `exec`: gc of what crashed runs left ([`super::gc_before_job`]), the plan, the job (signals to this
/// process forwarded to it), its clean-up. The rootfs stays leased until the job is gone.
pub fn run(home: &Home, driver_root: &Path, req: &ExecRequest) -> Result<super::JobOutcome> {
    super::prepare_home(home)?;
    super::gc_before_job(home).context("gc before exec failed")?.log();
    let (plan, lease) = prepare(home, driver_root, req)?;
    let outcome = super::run_job(home, plan, &super::RunOptions { forward_signals: true, ..Default::default() });
    drop(lease);
    outcome
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
    let rootfs = gpu::compat::RootfsCuda {
        name: &rootfs_name,
        tree: lease.path(),
        cuda_version: lease.info().cuda_version.as_deref(),
        disable_require: gpu::compat::disable_require(&req.env),
    };
    let edits = gpu::job_edits(&gpu_opts, &gpus, &caps, Some(&rootfs))?;
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
        cgroup_path: super::teardown::cgroup_path_for(home, &id),
        owned_dirs: vec![],
        rootless: false,
        scratch: None,
    };
    Ok((plan, lease))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> ExecRequest {
        serde_json::from_str(
            r#"{"rootfs":"bb","volumes":[],"env":[],"limits":{"memory_bytes":null,"pids":null,"cpus_milli":null},
               "network":"Host","gpus":"none","gpu_capabilities":"compute","cdi_spec":null,"name":null,
               "workdir":"/","user":null,"command":["true"]}"#,
        )
        .unwrap()
    }

    #[test]
    fn a_request_that_skipped_the_parsers_is_checked_again() {
        assert!(req().validate().is_ok());
        let bad_name = ExecRequest { name: Some("../../etc".into()), ..req() };
        assert!(bad_name.validate().unwrap_err().to_string().contains("bad --name"));
        let vol = Volume { host: "/data".into(), container: "/a/../../x".into(), env: None };
        let bad_vol = ExecRequest { volumes: vec![vol], ..req() };
        assert!(bad_vol.validate().unwrap_err().to_string().contains("malformed volume"));
        let bad_env = ExecRequest { env: vec![("A=B".into(), "x".into())], ..req() };
        assert!(bad_env.validate().unwrap_err().to_string().contains("malformed environment"));
        assert!(ExecRequest { command: vec![], ..req() }.validate().is_err());
        let extra = r#"{"rootfs":"bb","privileged":true}"#;
        assert!(serde_json::from_str::<ExecRequest>(extra).is_err(), "unknown fields are refused");
    }
}
