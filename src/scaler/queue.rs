//! Reading the pool's queue (`GET .../pools/{id}/jobrequests`, as KEDA's scaler does)
//! and sorting its jobs into "waiting and ours to serve", "waiting but not for us" and
//! "running".
//!
//! Traps this avoids (all seen in KEDA's azure-pipelines scaler): a job already picked
//! up (an `assignTime`, or a `reservedAgent` before the assign time is written) is not
//! waiting, so capacity is not started for it twice; finished jobs are skipped; the
//! request asks only for open requests (`completedRequestCount=0`) and at most `$top`
//! of them, because pools with long histories answer slowly.

use super::demands;
use crate::azure::JobRequest;
use std::collections::BTreeMap;

/// Requests asked for per poll (the `$top` of the call).
pub const DEFAULT_TOP: u32 = 250;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingJob {
    pub request_id: u64,
    pub demands: Vec<String>,
    pub pipeline: Option<String>,
    /// None: one of our agent shapes can serve it; Some(why not) otherwise.
    pub unmatched: Option<String>,
}

/// One poll of the queue, classified.
#[derive(Debug, Clone, Default)]
pub struct QueueView {
    pub waiting: Vec<WaitingJob>,
    /// Assigned and not finished (in any agent of the pool, ours or not).
    pub running: usize,
    /// How many requests the server returned.
    pub fetched: usize,
    /// The `$top` used; `fetched == top` means there may be more.
    pub top: u32,
}

/// Waiting for an agent: no result, never assigned, not reserved for an agent.
pub fn is_waiting(r: &JobRequest) -> bool {
    r.result.is_none() && r.assign_time.is_none() && r.finish_time.is_none() && r.reserved_agent.is_none()
}

/// Running: taken by an agent, not finished.
pub fn is_running(r: &JobRequest) -> bool {
    r.result.is_none() && r.finish_time.is_none() && (r.assign_time.is_some() || r.reserved_agent.is_some())
}

/// Sorts `requests`; a waiting job is ours when any of `shapes` (the capability sets our
/// agents would advertise) meets its demands.
pub fn classify(requests: &[JobRequest], shapes: &[BTreeMap<String, String>], top: u32) -> QueueView {
    let mut v = QueueView { fetched: requests.len(), top, ..Default::default() };
    for r in requests {
        if is_waiting(r) {
            let unmatched = match_any(&r.demands, shapes).err();
            v.waiting.push(WaitingJob {
                request_id: r.request_id,
                demands: r.demands.clone(),
                pipeline: r.definition.as_ref().and_then(|d| d.name.clone()),
                unmatched,
            });
        } else if is_running(r) {
            v.running += 1;
        }
    }
    v.waiting.sort_by_key(|w| w.request_id);
    v
}

