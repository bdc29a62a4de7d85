//! `azp-sandbox run`: N agent slots, each a thread running one job per fresh sandbox.
//!
//! Process model: this process is multi-threaded (slot threads, the HTTP client), so it
//! never calls libcontainer: every container is created by a single-threaded helper
//! process (see `sandbox::helper`). Signals are taken synchronously by the main thread
//! (blocked everywhere, then sigwait), which drains the slots.
//!
//! [`run`] is a straight line of phases, each a module: [`startup`] (the checks before
//! any slot starts), [`slots`] (the slot threads, or the [`autoscale`]r that starts
//! them), [`drain`] (when to stop, and the slots' drain), [`shutdown`] (records, gc).

pub mod autoscale;
pub mod caches;
pub mod diag;
pub mod drain;
pub mod failed;
pub mod hooks;
pub mod joblog;
pub mod lock;
pub mod phases;
pub mod service;
pub mod shutdown;
pub mod slot;
pub mod slots;
pub mod startup;
pub mod status;
pub mod workdir;

use crate::agent::package::{AgentPackage, PackageCache};
use crate::azure::AzureClient;
use crate::config::Home;
use crate::settings::{self, RunSettings};
use anyhow::{bail, Context, Result};
use slots::{job_in_progress, Slots};
use status::{SlotStatus, Status};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

/// State shared by the slot threads and the main thread.
pub struct Shared {
    pub home: Home,
    pub settings: RunSettings,
    pub token: String,
    client: AzureClient,
    /// The pool's id (for the caches' trust lookups).
    pool_id: u64,
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
        if let Err(e) = status::write(&status::path(&self.home), &st) {
            tracing::warn!("{e:#}");
        }
    }

    /// Where this home's per-job work dirs go (`--work-dir`), if anywhere.
    pub fn work_root(&self) -> Option<PathBuf> {
        workdir::root(&self.home, &self.settings)
    }

    /// The rootfs the slots run on.
    pub fn rootfs_name(&self) -> String {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).rootfs.clone()
    }

    /// The agent package's version (it changes after an update).
    pub fn package_version(&self) -> String {
        self.package.read().unwrap_or_else(|p| p.into_inner()).version.clone()
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
        if let Err(e) = status::write(&status::path(&self.home), &st) {
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

/// `run`, as its phases: start-up checks, the slots, the wait and the drain, shutdown.
pub fn run(home: &Home, settings: RunSettings, ctx: RunContext) -> Result<()> {
    // Signals first, before any thread exists, so every thread inherits the mask.
    let mut sigs = nix::sys::signal::SigSet::empty();
    for s in [nix::sys::signal::SIGTERM, nix::sys::signal::SIGINT, nix::sys::signal::SIGHUP] {
        sigs.add(s);
    }
    sigs.thread_block().context("cannot block signals")?;

    // Held until run returns: a second manager on this home is refused, naming our pid.
    let _home_lock = lock::acquire(home, "run")?;
    let ready = startup::check(home, &settings, ctx)?;
    // Made by the check: kept through firewall reloads until the drain is over.
    let table = (settings.network == crate::config::Network::Isolated && !crate::rootless::mode().rootless)
        .then(|| crate::sandbox::network::table_keeper::keep(ready.net.clone()));
    let mirrors_stop = std::sync::Arc::new(AtomicBool::new(false));
    // Not joined: a long first fetch must not hold up the drain (an interrupted fetch
    // leaves the mirror as it was).
    let _mirrors = crate::mirror::keeper::start(home.clone(), settings.git_mirrors.clone(), mirrors_stop.clone());
    let mut running = slots::start(home, settings, ready)?;
    let stop = drain::wait_for_stop(&sigs, home, &mut running);
    mirrors_stop.store(true, Ordering::SeqCst);
    drain::drain(&sigs, home, &mut running, stop);
    // Before the shutdown's gc removes the table.
    drop(table);
    shutdown::shutdown(home, running)
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

/// `azp-sandbox agents prune --pool P`: removes every offline agent with our prefix.
pub fn prune_command(settings: &RunSettings, env_token: Option<String>) -> Result<Vec<String>> {
    let token = settings::read_token(settings.token_file.as_deref(), env_token)?;
    let client = AzureClient::new(&settings.url, &token)?;
    let pool = client.find_pool(&settings.pool)?;
    prune(&client, pool.id, &settings.name_prefix, |_| false)
}
