//! `azp-sandbox run`: keep N agent slots, one job per fresh sandbox (see
//! `azp_sandbox::manager`).

use super::args::{LimitArgs, NetworkArgs, PoolArgs};
use super::{Context, Needs, Verb};
use anyhow::Result;
use azp_sandbox::config::Volume;
use azp_sandbox::settings::{FlagSettings, RunSettings};
use azp_sandbox::setuid::{Request, RunRequest};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pool: PoolArgs,
    /// Number of agent slots [default: one per GPU]
    #[arg(help_heading = "Slots and GPUs", long)]
    agents: Option<usize>,
    /// Rootfs name, or auto: the newest CUDA the host driver supports
    #[arg(help_heading = "Slots and GPUs", long)]
    rootfs: Option<String>,
    /// Read-only dataset for every job: HOST:CONTAINER[:ENVVAR]
    #[arg(help_heading = "Slots and GPUs", long = "volume", value_name = "HOST:CTR[:ENV]")]
    volumes: Vec<Volume>,
    /// GPUs per agent: N (own GPUs), all (shared) or none
    #[arg(help_heading = "Slots and GPUs", long)]
    gpus_per_agent: Option<String>,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    network: NetworkArgs,
    /// Agent package (FILE or URL) for air-gapped sites [default: the server's newest]
    #[arg(help_heading = "Jobs", long)]
    agent_package: Option<String>,
    /// Seconds running jobs get after SIGTERM to finish before they are cancelled
    /// (SIGINT to the agent: it reports the job canceled) [default: 600]
    #[arg(help_heading = "Jobs", long, value_name = "SECS")]
    drain_timeout: Option<u64>,
    /// Seconds a cancelled job gets to stop before it is killed [default: 30]
    #[arg(help_heading = "Jobs", long, value_name = "SECS")]
    cancel_grace: Option<u64>,
    /// Dir with pre-job.d/ and post-job.d/ hooks
    #[arg(help_heading = "Jobs", long)]
    hooks_dir: Option<PathBuf>,
    /// Start and stop slots with the pool's queue (README: "Clusters: autoscaling and Slurm")
    #[arg(help_heading = "Autoscale", long)]
    autoscale: bool,
    /// With --autoscale: slots kept running without jobs [default: 0]
    #[arg(help_heading = "Autoscale", long)]
    min_agents: Option<usize>,
    /// With --autoscale: the most slots at once [default: one per GPU]
    #[arg(help_heading = "Autoscale", long)]
    max_agents: Option<usize>,
    /// With --autoscale: seconds an agent waits without a job before it is stopped [default: 300]
    #[arg(help_heading = "Autoscale", long, value_name = "SECS")]
    idle_timeout: Option<u64>,
    /// With --autoscale: seconds between reads of the pool's queue [default: 15]
    #[arg(help_heading = "Autoscale", long, value_name = "SECS")]
    poll_interval: Option<u64>,
    /// Exit when no job ran for this many seconds (what Slurm batch jobs use)
    #[arg(help_heading = "Autoscale", long, value_name = "SECS")]
    exit_when_idle: Option<u64>,
    /// auto: every job in a user namespace of its own, as host ids no account has; host:
    /// jobs as host ids (NOT recommended: kernels < 5.19) [default: auto]
    #[arg(help_heading = "Jobs", long, value_enum)]
    userns: Option<azp_sandbox::identity::Choice>,
    /// Host dir (e.g. local NVMe) for each job's agent work folder, made empty per job
    /// and deleted after it [env: AZP_WORK; default: in the job's writable layer]
    #[arg(help_heading = "Jobs", long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Keep the writable layer and logs of the last N failed jobs in HOME/failed
    /// (`status` lists them, `gc --failed` removes them) [default: 0]
    #[arg(help_heading = "Jobs", long, value_name = "N")]
    keep_failed: Option<usize>,
    /// Most bytes of agent _diag logs kept per agent in HOME/logs/AGENT/ (0: none)
    /// [default: 200M]
    #[arg(help_heading = "Jobs", long, value_name = "SIZE", value_parser = azp_sandbox::settings::parse_logs_max)]
    diag_logs_max: Option<u64>,
    /// Check the configuration (as `azp-sandbox check`) and exit: 0 ready, 1 not
    #[arg(long)]
    check: bool,
}

impl RunArgs {
    /// The flags as settings (None: not given).
    fn flags(&self) -> FlagSettings {
        FlagSettings {
            agents: self.agents,
            rootfs: self.rootfs.clone(),
            volumes: self.volumes.clone(),
            gpus_per_agent: self.gpus_per_agent.clone(),
            limits: self.limits.ask(),
            agent_package: self.agent_package.clone(),
            drain_timeout: self.drain_timeout.map(Duration::from_secs),
            cancel_grace: self.cancel_grace.map(Duration::from_secs),
            hooks_dir: self.hooks_dir.clone(),
            autoscale: self.autoscale,
            min_agents: self.min_agents,
            max_agents: self.max_agents,
            idle_timeout: self.idle_timeout.map(Duration::from_secs),
            poll_interval: self.poll_interval.map(Duration::from_secs),
            exit_when_idle: self.exit_when_idle.map(Duration::from_secs),
            userns: self.userns,
            network: self.network.network,
            network_allow: self.network.network_allow.clone(),
            network_ipv6: self.network.ipv6,
            work_dir: self.work_dir.clone(),
            keep_failed: self.keep_failed,
            diag_logs_max: self.diag_logs_max,
            ..self.pool.flags()
        }
    }

    /// `run`'s settings (flags > AZP_* environment > config file), and AZP_TOKEN.
    fn settings(&self) -> Result<(RunSettings, Option<String>)> {
        self.pool.settings(self.flags())
    }

