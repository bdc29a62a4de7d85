//! The slots phase: the status, the state the slot threads share, every slot's config
//! (its base job plan and what its listener advertises), then the slots started, all at
//! once or one by one by the autoscaler; and [`Slots`], the slot threads.

use super::startup::Ready;
use super::status::{now_unix, JobLimits, SlotStatus, Status};
use super::{autoscale, phases, slot, Shared};
use crate::config::Home;
use crate::gpu;
use crate::rootfs::RootfsLease;
use crate::sandbox::limits::{self, node::Node};
use crate::sandbox::{JobPlan, Limits};
use crate::settings::RunSettings;
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// What runs between start-up and shutdown.
pub struct Running {
    pub shared: Arc<Shared>,
    pub slots: Slots,
    pub scaler: Option<autoscale::Scaler>,
    pub pool_id: u64,
    /// Per slot: its agent's name.
    pub names: Vec<String>,
    /// Held until shutdown.
    pub lease: RootfsLease,
}

pub fn start(home: &Home, settings: RunSettings, ready: Ready) -> Result<Running> {
    let autoscaling = settings.autoscale.is_some();
    let job_limits = job_limits(home, &settings, ready.split.len());
    let status = Status {
        pid: std::process::id(),
        url: settings.url.clone(),
        pool: settings.pool.clone(),
        started_unix: now_unix(),
        rootfs: ready.rootfs_name.clone(),
        limits_enforced: crate::rootless::mode().cgroups.parent().is_some(),
        limits_warning: crate::rootless::mode().limits_warning(),
        job_limits: Some(job_limits.clone()),
        stopping: false,
        slots: ready
            .names
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
        failed_jobs: vec![],
        caches: vec![],
        mirrors: vec![],
    };
    let agent_version = ready.package.version.to_string();
    let (configs, shapes) = configs(home, &settings, &ready, &agent_version, job_limits.per_job)?;
    let shared = Arc::new(Shared {
        home: home.clone(),
        settings: settings.clone(),
        token: ready.token,
        client: ready.client,
        pool_id: ready.pool_id,
        stopping: AtomicBool::new(false),
        status: Mutex::new(status),
        package: RwLock::new(ready.package),
        packages: ready.packages,
    });
    let mut slots = Slots::new(configs);
    let scaler = match &settings.autoscale {
        Some(a) => Some(autoscale::Scaler::start(&shared, ready.pool_id, a.clone(), shapes, &agent_version)?),
        None => {
            for i in 0..slots.len() {
                slots.start(i, &shared)?;
            }
            tracing::info!("{} slot(s) started: {}", slots.len(), ready.names.join(", "));
            None
        }
    };
    Ok(Running { shared, slots, scaler, pool_id: ready.pool_id, names: ready.names, lease: ready.lease })
}

/// The limits of every job, from the settings and the node shared by `slots` slots: one
/// line at start, and one per warning.
fn job_limits(home: &Home, settings: &RunSettings, slots: usize) -> JobLimits {
    let node = Node::read(home, crate::rootless::mode().rootless, true);
    let resolved = limits::resolve(&settings.limits, &node, slots);
    let basis = limits::defaults::basis(&node, slots);
    tracing::info!("job limits: {} per job ({basis})", resolved.limits);
    // A service says at start all that its jobs do not get, asked or not.
    let warnings: Vec<String> = resolved.notes.iter().chain(&resolved.warnings).cloned().collect();
    for w in &warnings {
        tracing::warn!("{w}");
    }
    JobLimits { per_job: resolved.limits, basis, warnings }
}

