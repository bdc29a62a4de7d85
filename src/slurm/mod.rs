//! `azp-sandbox slurm`: on a login or service node, turn the pool's queue into Slurm
//! batch jobs. While jobs that our agents can serve wait, batch jobs are submitted
//! (`sbatch`, job name `azp-sandbox`, `--gres=gpu:K`), each running
//! `azp-sandbox run --agents K --exit-when-idle T` on its compute node, so it ends by
//! itself once the queue is served; surplus PENDING ones are cancelled (`scancel`);
//! every batch job is tracked (`squeue`, then `sacct` for how it ended), and one killed at
//! its time limit is reported with what happened to its CI jobs. Everything goes
//! through Slurm's own command-line tools.

use crate::azure::AzureClient;
use crate::clock::now_unix;
use crate::scaler::{self, policy, queue, ScalerStatus};
use crate::settings::SlurmSettings;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The job name of every batch job we submit.
pub const JOB_NAME: &str = "azp-sandbox";

/// One of our batch jobs as `squeue` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchJob {
    pub id: u64,
    pub state: String,
    pub reason: String,
    pub nodes: String,
}

impl BatchJob {
    pub fn is_pending(&self) -> bool {
        matches!(self.state.as_str(), "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED")
    }
}

/// `squeue --format=%i|%T|%r|%N|%k` lines, keeping the jobs whose comment is `comment`.
pub fn parse_squeue(out: &str, comment: &str) -> Vec<BatchJob> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.trim().splitn(5, '|').collect();
            if f.len() < 5 || f[4].trim() != comment {
                return None;
            }
            Some(BatchJob {
                id: f[0].trim().parse().ok()?,
                state: f[1].trim().into(),
                reason: f[2].trim().into(),
                nodes: f[3].trim().into(),
            })
        })
        .collect()
}

/// How a batch job ended, from `sacct --parsable2 --format=JobID,State,ExitCode,Elapsed,NodeList`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub state: String,
    pub exit_code: String,
    pub elapsed: String,
    pub nodes: String,
}

pub fn parse_sacct(out: &str, id: u64) -> Option<Ended> {
    let want = id.to_string();
    out.lines().find_map(|l| {
        let f: Vec<&str> = l.trim().split('|').collect();
        (f.len() >= 5 && f[0] == want).then(|| Ended {
            // "CANCELLED by 0" -> CANCELLED
            state: f[1].split_whitespace().next().unwrap_or("").to_string(),
            exit_code: f[2].into(),
            elapsed: f[3].into(),
            nodes: f[4].into(),
        })
    })
}

/// `scontrol show job -o ID` (one line of `Key=Value`): the fallback where accounting
/// is off (sacct refuses), valid for `MinJobAge` after the end.
pub fn parse_scontrol(out: &str) -> Option<Ended> {
    let get = |k: &str| {
        out.split_whitespace().find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('='))).map(str::to_owned)
    };
    Some(Ended {
        state: get("JobState")?,
        exit_code: get("ExitCode").unwrap_or_default(),
        elapsed: get("RunTime").unwrap_or_default(),
        nodes: get("NodeList").unwrap_or_default(),
    })
}

/// `sbatch --parsable` prints `ID` or `ID;CLUSTER`.
pub fn parse_sbatch(out: &str) -> Option<u64> {
    out.trim().split(';').next()?.trim().parse().ok()
}

