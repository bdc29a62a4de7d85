//! `HOME/status.json`: what the running manager is doing, rewritten (atomically) on every
//! slot change, shown by `azp-sandbox status`.

use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Status {
    pub pid: u32,
    pub url: String,
    pub pool: String,
    pub started_unix: u64,
    pub rootfs: String,
    pub limits_enforced: bool,
    /// Why limits are not enforced and how to fix it (rootless without delegation).
    #[serde(default)]
    pub limits_warning: Option<String>,
    pub stopping: bool,
    pub slots: Vec<SlotStatus>,
    /// Queue-driven autoscaling: queue, knobs and the latest decisions.
    #[serde(default)]
    pub scaler: Option<crate::scaler::ScalerStatus>,
    /// Failed jobs kept for inspection (`--keep-failed`), oldest first: read from
    /// `HOME/failed` by `status`, not written by the manager.
    #[serde(default)]
    pub failed_jobs: Vec<super::failed::KeptJob>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SlotStatus {
    pub slot: usize,
    pub agent: String,
    /// off (autoscaling) | starting | configuring | waiting-for-job | busy | paused | stopping | stopped
    pub state: String,
    /// Since when the agent has been up (waiting or running a job).
    pub since_unix: u64,
    pub gpus: Vec<String>,
    pub jobs_done: u64,
    pub last_exit: Option<i32>,
    pub last_result: Option<String>,
    pub paused_reason: Option<String>,
}

/// The clock lives in [`crate::clock`]; the manager's modules take it from here.
pub use crate::clock::now_unix;

pub fn write(path: &Path, status: &Status) -> Result<()> {
    crate::json_file::write_atomic(path, status)
}

/// `HOME/status.json`.
pub fn path(home: &crate::config::Home) -> std::path::PathBuf {
    home.root().join("status.json")
}

/// Human-readable table for `azp-sandbox status`.
pub fn render(s: &Status, alive: bool) -> String {
    let now = now_unix();
    let mut out = format!(
        "manager   pid {} ({})\npool      {} at {}\nrootfs    {}\n",
        s.pid,
        if !alive {
            "NOT RUNNING"
        } else if s.stopping {
            "stopping"
        } else {
            "running"
        },
        s.pool,
        s.url,
        s.rootfs
    );
    if let Some(sc) = &s.scaler {
        out.push_str(&sc.render(now));
    }
    if !s.limits_enforced {
        let why = s.limits_warning.as_deref().unwrap_or("WARNING: memory/pids/cpu limits are NOT enforced for jobs");
        out.push_str(&format!("{why}\n"));
    }
    out.push_str(&format!(
        "{:<5} {:<24} {:<16} {:>8} {:>5} {:<20} {}\n",
        "SLOT", "AGENT", "STATE", "AGE", "JOBS", "GPUS", "NOTE"
    ));
    for sl in &s.slots {
        let age = if sl.since_unix == 0 { 0 } else { now.saturating_sub(sl.since_unix) };
        let note = sl
            .paused_reason
            .clone()
            .or_else(|| sl.last_result.clone().map(|r| format!("last job: {r}")))
            .or_else(|| sl.last_exit.map(|c| format!("last run.sh exit {c}")))
            .unwrap_or_default();
        out.push_str(&format!(
            "{:<5} {:<24} {:<16} {:>7}s {:>5} {:<20} {}\n",
            sl.slot,
            sl.agent,
            sl.state,
            age,
            sl.jobs_done,
            if sl.gpus.is_empty() { "-".to_string() } else { sl.gpus.join(",") },
            note
        ));
    }
    out.push_str(&super::failed::render(&s.failed_jobs));
    out
}
