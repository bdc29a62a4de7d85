//! `azp-sandbox slurm`: on a Slurm login node, batch jobs running agents while matching
//! jobs wait (see `azp_sandbox::slurm`).

use super::args::PoolArgs;
use super::{Context, Verb};
use anyhow::Result;
use azp_sandbox::settings::{self, SlurmFlags, SlurmSettings};
use std::path::PathBuf;

#[derive(clap::Args)]
#[command(next_help_heading = "Slurm")]
pub struct SlurmArgs {
    #[command(flatten)]
    pool: PoolArgs,
    /// Slurm partition of the GPU nodes
    #[arg(long)]
    partition: String,
    /// The most batch jobs (pending + running) at once
    #[arg(long, default_value_t = 4)]
    max_jobs: usize,
    /// GPUs per batch job (--gres=gpu:K), one agent each; 0: one CPU-only agent
    #[arg(long, default_value_t = 1)]
    gpus_per_job: usize,
    /// Extra sbatch argument, e.g. --sbatch-arg=--time=04:00:00 (repeatable)
    #[arg(long = "sbatch-arg", value_name = "ARG", allow_hyphen_values = true)]
    sbatch_args: Vec<String>,
    /// Seconds between reads of the pool's queue and of squeue
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    poll_interval: u64,
    /// A batch job exits when no job came for this many seconds (its run --exit-when-idle)
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    idle_timeout: u64,
    /// Seconds a batch job's running CI jobs get when Slurm stops it (SIGTERM this + 60 s before the time limit)
    #[arg(long, value_name = "SECS", default_value_t = 240)]
    drain_timeout: u64,
    /// Rootfs the batch jobs use [default: the config file's, else auto]
    #[arg(long)]
    rootfs: Option<String>,
    /// How compute nodes start azp-sandbox, e.g. "sudo -n /usr/local/bin/azp-sandbox" [default: this binary's path]
    #[arg(long)]
    remote_exe: Option<String>,
    /// --home on the compute nodes (node-local: the rootfs store and agent package stay cached)
    #[arg(long)]
    remote_home: Option<PathBuf>,
    /// --config for the batch jobs' run
    #[arg(long)]
    remote_config: Option<PathBuf>,
    /// Extra argument for the batch jobs' run, e.g. --run-arg=--memory=64G (repeatable)
    #[arg(long = "run-arg", value_name = "ARG", allow_hyphen_values = true)]
    run_args: Vec<String>,
    /// A capability the compute nodes' agents have that this node cannot see, for matching demands (repeatable)
    #[arg(long = "capability", value_name = "NAME=VALUE")]
    capabilities: Vec<String>,
}

impl SlurmArgs {
    /// `slurm`'s settings: the pool's from flags > AZP_* environment > config file, the
    /// rest from its flags; and AZP_TOKEN.
    fn settings(self) -> Result<(SlurmSettings, Option<String>)> {
        let (pool, env_token) = self.pool.settings(self.pool.flags())?;
        let flags = SlurmFlags {
            partition: self.partition,
            max_jobs: self.max_jobs,
            gpus_per_job: self.gpus_per_job,
            sbatch_args: self.sbatch_args,
            poll_interval_secs: self.poll_interval,
            idle_timeout_secs: self.idle_timeout,
            drain_timeout_secs: self.drain_timeout,
            rootfs: self.rootfs,
            remote_exe: self.remote_exe,
            remote_home: self.remote_home,
            remote_config: self.remote_config,
            run_args: self.run_args,
            capabilities: self.capabilities,
        };
        Ok((settings::for_slurm(pool, self.pool.config, flags, std::env::current_exe)?, env_token))
    }
}

impl Verb for SlurmArgs {
    fn run(self: Box<Self>, ctx: &Context) -> Result<i32> {
        let (settings, env_token) = self.settings()?;
        azp_sandbox::slurm::run(&ctx.home, settings, env_token)?;
        Ok(0)
    }
}
