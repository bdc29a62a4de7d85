//! The limits of a job: what was asked for ([`LimitsAsk`], from flags, config keys or a
//! setuid request), the node they are derived from ([`node::Node`]), and the limits a
//! job runs with ([`resolve`], into [`Limits`]).
//!
//! Every limit has a default that keeps the node alive with no flag at all (issue 25):
//! with N slots, memory = (RAM - a reserve) / N, pids 4096 (less where the node's
//! pid_max is small), cpus = cores / N, a disk quota = (free space - a reserve) / N.
//! `unlimited` must be said, and gets a warning.

pub mod defaults;
pub mod node;

pub use defaults::{resolve, Resolved};

use super::plan::Limits;
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// One limit as asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ask<T> {
    /// Not said: the node's default.
    #[default]
    Default,
    /// Not said, and at most this: a setuid site policy's maximum.
    DefaultUpTo(T),
    Value(T),
    /// Said explicitly: no limit (warned about).
    Unlimited,
}

impl<T: Copy> Ask<T> {
    pub fn map<U>(self, f: impl Fn(T) -> U) -> Ask<U> {
        match self {
            Ask::Default => Ask::Default,
            Ask::DefaultUpTo(t) => Ask::DefaultUpTo(f(t)),
            Ask::Value(t) => Ask::Value(f(t)),
            Ask::Unlimited => Ask::Unlimited,
        }
    }

    /// `self`, or `lower` where `self` was not said (flags over config keys).
    pub fn or(self, lower: Ask<T>) -> Ask<T> {
        match self {
            Ask::Default => lower,
            said => said,
        }
    }
}

/// The limits one job (or every job of a `run`) asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsAsk {
    pub memory: Ask<u64>,
    pub pids: Ask<i64>,
    pub cpus_milli: Ask<u64>,
    /// The quota on the job's writable layer.
    pub disk: Ask<u64>,
    /// `/tmp` and `/dev/shm` (None: from the memory limit, see [`defaults`]).
    pub tmp_size: Option<u64>,
    pub shm_size: Option<u64>,
    /// Huge pages of each size (default: none, where the node can limit them).
    pub huge_pages: Ask<u64>,
}

impl LimitsAsk {
    /// Field by field, `self` where said, else `lower` (flags over config keys).
    pub fn or(self, lower: LimitsAsk) -> LimitsAsk {
        LimitsAsk {
            memory: self.memory.or(lower.memory),
            pids: self.pids.or(lower.pids),
            cpus_milli: self.cpus_milli.or(lower.cpus_milli),
            disk: self.disk.or(lower.disk),
            tmp_size: self.tmp_size.or(lower.tmp_size),
            shm_size: self.shm_size.or(lower.shm_size),
            huge_pages: self.huge_pages.or(lower.huge_pages),
        }
    }

    /// Exactly these limits, nothing left to a default (library callers and tests).
    pub fn exactly(l: &Limits) -> LimitsAsk {
        let v = |o: Option<u64>| o.map(Ask::Value).unwrap_or(Ask::Unlimited);
        LimitsAsk {
            memory: v(l.memory_bytes),
            pids: l.pids.map(Ask::Value).unwrap_or(Ask::Unlimited),
            cpus_milli: v(l.cpus_milli),
            disk: v(l.disk_bytes),
            tmp_size: l.tmp_bytes,
            shm_size: l.shm_bytes,
            huge_pages: l.huge_pages.map(|h| Ask::Value(h.bytes)).unwrap_or(Ask::Unlimited),
        }
    }
}

const UNLIMITED: &str = "unlimited";

/// `--memory` / `memory`: a size (`4G`) or `unlimited`.
pub fn parse_memory(s: &str) -> Result<Ask<u64>> {
    parse_size_ask("--memory", s)
}

/// `--disk` / `disk`: a size (`50G`) or `unlimited`.
pub fn parse_disk(s: &str) -> Result<Ask<u64>> {
    parse_size_ask("--disk", s)
}

fn parse_size_ask(flag: &str, s: &str) -> Result<Ask<u64>> {
    if s.trim() == UNLIMITED {
        return Ok(Ask::Unlimited);
    }
    match crate::config::parse_size(s) {
        Ok(b) => Ok(Ask::Value(b)),
        Err(_) => bail!("bad {flag} '{s}': use a size such as 4G or 512M, or unlimited"),
    }
}

/// `--huge-pages` / `huge_pages`: a size (`1G`, `0`) of each huge page size, or
/// `unlimited`.
pub fn parse_huge_pages(s: &str) -> Result<Ask<u64>> {
    if s.trim() == UNLIMITED {
        return Ok(Ask::Unlimited);
    }
    match crate::config::parse_size_or_zero(s) {
        Ok(b) => Ok(Ask::Value(b)),
        Err(_) => bail!("bad --huge-pages '{s}': use a size such as 1G or 0 (of each huge page size), or unlimited"),
    }
}

/// `--tmp-size` / `--shm-size`: a size.
pub fn parse_tmpfs_size(flag: &str, s: &str) -> Result<u64> {
    match crate::config::parse_size(s) {
        Ok(b) if b >= 1 << 20 => Ok(b),
        _ => bail!("bad {flag} '{s}': use a size of at least 1M, such as 8G"),
    }
}

/// `--pids` / `pids`: a positive number of processes and threads, or `unlimited`.
pub fn parse_pids(s: &str) -> Result<Ask<i64>> {
    if s.trim() == UNLIMITED {
        return Ok(Ask::Unlimited);
    }
    match s.trim().parse::<i64>() {
        Ok(n) if n > 0 => Ok(Ask::Value(n)),
        _ => bail!("bad --pids '{s}': use a positive number of processes, or unlimited"),
    }
}