    /// `--check`: only the checks, nothing started.
    pub fn check_only(&self) -> bool {
        self.check
    }

    /// `check` with these flags: one line per check; exit 1 on any FAIL.
    pub fn check(&self, ctx: &Context, local_only: bool) -> Result<i32> {
        let env = azp_sandbox::settings::Env::process();
        let inputs = azp_sandbox::check::Inputs {
            home: &ctx.home,
            config: self.pool.config.as_deref(),
            env: &env,
            flags: self.flags(),
            driver_root: ctx.driver_root.clone(),
        };
        let report = azp_sandbox::check::run(inputs, local_only);
        print!("{}", report.render());
        Ok(if report.failed() { 1 } else { 0 })
    }

    /// Setuid mode: what the privileged side is asked to run (it checks it against the
    /// site policy). The PAT is read here, as the caller.
    pub fn setuid_request(&self) -> Result<Request> {
        super::setuid::refuse_userns(self.userns)?;
        let (settings, env_token) = self.settings()?;
        // Not carried to the privileged side: refused here rather than silently dropped.
        if let Some(w) = &settings.work_dir {
            anyhow::bail!(
                "--work-dir {} is not available in setuid mode: jobs keep their work folder in their own layer \
                 (unset AZP_WORK and work_dir)",
                w.display()
            );
        }
        if settings.keep_failed > 0 {
            anyhow::bail!(
                "--keep-failed is not available in setuid mode: failed jobs are not kept (unset keep_failed)"
            );
        }
        let token = azp_sandbox::settings::read_token(settings.token_file.as_deref(), env_token)?;
        Ok(Request::Run(RunRequest::from_settings(&settings, token)))
    }
}

impl Verb for RunArgs {
    fn needs(&self) -> Needs {
        Needs::Service
    }

    fn run(self: Box<Self>, ctx: &Context) -> Result<i32> {
        if self.check {
            return self.check(ctx, false);
        }
        let (settings, env_token) = self.settings()?;
        azp_sandbox::identity::init(settings.userns)?;
        let run = azp_sandbox::manager::RunContext { driver_root: ctx.driver_root.clone(), env_token, job_user: None };
        azp_sandbox::manager::run(&ctx.home, settings, run)?;
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Cli, Command};
    use azp_sandbox::sandbox::Ask;
    use clap::Parser;
    use std::time::Duration;

    fn run_args(args: &[&str]) -> super::RunArgs {
        match Cli::try_parse_from([&["azp-sandbox", "run"], args].concat()).unwrap().command {
            Command::Run(a) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn every_flag_reaches_the_settings() {
        let a = run_args(&[
            "--pool=p",
            "--url=https://u",
            "--token-file=/t",
            "--name-prefix=n",
            "--agents=2",
            "--rootfs=r",
            "--volume=/a:/b",
            "--gpus-per-agent=all",
            "--memory=1G",
            "--pids=9",
            "--cpus=1.5",
            "--disk=20G",
            "--tmp-size=1G",
            "--shm-size=256M",
            "--agent-package=/pkg.tgz",
            "--drain-timeout=7",
            "--cancel-grace=4",
            "--hooks-dir=/h",
            "--autoscale",
            "--min-agents=1",
            "--max-agents=3",
            "--idle-timeout=30",
            "--poll-interval=5",
            "--exit-when-idle=60",
            "--network=none",
            "--network-allow=10.1.2.3",
            "--work-dir=/scratch",
            "--keep-failed=2",
            "--diag-logs-max=10M",
        ]);
        let f = a.flags();
        assert_eq!(
            (f.pool.as_deref(), f.url.as_deref(), f.name_prefix.as_deref()),
            (Some("p"), Some("https://u"), Some("n"))
        );
        assert_eq!(f.token_file.as_deref(), Some(std::path::Path::new("/t")));
        assert_eq!((f.agents, f.rootfs.as_deref(), f.volumes.len()), (Some(2), Some("r"), 1));
        assert_eq!(
            (f.gpus_per_agent.as_deref(), f.limits.memory, f.limits.pids, f.limits.cpus_milli),
            (Some("all"), Ask::Value(1 << 30), Ask::Value(9), Ask::Value(1500))
        );
        assert_eq!(
            (f.limits.disk, f.limits.tmp_size, f.limits.shm_size),
            (Ask::Value(20 << 30), Some(1 << 30), Some(256 << 20))
        );
        assert_eq!(
            (f.agent_package.as_deref(), f.hooks_dir.as_deref()),
            (Some("/pkg.tgz"), Some(std::path::Path::new("/h")))
        );
        assert_eq!((f.drain_timeout, f.cancel_grace), (Some(Duration::from_secs(7)), Some(Duration::from_secs(4))));
        assert!(f.autoscale);
        assert_eq!((f.min_agents, f.max_agents), (Some(1), Some(3)));
        assert_eq!((f.idle_timeout, f.poll_interval), (Some(Duration::from_secs(30)), Some(Duration::from_secs(5))));
        assert_eq!(f.exit_when_idle, Some(Duration::from_secs(60)));
        assert_eq!(
            (f.network, f.network_allow[0].to_string()),
            (Some(azp_sandbox::config::Network::None), "10.1.2.3".into())
        );
        assert_eq!(
            (f.work_dir.as_deref(), f.keep_failed, f.diag_logs_max),
            (Some(std::path::Path::new("/scratch")), Some(2), Some(10 << 20))
        );
        let f = run_args(&[]).flags();
        assert!(f.pool.is_none() && f.agents.is_none() && f.drain_timeout.is_none() && !f.autoscale, "{f:?}");
    }
}
