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
//! An `exec` (root mode, isolated) keeps it too, once its job has run for [`EXEC_AFTER`]
//! ([`keep_unless_done`]): a `slurm` batch run or a long build would otherwise run on
//! without masquerade after a reload, until the end of the job.

use super::JobNetwork;
use crate::sys::net::NftablesWatch;
use anyhow::{Context, Result};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

/// How long an `exec`'s job runs before it keeps the table as well. Most `exec` jobs (a
/// command, a test's) are over sooner and start no thread, netlink subscription and
/// table lookup for it. A reload within that second is undone by the keeper's first
/// look.
pub const EXEC_AFTER: Duration = Duration::from_secs(1);

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

/// `exec`'s keeper: started once `done` (the helper's result pipe, readable when the job
/// is over) has had nothing to read for [`EXEC_AFTER`]; None when it had.
pub fn keep_unless_done(done: BorrowedFd, net: &JobNetwork) -> Option<TableKeeper> {
    (!readable_within(done, EXEC_AFTER)).then(|| keep(net.clone())).flatten()
}

/// Whether `fd` has something to read (or its writers are gone) within `time`. One that
/// cannot be polled counts as readable: the job then runs without a keeper, as before.
fn readable_within(fd: BorrowedFd, time: Duration) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout};
    let deadline = Instant::now() + time;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX).max(1);
        match nix::poll::poll(&mut [PollFd::new(fd, PollFlags::POLLIN)], PollTimeout::from(ms)) {
            // A forwarded stop signal interrupts the poll, not the wait.
            Ok(0) | Err(nix::errno::Errno::EINTR) => {}
            Ok(_) | Err(_) => return true,
        }
    }
}

fn start(net: JobNetwork) -> Result<TableKeeper> {
    let watch = NftablesWatch::subscribe().context("cannot watch nftables to keep the jobs' table")?;
    let (stop_rx, stop_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("a pipe")?;
    // Signals stay with the threads that take them (an `exec -t`'s SIGWINCH).
    let thread = crate::sys::signals::spawn_blocking_all("network-table", move || {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exec_keeps_the_table_only_while_its_job_has_no_result() {
        // The result is there, or the helper ended without one (EOF): no keeper.
        let (rx, tx) = nix::unistd::pipe().unwrap();
        nix::unistd::write(&tx, b"r").unwrap();
        assert!(readable_within(rx.as_fd(), EXEC_AFTER));
        let (rx, tx) = nix::unistd::pipe().unwrap();
        drop(tx);
        assert!(readable_within(rx.as_fd(), EXEC_AFTER));
        // Still running: a keeper.
        let (rx, _tx) = nix::unistd::pipe().unwrap();
        assert!(!readable_within(rx.as_fd(), Duration::from_millis(20)));
    }
}
