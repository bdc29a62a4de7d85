//! `azp-sandbox run`: N agent slots, each a thread running one job per fresh sandbox.
//!
//! Process model: this process is multi-threaded (slot threads, the HTTP client), so it
//! never calls libcontainer: every container is created by a single-threaded helper
//! process (see `sandbox::helper`). Signals are taken synchronously by the main thread
//! (blocked everywhere, then sigwait), which drains the slots.

pub mod autoscale;
pub mod hooks;
pub mod phases;
pub mod service;
pub mod settings;
pub mod slot;
pub mod status;

use crate::agent::package::{AgentPackage, PackageCache};
use crate::azure::AzureClient;
use crate::config::Home;
use crate::gpu::{self, DiscoverOptions, GpuInfo, PerAgent};
use crate::rootfs::Store;
use crate::sandbox::{JobPlan, Limits};
use anyhow::{bail, Context, Result};
use settings::RunSettings;
use status::{now_unix, SlotStatus, Status};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// State shared by the slot threads and the main thread.
pub struct Shared {
    pub home: Home,
    pub settings: RunSettings,
    pub token: String,
    client: AzureClient,
    stopping: AtomicBool,
    status: Mutex<Status>,
    package: RwLock<AgentPackage>,
    packages: PackageCache,
}

impl Shared {
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    pub fn update_slot(&self, index: usize, f: impl FnOnce(&mut SlotStatus)) {
        let mut st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = st.slots.get_mut(index) {
            f(s);
        }
        if let Err(e) = status::write(&self.home.root().join("status.json"), &st) {
            tracing::warn!("{e:#}");
        }
    }

    /// The lower layer holding the agent package at `/azp/agent`.
    pub fn package_layer(&self) -> PathBuf {
        layer_of(&self.package.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// After run.sh exit 4: fetch the newest package (one GET when nothing changed).
    pub fn refresh_package(&self) -> Result<()> {
        if self.settings.agent_package.is_some() {
            bail!("the agent wants a newer version but --agent-package pins one: update that file");
        }
        let pkg = self.packages.ensure_latest(&self.client, crate::azure::host_platform())?;
        *self.package.write().unwrap_or_else(|p| p.into_inner()) = pkg;
        Ok(())
    }

    /// Changes the scaler's part of the status (and writes the status file).
    pub fn update_scaler(&self, f: impl FnOnce(&mut crate::scaler::ScalerStatus)) {
        let mut st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = st.scaler.as_mut() {
            f(s);
        }
        if let Err(e) = status::write(&self.home.root().join("status.json"), &st) {
            tracing::warn!("{e:#}");
        }
    }

    /// The slot's state and since when, from the status.
    pub fn slot_state(&self, index: usize) -> Option<(String, u64)> {
        let st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        st.slots.get(index).map(|s| (s.state.clone(), s.since_unix))
    }

    /// Sleeps up to `d`, returning early when a stop was requested.
    pub fn sleep_unless_stopping(&self, d: Duration) {
        let end = Instant::now() + d;
        while !self.is_stopping() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(100).min(end - Instant::now()));
        }
    }
}

fn layer_of(pkg: &AgentPackage) -> PathBuf {
    pkg.layer.clone()
}

/// Everything `run` needs from the command line besides the settings.
pub struct RunContext {
    pub driver_root: PathBuf,
    /// AZP_TOKEN (discouraged; the token file is preferred), or the PAT setuid mode's
    /// unprivileged side read from the caller's token file.
    pub env_token: Option<String>,
    /// Run the agents as this uid:gid instead of the rootfs's `azp` user (setuid mode:
    /// the caller).
    pub job_user: Option<(u32, u32)>,
}