/// Per slot: its config, and the capabilities its listener advertises (matched against
/// the queue's demands by the autoscaler).
#[allow(clippy::type_complexity)]
fn configs(
    home: &Home,
    settings: &RunSettings,
    ready: &Ready,
    agent_version: &str,
    limits: Limits,
) -> Result<(Vec<slot::SlotConfig>, Vec<BTreeMap<String, String>>)> {
    let (driver, lease, user, names) = (&ready.driver, &ready.lease, ready.user, &ready.names);
    let caps = gpu::Capabilities::default();
    let mut configs = Vec::new();
    let mut shapes = Vec::new();
    for (i, gpus) in ready.split.iter().enumerate() {
        let mut edits = if gpus.is_empty() { Default::default() } else { gpu::inject::edits(driver, gpus, &caps)? };
        if let Some(c) = &ready.compat {
            c.apply(&mut edits);
        }
        // Every job reads the git mirrors (read-only volumes, git alternates).
        let (mirror_volumes, mirror_env) = crate::mirror::job_volumes(home, &settings.git_mirrors);
        let base_plan = JobPlan {
            id: String::new(),
            lower: vec![lease.path().to_path_buf()],
            args: vec![],
            env: [ready.proxy_env.clone(), mirror_env].concat(),
            cwd: phases::agent_dir(),
            uid: 0,
            gid: 0,
            hostname: names[i].clone(),
            volumes: [settings.volumes.clone(), mirror_volumes].concat(),
            limits,
            network: settings.network,
            net: ready.net.clone(),
            edits,
            cgroup_path: PathBuf::new(),
            owned_dirs: vec![],
            rootless: false,
            process: Default::default(),
            userns: None,
            scratch: None,
            caches: vec![],
        };
        crate::sandbox::runner::validate(&base_plan)?;
        let facts = phases::SlotFacts {
            slot: i,
            rootfs: ready.rootfs_name.clone(),
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
        shapes.push(phases::advertised_capabilities(&listener, &names[i], agent_version, lease.path()));
        configs.push(cfg);
    }
    Ok((configs, shapes))
}

/// The slot threads: started all at once, or one by one by the autoscaler.
pub struct Slots {
    pub(super) v: Vec<SlotHandle>,
}

pub(super) struct SlotHandle {
    pub(super) cfg: slot::SlotConfig,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
    /// The pid of the slot's current sandbox helper (0: none yet).
    pub(super) pid: Arc<AtomicI32>,
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
    pub(super) fn start(&mut self, i: usize, shared: &Arc<Shared>) -> Result<()> {
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
    pub(super) fn alive(&self, i: usize) -> bool {
        self.v[i].thread.is_some()
    }

    pub(super) fn all_finished(&self) -> bool {
        self.v.iter().all(|h| h.thread.as_ref().is_none_or(|t| t.is_finished()))
    }

    /// Joins the threads that ended; returns their slot indexes.
    pub(super) fn reap(&mut self) -> Vec<usize> {
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
    pub(super) fn any_busy(&self, home: &Home, work_root: Option<&Path>) -> bool {
        let layer_dirs = home.job_layer_dirs();
        self.v.iter().any(|h| h.thread.is_some() && job_in_progress(&layer_dirs, &h.cfg.agent_name, work_root))
    }
}

/// Is the slot's current job (its layer dir, among `layer_dirs` from
/// [`Home::job_layer_dirs`], listed once for all slots; its work dir under `work_root`
/// with `--work-dir`) showing a job the agent has taken?
pub(super) fn job_in_progress(layer_dirs: &[PathBuf], agent_name: &str, work_root: Option<&Path>) -> bool {
    layer_dirs.iter().any(|dir| {
        let n = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        n.strip_prefix(agent_name)
            .is_some_and(|rest| rest.starts_with('-') && rest[1..].chars().all(|c| c.is_ascii_digit()))
            && slot::ran_a_job(&dir.join("upper"), work_root.map(|r| r.join(&n)).as_deref())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_busy_once_its_agent_took_a_job() {
        let tmp = tempfile::tempdir().unwrap();
        let layer = |name: &str, took_job: bool| {
            let upper = tmp.path().join(name).join("upper");
            let agent = upper.join(phases::AGENT_DIR.trim_start_matches('/'));
            std::fs::create_dir_all(if took_job { agent.join(phases::WORK_DIR) } else { agent }).unwrap();
            tmp.path().join(name)
        };
        let dirs = [layer("host-1-7", false), layer("host-10-3", true), layer("host-2-x", true)];
        assert!(!job_in_progress(&dirs, "host-1", None), "host-1's agent took no job; host-10 is another slot");
        assert!(job_in_progress(&dirs, "host-10", None));
        assert!(!job_in_progress(&dirs, "host-2", None), "not one of its job ids");
        assert!(job_in_progress(&[layer("host-1-8", true)], "host-1", None));
    }
}
