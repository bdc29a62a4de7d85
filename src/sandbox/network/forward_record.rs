//! What the jobs' table turned on of the host's forwarding, kept in a file as well as in
//! the table (its comment, its `v6_uplinks` set). A firewall reload (`flush ruleset`:
//! Debian's /etc/nftables.conf starts with it) removes the table and its records but not
//! the settings; without this file the next table would find forwarding on, record
//! nothing, and gc would leave the host a router for others (found by a red-team pass).
//! One file per network namespace (the settings are the namespace's), in /run: a reboot
//! clears it, as it clears the settings. Written before each setting is turned on, so a
//! crash in between leaves a record, not a setting nobody undoes.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;

const DIR: &str = "/run/azp-sandbox";

/// What is to be turned back off when the table goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    /// net.ipv4.ip_forward was 0 and was turned on.
    pub ip_forward: bool,
    /// Uplinks whose net.ipv6.conf.LINK.force_forwarding was turned on.
    pub uplinks: Vec<String>,
}

impl Record {
    pub fn is_empty(&self) -> bool {
        !self.ip_forward && self.uplinks.is_empty()
    }
}

fn path() -> PathBuf {
    PathBuf::from(super::per_netns(&format!("{DIR}/forwarding")))
}

/// The record's lines: `ip_forward`, `force_forwarding LINK`; anything else is skipped.
pub fn parse(text: &str) -> Record {
    let mut r = Record::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("ip_forward"), None) => r.ip_forward = true,
            (Some("force_forwarding"), Some(link)) if !r.uplinks.iter().any(|l| l == link) => {
                r.uplinks.push(link.to_string())
            }
            _ => {}
        }
    }
    r
}

/// This namespace's record, with what is still on only (empty when there is none). The
/// file is keyed by the namespace's inode number, which the kernel reuses once a
/// namespace is gone: a record left by a dead namespace (a test's) names settings that
/// a new namespace starts with off, and those are dropped here.
pub fn read() -> Record {
    let r = parse(&std::fs::read_to_string(path()).unwrap_or_default());
    Record {
        ip_forward: r.ip_forward && !crate::sys::forwarding::ipv4_forwarding_off(),
        uplinks: r
            .uplinks
            .into_iter()
            .filter(|l| crate::sys::forwarding::uplink_force_forwarding(l) == Some(true))
            .collect(),
    }
}

fn append(line: &str) -> Result<()> {
    let p = path();
    std::fs::create_dir_all(DIR).with_context(|| format!("cannot create {DIR}"))?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&p)
        .with_context(|| format!("cannot open {}", p.display()))?;
    f.write_all(format!("{line}\n").as_bytes()).with_context(|| format!("cannot write {}", p.display()))
}

/// Before turning IPv4 forwarding on.
pub fn add_ip_forward() -> Result<()> {
    append("ip_forward")
}

/// Before turning `link`'s IPv6 force_forwarding on.
pub fn add_uplink(link: &str) -> Result<()> {
    append(&format!("force_forwarding {link}"))
}

/// After everything in it was turned back off.
pub fn remove() -> Result<()> {
    let p = path();
    match std::fs::remove_file(&p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot remove {}", p.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_read_back_without_repeats_or_strangers() {
        let r = parse("force_forwarding eth0\nip_forward\nforce_forwarding eth0\nforce_forwarding wlan0\njunk\n\n");
        assert_eq!(r, Record { ip_forward: true, uplinks: vec!["eth0".into(), "wlan0".into()] });
        assert!(parse("").is_empty() && !r.is_empty());
        assert_eq!(parse("force_forwarding\n"), Record::default(), "a line without a link is skipped");
    }
}
