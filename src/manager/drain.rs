//! When `run` stops, and how its slots drain: the wait for a signal (or for every slot
//! to end, or `--exit-when-idle`), then each slot's agent is stopped as a user expects:
//! an agent that has taken no job at once, one that runs a job once `--drain-timeout`
//! has passed (or a second signal forces it). Stopping is SIGINT to the slot's helper,
//! which the job's init passes to the agent's whole process group: the listener cancels
//! its job, reports it "canceled", deletes its session and exits. One that is still
//! there `--cancel-grace` later is killed (a second signal to the helper: SIGKILL).
//! The decisions ([`IdleExit`], [`Drain`]) take the time as an argument and are
//! unit-tested; the loops around them only observe and act.
//!
//! "Has a job" is asked of the disk (the listener's Worker log, the job's work folder)
//! and of the server: the real listener takes a job, renews its request and starts its
//! worker before anything shows on disk (about a second), and a job in that window must
//! get the drain timeout too, not a cancel at once. The server's `assignedRequest` of
//! the slot's agent closes it; it is asked once, when the drain begins, off the drain's
//! thread ([`ServerLook`]): an unreachable server holds idle slots back at most
//! [`SERVER_WAIT`], then the disk alone decides.

use super::slots::{job_in_progress, Running};
use crate::azure::AzureClient;
use crate::config::Home;
use crate::sys::signals::wait_timeout as wait_signal;
use nix::sys::signal::{SigSet, Signal};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the wait looks at the slots (and ticks the autoscaler), and the drain at
/// the helpers.
const WAIT_TICK: Duration = Duration::from_millis(500);
const DRAIN_TICK: Duration = Duration::from_millis(100);
/// How long the drain waits for the server's word on agents that look idle on disk.
pub const SERVER_WAIT: Duration = Duration::from_secs(5);

/// Why the wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Signal(Signal),
    /// Every slot ended on its own (no autoscaling), or `--exit-when-idle`.
    Ended,
}

/// Waits until `run` must stop; meanwhile ticks the autoscaler.
pub fn wait_for_stop(sigs: &SigSet, home: &Home, r: &mut Running) -> Stop {
    let mut idle = r.shared.settings.exit_when_idle.map(|t| IdleExit::new(t, Instant::now()));
    loop {
        if let Some(s) = wait_signal(sigs, WAIT_TICK) {
            return Stop::Signal(s);
        }
        match r.scaler.as_mut() {
            Some(sc) => sc.tick(&r.shared, &mut r.slots),
            None if r.slots.all_finished() => return Stop::Ended,
            None => {}
        }
        if let Some(w) = idle.as_mut() {
            if w.expired(Instant::now(), r.slots.any_busy(home, r.shared.work_root().as_deref())) {
                tracing::info!("no job for {}s (--exit-when-idle): stopping", w.limit.as_secs());
                return Stop::Ended;
            }
        }
    }
}

