//! Settings of `azp-sandbox slurm`: the pool's part as `run`'s (flags > AZP_* environment
//! > config file), the rest from its own flags, checked here.

use super::run::RunSettings;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct SlurmSettings {
    pub url: String,
    pub token_file: Option<PathBuf>,
    pub pool: String,
    /// Agents are named `<prefix>-j<SLURM_JOB_ID>-<slot>`; the placeholder `<prefix>-placeholder`.
    pub name_prefix: String,
    pub partition: String,
    pub max_jobs: usize,
    /// GPUs (and agents, one GPU each) per batch job; 0: one CPU-only agent.
    pub gpus_per_job: usize,
    /// Passed to `sbatch` as they are (e.g. `--time=04:00:00`, `--account=ci`).
    pub sbatch_args: Vec<String>,
    pub poll_interval: Duration,
    /// `--exit-when-idle` of the batch job's `run`.
    pub idle_timeout: Duration,
    /// `--drain-timeout` of the batch job's `run`; Slurm is asked to send SIGTERM this
    /// long plus a minute before the time limit (`--signal=B:TERM@...`).
    pub drain_timeout: Duration,
    pub rootfs: Option<String>,
    /// How the compute node starts azp-sandbox (may be `sudo -n /usr/local/bin/azp-sandbox`).
    pub remote_exe: String,
    /// `--home` on the compute node (node-local: the rootfs store and package cache stay).
    pub remote_home: Option<PathBuf>,
    /// `--config` for the batch job's `run`.
    pub remote_config: Option<PathBuf>,
    /// More arguments for the batch job's `run` (e.g. `--volume=/data:/data:DATA`).
    pub run_args: Vec<String>,
    /// Capabilities the compute nodes' agents advertise beyond what is known here
    /// (`gpu_model=NVIDIA A100-SXM4-80GB`, `cuda_version=12.4`, ...).
    pub capabilities: Vec<(String, String)>,
}

impl SlurmSettings {
    pub fn agents_per_job(&self) -> usize {
        self.gpus_per_job.max(1)
    }
}

/// `slurm`'s own flags, as given (the defaults are clap's).
#[derive(Debug, Clone, Default)]
pub struct SlurmFlags {
    pub partition: String,
    pub max_jobs: usize,
    pub gpus_per_job: usize,
    pub sbatch_args: Vec<String>,
    pub poll_interval_secs: u64,
    pub idle_timeout_secs: u64,
    pub drain_timeout_secs: u64,
    pub rootfs: Option<String>,
    pub remote_exe: Option<String>,
    pub remote_home: Option<PathBuf>,
    pub remote_config: Option<PathBuf>,
    pub run_args: Vec<String>,
    /// `NAME=VALUE`, unchecked.
    pub capabilities: Vec<String>,
}

