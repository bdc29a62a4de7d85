//! `azp-sandbox service install`: a systemd unit for the root service (what the seed's
//! `svc.sh install` did for one agent).

use crate::config::Home;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

pub fn unit_text(exe: &Path, config: &Path, home: &Home) -> String {
    format!(
        "[Unit]\n\
         Description=azp-sandbox: Azure Pipelines agents, one fresh sandbox per job\n\
         Documentation=https://github.com/azp-sandbox/azp-sandbox\n\
         After=network-online.target nvidia-persistenced.service\n\
         Wants=network-online.target\n\n\
         [Service]\n\
         Type=simple\n\
         ExecStart={exe} --home {home} run --config {config}\n\
         # SIGTERM drains: running jobs get drain_timeout_secs (config) to finish.\n\
         KillMode=mixed\n\
         TimeoutStopSec=infinity\n\
         Restart=on-failure\n\
         RestartSec=10\n\
         # The manager must outlive jobs under memory pressure (jobs get oom_score_adj 1000).\n\
         OOMScoreAdjust=-500\n\
         # cgroup v2: the manager moves into this unit's cgroup's leaf `manager`, and each job\n\
         # gets a cgroup below this unit's: MemoryMax=, TasksMax=, CPUQuota= here cap all\n\
         # jobs together, and `systemctl stop` reaches every one. (cgroup v1: jobs' cgroups\n\
         # are below /azp-sandbox in each hierarchy, outside this unit; README \"Limits\".)\n\
         Delegate=yes\n\
         # Each job has its own pids limit (4096 by default, at most 3/4 of pid_max shared\n\
         # by the slots); systemd's default TasksMax (15% of pid_max) would cap them all.\n\
         TasksMax=infinity\n\n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        exe = exe.display(),
        home = home.root().display(),
        config = config.display()
    )
}

pub fn install(unit_dir: &Path, name: &str, config: &Path, home: &Home) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the azp-sandbox binary")?;
    std::fs::create_dir_all(unit_dir).with_context(|| format!("cannot create {}", unit_dir.display()))?;
    let path = unit_dir.join(format!("{name}.service"));
    std::fs::write(&path, unit_text(&exe, config, home)).with_context(|| format!("cannot write {}", path.display()))?;
    reserve_job_ids();
    if !config.exists() {
        tracing::warn!(
            "{} does not exist yet: write it (url, pool, token_file, ...) before starting the service",
            config.display()
        );
    }
    Ok(path)
}

/// The service's jobs run as host ids of the azp-sandbox entry of /etc/subuid and
/// /etc/subgid (see [`crate::identity::range`]): added here when missing.
fn reserve_job_ids() {
    use crate::identity::range;
    if !nix::unistd::geteuid().is_root() {
        tracing::warn!("not root: the job ids are not reserved; {}", range::how_to_add());
        return;
    }
    match range::ensure(&range::Files::host()) {
        Ok(changed) => {
            for f in changed {
                tracing::info!(
                    "reserved host ids {}+{} for jobs in {}",
                    range::DEFAULT_START,
                    range::DEFAULT_COUNT,
                    f.display()
                );
            }
        }
        Err(e) => tracing::warn!("{e:#}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_delegates_its_cgroup() {
        let text = unit_text(Path::new("/usr/bin/azp-sandbox"), Path::new("/etc/c.toml"), &Home::new("/h"));
        let lines: Vec<&str> = text.lines().collect();
        for want in [
            "Delegate=yes",
            "TasksMax=infinity",
            "KillMode=mixed",
            "ExecStart=/usr/bin/azp-sandbox --home /h run --config /etc/c.toml",
        ] {
            assert!(lines.contains(&want), "{want}: {text}");
        }
    }
}
