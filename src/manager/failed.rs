//! Failed jobs kept for inspection (`run --keep-failed N`, Azure's elastic pools call it
//! `maxSavedNodeCount`): the writable layer and the logs of the last N jobs whose agent
//! failed (run.sh exit != 0), whose sandbox failed, or that were killed. Each one is
//! `HOME/failed/<agent>/<job>/` with `layer/` (the overlay's upper and work dirs, moved
//! there, not copied), `agent.log` (the job's section of the agent's log), `diag/` (its
//! `_diag` copy) and `info.json`. `HOME/failed` is root-only (0700): no job, and no other
//! host user, can reach what a job left. `status` lists them; `gc --failed` removes them;
//! the oldest go when more than N are kept.

use crate::config::Home;
use crate::sys::fs_at;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

const INFO: &str = "info.json";
/// The job's writable layer, below its kept dir.
pub const LAYER: &str = "layer";

/// One kept failed job, as `status` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptJob {
    pub job: String,
    pub agent: String,
    pub slot: usize,
    pub failed_unix: u64,
    /// Why it counts as failed: `run.sh --once exited with 1`, `killed by signal 9`, or
    /// the sandbox's error.
    pub reason: String,
    pub rootfs: String,
    /// `HOME/failed/<agent>/<job>` (filled in when listed).
    #[serde(default)]
    pub dir: PathBuf,
}

/// The dir a failed job of `agent` is kept in (made, root-only, with its parents).
pub fn make_dir(home: &Home, agent: &str, job: &str) -> Result<PathBuf> {
    let top = home.failed_dir();
    for d in [top.clone(), top.join(agent)] {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&d)
            .or_else(|e| if e.kind() == std::io::ErrorKind::AlreadyExists { Ok(()) } else { Err(e) })
            .with_context(|| format!("cannot create {}", d.display()))?;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot make {} root-only", top.display()))?;
    let dir = top.join(agent).join(job);
    let _ = fs_at::remove_tree(&dir); // a leftover of a run that died while keeping it
    std::fs::DirBuilder::new().mode(0o700).create(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// Writes the record of a kept job into its dir, then removes the oldest kept jobs until
/// at most `keep` are left.
pub fn record(home: &Home, dir: &Path, job: &KeptJob, keep: usize) -> Result<()> {
    crate::json_file::write_atomic(&dir.join(INFO), job)?;
    for old in list(home).into_iter().rev().skip(keep) {
        match fs_at::remove_tree(&old.dir) {
            Ok(()) => tracing::info!("removed kept failed job {} (more than {keep} kept)", old.job),
            Err(e) => tracing::warn!("cannot remove kept failed job {}: {e}", old.dir.display()),
        }
    }
    Ok(())
}

/// The kept failed jobs, oldest first. A dir without a readable record (a run that died
/// while keeping it) is listed with what its path says.
pub fn list(home: &Home) -> Vec<KeptJob> {
    let mut out = Vec::new();
    for agent in read_dir(&home.failed_dir()) {
        for dir in read_dir(&agent) {
            let job = match std::fs::read(dir.join(INFO)).ok().and_then(|b| serde_json::from_slice::<KeptJob>(&b).ok())
            {
                Some(j) => j,
                None => KeptJob {
                    job: name_of(&dir),
                    agent: name_of(&agent),
                    slot: 0,
                    failed_unix: mtime(&dir),
                    reason: "unknown (no info.json)".into(),
                    rootfs: String::new(),
                    dir: PathBuf::new(),
                },
            };
            out.push(KeptJob { dir, ..job });
        }
    }
    out.sort_by(|a, b| (a.failed_unix, &a.job).cmp(&(b.failed_unix, &b.job)));
    out
}

/// `gc --failed`: removes every kept failed job; returns what was removed.
pub fn remove_all(home: &Home) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for j in list(home) {
        fs_at::remove_tree(&j.dir).with_context(|| format!("cannot remove {}", j.dir.display()))?;
        removed.push(format!("kept failed job {} ({})", j.job, j.dir.display()));
    }
    for agent in read_dir(&home.failed_dir()) {
        let _ = std::fs::remove_dir(agent);
    }
    Ok(removed)
}

/// `status`'s lines for the kept jobs (empty when there are none).
pub fn render(jobs: &[KeptJob]) -> String {
    if jobs.is_empty() {
        return String::new();
    }
    let mut out = format!("failed jobs kept ({}, `azp-sandbox gc --failed` removes them):\n", jobs.len());
    for j in jobs {
        out.push_str(&format!(
            "  {:<24} {} {} -> {}\n",
            j.job,
            crate::clock::rfc3339(j.failed_unix),
            j.reason,
            j.dir.display()
        ));
    }
    out
}

fn read_dir(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

fn name_of(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn mtime(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p).map(|m| m.mtime().max(0) as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(home: &Home, agent: &str, job: &str, at: u64, keep: usize) -> PathBuf {
        let dir = make_dir(home, agent, job).unwrap();
        std::fs::create_dir_all(dir.join(LAYER).join("upper")).unwrap();
        let j = KeptJob {
            job: job.into(),
            agent: agent.into(),
            slot: 0,
            failed_unix: at,
            reason: "run.sh --once exited with 1".into(),
            rootfs: "bb".into(),
            dir: PathBuf::new(),
        };
        record(home, &dir, &j, keep).unwrap();
        dir
    }

    #[test]
    fn the_newest_n_are_kept_root_only_and_gc_removes_them() {
        let t = tempfile::tempdir().unwrap();
        let home = Home::new(t.path());
        kept(&home, "h-0", "h-0-1", 100, 2);
        kept(&home, "h-1", "h-1-1", 200, 2);
        let third = kept(&home, "h-0", "h-0-2", 300, 2);
        let jobs: Vec<String> = list(&home).into_iter().map(|j| j.job).collect();
        assert_eq!(jobs, ["h-1-1", "h-0-2"], "the oldest went");
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&home.failed_dir()), 0o700);
        assert_eq!(mode(&third), 0o700);
        let text = render(&list(&home));
        assert!(text.starts_with("failed jobs kept (2, `azp-sandbox gc --failed` removes them):"), "{text}");
        assert!(text.contains("h-0-2") && text.contains("run.sh --once exited with 1"), "{text}");
        // A dir whose record is missing is still listed (and removed by gc).
        std::fs::create_dir_all(home.failed_dir().join("h-2/h-2-9")).unwrap();
        assert!(list(&home).iter().any(|j| j.job == "h-2-9" && j.reason.starts_with("unknown")));
        let removed = remove_all(&home).unwrap();
        assert_eq!(removed.len(), 3, "{removed:?}");
        assert!(list(&home).is_empty());
        assert_eq!(render(&[]), "");
    }
}
