//! Keeps the host's table while a `run` has jobs (root mode). A firewall reload takes it
//! (`nft flush ruleset`, as Debian's `nftables.conf` begins; firewalld's reload), and with
//! it the running jobs' masquerade, the DNS forward at their gateway and their connection
//! limit: their new connections then left with the job's own address and got no answer
//! until the next job's sandbox made the table again (seen: the agent of a sandbox
//! prepared before a reload registered from its own address, and the job that ran
//! through it posted its result so). The jobs' own routes and tables keep the host's
//! destinations out meanwhile (they fail closed); this thread makes the table again, with
//! the run's elements, as soon as nftables says something of it was deleted.
//!
//! `exec` has none: its one job runs through a reload without the table, and the next
//! `exec` makes it again.

use super::JobNetwork;
use crate::sys::net::NftablesWatch;
use anyhow::{Context, Result};
use std::os::fd::{AsFd, OwnedFd};

/// Stops its thread when dropped: before the run's end removes the table.
pub struct TableKeeper {
    stop: Option<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Starts keeping the table for jobs of `net` (the run's own, made already). None, said
/// in one line, where it cannot: the next job makes the table again then.
pub fn keep(net: JobNetwork) -> Option<TableKeeper> {
    start(net)
        .map_err(|e| {
            tracing::warn!("jobs' network: {e:#}: after a firewall reload, the next job makes the table again")
        })
        .ok()
}

fn start(net: JobNetwork) -> Result<TableKeeper> {
    let watch = NftablesWatch::subscribe().context("cannot watch nftables to keep the jobs' table")?;
    let (stop_rx, stop_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("a pipe")?;
    let thread = std::thread::Builder::new()
        .name("network-table".into())
        .spawn(move || {
            // A reload between the run's making the table and the subscription: seen here.
            remake(&net);
            while wait(&watch, &stop_rx) {
                remake(&net);
            }
        })
        .context("cannot start the thread that keeps the jobs' network table")?;
    Ok(TableKeeper { stop: Some(stop_tx), thread: Some(thread) })
}

/// Until something of the table is deleted (true) or the keeper is dropped (false).
fn wait(watch: &NftablesWatch, stop: &OwnedFd) -> bool {
    watch.wait(stop.as_fd(), super::firewall::TABLE).unwrap_or_else(|e| {
        tracing::warn!("jobs' network: {e:#}: after a firewall reload, the next job makes the table again");
        false
    })
}

/// The table as the run needs it: made again where it went, the run's elements added
/// again where they went.
fn remake(net: &JobNetwork) {
    let table = super::firewall::TABLE;
    if crate::sys::net::nft_table(table).is_ok_and(|t| t.is_none()) {
        tracing::warn!(
            "jobs' network: the nftables table inet {table} was removed while jobs run (a firewall reload?): \
             making it again; connections under way through it were dropped"
        );
    }
    if let Err(e) = super::ensure_table(&mut net.clone(), true, crate::config::Ipv6::Auto) {
        tracing::warn!("jobs' network: cannot make the table inet {table} again ({e:#}); the next job tries again");
    }
}

impl Drop for TableKeeper {
    fn drop(&mut self) {
        // Its end of the pipe closed: the thread's poll says so.
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
