//! Flag groups that more than one verb takes, and the parsers of single flag values.

use anyhow::{bail, Result};
use azp_sandbox::sandbox::Limits;
use azp_sandbox::settings::{self, Env, FlagSettings, RunSettings};
use std::path::PathBuf;

/// Per-job cgroup limits, the same flags for `exec` and `run`.
#[derive(clap::Args, Clone, Copy, Default)]
pub struct LimitArgs {
    /// Memory limit per job, e.g. 4G (the job is OOM-killed above it)
    #[arg(long, value_parser = azp_sandbox::config::parse_size)]
    pub memory: Option<u64>,
    /// Maximum number of processes/threads per job
    #[arg(long, value_parser = parse_pids)]
    pub pids: Option<i64>,
    /// CPU quota per job in CPUs, e.g. 2 or 0.5
    #[arg(long, value_parser = parse_cpus)]
    pub cpus: Option<u64>,
}

impl LimitArgs {
    pub fn limits(self) -> Limits {
        Limits { memory_bytes: self.memory, pids: self.pids, cpus_milli: self.cpus }
    }
}

/// The jobs' network, the same flags for `exec` and `run`.
#[derive(clap::Args, Clone, Default)]
pub struct NetworkArgs {
    /// isolated: a network of its own, outbound only [default]; none: loopback only;
    /// host: the host's network (reaches the host's 127.0.0.1 and the other jobs)
    #[arg(long, value_enum, value_name = "MODE")]
    pub network: Option<azp_sandbox::config::Network>,
    /// A blocked destination jobs may reach: IP or IP:PORT, e.g. 169.254.169.254:80 (repeat)
    #[arg(long = "network-allow", value_name = "IP[:PORT]", value_parser = checked_allow)]
    pub network_allow: Vec<azp_sandbox::config::NetworkAllow>,
}

fn checked_allow(s: &str) -> Result<azp_sandbox::config::NetworkAllow, String> {
    s.parse().map_err(|e: anyhow::Error| e.to_string().replacen("network_allow", "--network-allow", 1))
}

/// The pool and where the rest of the settings are: `run`, `slurm`, `agents prune`.
#[derive(clap::Args, Default)]
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
    /// Settings file [default: /etc/azp-sandbox/config.toml when present]
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

pub fn parse_pids(s: &str) -> Result<i64> {
    match s.parse::<i64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("bad --pids '{s}': use a positive number of processes"),
    }
}

/// CPUs -> milli-CPUs.
pub fn parse_cpus(s: &str) -> Result<u64> {
    match s.parse::<f64>() {
        Ok(c) if c > 0.0 && c <= 4096.0 => Ok((c * 1000.0).round().max(1.0) as u64),
        _ => bail!("bad --cpus '{s}': use a positive number of CPUs such as 2 or 0.5"),
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
        assert_eq!(parse_pids("64").unwrap(), 64);
        for bad in ["0", "-3", "x"] {
            assert!(parse_pids(bad).unwrap_err().to_string().starts_with("bad --pids"), "{bad}");
        }
        assert_eq!(parse_cpus("2").unwrap(), 2000);
        assert_eq!(parse_cpus("0.5").unwrap(), 500);
        assert_eq!(parse_cpus("0.0001").unwrap(), 1, "never rounded to no CPU at all");
        for bad in ["0", "-1", "5000", "NaN", "x"] {
            assert!(parse_cpus(bad).unwrap_err().to_string().starts_with("bad --cpus"), "{bad}");
        }
        assert!(checked::<u32>("7").is_ok() && checked::<u32>("x").is_err());
    }
}
