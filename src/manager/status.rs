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
    /// The limits every job runs with (the node's defaults where not said).
    #[serde(default)]
    pub job_limits: Option<JobLimits>,
    pub stopping: bool,
    pub slots: Vec<SlotStatus>,
    /// Queue-driven autoscaling: queue, knobs and the latest decisions.
    #[serde(default)]
    pub scaler: Option<crate::scaler::ScalerStatus>,
    /// Failed jobs kept for inspection (`--keep-failed`), oldest first: read from
    /// `HOME/failed` by `status`, not written by the manager.
    #[serde(default)]
    pub failed_jobs: Vec<super::failed::KeptJob>,
    /// The home's caches (see [`crate::cache`]): read from the home by `status`.
    #[serde(default)]
    pub caches: Vec<crate::cache::store::Summary>,
    /// The home's git mirrors (see [`crate::mirror`]): read from the home by `status`.
    #[serde(default)]
    pub mirrors: Vec<crate::mirror::summary::Summary>,
}

/// The limits of each job, what their defaults came from, and the warnings of the start
/// (a limit said `unlimited`, no disk quota on the home's filesystem, swap).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JobLimits {
    pub per_job: crate::sandbox::Limits,
    /// What the defaults were derived from (slots, memory, cores, pid_max, free space).
    pub basis: String,
    #[serde(default)]
    pub warnings: Vec<String>,
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
    if let Some(l) = &s.job_limits {
        out.push_str(&format!("limits    per job: {} ({})\n", l.per_job, l.basis));
        for w in &l.warnings {
            out.push_str(&format!("{w}\n"));
        }
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
    out.push_str(&crate::cache::store::render(&s.caches));
    out.push_str(&crate::mirror::summary::render(&s.mirrors));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_in_force_and_their_warnings_are_shown() {
        let per_job = crate::sandbox::Limits { memory_bytes: Some(4 << 30), pids: Some(4096), ..Default::default() };
        let st = Status {
            job_limits: Some(JobLimits {
                per_job,
                basis: "2 slot(s) sharing 10.0G of RAM".into(),
                warnings: vec!["WARNING: no disk quota for jobs: why".into()],
            }),
            limits_enforced: true,
            ..Default::default()
        };
        let text = render(&st, true);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.contains(&"limits    per job: memory 4.0G, pids 4096, cpus unlimited, disk unlimited, /tmp half the RAM, /dev/shm 1.0G (2 slot(s) sharing 10.0G of RAM)"), "{text}");
        assert!(lines.contains(&"WARNING: no disk quota for jobs: why"), "{text}");
        // JSON: the numbers, for scripts; a status file of an older manager has none.
        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(json["job_limits"]["per_job"]["pids"], 4096);
        let old: Status = serde_json::from_str(r#"{"pid":1,"url":"","pool":"","started_unix":0,"rootfs":"","limits_enforced":true,"stopping":false,"slots":[]}"#).unwrap();
        assert!(old.job_limits.is_none());
    }
}
