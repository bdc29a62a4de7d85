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

/// The binary the unit runs: this one.
pub fn current_exe() -> Result<PathBuf> {
    std::env::current_exe().context("cannot find the azp-sandbox binary")
}

/// Why a unit should not run `exe`: it is inside a cargo build tree, which the next
/// `cargo build` or `cargo clean` replaces or removes under the running service.
pub fn build_tree_warning(exe: &Path) -> Option<String> {
    let s = exe.to_string_lossy();
    ["/target/debug/", "/target/release/"].iter().any(|t| s.contains(t)).then(|| {
        format!(
            "the unit runs {}, inside a cargo build tree (the next cargo build or clean changes it under the service): \
             install the binary first, e.g. install -m 755 {} /usr/local/bin/ and run that one's `service install`",
            s,
            s
        )
    })
}

/// The unit's file name in `unit_dir` for the service `name`, refusing names systemd would
/// not take as one file name.
pub fn unit_path(unit_dir: &Path, name: &str) -> Result<PathBuf> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@' | ':' | '\\'));
    if !ok {
        anyhow::bail!(
            "bad service --name '{}': use letters, digits and - _ . @ (e.g. azp-sandbox-gpu)",
            name.escape_debug()
        );
    }
    Ok(unit_dir.join(format!("{name}.service")))
}

pub fn install(unit_dir: &Path, name: &str, config: &Path, home: &Home) -> Result<PathBuf> {
    let exe = current_exe()?;
    let path = unit_path(unit_dir, name)?;
    std::fs::create_dir_all(unit_dir).with_context(|| format!("cannot create {}", unit_dir.display()))?;
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
    fn a_binary_in_a_build_tree_is_named() {
        for exe in ["/src/azp/target/debug/azp-sandbox", "/w/target/release/azp-sandbox"] {
            let w = build_tree_warning(Path::new(exe)).unwrap_or_else(|| panic!("{exe}"));
            assert!(w.contains(exe) && w.contains("install") && !w.contains('\n'), "{w}");
        }
        for exe in ["/usr/local/bin/azp-sandbox", "/opt/target/azp-sandbox"] {
            assert_eq!(build_tree_warning(Path::new(exe)), None, "{exe}");
        }
    }

    #[test]
    fn unit_names() {
        assert_eq!(unit_path(Path::new("/u"), "azp-gpu").unwrap(), Path::new("/u/azp-gpu.service"));
        for bad in ["", "a/b", "../x", ".x", "a b"] {
            let e = unit_path(Path::new("/u"), bad).unwrap_err().to_string();
            assert!(e.starts_with("bad service --name"), "{bad}: {e}");
        }
    }

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
