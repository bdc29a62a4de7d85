//! `run --autoscale`: slots are started while jobs they can serve wait in the pool's
//! queue, and stopped after `--idle-timeout` without a job. A job never loses its agent:
//! only a slot whose agent has taken no job is stopped, and before it is signalled its
//! agent record is disabled in the pool (the server then assigns it nothing) and checked
//! once more, locally ([`super::job_in_progress`]) and on the server (`assignedRequest`).
//! While no agent is online an offline placeholder record with the slots' capabilities
//! keeps jobs queued (see [`crate::scaler::ensure_placeholder`]).

use super::{job_in_progress, Shared, Slots};
use crate::manager::status::now_unix;
use crate::scaler::policy::{self, SlotState};
use crate::scaler::{self, queue, AutoscaleSettings, ScalerStatus};
use anyhow::Result;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Scaler {
    pool_id: u64,
    cfg: AutoscaleSettings,
    /// Per slot: the capabilities its listener advertises.
    shapes: Vec<BTreeMap<String, String>>,
    placeholder: String,
    next_poll: Instant,
    /// Per slot: when it was last seen running a job (idle time counts from there too).
    busy_seen: Vec<Option<Instant>>,
    /// Per slot: the helper pid last sent SIGTERM after a stop decision.
    signalled: Vec<Option<i32>>,
    warned_truncated: bool,
}

impl Scaler {
    /// Registers the placeholder agent and the scaler's status; no slot is started yet.
    pub fn start(
        shared: &Arc<Shared>,
        pool_id: u64,
        cfg: AutoscaleSettings,
        shapes: Vec<BTreeMap<String, String>>,
        agent_version: &str,
    ) -> Result<Scaler> {
        let n = shapes.len();
        let placeholder = scaler::placeholder_name(&shared.settings.name_prefix);
        scaler::ensure_placeholder(&shared.client, pool_id, &placeholder, agent_version, &shapes[0])?;
        {
            let mut st = shared.status.lock().unwrap_or_else(|p| p.into_inner());
            st.scaler = Some(ScalerStatus {
                mode: "autoscale".into(),
                min: cfg.min_agents,
                max: n,
                idle_timeout_s: cfg.idle_timeout.as_secs(),
                poll_interval_s: cfg.poll_interval.as_secs(),
                placeholder: Some(placeholder.clone()),
                ..Default::default()
            });
        }
        tracing::info!(
            "autoscaling {}..{n} agent(s) on the queue of pool '{}': read every {}s, idle timeout {}s",
            cfg.min_agents,
            shared.settings.pool,
            cfg.poll_interval.as_secs(),
            cfg.idle_timeout.as_secs()
        );
        Ok(Scaler {
            pool_id,
            cfg,
            placeholder,
            next_poll: Instant::now(),
            busy_seen: vec![None; n],
            signalled: vec![None; n],
            shapes,
            warned_truncated: false,
        })
    }

