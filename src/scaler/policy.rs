//! The scaling policy, as pure functions: what the queue and the agents look like in,
//! decisions with a reason a person can read out.
//!
//! Rules shared by both forms (slots on one host, batch jobs through Slurm):
//! * capacity is started only for waiting jobs that our agents can serve, and only
//!   beyond what is already idle or on its way (starting slots, pending batch jobs), so a
//!   job is never counted twice;
//! * never more than the maximum, never fewer than the minimum (slots);
//! * only capacity that holds no job is ever stopped: idle slots after the idle timeout,
//!   PENDING batch jobs (a running batch job ends itself with `--exit-when-idle`).

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Not running (autoscaling keeps it off until needed).
    Off,
    /// Started, its agent not yet waiting for a job (sandbox, registration).
    Starting,
    /// Its agent waits for a job, for this long.
    Idle(Duration),
    /// Its agent runs a job.
    Busy,
    /// Told to stop (its agent disabled), not yet gone: counts toward the maximum only.
    Stopping,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotsInput<'a> {
    /// Waiting jobs our agents can serve.
    pub waiting: usize,
    /// What they wait for (see `QueueView::matching_summary`).
    pub waiting_for: &'a str,
    /// Every slot, by index.
    pub slots: &'a [SlotState],
    /// Off slots able to serve at least one waiting job, in the order to start them.
    pub candidates: &'a [usize],
    pub min: usize,
    pub max: usize,
    pub idle_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decision {
    pub start: Vec<usize>,
    pub stop: Vec<usize>,
    pub reason: String,
}

impl Decision {
    /// Something is to be done (else the reason only describes the steady state).
    pub fn acts(&self) -> bool {
        !self.start.is_empty() || !self.stop.is_empty()
    }
}