/// Stops the slots: no new agents; idle ones stopped at once, busy ones at the deadline,
/// each killed if still there a cancel grace later; returns once every slot thread has
/// ended (and joins them).
pub fn drain(sigs: &SigSet, home: &Home, r: &mut Running, stop: Stop) {
    let timeout = r.shared.settings.drain_timeout;
    let grace = r.shared.settings.cancel_grace;
    if let Stop::Signal(s) = stop {
        tracing::info!(
            "received {s}: no new jobs; running jobs get {}s to finish, then are cancelled (SIGINT) and killed {}s later",
            timeout.as_secs(),
            grace.as_secs()
        );
    }
    r.shared.stopping.store(true, Ordering::SeqCst);
    r.shared.status.lock().unwrap_or_else(|p| p.into_inner()).stopping = true;
    let mut plan = Drain::new(Instant::now(), timeout, grace);
    let server = ServerLook::start(r.shared.client.clone(), r.pool_id, r.names.clone());
    while !r.slots.all_finished() {
        let layer_dirs = home.job_layer_dirs();
        let views: Vec<SlotView> = r
            .slots
            .v
            .iter()
            .map(|h| SlotView { running: h.thread.is_some(), pid: h.pid.load(Ordering::SeqCst) })
            .collect();
        let work_root = r.shared.work_root();
        let busy = |i: usize| {
            job_in_progress(&layer_dirs, &r.names[i], work_root.as_deref()) || server.busy(&r.names[i], Instant::now())
        };
        let forced = || wait_signal(sigs, Duration::ZERO).is_some();
        for act in plan.due(Instant::now(), &views, busy, forced) {
            let name = &r.names[act.slot];
            let signal = match act.step {
                Step::Cancel => {
                    let why = if act.busy { "drain timeout: its job is cancelled" } else { "idle" };
                    tracing::info!(
                        slot = act.slot,
                        "stopping agent {name} ({why}): SIGINT, SIGKILL in {}s",
                        grace.as_secs()
                    );
                    Signal::SIGINT
                }
                Step::Kill => {
                    tracing::warn!(
                        slot = act.slot,
                        "agent {name} still running {}s after SIGINT: killing it",
                        grace.as_secs()
                    );
                    Signal::SIGTERM
                }
            };
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(act.pid), signal);
        }
        std::thread::sleep(DRAIN_TICK);
    }
    r.slots.reap();
}

/// The server's answer to "which of these agents has a job assigned", asked once in a
/// thread of its own (the client retries for up to a minute and a half).
pub struct ServerLook {
    asked: Instant,
    answer: Arc<Mutex<Option<HashSet<String>>>>,
}

impl ServerLook {
    pub fn start(client: AzureClient, pool_id: u64, names: Vec<String>) -> ServerLook {
        let answer = Arc::new(Mutex::new(None));
        let out = answer.clone();
        let spawned = std::thread::Builder::new().name("drain-server-look".into()).spawn(move || {
            let assigned = match client.list_agents(pool_id, None) {
                Ok(list) => list
                    .into_iter()
                    .filter(|a| a.assigned_request.is_some() && names.contains(&a.name))
                    .map(|a| a.name)
                    .collect(),
                Err(e) => {
                    tracing::warn!(
                        "drain: cannot ask the server which agents have a job ({e}); the disk alone decides"
                    );
                    HashSet::new()
                }
            };
            *out.lock().unwrap_or_else(|p| p.into_inner()) = Some(assigned);
        });
        if let Err(e) = spawned {
            tracing::warn!("drain: cannot start the server look ({e}); the disk alone decides");
            *answer.lock().unwrap_or_else(|p| p.into_inner()) = Some(HashSet::new());
        }
        ServerLook::answered_with(answer)
    }

    fn answered_with(answer: Arc<Mutex<Option<HashSet<String>>>>) -> ServerLook {
        ServerLook { asked: Instant::now(), answer }
    }

    /// Whether `agent` has a job by the server's word; while the answer is out (for at
    /// most [`SERVER_WAIT`]) every agent counts as busy, so none is cancelled early.
    pub fn busy(&self, agent: &str, now: Instant) -> bool {
        match &*self.answer.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(assigned) => assigned.contains(agent),
            None => now < self.asked + SERVER_WAIT,
        }
    }
}

/// `--exit-when-idle`: expired once no slot ran a job for `limit`.
#[derive(Debug)]
pub struct IdleExit {
    limit: Duration,
    last_activity: Instant,
}

impl IdleExit {
    pub fn new(limit: Duration, now: Instant) -> IdleExit {
        IdleExit { limit, last_activity: now }
    }

    /// Whether `run` should stop, seeing at `now` whether some slot is busy.
    pub fn expired(&mut self, now: Instant, busy: bool) -> bool {
        if busy {
            self.last_activity = now;
            return false;
        }
        now.saturating_duration_since(self.last_activity) >= self.limit
    }
}