fn sh_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The batch script: `run` with K agents until idle, agents named after the job.
pub fn batch_script(s: &SlurmSettings) -> String {
    let k = s.agents_per_job();
    let mut args: Vec<String> = Vec::new();
    if let Some(h) = &s.remote_home {
        args.extend(["--home".into(), sh_quote(&h.display().to_string())]);
    }
    args.push("run".into());
    for (flag, v) in [("--pool", Some(s.pool.clone())), ("--url", Some(s.url.clone()))] {
        if let Some(v) = v {
            args.extend([flag.to_string(), sh_quote(&v)]);
        }
    }
    if let Some(t) = &s.token_file {
        args.extend(["--token-file".into(), sh_quote(&t.display().to_string())]);
    }
    if let Some(c) = &s.remote_config {
        args.extend(["--config".into(), sh_quote(&c.display().to_string())]);
    }
    args.extend(["--name-prefix".into(), format!("\"{}-j${{SLURM_JOB_ID}}\"", s.name_prefix)]);
    args.extend(["--agents".into(), k.to_string()]);
    args.extend(["--gpus-per-agent".into(), if s.gpus_per_job == 0 { "none".into() } else { "1".into() }]);
    args.extend(["--exit-when-idle".into(), s.idle_timeout.as_secs().to_string()]);
    args.extend(["--drain-timeout".into(), s.drain_timeout.as_secs().to_string()]);
    if let Some(r) = &s.rootfs {
        args.extend(["--rootfs".into(), sh_quote(r)]);
    }
    args.extend(s.run_args.iter().map(|a| sh_quote(a)));
    format!(
        "#!/bin/sh\n\
         # Written by `azp-sandbox slurm` for pool {pool}: {k} agent(s) on this node, one job per\n\
         # fresh sandbox, until no job came for {idle}s.\n\
         echo \"azp-sandbox: Slurm job ${{SLURM_JOB_ID}} on $(hostname): {k} agent(s) for pool {pool}\"\n\
         exec {exe} {args}\n",
        pool = s.pool,
        idle = s.idle_timeout.as_secs(),
        exe = s.remote_exe,
        args = args.join(" ")
    )
}

/// The `sbatch` arguments (before the script path).
pub fn sbatch_args(s: &SlurmSettings, comment: &str, output_dir: &Path) -> Vec<String> {
    let mut a = vec![
        "--parsable".to_string(),
        format!("--job-name={JOB_NAME}"),
        format!("--partition={}", s.partition),
        format!("--comment={comment}"),
        "--nodes=1".into(),
        format!("--signal=B:TERM@{}", s.drain_timeout.as_secs() + 60),
        format!("--output={}/azp-sandbox-%j.out", output_dir.display()),
    ];
    if s.gpus_per_job > 0 {
        a.push(format!("--gres=gpu:{}", s.gpus_per_job));
    }
    a.extend(s.sbatch_args.iter().cloned());
    a
}

/// What the compute nodes' agents will advertise, as far as this node can tell: the
/// rootfs (and its CUDA version when this node's store has it), the GPU count per
/// agent, azp-sandbox's version, and `--capability` entries (which win).
pub fn shape(s: &SlurmSettings, store: Option<&crate::rootfs::Store>) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert("azp_sandbox".into(), env!("CARGO_PKG_VERSION").into());
    m.insert("azp_sandbox_slot".into(), "0".into());
    m.insert("gpu_count".into(), if s.gpus_per_job == 0 { "0" } else { "1" }.into());
    m.insert("Agent.OS".into(), "Linux".into());
    if let Some(r) = s.rootfs.as_deref().filter(|r| *r != "auto") {
        m.insert("azp_sandbox_rootfs".into(), r.into());
        if let Some(cuda) = store
            .and_then(|st| st.list().ok())
            .and_then(|l| l.into_iter().find(|x| x.name == r))
            .and_then(|x| x.cuda_version)
        {
            m.insert("cuda_version".into(), cuda);
        }
    }
    for (k, v) in &s.capabilities {
        m.insert(k.clone(), v.clone());
    }
    m
}

/// `azp-sandbox status --slurm`: `HOME/slurm-status.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SlurmStatus {
    pub pid: u32,
    pub url: String,
    pub pool: String,
    pub partition: String,
    pub started_unix: u64,
    pub jobs: Vec<BatchJob>,
    pub scaler: ScalerStatus,
}

impl SlurmStatus {
    pub fn render(&self, alive: bool) -> String {
        let mut out = format!(
            "slurm     pid {} ({}), partition {}\npool      {} at {}\n",
            self.pid,
            if alive { "running" } else { "NOT RUNNING" },
            self.partition,
            self.pool,
            self.url
        );
        out.push_str(&self.scaler.render(now_unix()));
        out.push_str(&format!("{:<12} {:<12} {:<24} {}\n", "BATCH JOB", "STATE", "NODES", "REASON"));
        for j in &self.jobs {
            out.push_str(&format!(
                "{:<12} {:<12} {:<24} {}\n",
                j.id,
                j.state,
                if j.nodes.is_empty() { "-" } else { &j.nodes },
                j.reason
            ));
        }
        out
    }
}

pub fn status_path(home: &crate::config::Home) -> PathBuf {
    home.root().join("slurm-status.json")
}