/// `slurm`'s settings from the pool's (`pool`, merged as `run`'s from `--config FILE` =
/// `config`) and its flags. `--remote-exe` defaults to `this_exe` (this binary's path).
pub fn for_slurm(
    pool: RunSettings,
    config: Option<PathBuf>,
    a: SlurmFlags,
    this_exe: impl FnOnce() -> std::io::Result<PathBuf>,
) -> Result<SlurmSettings> {
    let mut capabilities = Vec::new();
    for c in &a.capabilities {
        match c.split_once('=') {
            Some((k, v)) if !k.is_empty() => capabilities.push((k.to_string(), v.to_string())),
            _ => bail!("bad --capability '{c}': use NAME=VALUE, e.g. gpu_model=NVIDIA A100-SXM4-80GB"),
        }
    }
    if a.poll_interval_secs == 0 {
        bail!("--poll-interval must be at least 1 second");
    }
    let remote_exe = match a.remote_exe {
        Some(e) => e,
        None => this_exe().context("cannot find the azp-sandbox binary: give --remote-exe")?.display().to_string(),
    };
    Ok(SlurmSettings {
        url: pool.url,
        token_file: pool.token_file,
        pool: pool.pool,
        name_prefix: pool.name_prefix,
        partition: a.partition,
        max_jobs: a.max_jobs,
        gpus_per_job: a.gpus_per_job,
        sbatch_args: a.sbatch_args,
        poll_interval: Duration::from_secs(a.poll_interval_secs),
        idle_timeout: Duration::from_secs(a.idle_timeout_secs),
        drain_timeout: Duration::from_secs(a.drain_timeout_secs),
        rootfs: a.rootfs.or(Some(pool.rootfs)),
        remote_exe,
        remote_home: a.remote_home,
        remote_config: a.remote_config.or(config),
        run_args: a.run_args,
        capabilities,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{merge, FlagSettings};

    fn pool(rootfs: Option<&str>) -> RunSettings {
        let flags = FlagSettings {
            url: Some("https://dev.azure.com/o".into()),
            pool: Some("gpu".into()),
            name_prefix: Some("login".into()),
            rootfs: rootfs.map(String::from),
            ..Default::default()
        };
        merge(Default::default(), Default::default(), flags).unwrap()
    }

    fn flags() -> SlurmFlags {
        SlurmFlags {
            partition: "gpu".into(),
            max_jobs: 4,
            gpus_per_job: 1,
            poll_interval_secs: 30,
            ..Default::default()
        }
    }

    fn no_exe() -> std::io::Result<PathBuf> {
        Err(std::io::Error::other("no /proc/self/exe"))
    }

    #[test]
    fn pool_part_and_defaults() {
        let s =
            for_slurm(pool(None), Some("/etc/site.toml".into()), flags(), || Ok("/opt/azp-sandbox".into())).unwrap();
        assert_eq!(
            (s.url.as_str(), s.pool.as_str(), s.name_prefix.as_str()),
            ("https://dev.azure.com/o", "gpu", "login")
        );
        assert_eq!(s.remote_exe, "/opt/azp-sandbox", "this binary by default");
        assert_eq!(s.remote_config, Some(PathBuf::from("/etc/site.toml")), "the batch jobs read our --config");
        assert_eq!(s.rootfs.as_deref(), Some("auto"), "the pool settings' rootfs");
        assert_eq!(s.poll_interval, Duration::from_secs(30));
        let given = SlurmFlags {
            rootfs: Some("cuda".into()),
            remote_exe: Some("sudo -n azp-sandbox".into()),
            remote_config: Some("/n/c.toml".into()),
            capabilities: vec!["gpu_model=NVIDIA A100=80GB".into()],
            ..flags()
        };
        let s = for_slurm(pool(Some("other")), Some("/etc/site.toml".into()), given, no_exe).unwrap();
        assert_eq!(s.rootfs.as_deref(), Some("cuda"), "--rootfs beats the pool's");
        assert_eq!(s.remote_exe, "sudo -n azp-sandbox", "the binary is not looked for when given");
        assert_eq!(s.remote_config, Some(PathBuf::from("/n/c.toml")));
        assert_eq!(s.capabilities, vec![("gpu_model".to_string(), "NVIDIA A100=80GB".to_string())]);
    }

    #[test]
    fn errors_say_what_to_fix() {
        let bad_cap = SlurmFlags { capabilities: vec!["=x".into()], ..flags() };
        let e = for_slurm(pool(None), None, bad_cap, no_exe).unwrap_err().to_string();
        assert!(e.contains("--capability '=x'") && e.contains("NAME=VALUE"), "{e}");
        let e = for_slurm(pool(None), None, SlurmFlags { poll_interval_secs: 0, ..flags() }, no_exe).unwrap_err();
        assert!(e.to_string().contains("--poll-interval"), "{e}");
        let e = format!("{:#}", for_slurm(pool(None), None, flags(), no_exe).unwrap_err());
        assert!(e.contains("give --remote-exe"), "{e}");
    }
}
