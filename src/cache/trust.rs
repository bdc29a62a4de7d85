//! Which jobs may write the caches: the manager asks Azure DevOps itself after the job,
//! never the job. The agent's newest job request names its owner (the build, for a
//! pipeline run) and project (`scopeId`); the build says its `sourceBranch` and `reason`.
//! Trusted: a build of a protected branch (`refs/heads/main` unless the operator sets
//! `trusted_branches`), and never one whose reason is a pull request.

use crate::azure::{AzureClient, AzureError};
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

/// The build of the last job of the agent named `agent_name`, from Azure DevOps: the
/// agent's record (by its name, which the manager chose) -> its newest job request ->
/// that request's owner build. A request that did not succeed is refused.
pub fn learn(client: &AzureClient, pool_id: u64, agent_name: &str) -> Result<BuildFacts> {
    let agents = client.list_agents(pool_id, Some(agent_name))?;
    let Some(agent) = agents.iter().find(|a| a.name == agent_name) else {
        bail!("pool {pool_id} has no agent named {agent_name}");
    };
    let agent_id = agent.id;
    let requests = client.agent_job_requests(pool_id, agent_id, 10)?;
    let mine = requests
        .iter()
        .filter(|r| r.reserved_agent.as_ref().and_then(|a| a.id) == Some(agent_id))
        .max_by_key(|r| r.request_id);
    let Some(req) = mine else { bail!("Azure DevOps lists no job request of agent {agent_id}") };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(branch: &str, reason: &str) -> BuildFacts {
        BuildFacts { request_id: 1, build_id: 7, source_branch: branch.into(), reason: reason.into() }
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
