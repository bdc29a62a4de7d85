//! A root-mode job's tracked connections after it: the host's table masqueraded them, so
//! each is an entry of the host's one conntrack table, and nothing else ends them with
//! the job (a server of the job's that keeps answering keeps them for days). Its helper
//! forgets them once the job is over (`sys::net::forget_connections`). A helper killed
//! first (`kill -9` of an `exec` or a `run`, which its helper follows; a crash) cannot:
//! so, from the job's start until they are forgotten, the job dir holds a record of
//! them, and the clean-up that finds it (the runner's, or `gc`'s) forgets them instead.
//!
//! That clean-up may come late (another home's `gc`, a service restarted hours later),
//! and the killed job's address is free again as soon as its link is gone: a job that
//! claimed it meanwhile would get the replies its far ends still send, and could send on
//! those connections. So the record has a marker beside the others of its host namespace,
//! `<address>@<link>` in [`markers_dir`], for as long as the record lasts; a helper whose
//! job got an address checks for markers of it before its job starts, and forgets the
//! connections of a killed holder first ([`before_its_job`]).

use crate::sys::net::{JobConnections, Look};
use crate::sys::Sys;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// Where [`markers_dir`] is, per host namespace.
const MARKERS: &str = "/run/azp-sandbox/unforgotten";

/// The markers' dir of the caller's network namespace (the host's: see
/// `super::ensure_table`, which puts it in the job's plan).
pub fn markers_dir() -> PathBuf {
    PathBuf::from(super::per_netns(MARKERS))
}

/// A job's connections, with the dir of its marker (None: no marker, a plan made
/// without the host's table, as in unit tests of the helper).
#[derive(Debug, Clone)]
pub struct Tracked {
    pub connections: JobConnections,
    pub markers: Option<PathBuf>,
}

/// What the record holds: the job's link on the host (its element in the counting set),
/// its addresses, and where its markers are.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    link: String,
    sources: Vec<IpAddr>,
    #[serde(default)]
    markers: Option<PathBuf>,
}

/// The marker of `link`'s hold on `address` (IPv4: the job's IPv6 address is made of it).
fn marker_name(address: &IpAddr, link: &str) -> Option<String> {
    matches!(address, IpAddr::V4(_)).then(|| format!("{address}@{link}"))
}

fn markers(t: &Tracked) -> Vec<PathBuf> {
    let Some(dir) = &t.markers else { return vec![] };
    t.connections.sources.iter().filter_map(|a| marker_name(a, &t.connections.link)).map(|n| dir.join(n)).collect()
}

/// The helper, before its job starts: the record of the job's connections in `file`,
/// and its markers.
pub fn record(file: &Path, t: &Tracked) -> Result<()> {
    let c = &t.connections;
    let r = Record { link: c.link.clone(), sources: c.sources.clone(), markers: t.markers.clone() };
    std::fs::write(file, serde_json::to_vec(&r)?).with_context(|| format!("cannot write {}", file.display()))?;
    if let Some(dir) = &t.markers {
        create_private_dir(dir)?;
    }
    for m in markers(t) {
        std::fs::write(&m, b"").with_context(|| format!("cannot write {}", m.display()))?;
    }
    Ok(())
}

fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot create {}", dir.display())),
    }
}

/// The helper, once it tried to forget them (or its job never started): no record or
/// marker left for a clean-up or an heir to act on.
pub fn forgotten(file: &Path, t: &Tracked) {
    for m in markers(t) {
        remove(&m);
    }
    if let Err(e) = std::fs::remove_file(file) {
        tracing::debug!("cannot remove {} ({e}): the clean-up reads the job's connections again", file.display());
    }
}

fn remove(marker: &Path) {
    if let Err(e) = std::fs::remove_file(marker) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::debug!("cannot remove {} ({e})", marker.display());
        }
    }
}

/// A clean-up, once the job's processes are gone: the connections of a record the
/// helper left (it was killed before it forgot them), forgotten, and the record
/// removed. How many (None: no record, the usual case). A failure is a warning: they
/// expire on their own, and the markers stay for an heir of the address. So does the
/// marker of an address another job's link holds by now: that job's helper forgets
/// them, if it has not yet (its check may come after this).
pub fn left_by_a_killed_helper(file: &Path, sys: &dyn Sys) -> Option<usize> {
    let bytes = std::fs::read(file).ok()?;
    let forgotten = match serde_json::from_slice::<Record>(&bytes) {
        Ok(r) => {
            let t = Tracked { connections: super::job_connections(r.link, r.sources), markers: r.markers };
            // Always: the table may have been removed, or made again, since.
            match sys.forget_connections(&t.connections, Look::Always) {
                Ok(f) => {
                    for (a, m) in t.connections.sources.iter().zip(markers(&t)) {
                        if !f.kept.contains(a) {
                            remove(&m);
                        }
                    }
                    f.entries
                }
                Err(e) => {
                    tracing::warn!("{}: the job's tracked connections expire on their own", e.with_causes());
                    0
                }
            }
        }
        Err(e) => {
            tracing::warn!("{} is unreadable ({e}): the job's tracked connections expire on their own", file.display());
            0
        }
    };
    let _ = std::fs::remove_file(file);
    Some(forgotten)
}