pub fn jobs(n: usize) -> String {
    if n == 1 {
        "1 job waits".into()
    } else {
        format!("{n} jobs wait")
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn waits_for(n: usize, what: &str) -> String {
    if what.is_empty() || what == "no demands" {
        jobs(n)
    } else {
        format!("{} for {what}", jobs(n))
    }
}

/// One host: which slots to start and stop.
pub fn decide_slots(i: &SlotsInput) -> Decision {
    let active = i.slots.iter().filter(|s| **s != SlotState::Off).count();
    let idle: Vec<(usize, Duration)> = i
        .slots
        .iter()
        .enumerate()
        .filter_map(|(n, s)| if let SlotState::Idle(d) = s { Some((n, *d)) } else { None })
        .collect();
    let starting = i.slots.iter().filter(|s| **s == SlotState::Starting).count();
    let busy = i.slots.iter().filter(|s| **s == SlotState::Busy).count();
    let free = idle.len() + starting;
    let need = i.waiting.saturating_sub(free);
    let room = i.max.saturating_sub(active);
    let mut d = Decision::default();

    if need > 0 {
        let n = need.min(room).min(i.candidates.len());
        d.start = i.candidates[..n].to_vec();
        let why = waits_for(i.waiting, i.waiting_for);
        d.reason = if n > 0 {
            let mut r = format!("scaled up {n} because {why}");
            if free > 0 {
                r.push_str(&format!(" ({free} idle or starting)"));
            }
            if n < need && room == n {
                r.push_str(&format!("; max reached ({} of {} agents)", active + n, i.max));
            }
            r
        } else if room == 0 {
            format!("not scaling: max reached ({active} of {} agents running, {why})", i.max)
        } else {
            format!("not scaling: no stopped slot can serve them ({why})")
        };
    } else if i.waiting > 0 {
        d.reason = format!(
            "steady: {}, {} idle or starting will take them",
            waits_for(i.waiting, i.waiting_for),
            plural(free, "agent", "agents")
        );
    } else {
        // Nothing waits for us: stop what has been idle long enough, down to the minimum.
        let mut expired: Vec<(usize, Duration)> = idle.iter().copied().filter(|(_, t)| *t >= i.idle_timeout).collect();
        expired.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
        let may_stop = active.saturating_sub(i.min);
        d.stop = expired.iter().take(may_stop).map(|(n, _)| *n).collect();
        d.stop.sort_unstable();
        d.reason = if !d.stop.is_empty() {
            format!(
                "scaled down {}: no job for {} (idle timeout {}s){}",
                d.stop.len(),
                plural(d.stop.len(), "agent", "agents"),
                i.idle_timeout.as_secs(),
                if busy > 0 { format!(", {busy} busy kept") } else { String::new() }
            )
        } else if busy > 0 {
            format!("steady: {} busy, no job waits for us", plural(busy, "agent", "agents"))
        } else if !idle.is_empty() && active <= i.min {
            format!("steady: {} kept for --min-agents {}", plural(active, "agent", "agents"), i.min)
        } else if !idle.is_empty() {
            format!(
                "idle: {} waiting for jobs, stopped after {}s idle",
                plural(idle.len(), "agent", "agents"),
                i.idle_timeout.as_secs()
            )
        } else if active == 0 {
            "idle: no agent running, no job waits for us".into()
        } else {
            format!("steady: {} starting or stopping", plural(active - busy - idle.len(), "agent", "agents"))
        };
    }
    // The minimum holds whatever the queue says.
    let after = active + d.start.len() - d.stop.len();
    if after < i.min {
        let more: Vec<usize> = (0..i.slots.len())
            .filter(|n| i.slots[*n] == SlotState::Off && !d.start.contains(n))
            .take(i.min - after)
            .collect();
        if !more.is_empty() {
            d.reason = if d.start.is_empty() {
                format!("scaled up {} to keep --min-agents {}", more.len(), i.min)
            } else {
                format!("{}; {} more for --min-agents {}", d.reason, more.len(), i.min)
            };
            d.start.extend(more);
        }
    }
    d
}

/// Slurm: batch jobs of `agents_per_job` agents each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchInput<'a> {
    pub waiting: usize,
    pub waiting_for: &'a str,
    /// Our PENDING batch jobs, oldest first.
    pub pending: &'a [u64],
    /// Our RUNNING batch jobs.
    pub running: usize,
    /// Agents of running batch jobs without a job (idle or still starting).
    pub running_free_agents: usize,
    pub agents_per_job: usize,
    pub max_jobs: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BatchDecision {
    pub submit: usize,
    pub cancel: Vec<u64>,
    pub reason: String,
}

pub fn decide_batch(i: &BatchInput) -> BatchDecision {
    let k = i.agents_per_job.max(1);
    let free = i.pending.len() * k + i.running_free_agents;
    let active = i.pending.len() + i.running;
    let room = i.max_jobs.saturating_sub(active);
    let need = i.waiting.saturating_sub(free);
    let why = waits_for(i.waiting, i.waiting_for);
    let mut d = BatchDecision::default();
    if need > 0 {
        let want = need.div_ceil(k);
        d.submit = want.min(room);
        d.reason = if d.submit > 0 {
            let mut r = format!("submitted {} because {why}", plural(d.submit, "batch job", "batch jobs"));
            if free > 0 {
                r.push_str(&format!(" ({free} agents pending or idle)"));
            }
            if d.submit < want {
                r.push_str(&format!("; max reached ({} of {} batch jobs)", active + d.submit, i.max_jobs));
            }
            r
        } else {
            format!("not submitting: max reached ({active} of {} batch jobs, {why})", i.max_jobs)
        };
        return d;
    }
    // Surplus: PENDING jobs whose agents nobody needs (newest first).
    let surplus_jobs = (free - i.waiting) / k;
    d.cancel = i.pending.iter().rev().take(surplus_jobs).copied().collect();
    d.reason = if !d.cancel.is_empty() {
        let waiting = if i.waiting == 0 { "no job waits for us".to_string() } else { why.clone() };
        format!(
            "cancelled {} not needed: {waiting}, {free} agents pending or idle",
            plural(d.cancel.len(), "pending batch job", "pending batch jobs")
        )
    } else if i.waiting > 0 {
        format!("steady: {why}, {free} agents pending or idle will take them")
    } else if active > 0 {
        format!("steady: no job waits for us; {} ends itself when idle", plural(active, "batch job", "batch jobs"))
    } else {
        "idle: no batch job, no job waits for us".into()
    };
    d
}

#[cfg(test)]
mod tests {
    use super::SlotState::*;
    use super::*;

    fn input<'a>(
        waiting: usize,
        slots: &'a [SlotState],
        candidates: &'a [usize],
        min: usize,
        max: usize,
    ) -> SlotsInput<'a> {
        SlotsInput {
            waiting,
            waiting_for: "cuda_version 12.4",
            slots,
            candidates,
            min,
            max,
            idle_timeout: Duration::from_secs(60),
        }
    }

    #[test]
    fn scales_up_for_waiting_jobs_up_to_max() {
        let slots = [Off, Off, Off, Off];
        let d = decide_slots(&input(3, &slots, &[0, 1, 2, 3], 0, 2));
        assert_eq!(d.start, vec![0, 1]);
        assert_eq!(d.reason, "scaled up 2 because 3 jobs wait for cuda_version 12.4; max reached (2 of 2 agents)");
        let d = decide_slots(&input(2, &slots, &[0, 1, 2, 3], 0, 4));
        assert_eq!(
            (d.start.clone(), d.reason.as_str()),
            (vec![0, 1], "scaled up 2 because 2 jobs wait for cuda_version 12.4")
        );
        // Only slots able to serve the jobs are started.
        let d = decide_slots(&input(2, &slots, &[3], 0, 4));
        assert_eq!(d.start, vec![3]);
        let d = decide_slots(&input(2, &slots, &[], 0, 4));
        assert!(d.start.is_empty() && d.reason.starts_with("not scaling: no stopped slot"), "{d:?}");
    }

    #[test]
    fn max_reached_is_said() {
        let slots = [Busy, Busy, Off];
        let d = decide_slots(&input(3, &slots, &[2], 0, 2));
        assert!(!d.acts());
        assert_eq!(d.reason, "not scaling: max reached (2 of 2 agents running, 3 jobs wait for cuda_version 12.4)");
    }

    #[test]
    fn idle_and_starting_agents_absorb_waiting_jobs() {
        // KEDA's trap: the job an idle/starting agent is about to take must not start another.
        let slots = [Starting, Idle(Duration::from_secs(1)), Off, Off];
        let d = decide_slots(&input(2, &slots, &[2, 3], 0, 4));
        assert!(!d.acts(), "{d:?}");
        assert_eq!(d.reason, "steady: 2 jobs wait for cuda_version 12.4, 2 agents idle or starting will take them");
        let d = decide_slots(&input(3, &slots, &[2, 3], 0, 4));
        assert_eq!(d.start, vec![2]);
        assert_eq!(d.reason, "scaled up 1 because 3 jobs wait for cuda_version 12.4 (2 idle or starting)");
    }

    #[test]
    fn scales_down_only_idle_agents_after_the_timeout() {
        let long = Duration::from_secs(61);
        let short = Duration::from_secs(5);
        let slots = [Busy, Idle(long), Idle(short), Idle(long)];
        let d = decide_slots(&input(0, &slots, &[], 0, 4));
        assert_eq!(d.stop, vec![1, 3], "busy slot 0 and the recently idle slot 2 stay");
        assert_eq!(d.reason, "scaled down 2: no job for 2 agents (idle timeout 60s), 1 busy kept");
        // Jobs waiting: nothing is stopped even after the timeout.
        let d = decide_slots(&input(1, &slots, &[], 0, 4));
        assert!(d.stop.is_empty());
        // Never below the minimum.
        let d = decide_slots(&input(0, &[Idle(long), Idle(long), Off], &[], 1, 4));
        assert_eq!(d.stop.len(), 1);
        let d = decide_slots(&input(0, &[Idle(long), Off], &[], 1, 4));
        assert!(d.stop.is_empty());
        assert_eq!(d.reason, "steady: 1 agent kept for --min-agents 1");
        // Busy ones are never stopped, whatever their number.
        let d = decide_slots(&input(0, &[Busy, Busy], &[], 0, 2));
        assert!(!d.acts());
        assert_eq!(d.reason, "steady: 2 agents busy, no job waits for us");
        // A stopping slot is no capacity for waiting jobs, but still counts toward max.
        let d = decide_slots(&input(1, &[Stopping, Off], &[1], 0, 2));
        assert_eq!(d.start, vec![1]);
        let d = decide_slots(&input(1, &[Stopping, Off], &[1], 0, 1));
        assert!(d.start.is_empty() && d.reason.starts_with("not scaling: max reached"), "{d:?}");
    }

    #[test]
    fn min_agents_are_kept_running() {
        let d = decide_slots(&input(0, &[Off, Off, Off], &[], 2, 3));
        assert_eq!(d.start, vec![0, 1]);
        assert_eq!(d.reason, "scaled up 2 to keep --min-agents 2");
        let d = decide_slots(&input(0, &[Off, Off], &[], 0, 2));
        assert!(!d.acts());
        assert_eq!(d.reason, "idle: no agent running, no job waits for us");
    }

    fn batch<'a>(
        waiting: usize,
        pending: &'a [u64],
        running: usize,
        running_free: usize,
        k: usize,
        max: usize,
    ) -> BatchInput<'a> {
        BatchInput {
            waiting,
            waiting_for: "cuda_version 12.4",
            pending,
            running,
            running_free_agents: running_free,
            agents_per_job: k,
            max_jobs: max,
        }
    }

    #[test]
    fn submits_enough_batch_jobs_for_the_waiting_jobs() {
        let d = decide_batch(&batch(3, &[], 0, 0, 1, 8));
        assert_eq!(d.submit, 3);
        assert_eq!(d.reason, "submitted 3 batch jobs because 3 jobs wait for cuda_version 12.4");
        let d = decide_batch(&batch(5, &[], 0, 0, 2, 8));
        assert_eq!(d.submit, 3, "5 jobs, 2 agents per batch job");
        let d = decide_batch(&batch(5, &[7], 1, 1, 1, 8));
        assert_eq!(d.submit, 3, "one pending and one free running agent absorb 2");
        let d = decide_batch(&batch(5, &[], 0, 0, 1, 2));
        assert_eq!(d.submit, 2);
        assert!(d.reason.ends_with("max reached (2 of 2 batch jobs)"), "{}", d.reason);
        let d = decide_batch(&batch(5, &[1, 2], 0, 0, 1, 2));
        assert_eq!(d.submit, 0);
        assert_eq!(d.reason, "not submitting: max reached (2 of 2 batch jobs, 5 jobs wait for cuda_version 12.4)");
    }

    #[test]
    fn cancels_surplus_pending_jobs_newest_first() {
        let d = decide_batch(&batch(1, &[10, 11, 12], 1, 1, 1, 8));
        assert_eq!(d.submit, 0);
        assert_eq!(d.cancel, vec![12, 11, 10], "the running job's free agent takes the one waiting job");
        let d = decide_batch(&batch(1, &[10, 11, 12], 0, 0, 1, 8));
        assert_eq!(d.cancel, vec![12, 11]);
        assert!(d.reason.starts_with("cancelled 2 pending batch jobs not needed: 1 job waits"), "{}", d.reason);
        let d = decide_batch(&batch(0, &[], 2, 2, 1, 8));
        assert!(d.cancel.is_empty() && d.submit == 0);
        // With 2 agents per job, one surplus agent does not cancel a job.
        let d = decide_batch(&batch(3, &[1, 2], 0, 0, 2, 8));
        assert!(d.cancel.is_empty(), "{d:?}");
    }
}
