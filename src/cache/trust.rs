//! Which jobs may write the caches: the manager asks Azure DevOps itself after the job,
//! never the job. The agent's newest job request names its owner (the build, for a
//! pipeline run) and project (`scopeId`); the build says its `sourceBranch` and `reason`.
//! Trusted: a build of a protected branch (`refs/heads/main` unless the operator sets
//! `trusted_branches`), and never one whose reason is a pull request.

use crate::azure::{AzureClient, AzureError, JobRequest};
use anyhow::{bail, Result};

/// What Azure DevOps says about the build a job belonged to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildFacts {
    pub request_id: u64,
    pub build_id: u64,
    pub source_branch: String,
    pub reason: String,
}

/// The branches trusted when the operator names none.
pub const DEFAULT_TRUSTED: &[&str] = &["refs/heads/main"];

/// Trusted or not, and why (for the job's log line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Trusted(String),
    Untrusted(String),
}

/// The decision for a build: never a pull request; else its branch must match one of
/// `patterns` (exact, or a prefix ending in `*`: `refs/heads/release/*`).
pub fn decide(facts: &BuildFacts, patterns: &[String]) -> Verdict {
    let who = format!("build {} ({}, reason {})", facts.build_id, facts.source_branch, facts.reason);
    if facts.reason.eq_ignore_ascii_case("pullRequest") || facts.source_branch.starts_with("refs/pull/") {
        return Verdict::Untrusted(format!("{who}: a pull request never writes caches"));
    }
    let matches = |p: &str| match p.strip_suffix('*') {
        Some(prefix) => facts.source_branch.starts_with(prefix),
        None => facts.source_branch == p,
    };
    let defaults: Vec<String> = DEFAULT_TRUSTED.iter().map(|s| s.to_string()).collect();
    let patterns = if patterns.is_empty() { &defaults } else { patterns };
    match patterns.iter().any(|p| matches(p)) {
        true => Verdict::Trusted(format!("{who}: a trusted branch")),
        false => Verdict::Untrusted(format!("{who}: not a trusted branch ({})", patterns.join(", "))),
    }
}

/// The agent's job requests before its job could start: taken after `config.sh` and
/// before `run.sh` (see [`learn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Before {
    pub agent_id: u64,
    /// The newest request id the agent had then (0: none).
    pub newest_request: u64,
}

/// How many of the agent's newest requests are read: more than one since [`Before`] is
/// refused anyway.
const REQUESTS_READ: u32 = 10;

/// [`Before`] for the agent named `agent_name`, from Azure DevOps.
pub fn before(client: &AzureClient, pool_id: u64, agent_name: &str) -> Result<Before> {
    let agent_id = agent_id(client, pool_id, agent_name)?;
    let requests = client.agent_job_requests(pool_id, agent_id, REQUESTS_READ)?;
    Ok(Before { agent_id, newest_request: requests.iter().map(|r| r.request_id).max().unwrap_or(0) })
}

/// The build of the job the agent named `agent_name` ran in its sandbox, from Azure
/// DevOps: the agent's record (by its name, which the manager chose) -> the one job
/// request it took since `before` -> that request's owner build. A request that did not
/// succeed is refused.
///
/// The job can read its agent's credentials (it runs as the agent's user, as on any
/// self-hosted agent) and act as the agent until its sandbox ends: a pull request's job
/// took the next queued build of `main` that way, so that "the agent's newest request"
/// was a trusted build and the pull request's cache writes were committed (found by a
/// red-team pass). So the request is the agent's only one since `before`, taken before
/// `run.sh` started: a second one means something in the sandbox took a job as the agent,
/// and nothing of it is trusted.
pub fn learn(client: &AzureClient, pool_id: u64, agent_name: &str, before: &Before) -> Result<BuildFacts> {
    let agent_id = agent_id(client, pool_id, agent_name)?;
    if agent_id != before.agent_id {
        bail!("agent {agent_name}'s record changed during its job (id {} -> {agent_id})", before.agent_id);
    }
    let requests = client.agent_job_requests(pool_id, agent_id, REQUESTS_READ)?;
    let req = the_jobs_request(&requests, before)?;
    if let Some(result) = req.result.as_deref().filter(|r| !r.eq_ignore_ascii_case("succeeded")) {
        bail!("job request {} ended {result}: only a succeeded job commits", req.request_id);
    }
    if !req.plan_type.as_deref().is_some_and(|t| t.eq_ignore_ascii_case("build")) {
        bail!("job request {} is not a build's (planType {:?})", req.request_id, req.plan_type);
    }
    let build_id = req.owner.as_ref().and_then(|o| o.id.as_ref()).and_then(|v| v.as_u64());
    let (Some(build_id), Some(project)) = (build_id, req.scope_id.as_deref()) else {
        bail!("job request {} names no owner build or project", req.request_id);
    };
    let build = client.build(project, build_id).map_err(|e: AzureError| anyhow::anyhow!(e))?;
    Ok(BuildFacts {
        request_id: req.request_id,
        build_id,
        source_branch: build.source_branch.unwrap_or_default(),
        reason: build.reason.unwrap_or_default(),
    })
}