/// The helper of a job that got its address (`t`, before its record): the connections a
/// killed job left on that address (the markers of other links), forgotten before this
/// job can get their replies. How many. An error keeps the job from starting (and the
/// marker, for the next heir): it would get them.
pub fn before_its_job(t: &Tracked, sys: &dyn Sys) -> Result<usize> {
    let Some(dir) = &t.markers else { return Ok(0) };
    let own = &t.connections;
    let prefixes: Vec<String> = own.sources.iter().filter_map(|a| marker_name(a, "")).collect();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
    };
    let mut forgotten = 0;
    for entry in entries {
        let name = entry.with_context(|| format!("cannot list {}", dir.display()))?.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(link) = prefixes.iter().find_map(|p| name.strip_prefix(p.as_str())) else { continue };
        if link == own.link {
            continue;
        }
        let theirs = JobConnections { link: link.to_string(), heir: Some(own.link.clone()), ..own.clone() };
        let f = sys.forget_connections(&theirs, Look::Always).with_context(|| {
            format!(
                "cannot forget the tracked connections a killed job left on {} (its link {link}); \
                 its replies would reach this job, which is not started",
                name.split('@').next().unwrap_or(name)
            )
        })?;
        forgotten += f.entries;
        remove(&dir.join(name));
    }
    Ok(forgotten)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::Recorder;

    fn tracked(link: &str, v4: &str, markers: &Path) -> Tracked {
        let sources = vec![v4.parse().unwrap(), "fd61:7a70:7362::1".parse().unwrap()];
        Tracked { connections: super::super::job_connections(link.into(), sources), markers: Some(markers.into()) }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .map(|r| r.map(|e| e.unwrap().file_name().into_string().unwrap()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    #[test]
    fn a_record_has_a_marker_of_its_ipv4_address_until_forgotten() {
        let d = tempfile::tempdir().unwrap();
        let (file, dir) = (d.path().join("connections.json"), d.path().join("unforgotten"));
        let t = tracked("azp0000000000a1", "10.87.0.5", &dir);
        record(&file, &t).unwrap();
        assert_eq!(names(&dir), ["10.87.0.5@azp0000000000a1"]);
        forgotten(&file, &t);
        assert!(names(&dir).is_empty() && !file.exists());
        // No dir in the plan: the record alone.
        let t = Tracked { markers: None, ..t };
        record(&file, &t).unwrap();
        assert!(file.exists() && names(&dir).is_empty());
    }

    #[test]
    fn an_heir_forgets_a_killed_holders_connections_of_its_address_first() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("unforgotten");
        // Killed holders: of the heir's address, and of another one (not the heir's).
        let killed = tracked("azp0000000000a1", "10.87.0.5", &dir);
        record(&d.path().join("a.json"), &killed).unwrap();
        record(&d.path().join("b.json"), &tracked("azp0000000000b2", "10.87.0.50", &dir)).unwrap();
        let heir = tracked("azp0000000000c3", "10.87.0.5", &dir);
        let rec = Recorder::default();
        assert_eq!(before_its_job(&heir, &rec).unwrap(), 0);
        // The killed link's entries of the heir's addresses, whoever holds them now.
        assert_eq!(
            rec.calls(),
            ["forget_connections 10.87.0.5 fd61:7a70:7362::1 of azp0000000000a1 Always heir azp0000000000c3"]
        );
        assert_eq!(names(&dir), ["10.87.0.50@azp0000000000b2"]);
        // Its own marker (written after this) and no dir at all: nothing to do.
        record(&d.path().join("c.json"), &heir).unwrap();
        let rec = Recorder::default();
        assert_eq!(before_its_job(&heir, &rec).unwrap(), 0);
        assert!(rec.calls().is_empty(), "{:?}", rec.calls());
        let nowhere = tracked("azp0000000000c3", "10.87.0.5", &d.path().join("none"));
        assert_eq!(before_its_job(&nowhere, &rec).unwrap(), 0);
    }

    #[test]
    fn an_heir_that_cannot_forget_them_does_not_start_and_the_marker_stays() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("unforgotten");
        record(&d.path().join("a.json"), &tracked("azp0000000000a1", "10.87.0.5", &dir)).unwrap();
        let rec = Recorder::failing_at(0, nix::errno::Errno::EPERM);
        let e = before_its_job(&tracked("azp0000000000c3", "10.87.0.5", &dir), &rec).unwrap_err();
        let e = format!("{e:#}");
        assert!(e.starts_with("cannot forget the tracked connections a killed job left on 10.87.0.5"), "{e}");
        assert_eq!(names(&dir), ["10.87.0.5@azp0000000000a1"]);
    }

    #[test]
    fn a_clean_up_removes_the_markers_of_what_it_forgot_and_keeps_them_on_failure() {
        let d = tempfile::tempdir().unwrap();
        let (file, dir) = (d.path().join("connections.json"), d.path().join("unforgotten"));
        let t = tracked("azp0000000000a1", "10.87.0.5", &dir);
        record(&file, &t).unwrap();
        // Failed: they expire on their own; an heir of the address tries again.
        assert_eq!(left_by_a_killed_helper(&file, &Recorder::failing_at(0, nix::errno::Errno::EIO)), Some(0));
        assert!(!file.exists());
        assert_eq!(names(&dir), ["10.87.0.5@azp0000000000a1"]);
        record(&file, &t).unwrap();
        let rec = Recorder::default();
        assert_eq!(left_by_a_killed_helper(&file, &rec), Some(0));
        assert_eq!(rec.calls(), ["forget_connections 10.87.0.5 fd61:7a70:7362::1 of azp0000000000a1 Always"]);
        assert!(!file.exists() && names(&dir).is_empty());
        // A record of an older azp-sandbox (no markers) still reads.
        std::fs::write(&file, br#"{"link":"azp0000000000a1","sources":["10.87.0.5"]}"#).unwrap();
        assert_eq!(left_by_a_killed_helper(&file, &Recorder::default()), Some(0));
    }
}
