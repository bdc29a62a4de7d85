//! Queue-driven autoscaling: read the pool's queue, keep only the jobs our agents can
//! serve, decide (with a reason) how much capacity to start or stop, and keep an offline
//! placeholder agent record so that Azure queues jobs while none of ours is online.
//!
//! The pieces are pure and unit-tested ([`demands`], [`queue`], [`policy`]); the loops
//! that act on them are `manager::autoscale` (slots on one host) and `slurm` (batch jobs).

pub mod demands;
pub mod policy;
pub mod queue;

use crate::azure::{AzureClient, AzureError};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

/// The knobs of `run --autoscale` (and their Slurm counterparts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoscaleSettings {
    pub min_agents: usize,
    /// None: as many slots as `run` would start without autoscaling.
    pub max_agents: Option<usize>,
    /// An agent without a job for this long is stopped.
    pub idle_timeout: Duration,
    /// How often the queue is read.
    pub poll_interval: Duration,
}

impl Default for AutoscaleSettings {
    fn default() -> Self {
        AutoscaleSettings {
            min_agents: 0,
            max_agents: None,
            idle_timeout: Duration::from_secs(300),
            poll_interval: Duration::from_secs(15),
        }
    }
}

/// The placeholder record's name for agents named `<prefix>-...`.
pub fn placeholder_name(prefix: &str) -> String {
    format!("{prefix}-placeholder")
}

/// Registers (or re-registers) the offline placeholder agent `name` with `caps`, so that
/// the service queues matching jobs while none of our agents is online (with no matching
/// agent at all, it fails them at once). It never connects: its key is thrown away.
pub fn ensure_placeholder(
    client: &AzureClient,
    pool_id: u64,
    name: &str,
    version: &str,
    caps: &BTreeMap<String, String>,
) -> Result<u64, AzureError> {
    for a in client.list_agents(pool_id, Some(name))? {
        if a.name == name {
            client.delete_agent(pool_id, a.id)?;
        }
    }
    let mut system = caps.clone();
    system.insert("Agent.Name".into(), name.into());
    system.insert("Agent.Version".into(), version.into());
    system.insert("Agent.OS".into(), "Linux".into());
    let body = serde_json::json!({
        "name": name,
        "version": version,
        "osDescription": "azp-sandbox placeholder: never online; lets jobs queue while autoscaled agents are stopped",
        "enabled": true,
        "maxParallelism": 1,
        "provisioningState": "Provisioned",
        "systemCapabilities": system,
        "authorization": {"publicKey": {"exponent": "AQAB", "modulus": random_modulus()}},
    });
    let a = client.add_agent(pool_id, &body)?;
    tracing::info!("placeholder agent '{name}' (id {}) registered: jobs queue while no agent is online", a.id);
    Ok(a.id)
}

/// Deletes the placeholder record(s) named `name`.
pub fn remove_placeholder(client: &AzureClient, pool_id: u64, name: &str) -> Result<(), AzureError> {
    for a in client.list_agents(pool_id, Some(name))? {
        if a.name == name {
            client.delete_agent(pool_id, a.id)?;
            tracing::info!("placeholder agent '{name}' (id {}) removed", a.id);
        }
    }
    Ok(())
}

fn random_modulus() -> String {
    let mut b = vec![0u8; 256];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    b[0] |= 0x80;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// What the scaler shows in `azp-sandbox status` (and the status JSON).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ScalerStatus {
    /// "autoscale" (slots on this host) or "slurm".
    pub mode: String,
    pub min: usize,
    pub max: usize,
    pub idle_timeout_s: u64,
    pub poll_interval_s: u64,
    pub placeholder: Option<String>,
    /// The last queue read, as one line.
    pub queue: String,
    pub waiting_for_us: usize,
    pub waiting_not_for_us: usize,
    pub running_in_pool: usize,
    pub last_poll_unix: u64,
    pub last_error: Option<String>,
    /// Newest last, at most [`DecisionLog::KEEP`].
    pub decisions: Vec<LoggedDecision>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LoggedDecision {
    pub unix: u64,
    pub reason: String,
}

/// The times are the caller's (`now`, Unix seconds): the scaler reads no clock, so it
/// needs nothing from the loops that drive it and its tests choose the time.
impl ScalerStatus {
    pub fn set_queue(&mut self, q: &queue::QueueView, now: u64) {
        self.queue = q.line();
        self.waiting_for_us = q.matching_count();
        self.waiting_not_for_us = q.unmatched_count();
        self.running_in_pool = q.running;
        self.last_poll_unix = now;
        self.last_error = None;
    }

    /// Logs and keeps `reason` when it acts or differs from the previous one (a steady
    /// state is logged once, not at every poll).
    pub fn record(&mut self, reason: &str, acts: bool, now: u64) {
        if !acts && self.decisions.last().is_some_and(|d| d.reason == reason) {
            return;
        }
        tracing::info!("{}: {reason}", self.mode);
        self.decisions.push(LoggedDecision { unix: now, reason: reason.to_string() });
        let n = self.decisions.len();
        if n > DecisionLog::KEEP {
            self.decisions.drain(..n - DecisionLog::KEEP);
        }
    }

    /// Lines for `azp-sandbox status`, decision ages as of `now`.
    pub fn render(&self, now: u64) -> String {
        let mut out = format!(
            "{:<9} min {} max {}, idle timeout {}s, queue read every {}s{}\n",
            self.mode,
            self.min,
            self.max,
            self.idle_timeout_s,
            self.poll_interval_s,
            self.placeholder.as_deref().map(|p| format!(", placeholder agent {p}")).unwrap_or_default()
        );
        out.push_str(&format!("queue     {}\n", if self.queue.is_empty() { "(not read yet)" } else { &self.queue }));
        if let Some(e) = &self.last_error {
            out.push_str(&format!("ERROR     {e}\n"));
        }
        for d in self.decisions.iter().rev().take(5) {
            out.push_str(&format!("decision  {:>5}s ago: {}\n", now.saturating_sub(d.unix), d.reason));
        }
        out
    }
}

/// Namespace for the decision log's size.
pub struct DecisionLog;
impl DecisionLog {
    pub const KEEP: usize = 20;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_are_logged_once_while_steady() {
        let mut s = ScalerStatus { mode: "autoscale".into(), ..Default::default() };
        s.record("idle: no agent running, no job waits for us", false, 100);
        s.record("idle: no agent running, no job waits for us", false, 101);
        s.record("scaled up 2 because 3 jobs wait for cuda_version 12.4", true, 102);
        s.record("scaled up 2 because 3 jobs wait for cuda_version 12.4", true, 103);
        assert_eq!(s.decisions.len(), 3);
        for _ in 0..50 {
            s.record("x", true, 200);
        }
        assert_eq!(s.decisions.len(), DecisionLog::KEEP);
        let r = s.render(230);
        assert!(r.contains("min 0 max 0") && r.contains("decision") && r.contains(": x"), "{r}");
        assert!(r.contains("   30s ago: x"), "ages count from the caller's now: {r}");
    }
}
