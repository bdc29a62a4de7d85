//! The manager's part: at start, every mirror is made (empty if new) and its remote checked;
//! then a thread of the manager fetches each mirror when its interval has passed, one at a
//! time, outside every job. A failed fetch logs one line and keeps the mirror as it was.

use super::{fetch, MirrorSpec};
use crate::config::Home;
use anyhow::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Start-up: each mirror exists (so every job's plan can bind it) and its remote answers.
/// A remote that does not answer is an error only for a mirror never fetched: an
/// existing mirror is still useful, and is fetched again on its timer.
pub fn prepare(home: &Home, specs: &[MirrorSpec]) -> Result<()> {
    for s in specs {
        let fetched_before = s.dir(home).join("packed-refs").exists() || has_refs(&s.dir(home));
        if let Err(e) = fetch::check_remote(s) {
            if !fetched_before {
                return Err(e.context(format!("[[git_mirror]] {}", s.url)));
            }
            tracing::warn!("{e:#}; jobs use the mirror as it is");
        }
        fetch::create(home, s)?;
    }
    Ok(())
}

fn has_refs(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir.join("refs/heads")).is_ok_and(|mut d| d.next().is_some())
}

/// The keeper thread: fetches every mirror now, then each again when its interval has
/// passed, until `stop`.
pub fn start(home: Home, specs: Vec<MirrorSpec>, stop: Arc<AtomicBool>) -> Option<std::thread::JoinHandle<()>> {
    if specs.is_empty() {
        return None;
    }
    Some(std::thread::spawn(move || {
        let mut due: Vec<Instant> = specs.iter().map(|_| Instant::now()).collect();
        while !stop.load(Ordering::SeqCst) {
            for (i, s) in specs.iter().enumerate() {
                if Instant::now() >= due[i] && !stop.load(Ordering::SeqCst) {
                    refresh_one(&home, s);
                    due[i] = Instant::now() + s.interval;
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }))
}

/// One fetch, logged: how long it took and the mirror's size, or why it failed.
pub fn refresh_one(home: &Home, s: &MirrorSpec) -> bool {
    let started = Instant::now();
    match fetch::fetch(home, s) {
        Ok(()) => {
            tracing::info!(
                "git mirror {} fetched in {:.1} s ({})",
                s.url,
                started.elapsed().as_secs_f64(),
                s.dir(home).display()
            );
            true
        }
        Err(e) => {
            tracing::warn!("{e:#}; the mirror is kept as it was, next try in {} s", s.interval.as_secs());
            false
        }
    }
}
