//! The config file (`/etc/azp-sandbox/config.toml`, or `--config FILE`): the lowest of
//! the three sources. Read once, with unknown keys refused.

use super::keys;
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

pub const DEFAULT_CONFIG: &str = "/etc/azp-sandbox/config.toml";

/// The config file, as written by a sysadmin. Every key is optional; numbers may be
/// written `1` or `"1"` (see [`keys`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct FileSettings {
    pub url: Option<String>,
    pub token_file: Option<PathBuf>,
    pub pool: Option<String>,
    #[serde(default, deserialize_with = "keys::count")]
    pub agents: Option<usize>,
    pub rootfs: Option<String>,
    #[serde(default)]
    pub volumes: Vec<String>,
    #[serde(default, deserialize_with = "keys::word")]
    pub gpus_per_agent: Option<String>,
    /// Per-job limits: a size ("4G"), a number, or "unlimited" (see `settings::run`).
    #[serde(default, deserialize_with = "keys::word")]
    pub memory: Option<String>,
    pub pids: Option<NumberOrWord>,
    pub cpus: Option<NumberOrWord>,
    #[serde(default, deserialize_with = "keys::word")]
    pub disk: Option<String>,
    #[serde(default, deserialize_with = "keys::word")]
    pub tmp_size: Option<String>,
    #[serde(default, deserialize_with = "keys::word")]
    pub shm_size: Option<String>,
    #[serde(default, deserialize_with = "keys::word")]
    pub huge_pages: Option<String>,
    pub agent_package: Option<String>,
    pub name_prefix: Option<String>,
    #[serde(default, deserialize_with = "keys::count")]
    pub drain_timeout_secs: Option<u64>,
    #[serde(default, deserialize_with = "keys::count")]
    pub cancel_grace_secs: Option<u64>,
    pub hooks_dir: Option<PathBuf>,
    #[serde(default, deserialize_with = "keys::count")]
    pub hook_timeout_secs: Option<u64>,
    #[serde(default)]
    pub extra_lib_dirs: Vec<PathBuf>,
    /// Queue-driven autoscaling (see `run --autoscale`).
    #[serde(default, deserialize_with = "keys::flag")]
    pub autoscale: Option<bool>,
    #[serde(default, deserialize_with = "keys::count")]
    pub min_agents: Option<usize>,
    #[serde(default, deserialize_with = "keys::count")]
    pub max_agents: Option<usize>,
    #[serde(default, deserialize_with = "keys::count")]
    pub idle_timeout_secs: Option<u64>,
    #[serde(default, deserialize_with = "keys::count")]
    pub poll_interval_secs: Option<u64>,
    /// "auto" (a user namespace and host ids of its own per job) or "host".
    pub userns: Option<String>,
    /// Jobs' network: `isolated` (default), `none` or `host` (see `run --network`).
    pub network: Option<String>,
    /// Destinations jobs may reach although blocked (`IP[:PORT]`, e.g. `169.254.169.254:80`).
    #[serde(default)]
    pub network_allow: Vec<String>,
    /// Where jobs' addresses come from (root mode; default 10.87.0.0/16).
    pub network_subnet: Option<String>,
    /// Jobs' outbound IPv6: `auto` (default: where the host has it), `on` or `off`.
    pub network_ipv6: Option<String>,
    /// The HTTP(S) proxy jobs use (HTTP_PROXY and HTTPS_PROXY), when the service's
    /// environment names none; one on the host's loopback is reached at the jobs' gateway.
    pub proxy: Option<String>,
    /// Host dir for the jobs' agent work folders (`run --work-dir`).
    pub work_dir: Option<PathBuf>,
    /// Failed jobs kept for inspection (`run --keep-failed`).
    #[serde(default, deserialize_with = "keys::count")]
    pub keep_failed: Option<usize>,
    /// Size bound of each agent's kept `_diag` logs, e.g. "200M".
    #[serde(default, deserialize_with = "keys::word")]
    pub diag_logs_max: Option<String>,
    /// Git mirrors the manager keeps fresh for jobs (`[[git_mirror]]`, see docs/git-mirror.md).
    #[serde(default)]
    pub git_mirror: Vec<crate::mirror::MirrorEntry>,
    /// Setuid mode's site policy (read by `setuid::policy`, not by `run`).
    pub setuid: Option<toml::Value>,
    /// Named caches every job gets (`[[cache]]`, see `crate::cache`).
    #[serde(default)]
    pub cache: Vec<CacheFile>,
    /// Branches whose builds commit caches (default `refs/heads/main`; `prefix/*`).
    #[serde(default)]
    pub trusted_branches: Vec<String>,
}

/// One `[[cache]]` table: `name = "pip", path = "/root/.cache/pip", max_size = "50G"`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheFile {
    pub name: String,
    pub path: PathBuf,
    pub max_size: Option<String>,
}

/// A key that takes a number or a word (`pids = 4096`, `pids = "unlimited"`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum NumberOrWord {
    Number(f64),
    Word(String),
}

impl NumberOrWord {
    /// As the flag's text, for the flag's parser.
    pub fn text(&self) -> String {
        match self {
            NumberOrWord::Number(n) => n.to_string(),
            NumberOrWord::Word(w) => w.clone(),
        }
    }
}

/// Reads the config file: `explicit` must exist; the default path may be absent.
pub fn read_file(explicit: Option<&Path>) -> Result<FileSettings> {
    let path = explicit.unwrap_or(Path::new(DEFAULT_CONFIG));
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if explicit.is_none() && e.kind() == std::io::ErrorKind::NotFound => return Ok(FileSettings::default()),
        Err(e) => bail!("cannot read config file {}: {e}", path.display()),
    };
    parse_file(&text).with_context(|| format!("bad config file {}", path.display()))
}

pub fn parse_file(text: &str) -> Result<FileSettings> {
    toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", keys::one_line(&e, text, None)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_file_may_be_absent_a_given_one_not() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("config.toml");
        let e = read_file(Some(&missing)).unwrap_err();
        assert!(e.to_string().starts_with("cannot read config file"), "{e}");
        std::fs::write(&missing, "pool = \"p\"\nagents = 2\n").unwrap();
        let f = read_file(Some(&missing)).unwrap();
        assert_eq!((f.pool.as_deref(), f.agents), (Some("p"), Some(2)));
        std::fs::write(&missing, "pool = 3\n").unwrap();
        let e = format!("{:#}", read_file(Some(&missing)).unwrap_err());
        assert!(e.contains("bad config file") && e.contains("pool") && !e.contains('\n'), "{e}");
    }
}