pub fn run(home: &Home, settings: RunSettings, ctx: RunContext) -> Result<()> {
    // Signals first, before any thread exists, so every thread inherits the mask.
    let mut sigs = nix::sys::signal::SigSet::empty();
    for s in [nix::sys::signal::SIGTERM, nix::sys::signal::SIGINT, nix::sys::signal::SIGHUP] {
        sigs.add(s);
    }
    sigs.thread_block().context("cannot block signals")?;

    home.ensure()?;
    crate::sandbox::gc(home)?.log();

    let token = settings::read_token(settings.token_file.as_deref(), ctx.env_token)?;
    let client = AzureClient::new(&settings.url, &token)?;
    client.check_connection()?;
    let pool = client.find_pool(&settings.pool)?;
    client.check_manage_permission(pool.id)?;
    tracing::info!("connected to {} (pool '{}', id {})", settings.url, pool.name, pool.id);

    // GPUs and the per-slot split.
    let gpu_opts = DiscoverOptions {
        driver_root: ctx.driver_root.clone(),
        extra_lib_dirs: [DiscoverOptions::default().extra_lib_dirs, settings.extra_lib_dirs.clone()].concat(),
        cdi_spec: None,
    };
    let inventory = gpu::NvmlInventory::load(&gpu_opts.driver_root, &gpu_opts.extra_lib_dirs);
    let mut driver = gpu::discover(&gpu_opts, &inventory)?;
    // In a Slurm batch job, only the GPUs Slurm gave the job (SLURM_JOB_GPUS: indexes).
    if let (Some(_), Some(ids)) =
        (std::env::var_os("SLURM_JOB_ID"), std::env::var("SLURM_JOB_GPUS").ok().filter(|v| !v.is_empty()))
    {
        let ids: Vec<u32> = ids.split(',').filter_map(|i| i.trim().parse().ok()).collect();
        driver.gpus.retain(|g| ids.contains(&g.index));
        tracing::info!("Slurm job: using the GPUs it was given ({ids:?}): {} found", driver.gpus.len());
    }
    let agents_given = settings.agents.or(settings.autoscale.as_ref().and_then(|a| a.max_agents));
    let per_agent = if driver.gpus.is_empty() && settings.gpus_per_agent == PerAgent::Count(1) && agents_given.is_some()
    {
        // Default split on a host without GPUs: plain CPU agents.
        PerAgent::None
    } else {
        settings.gpus_per_agent
    };
    let agents = agents_given.unwrap_or_else(|| gpu::select::default_agents(&driver.gpus));
    if let Some(a) = &settings.autoscale {
        if a.min_agents > agents {
            bail!(
                "--min-agents {} is more than the {agents} slot(s) this host has: lower it or raise --max-agents",
                a.min_agents
            );
        }
    }
    let split: Vec<Vec<GpuInfo>> = if per_agent == PerAgent::None {
        vec![vec![]; agents]
    } else {
        if driver.gpus.is_empty() {
            bail!(
                "{}",
                driver
                    .unavailable_reason()
                    .unwrap_or_else(|| "no NVIDIA GPU found: use --gpus-per-agent none for CPU-only agents".into())
            );
        }
        gpu::select::split(&driver.gpus, agents, per_agent)?
    };

    // Rootfs (held for the manager's lifetime) and its unprivileged user.
    let store = Store::new(home);
    let rootfs_name = crate::rootfs::select::resolve(&store, &settings.rootfs, driver.cuda_version)?;
    let lease = store.lease(&rootfs_name)?;
    let user = ctx.job_user.or_else(|| passwd_user(lease.path(), "azp"));
    if user.is_none() {
        tracing::warn!(
            "rootfs '{rootfs_name}' has no 'azp' user: agents run as root in the sandbox (AGENT_ALLOW_RUNASROOT=1)"
        );
    }

    let packages = PackageCache::new(home);
    let package = match &settings.agent_package {
        Some(src) => packages.ensure_from(src)?,
        None => packages.ensure_latest(&client, crate::azure::host_platform())?,
    };
    tracing::info!("agent package {} at {}", package.version, package.dir.display());

    let names: Vec<String> = (0..agents).map(|i| format!("{}-{i}", settings.name_prefix)).collect();
    let autoscaling = settings.autoscale.is_some();
    // Autoscaling re-registers a slot's agent when it starts: no record is kept meanwhile.
    prune(&client, pool.id, &settings.name_prefix, |n| !autoscaling && names.iter().any(|m| m == n))?;

    let status = Status {
        pid: std::process::id(),
        url: settings.url.clone(),
        pool: settings.pool.clone(),
        started_unix: now_unix(),
        rootfs: rootfs_name.clone(),
        limits_enforced: crate::rootless::mode().cgroups.parent().is_some(),
        limits_warning: crate::rootless::mode().limits_warning(),
        stopping: false,
        slots: names
            .iter()
            .enumerate()
            .map(|(i, n)| SlotStatus {
                slot: i,
                agent: n.clone(),
                state: if autoscaling { "off" } else { "starting" }.into(),
                ..Default::default()
            })
            .collect(),
        scaler: None,
    };
    let agent_version = package.version.to_string();
    let shared = Arc::new(Shared {
        home: home.clone(),
        settings: settings.clone(),
        token,
        client: client.clone(),
        stopping: AtomicBool::new(false),
        status: Mutex::new(status),
        package: RwLock::new(package),
        packages,
    });

    let caps = gpu::Capabilities::default();
    let mut configs = Vec::new();
    let mut shapes = Vec::new();
    for (i, gpus) in split.into_iter().enumerate() {
        let edits = if gpus.is_empty() { Default::default() } else { gpu::inject::edits(&driver, &gpus, &caps)? };
        let base_plan = JobPlan {
            id: String::new(),
            lower: vec![lease.path().to_path_buf()],
            args: vec![],
            env: vec![],
            cwd: phases::agent_dir(),
            uid: 0,
            gid: 0,
            hostname: names[i].clone(),
            volumes: settings.volumes.clone(),
            limits: Limits { memory_bytes: settings.memory, pids: settings.pids, cpus_milli: settings.cpus_milli },
            network: crate::config::Network::Host,
            edits,
            cgroup_path: PathBuf::new(),
            owned_dirs: vec![],
            rootless: false,
        };
        crate::sandbox::runner::validate(&base_plan)?;
        let facts = phases::SlotFacts {
            slot: i,
            rootfs: rootfs_name.clone(),
            rootfs_cuda: lease.info().cuda_version.clone(),
            driver_version: driver.version.clone(),
            cuda_driver_version: driver.cuda_version.map(|(a, b)| format!("{a}.{b}")),
            gpus: gpus.clone(),
        };
        let cfg = slot::SlotConfig {
            index: i,
            agent_name: names[i].clone(),
            base_plan,
            user,
            gpu_names: gpus.iter().map(|g| g.uuid.clone().unwrap_or_else(|| g.index.to_string())).collect(),
            capability_env: phases::capability_env(&facts),
            stop: Arc::new(AtomicBool::new(false)),
        };
        // What this slot's listener will advertise, for matching the queue's demands.
        let mut listener = cfg.base_plan.clone();
        let (uid, gid) = user.unwrap_or((0, 0));
        (listener.uid, listener.gid) = (uid, gid);
        let job = phases::AgentJob {
            url: &settings.url,
            pool: &settings.pool,
            agent_name: &names[i],
            as_root: user.is_none(),
        };
        listener.env = [phases::agent_env(&job), cfg.capability_env.clone()].concat();
        shapes.push(phases::advertised_capabilities(&listener, &names[i], &agent_version, lease.path()));
        configs.push(cfg);
    }
    let mut slots = Slots::new(configs);
    let mut scaler = match &settings.autoscale {
        Some(a) => Some(autoscale::Scaler::start(&shared, pool.id, a.clone(), shapes, &agent_version)?),
        None => {
            for i in 0..slots.len() {
                slots.start(i, &shared)?;
            }
            tracing::info!("{} slot(s) started: {}", slots.len(), names.join(", "));
            None
        }
    };

    // Wait for a signal (or for every slot to end on its own, or --exit-when-idle).
    let mut last_activity = Instant::now();
    let sig = loop {
        let timeout = Duration::from_millis(500);
        if let Some(s) = crate::sys::signals::wait_timeout(&sigs, timeout) {
            break Some(s);
        }
        match scaler.as_mut() {
            Some(sc) => sc.tick(&shared, &mut slots),
            None if slots.all_finished() => break None,
            None => {}
        }
        if let Some(t) = settings.exit_when_idle {
            if slots.any_busy(home) {
                last_activity = Instant::now();
            } else if last_activity.elapsed() >= t {
                tracing::info!("no job for {}s (--exit-when-idle): stopping", t.as_secs());
                break None;
            }
        }
    };
    if let Some(s) = sig {
        tracing::info!("received {s}: no new jobs; running jobs get {}s to finish", settings.drain_timeout.as_secs());
    }
    shared.stopping.store(true, Ordering::SeqCst);
    {
        let mut st = shared.status.lock().unwrap_or_else(|p| p.into_inner());
        st.stopping = true;
    }
    // Idle agents (no job taken) are stopped at once; busy ones get the drain timeout.
    let deadline = Instant::now() + settings.drain_timeout;
    let mut signalled = std::collections::HashSet::new();
    while !slots.all_finished() {
        let layer_dirs = home.job_layer_dirs();
        for (i, h) in slots.v.iter().enumerate() {
            let p = h.pid.load(Ordering::SeqCst);
            if h.thread.is_none() || p <= 0 || signalled.contains(&(i, p)) {
                continue;
            }
            let busy = job_in_progress(&layer_dirs, &names[i]);
            if !busy || Instant::now() >= deadline || crate::sys::signals::wait_timeout(&sigs, Duration::ZERO).is_some()
            {
                tracing::info!(
                    slot = i,
                    "stopping agent {} ({})",
                    names[i],
                    if busy { "drain timeout" } else { "idle" }
                );
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::SIGTERM);
                signalled.insert((i, p));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    slots.reap();
    // Our agents are gone now (whatever the server still shows: a killed listener may
    // not have closed its session): remove their records so the pool has no stale ones.
    for a in client.list_agents(pool.id, None)? {
        if names.contains(&a.name) {
            client.delete_agent(pool.id, a.id)?;
            tracing::info!("removed agent record '{}' (id {})", a.name, a.id);
        }
    }
    if let Some(sc) = scaler {
        sc.shutdown(&client);
    }
    drop(lease);
    crate::sandbox::gc_all(home)?.log();
    tracing::info!(
        "stopped; {} job(s) served",
        shared.status.lock().map(|s| s.slots.iter().map(|x| x.jobs_done).sum::<u64>()).unwrap_or(0)
    );
    Ok(())
}

/// The slot threads: started all at once, or one by one by the autoscaler.
pub struct Slots {
    v: Vec<SlotHandle>,
}

struct SlotHandle {
    cfg: slot::SlotConfig,
    thread: Option<std::thread::JoinHandle<()>>,
    pid: Arc<AtomicI32>,
}

impl Slots {
    fn new(configs: Vec<slot::SlotConfig>) -> Slots {
        Slots {
            v: configs
                .into_iter()
                .map(|cfg| SlotHandle { cfg, thread: None, pid: Arc::new(AtomicI32::new(0)) })
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.v.len()
    }

    pub fn is_empty(&self) -> bool {
        self.v.is_empty()
    }

    /// Starts slot `i` (a fresh stop flag, a new thread).
    fn start(&mut self, i: usize, shared: &Arc<Shared>) -> Result<()> {
        let h = &mut self.v[i];
        if h.thread.is_some() {
            return Ok(());
        }
        h.cfg.stop = Arc::new(AtomicBool::new(false));
        h.pid.store(0, Ordering::SeqCst);
        let (sh, cfg, pid) = (shared.clone(), h.cfg.clone(), h.pid.clone());
        h.thread =
            Some(std::thread::Builder::new().name(format!("slot-{i}")).spawn(move || slot::run_slot(sh, cfg, pid))?);
        Ok(())
    }

    /// A thread exists for slot `i` (it may be ending).
    fn alive(&self, i: usize) -> bool {
        self.v[i].thread.is_some()
    }

    fn all_finished(&self) -> bool {
        self.v.iter().all(|h| h.thread.as_ref().is_none_or(|t| t.is_finished()))
    }

    /// Joins the threads that ended; returns their slot indexes.
    fn reap(&mut self) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, h) in self.v.iter_mut().enumerate() {
            if h.thread.as_ref().is_some_and(|t| t.is_finished()) {
                let _ = h.thread.take().map(|t| t.join());
                out.push(i);
            }
        }
        out
    }

    /// Some slot's agent is running a job.
    fn any_busy(&self, home: &Home) -> bool {
        let layer_dirs = home.job_layer_dirs();
        self.v.iter().any(|h| h.thread.is_some() && job_in_progress(&layer_dirs, &h.cfg.agent_name))
    }
}

/// Is the slot's current job (its layer dir, among `layer_dirs` from
/// [`Home::job_layer_dirs`], listed once for all slots) showing a job the agent has taken?
fn job_in_progress(layer_dirs: &[PathBuf], agent_name: &str) -> bool {
    layer_dirs.iter().any(|dir| {
        let n = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        n.strip_prefix(agent_name)
            .is_some_and(|rest| rest.starts_with('-') && rest[1..].chars().all(|c| c.is_ascii_digit()))
            && slot::ran_a_job(&dir.join("upper"))
    })
}

/// Deletes offline agents named `<prefix>-<n>` for which `keep` is false.
pub fn prune(client: &AzureClient, pool_id: u64, prefix: &str, keep: impl Fn(&str) -> bool) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for a in client.list_agents(pool_id, None)? {
        let ours = a
            .name
            .strip_prefix(prefix)
            .and_then(|r| r.strip_prefix('-'))
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if ours && !a.is_online() && !keep(&a.name) {
            client.delete_agent(pool_id, a.id)?;
            tracing::info!("removed offline agent record '{}' (id {})", a.name, a.id);
            removed.push(a.name);
        }
    }
    Ok(removed)
}

/// uid/gid of `user` from the rootfs's /etc/passwd.
pub fn passwd_user(rootfs: &Path, user: &str) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(rootfs.join("etc/passwd")).ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 4 && f[0] == user).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?))).flatten()
    })
}

/// `azp-sandbox agents prune --pool P`: removes every offline agent with our prefix.
pub fn prune_command(settings: &RunSettings, env_token: Option<String>) -> Result<Vec<String>> {
    let token = settings::read_token(settings.token_file.as_deref(), env_token)?;
    let client = AzureClient::new(&settings.url, &token)?;
    let pool = client.find_pool(&settings.pool)?;
    prune(&client, pool.id, &settings.name_prefix, |_| false)
}
