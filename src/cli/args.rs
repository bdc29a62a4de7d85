//! Flag groups that more than one verb takes, and the parsers of single flag values.

use anyhow::{bail, Result};
use azp_sandbox::sandbox::limits;
use azp_sandbox::sandbox::{Ask, LimitsAsk};
use azp_sandbox::settings::{self, Env, FlagSettings, RunSettings};
use std::path::PathBuf;

/// Per-job limits, the same flags for `exec` and `run`. Each has a default derived from
/// the node and the number of slots (README: "Limits"); `unlimited` must be said.
#[derive(clap::Args, Clone, Copy, Default)]
#[command(next_help_heading = "Limits (per job)")]
pub struct LimitArgs {
    /// Memory (and memory + swap) per job, e.g. 4G, or unlimited; the job is OOM-killed
    /// above it [default: (RAM - max(2G, 10%)) / slots]
    #[arg(long, value_name = "SIZE", value_parser = limits::parse_memory)]
    pub memory: Option<Ask<u64>>,
    /// Processes and threads per job, or unlimited [default: 4096]
    #[arg(long, value_name = "N", value_parser = limits::parse_pids)]
    pub pids: Option<Ask<i64>>,
    /// CPU quota per job in CPUs, e.g. 2 or 0.5, or unlimited [default: cores / slots]
    #[arg(long, value_name = "CPUS", value_parser = limits::parse_cpus)]
    pub cpus: Option<Ask<u64>>,
    /// Disk quota on each job's writable layer, e.g. 50G, or unlimited; needs project
    /// quotas on the home's filesystem [default: (free space - max(1G, 5%)) / slots]
    #[arg(long, value_name = "SIZE", value_parser = limits::parse_disk)]
    pub disk: Option<Ask<u64>>,
    /// Size of the job's /tmp (a tmpfs, counted as its memory) [default: the memory limit]
    #[arg(long, value_name = "SIZE", value_parser = |s: &str| limits::parse_tmpfs_size("--tmp-size", s))]
    pub tmp_size: Option<u64>,
    /// Size of the job's /dev/shm [default: half the memory limit]
    #[arg(long, value_name = "SIZE", value_parser = |s: &str| limits::parse_tmpfs_size("--shm-size", s))]
    pub shm_size: Option<u64>,
    /// Huge pages per job, of each page size, e.g. 1G, or unlimited; root mode, where
    /// the job's cgroup has the hugetlb controller [default: 0]
    #[arg(long, value_name = "SIZE", value_parser = limits::parse_huge_pages)]
    pub huge_pages: Option<Ask<u64>>,
}

impl LimitArgs {
    /// What the flags ask for (not given: the default).
    pub fn ask(self) -> LimitsAsk {
        LimitsAsk {
            memory: self.memory.unwrap_or_default(),
            pids: self.pids.unwrap_or_default(),
            cpus_milli: self.cpus.unwrap_or_default(),
            disk: self.disk.unwrap_or_default(),
            tmp_size: self.tmp_size,
            shm_size: self.shm_size,
            huge_pages: self.huge_pages.unwrap_or_default(),
        }
    }
}

/// The jobs' network, the same flags for `exec` and `run`.
#[derive(clap::Args, Clone, Default)]
#[command(next_help_heading = "Network")]
pub struct NetworkArgs {
    /// isolated: a network of its own, outbound only [default]; none: loopback only;
    /// host: the host's network (reaches the host's 127.0.0.1 and the other jobs)
    #[arg(long, value_enum, value_name = "MODE")]
    pub network: Option<azp_sandbox::config::Network>,
    /// A blocked destination jobs may reach: IP or IP:PORT, e.g. 169.254.169.254:80 (repeat)
    #[arg(long = "network-allow", value_name = "IP[:PORT]", value_parser = checked_allow)]
    pub network_allow: Vec<azp_sandbox::config::NetworkAllow>,
    /// Outbound IPv6 for jobs too: auto (where the host has an IPv6 default route and
    /// can forward it for them) [default], on (an error where it cannot), off
    #[arg(long, value_enum, value_name = "WHEN", env = "AZP_SANDBOX_IPV6")]
    pub ipv6: Option<azp_sandbox::config::Ipv6>,
}

fn checked_allow(s: &str) -> Result<azp_sandbox::config::NetworkAllow, String> {
    s.parse().map_err(|e: anyhow::Error| e.to_string().replacen("network_allow", "--network-allow", 1))
}

/// The pool and where the rest of the settings are: `run`, `slurm`, `agents prune`.
#[derive(clap::Args, Default)]
#[command(next_help_heading = "Azure")]
pub struct PoolArgs {
    /// Agent pool [env: AZP_POOL]
    #[arg(long)]
    pub pool: Option<String>,
    /// Organization URL, e.g. https://dev.azure.com/ORG [env: AZP_URL]
    #[arg(long)]
    pub url: Option<String>,
    /// File holding the PAT (scope: Agent Pools read & manage) [env: AZP_TOKEN_FILE]
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Agent names are <prefix>-<slot> [env: AZP_AGENT_NAME] [default: host name]
    #[arg(long)]
    pub name_prefix: Option<String>,
    /// Settings file (TOML; flags override it) [default: /etc/azp-sandbox/config.toml
    /// when present]
    #[arg(long)]
    pub config: Option<PathBuf>,
}

impl PoolArgs {
    /// These flags as settings (None: not given).
    pub fn flags(&self) -> FlagSettings {
        FlagSettings {
            url: self.url.clone(),
            token_file: self.token_file.clone(),
            pool: self.pool.clone(),
            name_prefix: self.name_prefix.clone(),
            ..Default::default()
        }
    }

    /// The settings from `flags` > AZP_* environment > the config file, and AZP_TOKEN.
    pub fn settings(&self, flags: FlagSettings) -> Result<(RunSettings, Option<String>)> {
        let env = Env::process();
        Ok((settings::for_run(self.config.as_deref(), &env, flags)?, env.token()))
    }
}

/// A clap value parser that checks the value parses as `T` but keeps the text.
pub fn checked<T: std::str::FromStr>(s: &str) -> Result<String, String>
where
    T::Err: std::fmt::Display,
{
    s.parse::<T>().map(|_| s.to_string()).map_err(|e| e.to_string())
}

pub fn parse_job_name(s: &str) -> Result<String> {
    azp_sandbox::sandbox::exec::parse_job_name(s)
}

pub fn parse_user(s: &str) -> Result<(u32, u32)> {
    let (u, g) = s.split_once(':').unwrap_or((s, s));
    match (u.parse::<u32>(), g.parse::<u32>()) {
        (Ok(u), Ok(g)) => Ok((u, g)),
        _ => bail!("bad --user '{s}': use numeric UID or UID:GID, e.g. 1000:1000"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_parsers() {
        assert_eq!(parse_user("1000").unwrap(), (1000, 1000));
        assert_eq!(parse_user("1000:100").unwrap(), (1000, 100));
        for bad in ["", "x", "1:x", "-1"] {
            assert!(parse_user(bad).unwrap_err().to_string().starts_with("bad --user"), "{bad}");
        }
        assert!(checked::<u32>("7").is_ok() && checked::<u32>("x").is_err());
    }
}