fn run_tool(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().with_context(|| format!("cannot run {what}: is Slurm's client installed and on PATH?"))?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn user_name() -> String {
    nix::unistd::User::from_uid(nix::unistd::geteuid()).ok().flatten().map(|u| u.name).unwrap_or_else(|| "root".into())
}

struct Slurm<'a> {
    s: &'a SlurmSettings,
    client: AzureClient,
    pool_id: u64,
    comment: String,
    shapes: Vec<BTreeMap<String, String>>,
    script: PathBuf,
    output_dir: PathBuf,
    user: String,
    /// Jobs we know of (submitted or adopted) and have not seen end.
    tracked: BTreeSet<u64>,
    status: SlurmStatus,
    status_file: PathBuf,
}

/// The `slurm` command: runs until SIGTERM/SIGINT.
pub fn run(home: &crate::config::Home, s: SlurmSettings, env_token: Option<String>) -> Result<()> {
    let mut sigs = nix::sys::signal::SigSet::empty();
    for sig in [nix::sys::signal::SIGTERM, nix::sys::signal::SIGINT, nix::sys::signal::SIGHUP] {
        sigs.add(sig);
    }
    sigs.thread_block().context("cannot block signals")?;
    if s.max_jobs == 0 {
        bail!("--max-jobs must be at least 1");
    }
    let _home_lock = crate::manager::lock::acquire(home, "slurm")?;
    let token = crate::settings::read_token(s.token_file.as_deref(), env_token)?;
    let client = AzureClient::new(&s.url, &token)?;
    client.check_connection()?;
    let pool = client.find_pool(&s.pool)?;
    client.check_manage_permission(pool.id)?;
    let dir = home.root().join("slurm");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let script = dir.join("azp-sandbox-batch.sh");
    std::fs::write(&script, batch_script(&s)).with_context(|| format!("cannot write {}", script.display()))?;
    let store = crate::rootfs::Store::new(home);
    let shape = shape(&s, Some(&store));
    let version = match client.agent_package(crate::azure::host_platform()) {
        Ok(p) => p.version.to_string(),
        Err(e) => {
            tracing::warn!("cannot read the agent version ({e}); the placeholder says 4.0.0");
            "4.0.0".into()
        }
    };
    let placeholder = scaler::placeholder_name(&s.name_prefix);
    scaler::ensure_placeholder(&client, pool.id, &placeholder, &version, &shape)?;
    let comment = format!("azp-sandbox pool={} prefix={}", s.pool, s.name_prefix);
    let mut me = Slurm {
        s: &s,
        client,
        pool_id: pool.id,
        comment,
        shapes: vec![shape],
        script,
        output_dir: dir,
        user: user_name(),
        tracked: BTreeSet::new(),
        status: SlurmStatus {
            pid: std::process::id(),
            url: s.url.clone(),
            pool: s.pool.clone(),
            partition: s.partition.clone(),
            started_unix: now_unix(),
            jobs: vec![],
            scaler: ScalerStatus {
                mode: "slurm".into(),
                min: 0,
                max: s.max_jobs,
                idle_timeout_s: s.idle_timeout.as_secs(),
                poll_interval_s: s.poll_interval.as_secs(),
                placeholder: Some(placeholder.clone()),
                ..Default::default()
            },
        },
        status_file: status_path(home),
    };
    tracing::info!(
        "slurm: serving pool '{}' with up to {} batch job(s) of {} agent(s) in partition {} (queue read every {}s)",
        s.pool,
        s.max_jobs,
        s.agents_per_job(),
        s.partition,
        s.poll_interval.as_secs()
    );
    let result = me.main_loop(&sigs);
    // Jobs still PENDING would start agents nobody manages: cancel them. Running ones
    // end by themselves (--exit-when-idle).
    match me.squeue() {
        Ok(jobs) => {
            let pending: Vec<u64> = jobs.iter().filter(|j| j.is_pending()).map(|j| j.id).collect();
            if !pending.is_empty() {
                if let Err(e) = me.scancel(&pending) {
                    tracing::warn!("{e:#}");
                } else {
                    tracing::info!("slurm: cancelled pending batch job(s) {pending:?} at exit");
                }
            }
        }
        Err(e) => tracing::warn!("{e:#}"),
    }
    if let Err(e) = scaler::remove_placeholder(&me.client, me.pool_id, &placeholder) {
        tracing::warn!("cannot remove the placeholder agent '{placeholder}': {e}; delete it by hand");
    }
    let _ = std::fs::remove_file(&me.status_file);
    result
}

