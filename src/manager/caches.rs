//! After an agent's job: commit its caches when Azure DevOps says the job was a trusted
//! build (see [`crate::cache::trust`]); what the job wrote decides nothing.

use super::Shared;
use crate::cache::trust::{self, Verdict};
use crate::sandbox::Sandbox;

/// What the commit needs to know before the agent's `run.sh` starts (see
/// [`trust::learn`]): its job requests then, or why they could not be read (no commit).
pub fn before_the_job(shared: &Shared, agent_name: &str) -> Result<trust::Before, String> {
    trust::before(&shared.client, shared.pool_id, agent_name).map_err(|e| format!("{e:#}"))
}

/// Asks Azure DevOps which build the agent `agent_name` ran in its sandbox (its one job
/// request since `before`) and commits every cache of `sandbox` if it is trusted; one log
/// line either way.
pub fn commit_if_trusted(
    shared: &Shared,
    slot: usize,
    agent_name: &str,
    before: &Result<trust::Before, String>,
    sandbox: &mut Sandbox,
) {
    let job = sandbox.id().to_string();
    let facts = match before {
        Ok(before) => trust::learn(&shared.client, shared.pool_id, agent_name, before),
        Err(e) => Err(anyhow::anyhow!("its job requests could not be read before the job: {e}")),
    };
    match facts.map(|f| (trust::decide(&f, &shared.settings.trusted_branches), f)) {
        Ok((Verdict::Trusted(why), f)) => {
            tracing::info!(slot, job = %job, request = f.request_id, "caches: committing ({why})");
            let all: Vec<usize> = (0..sandbox.plan().caches.len()).collect();
            sandbox.commit_caches(&all, &why);
        }
        Ok((Verdict::Untrusted(why), f)) => {
            tracing::info!(slot, job = %job, request = f.request_id, "caches: not committed ({why}); the job's changes are discarded")
        }
        Err(e) => tracing::warn!(
            slot,
            job = %job,
            "caches: not committed: cannot learn the job's build from Azure DevOps ({e:#}); the job's changes are discarded"
        ),
    }
}