/// Ok when one shape meets the demands; the reason of the first shape otherwise.
pub fn match_any(demands: &[String], shapes: &[BTreeMap<String, String>]) -> Result<(), String> {
    let mut first_err = None;
    for s in shapes {
        match demands::check_all(demands, s) {
            Ok(()) => return Ok(()),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    Err(first_err.unwrap_or_else(|| "no agent shape to match against".into()))
}

impl QueueView {
    pub fn matching(&self) -> impl Iterator<Item = &WaitingJob> {
        self.waiting.iter().filter(|w| w.unmatched.is_none())
    }
    pub fn matching_count(&self) -> usize {
        self.matching().count()
    }
    pub fn unmatched_count(&self) -> usize {
        self.waiting.len() - self.matching_count()
    }
    /// The read may have missed waiting jobs (the server had more than `$top`).
    pub fn maybe_truncated(&self) -> bool {
        self.top > 0 && self.fetched >= self.top as usize
    }

    /// What the jobs we can serve wait for: `cuda_version 12.4`, or with several
    /// distinct demand sets `cuda_version 12.4 (2); gpu_model (1)`.
    pub fn matching_summary(&self) -> String {
        summarize(self.matching().map(|w| demands::describe(&w.demands)))
    }

    /// Why the others cannot be served here, grouped: `cuda_version 99.9 (2): no capability cuda_version`.
    pub fn unmatched_summary(&self) -> String {
        let mut groups: BTreeMap<String, (usize, String)> = BTreeMap::new();
        for w in self.waiting.iter() {
            if let Some(why) = &w.unmatched {
                let e = groups.entry(demands::describe(&w.demands)).or_insert((0, why.clone()));
                e.0 += 1;
            }
        }
        groups.into_iter().map(|(d, (n, why))| format!("{d} ({n}): {why}")).collect::<Vec<_>>().join("; ")
    }

    /// One line for the log and the status.
    pub fn line(&self) -> String {
        let mut s = format!("{} waiting ({} for us", self.waiting.len(), self.matching_count());
        if self.matching_count() > 0 {
            s.push_str(&format!(": {}", self.matching_summary()));
        }
        s.push(')');
        if self.unmatched_count() > 0 {
            s.push_str(&format!(", {} we cannot serve ({})", self.unmatched_count(), self.unmatched_summary()));
        }
        s.push_str(&format!(", {} running", self.running));
        if self.maybe_truncated() {
            s.push_str(&format!(" (only the newest {} requests read)", self.top));
        }
        s
    }
}

/// Groups equal descriptions: one group -> itself; several -> `a (2); b (1)`.
pub fn summarize(descs: impl Iterator<Item = String>) -> String {
    let mut groups: Vec<(String, usize)> = Vec::new();
    for d in descs {
        match groups.iter_mut().find(|(g, _)| *g == d) {
            Some(g) => g.1 += 1,
            None => groups.push((d, 1)),
        }
    }
    match groups.len() {
        0 => String::new(),
        1 => groups.remove(0).0,
        _ => {
            groups.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            groups.into_iter().map(|(d, n)| format!("{d} ({n})")).collect::<Vec<_>>().join("; ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::azure::AgentRef;

    pub(crate) fn req(id: u64, demands: &[&str]) -> JobRequest {
        serde_json::from_value(serde_json::json!({
            "requestId": id, "queueTime": "2025-01-01T00:00:00Z", "assignTime": null, "result": null,
            "demands": demands, "definition": {"name": "pipe"}
        }))
        .unwrap()
    }

    fn shape(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn only_unassigned_unreserved_open_jobs_wait() {
        let mut assigned = req(2, &[]);
        assigned.assign_time = Some("2025-01-01T00:00:01Z".into());
        let mut reserved = req(3, &[]);
        reserved.reserved_agent = Some(AgentRef { id: Some(7), name: Some("x-0".into()), status: None, enabled: None });
        let mut done = req(4, &[]);
        done.assign_time = Some("t".into());
        done.finish_time = Some("t".into());
        done.result = Some("succeeded".into());
        let mut canceled_in_queue = req(5, &[]);
        canceled_in_queue.result = Some("canceled".into());
        let v = classify(&[req(1, &[]), assigned, reserved, done, canceled_in_queue], &[shape(&[])], 250);
        assert_eq!(v.waiting.iter().map(|w| w.request_id).collect::<Vec<_>>(), vec![1]);
        assert_eq!(v.running, 2, "assigned and reserved ones run");
        assert_eq!(v.fetched, 5);
        assert!(!v.maybe_truncated());
        assert!(classify(&[req(1, &[])], &[], 1).maybe_truncated());
    }

    #[test]
    fn counts_what_our_shapes_can_serve_with_reasons() {
        let shapes = [
            shape(&[("cuda_version", "12.4"), ("gpu_count", "1")]),
            shape(&[("cuda_version", "12.4"), ("gpu_count", "2")]),
        ];
        let reqs = [
            req(1, &["cuda_version -equals 12.4", "Agent.Version -gtVersion 2.0"]),
            req(2, &["cuda_version -equals 12.4"]),
            req(3, &["gpu_count -gtVersion 2"]),
            req(4, &["cuda_version -equals 11.8"]),
            req(5, &["gpu_count -gtVersion 4"]),
        ];
        let v = classify(&reqs, &shapes, 250);
        assert_eq!(
            v.matching().map(|w| w.request_id).collect::<Vec<_>>(),
            vec![1, 2, 3],
            "job 3 fits the 2-GPU shape only"
        );
        assert_eq!(v.unmatched_count(), 2);
        assert_eq!(v.waiting[3].unmatched.as_deref(), Some("cuda_version is 12.4, not 11.8"));
        assert_eq!(v.matching_summary(), "cuda_version 12.4 (2); gpu_count >= 2 (1)");
        let line = v.line();
        assert!(
            line.starts_with("5 waiting (3 for us: cuda_version 12.4 (2); gpu_count >= 2 (1)), 2 we cannot serve ("),
            "{line}"
        );
        assert!(line.contains("cuda_version 11.8 (1): cuda_version is 12.4, not 11.8"), "{line}");
    }

    #[test]
    fn summary_of_one_demand_set() {
        let v = classify(
            &[req(1, &["cuda_version -equals 12.4"]), req(2, &["cuda_version -equals 12.4"])],
            &[shape(&[("cuda_version", "12.4")])],
            250,
        );
        assert_eq!(v.matching_summary(), "cuda_version 12.4");
        let v = classify(&[req(1, &[])], &[shape(&[])], 250);
        assert_eq!(v.matching_summary(), "no demands");
    }
}