/// `--cpus` / `cpus`: CPUs (2, 0.5) as milli-CPUs, or `unlimited`.
pub fn parse_cpus(s: &str) -> Result<Ask<u64>> {
    if s.trim() == UNLIMITED {
        return Ok(Ask::Unlimited);
    }
    match s.trim().parse::<f64>() {
        Ok(c) => cpus_milli(c).map(Ask::Value).ok_or_else(|| {
            anyhow::anyhow!("bad --cpus '{s}': use a positive number of CPUs such as 2 or 0.5, or unlimited")
        }),
        Err(_) => bail!("bad --cpus '{s}': use a positive number of CPUs such as 2 or 0.5, or unlimited"),
    }
}

/// CPUs -> milli-CPUs (never rounded down to none); None when out of range.
pub fn cpus_milli(c: f64) -> Option<u64> {
    (c > 0.0 && c <= 4096.0).then(|| (c * 1000.0).round().max(1.0) as u64)
}

/// For a job's log line: what it used of its disk quota (empty without one).
pub fn disk_note(usage: Option<&crate::sys::quota::Usage>) -> String {
    match usage {
        None => String::new(),
        Some(u) if u.full() => format!(", disk quota REACHED ({} used)", human_size(u.bytes)),
        Some(u) => format!(", disk used {} of {}", human_size(u.bytes), human_size(u.bytes_limit)),
    }
}

pub use crate::config::human_size;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_unlimited_parse_and_bad_ones_say_what_to_use() {
        assert_eq!(parse_memory("4G").unwrap(), Ask::Value(4 << 30));
        assert_eq!(parse_memory("unlimited").unwrap(), Ask::Unlimited);
        assert_eq!(parse_disk("50G").unwrap(), Ask::Value(50 << 30));
        assert_eq!(parse_pids("64").unwrap(), Ask::Value(64));
        assert_eq!(parse_pids("unlimited").unwrap(), Ask::Unlimited);
        assert_eq!(parse_cpus("0.5").unwrap(), Ask::Value(500));
        assert_eq!(parse_cpus("0.0001").unwrap(), Ask::Value(1), "never rounded to no CPU at all");
        assert_eq!(parse_cpus("unlimited").unwrap(), Ask::Unlimited);
        assert_eq!(parse_tmpfs_size("--tmp-size", "8G").unwrap(), 8 << 30);
        assert_eq!(parse_huge_pages("0").unwrap(), Ask::Value(0), "none: the default, said");
        assert_eq!(parse_huge_pages("0M").unwrap(), Ask::Value(0));
        assert_eq!(parse_huge_pages("2M").unwrap(), Ask::Value(2 << 20));
        assert_eq!(parse_huge_pages("unlimited").unwrap(), Ask::Unlimited);
        for (e, flag) in [
            (parse_memory("lots").unwrap_err(), "--memory"),
            (parse_disk("none").unwrap_err(), "--disk"),
            (parse_pids("0").unwrap_err(), "--pids"),
            (parse_pids("-3").unwrap_err(), "--pids"),
            (parse_cpus("5000").unwrap_err(), "--cpus"),
            (parse_cpus("NaN").unwrap_err(), "--cpus"),
            (parse_tmpfs_size("--shm-size", "10K").unwrap_err(), "--shm-size"),
            (parse_huge_pages("0X").unwrap_err(), "--huge-pages"),
            (parse_huge_pages("some").unwrap_err(), "--huge-pages"),
        ] {
            let e = e.to_string();
            assert!(e.starts_with(&format!("bad {flag} ")) && !e.contains('\n'), "{e}");
        }
        assert!(parse_memory("x").unwrap_err().to_string().contains("or unlimited"));
    }

    #[test]
    fn flags_win_over_keys_field_by_field() {
        let flags = LimitsAsk { memory: Ask::Value(1), disk: Ask::Unlimited, ..Default::default() };
        let keys = LimitsAsk { memory: Ask::Value(2), pids: Ask::Value(3), tmp_size: Some(4), ..Default::default() };
        let both = flags.or(keys);
        assert_eq!(
            (both.memory, both.pids, both.disk, both.tmp_size),
            (Ask::Value(1), Ask::Value(3), Ask::Unlimited, Some(4))
        );
        assert_eq!(both.cpus_milli, Ask::Default);
    }

    #[test]
    fn sizes_for_people() {
        assert_eq!(human_size(5 << 30), "5.0G");
        assert_eq!(human_size(1536 << 20), "1.5G");
        assert_eq!(human_size(64 << 20), "64.0M");
        assert_eq!(human_size(100), "100");
        let l = Limits {
            memory_bytes: Some(4 << 30),
            pids: Some(4096),
            cpus_milli: Some(1500),
            disk_bytes: None,
            disk_inodes: None,
            disk_mechanism: None,
            tmp_bytes: Some(4 << 30),
            shm_bytes: Some(2 << 30),
            socket_bytes: None,
            ptys: None,
            huge_pages: None,
        };
        assert_eq!(l.to_string(), "memory 4.0G, pids 4096, cpus 1.5, disk unlimited, /tmp 4.0G, /dev/shm 2.0G");
        let l = Limits { socket_bytes: Some(512 << 20), ptys: Some(1536), ..l };
        assert!(l.to_string().ends_with(", /dev/shm 2.0G, socket buffers 512.0M, ptys 1536"), "{l}");
        let sizes = crate::sandbox::plan::HugePageSizes::of([2048]);
        let l = Limits { huge_pages: Some(crate::sandbox::plan::HugePages { bytes: 0, sizes }), ..l };
        assert!(l.to_string().ends_with(", ptys 1536, huge pages 0"), "{l}");
    }
}
