//! A root-mode job's tracked connections after it: the host's table masqueraded them, so
//! each is an entry of the host's one conntrack table, and nothing else ends them with
//! the job (a server of the job's that keeps answering keeps them for days). Its helper
//! forgets them once the job is over (`sys::net::forget_connections`). A helper killed
//! first (`kill -9` of an `exec` or a `run`, which its helper follows; a crash) cannot:
//! so, from the job's start until they are forgotten, the job dir holds a record of
//! them, and the clean-up that finds it (the runner's, or `gc`'s) forgets them instead.

use crate::sys::net::JobConnections;
use crate::sys::Sys;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::Path;

/// What the record holds: the job's link on the host (its element in the counting set)
/// and its addresses.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    link: String,
    sources: Vec<IpAddr>,
}

/// The helper, before its job starts: the record of the job's connections in `file`.
pub fn record(file: &Path, c: &JobConnections) -> Result<()> {
    let text = serde_json::to_vec(&Record { link: c.link.clone(), sources: c.sources.clone() })?;
    std::fs::write(file, text).with_context(|| format!("cannot write {}", file.display()))
}

/// The helper, once it forgot them: no record left for a clean-up to act on.
pub fn forgotten(file: &Path) {
    if let Err(e) = std::fs::remove_file(file) {
        tracing::debug!("cannot remove {} ({e}): the clean-up reads the job's connections again", file.display());
    }
}

/// A clean-up, once the job's processes are gone: the connections of a record the
/// helper left (it was killed before it forgot them), forgotten, and the record
/// removed. How many (None: no record, the usual case). A failure is a warning: they
/// expire on their own.
pub fn left_by_a_killed_helper(file: &Path, sys: &dyn Sys) -> Option<usize> {
    let bytes = std::fs::read(file).ok()?;
    let forgotten = match serde_json::from_slice::<Record>(&bytes) {
        Ok(r) => {
            let c = super::job_connections(r.link, r.sources);
            sys.forget_connections(&c)
                .map_err(|e| tracing::warn!("{}: the job's tracked connections expire on their own", e.with_causes()))
                .unwrap_or(0)
        }
        Err(e) => {
            tracing::warn!("{} is unreadable ({e}): the job's tracked connections expire on their own", file.display());
            0
        }
    };
    let _ = std::fs::remove_file(file);
    Some(forgotten)
}