/// A slot as the drain sees it.
#[derive(Debug, Clone, Copy)]
pub struct SlotView {
    /// Its thread exists.
    pub running: bool,
    /// Its current helper (0: none yet).
    pub pid: i32,
}

/// What the drain does to a slot's helper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// SIGINT: the job's init passes it to the agent, which cancels its job and exits.
    Cancel,
    /// A second signal (SIGTERM): the helper SIGKILLs the job.
    Kill,
}

/// A signal due to slot `slot`'s helper `pid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Act {
    pub slot: usize,
    pub pid: i32,
    /// It ran a job (cancelled at the deadline or when forced).
    pub busy: bool,
    pub step: Step,
}

/// The drain's decisions: each helper is cancelled once, an idle one at once, a busy one
/// once the deadline passed or a second signal forces it; and killed once, `grace` after
/// its cancel.
#[derive(Debug)]
pub struct Drain {
    deadline: Instant,
    grace: Duration,
    /// When each helper was cancelled, and whether it was then killed.
    cancelled: HashMap<(usize, i32), (Instant, bool)>,
}

impl Drain {
    pub fn new(now: Instant, timeout: Duration, grace: Duration) -> Drain {
        Drain { deadline: now + timeout, grace, cancelled: HashMap::new() }
    }

    /// The signals due at `now`. `busy(i)`: slot i's agent runs a job; `forced()`: a
    /// second signal came. Both are asked only about slots still to be cancelled (they
    /// read the disk, take the signal), `forced` only for busy ones before the deadline.
    pub fn due(
        &mut self,
        now: Instant,
        slots: &[SlotView],
        busy: impl Fn(usize) -> bool,
        mut forced: impl FnMut() -> bool,
    ) -> Vec<Act> {
        let mut out = Vec::new();
        for (i, s) in slots.iter().enumerate() {
            if !s.running || s.pid <= 0 {
                continue;
            }
            if let Some((at, killed)) = self.cancelled.get_mut(&(i, s.pid)) {
                if !*killed && now >= *at + self.grace {
                    *killed = true;
                    out.push(Act { slot: i, pid: s.pid, busy: true, step: Step::Kill });
                }
                continue;
            }
            let busy = busy(i);
            if !busy || now >= self.deadline || forced() {
                self.cancelled.insert((i, s.pid), (now, false));
                out.push(Act { slot: i, pid: s.pid, busy, step: Step::Cancel });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UP: SlotView = SlotView { running: true, pid: 100 };

    #[test]
    fn the_server_look_holds_idle_agents_until_it_answers_or_gives_up() {
        let answer = Arc::new(Mutex::new(None));
        let look = ServerLook::answered_with(answer.clone());
        let t0 = look.asked;
        assert!(look.busy("a-0", t0), "no answer yet: nobody is cancelled early");
        assert!(!look.busy("a-0", t0 + SERVER_WAIT), "no answer in time: the disk alone decides");
        *answer.lock().unwrap() = Some(HashSet::from(["a-1".to_string()]));
        assert!(!look.busy("a-0", t0) && look.busy("a-1", t0 + SERVER_WAIT * 10));
    }

    #[test]
    fn exit_when_idle_counts_from_the_last_busy_look() {
        let t0 = Instant::now();
        let mut w = IdleExit::new(Duration::from_secs(60), t0);
        assert!(!w.expired(t0 + Duration::from_secs(59), false));
        assert!(!w.expired(t0 + Duration::from_secs(61), true), "a job keeps it up");
        assert!(!w.expired(t0 + Duration::from_secs(120), false), "60 s after the job was seen");
        assert!(w.expired(t0 + Duration::from_secs(121), false));
    }

    const NO_GRACE_YET: Duration = Duration::from_secs(3600);

    fn cancel(slot: usize, pid: i32, busy: bool) -> Act {
        Act { slot, pid, busy, step: Step::Cancel }
    }

    #[test]
    fn idle_agents_stop_at_once_busy_ones_at_the_deadline() {
        let t0 = Instant::now();
        let mut d = Drain::new(t0, Duration::from_secs(600), NO_GRACE_YET);
        let slots = [UP, SlotView { running: true, pid: 200 }];
        let busy = |i: usize| i == 1;
        let due = d.due(t0, &slots, busy, || false);
        assert_eq!(due, [cancel(0, 100, false)]);
        assert_eq!(d.due(t0 + Duration::from_secs(599), &slots, busy, || false), [], "each helper once; busy waits");
        let due = d.due(t0 + Duration::from_secs(600), &slots, busy, || false);
        assert_eq!(due, [cancel(1, 200, true)]);
        assert_eq!(d.due(t0 + Duration::from_secs(700), &slots, busy, || false), []);
    }

    #[test]
    fn a_cancelled_agent_still_there_after_the_grace_is_killed_once() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(30);
        let mut d = Drain::new(t0, Duration::from_secs(60), grace);
        let slots = [UP, SlotView { running: true, pid: 200 }];
        let busy = |i: usize| i == 1;
        assert_eq!(d.due(t0, &slots, busy, || false), [cancel(0, 100, false)]);
        assert_eq!(d.due(t0 + Duration::from_secs(29), &slots, busy, || false), [], "the idle one's grace runs");
        let kill0 = Act { slot: 0, pid: 100, busy: true, step: Step::Kill };
        assert_eq!(d.due(t0 + grace, &slots, busy, || false), [kill0]);
        let at = t0 + Duration::from_secs(60);
        assert_eq!(d.due(at, &slots, busy, || false), [cancel(1, 200, true)], "the busy one at the deadline");
        assert_eq!(d.due(at + grace - Duration::from_millis(1), &slots, busy, || false), []);
        let kill1 = Act { slot: 1, pid: 200, busy: true, step: Step::Kill };
        assert_eq!(d.due(at + grace, &slots, busy, || false), [kill1]);
        assert_eq!(d.due(at + grace * 3, &slots, busy, || false), [], "killed once");
        // An agent that stopped in time is not there to kill: its thread ended.
        let mut d = Drain::new(t0, Duration::ZERO, grace);
        d.due(t0, &[UP], |_| true, || false);
        assert_eq!(d.due(t0 + grace, &[SlotView { running: false, pid: 100 }], |_| true, || false), []);
    }

    #[test]
    fn a_new_helper_is_signalled_again_and_empty_slots_never() {
        let t0 = Instant::now();
        let mut d = Drain::new(t0, Duration::ZERO, NO_GRACE_YET);
        let slots = [UP, SlotView { running: false, pid: 300 }, SlotView { running: true, pid: 0 }];
        assert_eq!(d.due(t0, &slots, |_| false, || false).len(), 1, "no thread, or no helper yet: nothing to signal");
        // The slot's agent ended and the next phase's helper started before the thread saw the stop.
        let due = d.due(t0, &[SlotView { running: true, pid: 101 }], |_| false, || false);
        assert_eq!(due, [cancel(0, 101, false)]);
    }

    #[test]
    fn a_second_signal_forces_a_busy_agent_and_is_read_only_when_needed() {
        let t0 = Instant::now();
        let mut d = Drain::new(t0, Duration::from_secs(600), NO_GRACE_YET);
        let mut asked = 0;
        let due = d.due(
            t0,
            &[UP, UP],
            |i| i == 1,
            || {
                asked += 1;
                true
            },
        );
        assert_eq!(due.iter().map(|t| (t.slot, t.busy)).collect::<Vec<_>>(), [(0, false), (1, true)]);
        assert_eq!(asked, 1, "not asked for the idle slot");
        let mut d = Drain::new(t0, Duration::ZERO, NO_GRACE_YET);
        d.due(t0, &[UP], |_| true, || panic!("past the deadline: no need to read signals"));
    }
}