impl Slurm<'_> {
    fn main_loop(&mut self, sigs: &nix::sys::signal::SigSet) -> Result<()> {
        // Adopt what an earlier run of this command left queued or running.
        for j in self.squeue()? {
            tracing::info!("slurm: adopting batch job {} ({})", j.id, j.state);
            self.tracked.insert(j.id);
        }
        loop {
            let started = Instant::now();
            if let Err(e) = self.tick() {
                tracing::warn!("slurm: {e:#}");
                self.status.scaler.last_error = Some(format!("{e:#}"));
                self.write_status();
            }
            let wait = self.s.poll_interval.saturating_sub(started.elapsed());
            if let Some(sig) = crate::sys::signals::wait_timeout(sigs, wait) {
                tracing::info!("slurm: received {sig}: stopping (running batch jobs end when idle)");
                return Ok(());
            }
        }
    }

    fn squeue(&self) -> Result<Vec<BatchJob>> {
        let out = run_tool(
            Command::new("squeue").args([
                "--noheader",
                &format!("--name={JOB_NAME}"),
                &format!("--user={}", self.user),
                "--format=%i|%T|%r|%N|%k",
            ]),
            "squeue",
        )?;
        Ok(parse_squeue(&out, &self.comment))
    }

    fn scancel(&self, ids: &[u64]) -> Result<()> {
        run_tool(Command::new("scancel").args(ids.iter().map(|i| i.to_string())), "scancel").map(drop)
    }

    fn sbatch(&self) -> Result<u64> {
        let out = run_tool(
            Command::new("sbatch").args(sbatch_args(self.s, &self.comment, &self.output_dir)).arg(&self.script),
            "sbatch",
        )?;
        parse_sbatch(&out).with_context(|| format!("sbatch printed no job id: {}", out.trim()))
    }

    fn agent_prefix(&self, job: u64) -> String {
        format!("{}-j{job}-", self.s.name_prefix)
    }

    fn tick(&mut self) -> Result<()> {
        let jobs = self.squeue()?;
        let seen: BTreeSet<u64> = jobs.iter().map(|j| j.id).collect();
        let ended: Vec<u64> = self.tracked.difference(&seen).copied().collect();
        for id in ended {
            self.report_end(id);
            self.tracked.remove(&id);
        }
        self.tracked.extend(seen.iter().copied());

        let requests = self.client.open_job_requests(self.pool_id, queue::DEFAULT_TOP)?;
        let q = queue::classify(&requests, &self.shapes, queue::DEFAULT_TOP);
        let agents = self.client.list_agents(self.pool_id, None)?;
        let k = self.s.agents_per_job();
        let pending: Vec<u64> = jobs.iter().filter(|j| j.is_pending()).map(|j| j.id).collect();
        let running: Vec<&BatchJob> = jobs.iter().filter(|j| !j.is_pending()).collect();
        let running_free: usize = running
            .iter()
            .map(|j| {
                let p = self.agent_prefix(j.id);
                let busy = agents.iter().filter(|a| a.name.starts_with(&p) && a.assigned_request.is_some()).count();
                k.saturating_sub(busy)
            })
            .sum();
        let summary = q.matching_summary();
        let d = policy::decide_batch(&policy::BatchInput {
            waiting: q.matching_count(),
            waiting_for: &summary,
            pending: &pending,
            running: running.len(),
            running_free_agents: running_free,
            agents_per_job: k,
            max_jobs: self.s.max_jobs,
        });
        let mut reason = d.reason.clone();
        let mut submitted = Vec::new();
        for _ in 0..d.submit {
            match self.sbatch() {
                Ok(id) => {
                    self.tracked.insert(id);
                    submitted.push(id);
                }
                Err(e) => {
                    reason.push_str(&format!("; sbatch failed: {e:#}"));
                    break;
                }
            }
        }
        if !submitted.is_empty() {
            reason.push_str(&format!(
                " (batch job(s) {})",
                submitted.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
            ));
        }
        if !d.cancel.is_empty() {
            match self.scancel(&d.cancel) {
                Ok(()) => reason
                    .push_str(&format!(" ({})", d.cancel.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", "))),
                Err(e) => reason.push_str(&format!("; scancel failed: {e:#}")),
            }
        }
        tracing::debug!("slurm: queue {}", q.line());
        let now = now_unix();
        self.status.scaler.set_queue(&q, now);
        self.status.scaler.record(&reason, !submitted.is_empty() || !d.cancel.is_empty(), now);
        self.status.jobs = jobs;
        for id in &submitted {
            self.status.jobs.push(BatchJob {
                id: *id,
                state: "PENDING".into(),
                reason: "submitted".into(),
                nodes: String::new(),
            });
        }
        self.write_status();
        Ok(())
    }

    /// A batch job left the queue: say how it ended (sacct) and what its CI jobs became,
    /// then remove agent records it may have left (a job killed hard cannot clean up).
    fn report_end(&self, id: u64) {
        let out = run_tool(
            Command::new("sacct").args([
                "--noheader",
                "--parsable2",
                &format!("--jobs={id}"),
                "--format=JobID,State,ExitCode,Elapsed,NodeList",
            ]),
            "sacct",
        );
        let ended = match &out {
            Ok(o) => parse_sacct(o, id),
            Err(_) => None,
        }
        .or_else(|| {
            run_tool(Command::new("scontrol").args(["show", "job", "-o", &id.to_string()]), "scontrol")
                .ok()
                .and_then(|o| parse_scontrol(&o))
        });
        let prefix = self.agent_prefix(id);
        // The CI jobs its agents held (the server keeps reservedAgent on requests).
        let ci: Vec<String> = self
            .client
            .job_requests(self.pool_id, queue::DEFAULT_TOP)
            .map(|rs| {
                rs.into_iter()
                    .filter(|r| {
                        r.reserved_agent
                            .as_ref()
                            .and_then(|a| a.name.as_deref())
                            .is_some_and(|n| n.starts_with(&prefix))
                    })
                    .map(|r| {
                        format!(
                            "CI job {} ({}) on {}: {}",
                            r.request_id,
                            r.definition.as_ref().and_then(|d| d.name.clone()).unwrap_or_else(|| "?".into()),
                            r.reserved_agent.as_ref().and_then(|a| a.name.clone()).unwrap_or_default(),
                            r.result.clone().unwrap_or_else(|| {
                                "no result yet: the server abandons it when its agent stops renewing the lease".into()
                            })
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let ci_text = if ci.is_empty() { "no CI job was running on it".to_string() } else { ci.join("; ") };
        match ended {
            Some(e) if e.state == "TIMEOUT" => tracing::warn!(
                "slurm: batch job {id} on {} was killed at its Slurm time limit (TIMEOUT after {}): its agents got SIGTERM \
                 (running CI jobs were drained for up to {}s, then killed); {ci_text}. Raise --time in --sbatch-arg or lower \
                 the pipelines' timeouts",
                e.nodes,
                e.elapsed,
                self.s.drain_timeout.as_secs()
            ),
            Some(e) if e.state == "COMPLETED" => {
                tracing::info!("slurm: batch job {id} on {} completed after {} (idle, exited)", e.nodes, e.elapsed)
            }
            Some(e) => tracing::warn!("slurm: batch job {id} ended {} (exit {}) after {} on {}; {ci_text}", e.state, e.exit_code, e.elapsed, e.nodes),
            None => tracing::info!(
                "slurm: batch job {id} left the queue (how it ended is unknown: {}); {ci_text}",
                match &out {
                    Err(e) => format!("{e:#}"),
                    Ok(_) => "sacct has no record".into(),
                }
            ),
        }
        match self.client.list_agents(self.pool_id, None) {
            Ok(list) => {
                for a in list.into_iter().filter(|a| a.name.starts_with(&prefix) && !a.is_online()) {
                    if self.client.delete_agent(self.pool_id, a.id).is_ok() {
                        tracing::info!("slurm: removed agent record '{}' left by batch job {id}", a.name);
                    }
                }
            }
            Err(e) => tracing::warn!("slurm: cannot list agents: {e}"),
        }
    }

    fn write_status(&self) {
        if crate::json_file::write_atomic(&self.status_file, &self.status).is_err() {
            tracing::warn!("cannot write {}", self.status_file.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn settings() -> SlurmSettings {
        SlurmSettings {
            url: "https://dev.azure.com/org".into(),
            token_file: Some("/etc/azp-sandbox/pat".into()),
            pool: "gpu".into(),
            name_prefix: "login1".into(),
            partition: "gpu".into(),
            max_jobs: 4,
            gpus_per_job: 2,
            sbatch_args: vec!["--time=04:00:00".into()],
            poll_interval: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(300),
            drain_timeout: Duration::from_secs(240),
            rootfs: Some("cuda12".into()),
            remote_exe: "/usr/local/bin/azp-sandbox".into(),
            remote_home: None,
            remote_config: None,
            run_args: vec!["--volume=/data/x y:/data:DATA".into()],
            capabilities: vec![("gpu_model".into(), "NVIDIA A100".into())],
        }
    }

    #[test]
    fn script_runs_k_agents_until_idle() {
        let s = batch_script(&settings());
        assert!(s.starts_with("#!/bin/sh\n"), "{s}");
        let exec = s.lines().find(|l| l.starts_with("exec ")).unwrap();
        assert_eq!(
            exec,
            "exec /usr/local/bin/azp-sandbox run --pool gpu --url https://dev.azure.com/org --token-file /etc/azp-sandbox/pat \
             --name-prefix \"login1-j${SLURM_JOB_ID}\" --agents 2 --gpus-per-agent 1 --exit-when-idle 300 --drain-timeout 240 \
             --rootfs cuda12 '--volume=/data/x y:/data:DATA'"
        );
        let a = sbatch_args(&settings(), "azp-sandbox pool=gpu prefix=login1", Path::new("/var/lib/azp-sandbox/slurm"));
        for want in [
            "--parsable",
            "--job-name=azp-sandbox",
            "--partition=gpu",
            "--gres=gpu:2",
            "--signal=B:TERM@300",
            "--time=04:00:00",
            "--nodes=1",
        ] {
            assert!(a.contains(&want.to_string()), "{want}: {a:?}");
        }
        let cpu = SlurmSettings { gpus_per_job: 0, ..settings() };
        assert!(!sbatch_args(&cpu, "c", Path::new("/x")).iter().any(|x| x.starts_with("--gres")));
        assert!(batch_script(&cpu).contains("--agents 1 --gpus-per-agent none"));
    }

    #[test]
    fn parses_slurm_output() {
        assert_eq!(parse_sbatch("1234\n"), Some(1234));
        assert_eq!(parse_sbatch("77;cluster1\n"), Some(77));
        assert_eq!(parse_sbatch("sbatch: error: x"), None);
        let q = "12|PENDING|Resources||azp-sandbox pool=gpu prefix=a\n13|RUNNING|None|node7|azp-sandbox pool=gpu prefix=a\n\
                 14|RUNNING|None|node8|azp-sandbox pool=other prefix=a\n";
        let jobs = parse_squeue(q, "azp-sandbox pool=gpu prefix=a");
        assert_eq!(jobs.iter().map(|j| (j.id, j.is_pending())).collect::<Vec<_>>(), vec![(12, true), (13, false)]);
        assert_eq!(jobs[1].nodes, "node7");
        let s = "13|TIMEOUT|0:0|01:00:03|node7\n13.batch|CANCELLED|0:15|01:00:05|node7\n14|CANCELLED by 0|0:0|00:00:00|None assigned\n";
        assert_eq!(
            parse_sacct(s, 13).unwrap(),
            Ended {
                state: "TIMEOUT".into(),
                exit_code: "0:0".into(),
                elapsed: "01:00:03".into(),
                nodes: "node7".into()
            }
        );
        assert_eq!(parse_sacct(s, 14).unwrap().state, "CANCELLED");
        assert!(parse_sacct(s, 15).is_none());
        let sc = "JobId=2 JobName=azp-sandbox UserId=root(0) JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15 RunTime=00:05:01 NodeList=vm";
        assert_eq!(
            parse_scontrol(sc).unwrap(),
            Ended { state: "TIMEOUT".into(), exit_code: "0:15".into(), elapsed: "00:05:01".into(), nodes: "vm".into() }
        );
        assert!(parse_scontrol("slurm_load_jobs error: Invalid job id specified").is_none());
    }

    #[test]
    fn shape_knows_rootfs_gpus_and_given_capabilities() {
        let m = shape(&settings(), None);
        assert_eq!(m.get("azp_sandbox_rootfs").map(String::as_str), Some("cuda12"));
        assert_eq!(m.get("gpu_count").map(String::as_str), Some("1"));
        assert_eq!(m.get("gpu_model").map(String::as_str), Some("NVIDIA A100"));
        assert!(scaler::demands::check_all(
            &["gpu_model -equals NVIDIA A100".into(), "gpu_count -gtVersion 1".into()],
            &m
        )
        .is_ok());
        assert!(scaler::demands::check_all(&["cuda_version -equals 12.4".into()], &m).is_err());
    }
}