    /// Called every ~500 ms by the manager's main loop.
    pub fn tick(&mut self, shared: &Arc<Shared>, slots: &mut Slots) {
        for i in slots.reap() {
            self.retire(shared, slots, i);
        }
        self.resignal(slots);
        if Instant::now() < self.next_poll {
            return;
        }
        self.next_poll = Instant::now() + self.cfg.poll_interval;
        let requests = match shared.client.open_job_requests(self.pool_id, queue::DEFAULT_TOP) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("autoscale: cannot read the queue: {e}");
                shared.update_scaler(|s| s.last_error = Some(format!("cannot read the queue: {e}")));
                return;
            }
        };
        let q = queue::classify(&requests, &self.shapes, queue::DEFAULT_TOP);
        if q.maybe_truncated() && !self.warned_truncated {
            tracing::warn!("autoscale: the pool has {} or more open job requests: only the newest are read", q.top);
            self.warned_truncated = true;
        }
        let layer_dirs = shared.home.job_layer_dirs();
        let states: Vec<SlotState> = (0..slots.len()).map(|i| self.state_of(shared, slots, &layer_dirs, i)).collect();
        let candidates: Vec<usize> = (0..slots.len())
            .filter(|i| states[*i] == SlotState::Off)
            .filter(|i| q.matching().any(|w| scaler::demands::check_all(&w.demands, &self.shapes[*i]).is_ok()))
            .collect();
        let summary = q.matching_summary();
        let d = policy::decide_slots(&policy::SlotsInput {
            waiting: q.matching_count(),
            waiting_for: &summary,
            slots: &states,
            candidates: &candidates,
            min: self.cfg.min_agents,
            max: slots.len(),
            idle_timeout: self.cfg.idle_timeout,
        });
        let mut reason = d.reason.clone();
        for &i in &d.start {
            match slots.start(i, shared) {
                Ok(()) => {
                    self.busy_seen[i] = None;
                    self.signalled[i] = None;
                    shared.update_slot(i, |s| {
                        s.state = "starting".into();
                        s.since_unix = now_unix();
                    });
                }
                Err(e) => reason.push_str(&format!("; slot {i} failed to start: {e:#}")),
            }
        }
        let mut kept = Vec::new();
        for &i in &d.stop {
            match self.try_stop(shared, slots, i) {
                Ok(true) => {}
                Ok(false) => kept.push(i),
                Err(e) => {
                    tracing::warn!(slot = i, "autoscale: cannot stop the idle agent safely, keeping it: {e}");
                    kept.push(i);
                }
            }
        }
        if !kept.is_empty() {
            reason.push_str(&format!("; kept slot(s) {kept:?}: a job arrived or the check failed"));
        }
        tracing::debug!("autoscale: queue {}", q.line());
        let now = now_unix();
        shared.update_scaler(|s| {
            s.set_queue(&q, now);
            s.record(&reason, d.acts(), now);
        });
    }

    fn state_of(&mut self, shared: &Shared, slots: &Slots, layer_dirs: &[std::path::PathBuf], i: usize) -> SlotState {
        if !slots.alive(i) {
            return SlotState::Off;
        }
        let h = &slots.v[i];
        if h.cfg.stop.load(Ordering::SeqCst) {
            return SlotState::Stopping;
        }
        if job_in_progress(layer_dirs, &h.cfg.agent_name, shared.work_root().as_deref()) {
            self.busy_seen[i] = Some(Instant::now());
            return SlotState::Busy;
        }
        match shared.slot_state(i) {
            Some((state, since)) if state == "waiting-for-job" => {
                let mut idle = Duration::from_secs(now_unix().saturating_sub(since));
                if let Some(b) = self.busy_seen[i] {
                    idle = idle.min(b.elapsed());
                }
                SlotState::Idle(idle)
            }
            _ => SlotState::Starting,
        }
    }

    /// Stops slot `i` if its agent has no job: disable its record (no new assignment),
    /// check again, then signal it. Ok(false): it got a job meanwhile and is kept.
    fn try_stop(&mut self, shared: &Shared, slots: &Slots, i: usize) -> Result<bool> {
        let h = &slots.v[i];
        let name = &h.cfg.agent_name;
        let client = &shared.client;
        let home = &shared.home;
        let record = client.list_agents(self.pool_id, Some(name))?.into_iter().find(|a| a.name == *name);
        if let Some(a) = &record {
            if a.assigned_request.is_some()
                || job_in_progress(&home.job_layer_dirs(), name, shared.work_root().as_deref())
            {
                return Ok(false);
            }
            client.set_agent_enabled(self.pool_id, a.id, false)?;
            let again = client.list_agents(self.pool_id, Some(name))?.into_iter().find(|x| x.name == *name);
            if again.as_ref().is_some_and(|x| x.assigned_request.is_some())
                || job_in_progress(&home.job_layer_dirs(), name, shared.work_root().as_deref())
            {
                client.set_agent_enabled(self.pool_id, a.id, true)?;
                return Ok(false);
            }
        } else if job_in_progress(&home.job_layer_dirs(), name, shared.work_root().as_deref()) {
            return Ok(false);
        }
        h.cfg.stop.store(true, Ordering::SeqCst);
        shared.update_slot(i, |s| {
            s.state = "stopping".into();
            s.since_unix = now_unix();
        });
        tracing::info!(slot = i, "autoscale: stopping idle agent {name}");
        self.signalled[i] = None;
        self.resignal(slots);
        Ok(true)
    }

    /// SIGTERM to the helper of every slot told to stop (again when a new phase began).
    fn resignal(&mut self, slots: &Slots) {
        for (i, h) in slots.v.iter().enumerate() {
            if h.thread.is_none() || !h.cfg.stop.load(Ordering::SeqCst) {
                continue;
            }
            let p = h.pid.load(Ordering::SeqCst);
            if p > 0 && self.signalled[i] != Some(p) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::SIGTERM);
                self.signalled[i] = Some(p);
            }
        }
    }

    /// A slot's thread ended: its agent record goes (the next start registers anew).
    fn retire(&mut self, shared: &Shared, slots: &Slots, i: usize) {
        let name = &slots.v[i].cfg.agent_name;
        match shared.client.list_agents(self.pool_id, Some(name)) {
            Ok(list) => {
                for a in list.into_iter().filter(|a| a.name == *name) {
                    if let Err(e) = shared.client.delete_agent(self.pool_id, a.id) {
                        tracing::warn!("autoscale: cannot remove the record of stopped agent {name}: {e}");
                    }
                }
            }
            Err(e) => tracing::warn!("autoscale: cannot list agent {name}: {e}"),
        }
        shared.update_slot(i, |s| {
            s.state = "off".into();
            s.since_unix = now_unix();
        });
        tracing::info!(slot = i, "autoscale: agent {name} stopped and its record removed");
    }

    /// At the manager's end: the placeholder goes too.
    pub fn shutdown(self, client: &crate::azure::AzureClient) {
        if let Err(e) = scaler::remove_placeholder(client, self.pool_id, &self.placeholder) {
            tracing::warn!("cannot remove the placeholder agent '{}': {e}; delete it by hand", self.placeholder);
        }
    }
}