fn agent_id(client: &AzureClient, pool_id: u64, agent_name: &str) -> Result<u64> {
    let agents = client.list_agents(pool_id, Some(agent_name))?;
    match agents.iter().find(|a| a.name == agent_name) {
        Some(agent) => Ok(agent.id),
        None => bail!("pool {pool_id} has no agent named {agent_name}"),
    }
}

/// The agent's one request since `before` (reserved to it), or why there is none.
fn the_jobs_request<'a>(requests: &'a [JobRequest], before: &Before) -> Result<&'a JobRequest> {
    let agent = before.agent_id;
    let new: Vec<&JobRequest> = requests.iter().filter(|r| r.request_id > before.newest_request).collect();
    match new.as_slice() {
        [] => bail!("Azure DevOps lists no job request of agent {agent} since its sandbox started"),
        [one] if one.reserved_agent.as_ref().and_then(|a| a.id) == Some(agent) => Ok(one),
        [one] => bail!("job request {} is not reserved to agent {agent}", one.request_id),
        many => {
            let ids: Vec<String> = many.iter().map(|r| r.request_id.to_string()).collect();
            bail!(
                "agent {agent} took {} job requests in one sandbox ({}): something in it acted as the agent \
                 (its credentials are readable there) and took more than its own job",
                many.len(),
                ids.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(branch: &str, reason: &str) -> BuildFacts {
        BuildFacts { request_id: 1, build_id: 7, source_branch: branch.into(), reason: reason.into() }
    }

    fn request(id: u64, agent: u64) -> JobRequest {
        serde_json::from_value(serde_json::json!({"requestId": id, "reservedAgent": {"id": agent, "name": "a"}}))
            .unwrap()
    }

    #[test]
    fn the_jobs_request_is_the_agents_only_one_since_before() {
        let before = Before { agent_id: 5, newest_request: 100 };
        let older = [request(99, 5), request(100, 5)];
        let err = |r: &[JobRequest]| the_jobs_request(r, &before).unwrap_err().to_string();
        assert!(err(&older).contains("no job request of agent 5 since"), "{}", err(&older));
        let one = [request(101, 5), request(100, 5)];
        assert_eq!(the_jobs_request(&one, &before).unwrap().request_id, 101);
        // A job acting as its agent took the next queued build too: neither is trusted,
        // whichever is newest.
        let two = [request(102, 5), request(101, 5), request(100, 5)];
        assert!(err(&two).contains("took 2 job requests in one sandbox (102, 101)"), "{}", err(&two));
        let elsewhere = [request(101, 6)];
        assert!(err(&elsewhere).contains("not reserved to agent 5"), "{}", err(&elsewhere));
    }

    #[test]
    fn main_is_trusted_a_pull_request_never() {
        let trusted = |f: &BuildFacts, p: &[&str]| {
            matches!(decide(f, &p.iter().map(|s| s.to_string()).collect::<Vec<_>>()), Verdict::Trusted(_))
        };
        assert!(trusted(&facts("refs/heads/main", "individualCI"), &[]));
        assert!(trusted(&facts("refs/heads/main", "manual"), &[]));
        assert!(!trusted(&facts("refs/heads/main", "pullRequest"), &[]), "a PR build, whatever its branch");
        assert!(!trusted(&facts("refs/pull/4/merge", "manual"), &["refs/*"]));
        assert!(!trusted(&facts("refs/heads/feature", "individualCI"), &[]));
        assert!(!trusted(&facts("refs/heads/mainline", "individualCI"), &[]), "exact, not a prefix");
        let ops = ["refs/heads/release/*", "refs/heads/dev"];
        assert!(trusted(&facts("refs/heads/release/2.1", "schedule"), &ops));
        assert!(trusted(&facts("refs/heads/dev", "schedule"), &ops));
        assert!(!trusted(&facts("refs/heads/main", "schedule"), &ops), "the operator's list replaces the default");
        let Verdict::Untrusted(why) = decide(&facts("refs/heads/x", "pullRequest"), &[]) else { panic!() };
        assert_eq!(why, "build 7 (refs/heads/x, reason pullRequest): a pull request never writes caches");
    }
}
