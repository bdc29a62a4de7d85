//! The shutdown phase, once every slot has ended: this host's agent records go (a killed
//! listener may not have closed its session, so the server may still show them), then
//! the autoscaler's placeholder, the rootfs lease, and everything the jobs left (gc).

use super::slots::Running;
use crate::config::Home;
use anyhow::Result;

pub fn shutdown(home: &Home, r: Running) -> Result<()> {
    let client = &r.shared.client;
    for a in client.list_agents(r.pool_id, None)? {
        if r.names.contains(&a.name) {
            client.delete_agent(r.pool_id, a.id)?;
            tracing::info!("removed agent record '{}' (id {})", a.name, a.id);
        }
    }
    if let Some(sc) = r.scaler {
        sc.shutdown(client);
    }
    drop(r.lease);
    if !crate::sandbox::wait_for_background_cleanups(std::time::Duration::from_secs(60)) {
        tracing::warn!("jobs' clean-ups still running after 60 s: `azp-sandbox gc` finishes them");
    }
    crate::sandbox::gc_all(home)?.log();
    tracing::info!(
        "stopped; {} job(s) served",
        r.shared.status.lock().map(|s| s.slots.iter().map(|x| x.jobs_done).sum::<u64>()).unwrap_or(0)
    );
    Ok(())
}
