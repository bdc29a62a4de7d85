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
//! those connections. So each record has a marker beside the others of its host's
//! namespace, `<IPv4 address>@<link>` in [`markers_dir`] (holding the record), that
//! outlives it until its connections are forgotten for sure:
//! - a new job's address is claimed among unmarked addresses first (`sys::net::Veth`'s
//!   `avoid`, from [`marked`]);
//! - a helper whose job got a marked address all the same (the pool had no other, or the
//!   holder was killed after the list was read) forgets the killed holder's connections
//!   before its job starts ([`before_its_job`]);
//! - `gc` forgets those of markers whose link is gone ([`sweep`]): those a clean-up has
//!   not come to yet, left where it failed, or kept for an address another link holds.
//!   (The clean-up removes the killed job's link itself once its processes are gone:
//!   sockets of its namespace, which the kernel tears down later, could make entries
//!   again until then.)

use crate::sys::net::{JobConnections, Look};
use crate::sys::Sys;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

/// Where [`markers_dir`] is, per host namespace (`-<inode>`).
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

/// What a record (and a marker) holds: the job's link on the host (its element in the
/// counting set), its addresses, and where its markers are (a record's).
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    link: String,
    sources: Vec<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    markers: Option<PathBuf>,
}

impl Record {
    /// Read from `file`, and sound: a job link's name, and a markers' dir of ours (its
    /// names are joined into paths that root removes).
    fn read(file: &Path) -> Result<Record> {
        let bytes = std::fs::read(file)?;
        let r: Record = serde_json::from_slice(&bytes)?;
        let ours = |d: &PathBuf| {
            d.is_absolute() && d.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("unforgotten-"))
        };
        anyhow::ensure!(super::is_job_link(&r.link), "not a job link: {:?}", r.link);
        anyhow::ensure!(r.markers.as_ref().is_none_or(ours), "not a markers' dir: {:?}", r.markers);
        Ok(r)
    }
}

/// The marker's name of `link`'s hold on `address` (IPv4: the job's IPv6 address is made
/// of it, and a job's IPv4 address is what it claims).
fn marker_name(address: Ipv4Addr, link: &str) -> String {
    format!("{address}@{link}")
}

/// Its address and link.
fn parse_marker(name: &str) -> Option<(Ipv4Addr, &str)> {
    let (a, link) = name.split_once('@')?;
    Some((a.parse().ok()?, link)).filter(|(_, l)| super::is_job_link(l))
}

fn v4_sources(c: &JobConnections) -> impl Iterator<Item = Ipv4Addr> + '_ {
    c.sources.iter().filter_map(|a| match a {
        IpAddr::V4(v4) => Some(*v4),
        IpAddr::V6(_) => None,
    })
}

/// The markers of `c` in `dir`, with their addresses.
fn markers_of<'a>(dir: &'a Path, c: &'a JobConnections) -> impl Iterator<Item = (Ipv4Addr, PathBuf)> + 'a {
    v4_sources(c).map(move |a| (a, dir.join(marker_name(a, &c.link))))
}

/// The addresses of `dir`'s markers: a killed job's connections may still be tracked
/// for them (or a running job holds them).
pub fn marked(dir: &Path) -> Vec<Ipv4Addr> {
    let names = marker_names(dir).unwrap_or_default();
    names.iter().filter_map(|n| parse_marker(n).map(|(a, _)| a)).collect()
}

/// The helper, before its job starts: the markers of the job's connections, then the
/// record in `file` (written even when a marker could not be).
pub fn record(file: &Path, t: &Tracked) -> Result<()> {
    let c = &t.connections;
    let marked = match &t.markers {
        Some(dir) => write_markers(dir, c),
        None => Ok(()),
    };
    let r = Record { link: c.link.clone(), sources: c.sources.clone(), markers: t.markers.clone() };
    std::fs::write(file, serde_json::to_vec(&r)?).with_context(|| format!("cannot write {}", file.display()))?;
    marked
}

fn write_markers(dir: &Path, c: &JobConnections) -> Result<()> {
    let text = serde_json::to_vec(&Record { link: c.link.clone(), sources: c.sources.clone(), markers: None })?;
    for (_, m) in markers_of(dir, c) {
        let written = match std::fs::write(&m, &text) {
            // Made when it is not there: the first job's, or a gc removed it once empty,
            // with the table.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                create_private_dir(dir).and_then(|()| Ok(std::fs::write(&m, &text)?))
            }
            w => Ok(w?),
        };
        written.with_context(|| format!("cannot write {}", m.display()))?;
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
    if let Some(dir) = &t.markers {
        markers_of(dir, &t.connections).for_each(|(_, m)| remove(&m));
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

/// A clean-up, once the job's processes are gone: the job's link removed if the kernel
/// has not yet (see `sys::net::remove_link`), the connections of a record the helper left
/// (it was killed before it forgot them) forgotten, and the record removed. How many
/// (None: no record, the usual case). The markers stay where it is not sure they are
/// all gone: on failure (a warning), and for an address another job's link holds by now
/// (that job's helper forgets them, if it has not yet); `gc` tries again (see
/// [`sweep`]).
pub fn left_by_a_killed_helper(file: &Path, sys: &dyn Sys) -> Option<Left> {
    if !file.exists() {
        return None;
    }
    let forgotten = match Record::read(file) {
        Ok(r) => {
            let c = super::job_connections(r.link, r.sources);
            // The job's processes are gone: so goes its link, now, rather than with the
            // kernel's teardown of its namespace. Failed, the forgetting waits for it as
            // before (and the marker stays while it is there).
            let removed = sys.remove_job_link(&c.link).unwrap_or_else(|e| {
                tracing::warn!("{}: its tracked connections are forgotten once it is gone", e.with_causes());
                false
            });
            let link = removed.then(|| c.link.clone());
            // Whatever the set says: the table may have been removed, or made again, since.
            match sys.forget_connections(&c, Look::Always) {
                Ok(f) => {
                    if let Some(dir) = r.markers.filter(|_| !f.link_present) {
                        for (_, m) in markers_of(&dir, &c).filter(|(a, _)| !f.kept.contains(&IpAddr::V4(*a))) {
                            remove(&m);
                        }
                    }
                    Left { entries: f.entries, link }
                }
                Err(e) => {
                    tracing::warn!("{}: the next `azp-sandbox gc` tries again", e.with_causes());
                    Left { entries: 0, link }
                }
            }
        }
        Err(e) => {
            tracing::warn!(
                "{} is unreadable ({e:#}): the job's tracked connections expire on their own",
                file.display()
            );
            Left::default()
        }
    };
    let _ = std::fs::remove_file(file);
    Some(forgotten)
}

/// What [`left_by_a_killed_helper`] found and undid: the tracked connections it forgot,
/// and the job's link if it removed it (the kernel had not yet, with the namespace).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Left {
    pub entries: usize,
    pub link: Option<String>,
}

/// What the marker `name` of `address` and `link` in `dir` says: the killed job's
/// connections (its own addresses, IPv6 included).
fn read_marker(dir: &Path, name: &str, address: Ipv4Addr, link: &str) -> JobConnections {
    // An unreadable marker still names its IPv4 address.
    let sources = Record::read(&dir.join(name)).map(|r| r.sources).unwrap_or_else(|_| vec![IpAddr::V4(address)]);
    super::job_connections(link.to_string(), sources)
}

fn marker_names(dir: &Path) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
    };
    let names = entries.map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()));
    names.collect::<std::io::Result<_>>().with_context(|| format!("cannot list {}", dir.display()))
}

/// The helper of a job that got its address (`t`, before its record): the connections a
/// killed job left on that address (the markers of other links), forgotten before this
/// job can get their replies. How many. An error keeps the job from starting (and the
/// marker, for the next heir): it would get them.
pub fn before_its_job(t: &Tracked, sys: &dyn Sys) -> Result<usize> {
    let Some(dir) = &t.markers else { return Ok(0) };
    let own = &t.connections;
    let mine: Vec<Ipv4Addr> = v4_sources(own).collect();
    let mut forgotten = 0;
    for name in marker_names(dir)? {
        let Some((address, link)) = parse_marker(&name) else { continue };
        if !mine.contains(&address) || link == own.link {
            continue;
        }
        let theirs = JobConnections { heir: Some(own.link.clone()), ..read_marker(dir, &name, address, link) };
        let f = sys.forget_connections(&theirs, Look::Always).with_context(|| {
            format!(
                "the job is not started (it would get their replies; run it again for another address): \
                 cannot forget the tracked connections a killed job left on {address} (its link {link})"
            )
        })?;
        forgotten += f.entries;
        remove(&dir.join(&name));
    }
    Ok(forgotten)
}

/// `gc`'s part, in the host's namespace (root mode: rootless jobs have no host table):
/// [`sweep`] of this namespace's markers, and their dir removed once empty when gc
/// removed the host's table (`table_removed`; a job that makes a marker meanwhile makes
/// the dir again). What it did, for gc's report.
pub fn gc(table_removed: bool) -> Option<String> {
    let dir = markers_dir();
    let swept = sweep(&dir, &crate::sys::Real).unwrap_or_else(|e| {
        tracing::warn!("killed jobs' tracked connections: {e:#}; the next `azp-sandbox gc` tries again");
        None
    });
    if table_removed {
        let _ = std::fs::remove_dir(&dir);
    }
    swept
}

/// The connections of markers in `dir` whose link is gone, forgotten, and
/// their markers removed (a job still running keeps its marker). What it did, for gc's
/// report, if anything.
pub fn sweep(dir: &Path, sys: &dyn Sys) -> Result<Option<String>> {
    let (mut markers, mut entries) = (0, 0);
    for name in marker_names(dir)? {
        let Some((address, link)) = parse_marker(&name) else { continue };
        let theirs = read_marker(dir, &name, address, link);
        let f = match sys.forget_connections(&theirs, Look::IfGone) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(
                    "{}: a killed job's tracked connections on {address}: the next `azp-sandbox gc` tries again",
                    e.with_causes()
                );
                continue;
            }
        };
        if !f.link_present && !f.kept.contains(&IpAddr::V4(address)) {
            remove(&dir.join(&name));
            markers += 1;
            entries += f.entries;
        }
    }
    Ok((markers > 0).then(|| format!("{entries} tracked connections of {markers} killed job(s)")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::net::Forgotten;
    use crate::sys::Recorder;

    const V6: &str = "fd61:7a70:7362::1";

    fn tracked(link: &str, v4: &str, markers: &Path) -> Tracked {
        let sources = vec![v4.parse().unwrap(), V6.parse().unwrap()];
        Tracked { connections: super::super::job_connections(link.into(), sources), markers: Some(markers.into()) }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v = marker_names(dir).unwrap();
        v.sort();
        v
    }

    fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let (file, dir) = (d.path().join("connections.json"), d.path().join("unforgotten-test"));
        (d, file, dir)
    }

    #[test]
    fn a_record_has_a_marker_of_its_ipv4_address_until_forgotten() {
        let (_d, file, dir) = dirs();
        let t = tracked("azp0000000000a1", "10.87.0.5", &dir);
        record(&file, &t).unwrap();
        assert_eq!(names(&dir), ["10.87.0.5@azp0000000000a1"]);
        assert_eq!(marked(&dir), [Ipv4Addr::new(10, 87, 0, 5)]);
        forgotten(&file, &t);
        assert!(names(&dir).is_empty() && !file.exists());
        // No dir in the plan: the record alone.
        let t = Tracked { markers: None, ..t };
        record(&file, &t).unwrap();
        assert!(file.exists() && names(&dir).is_empty());
        // A marker that cannot be written: said, and the record is there all the same.
        std::fs::remove_file(&file).unwrap();
        let t = Tracked { markers: Some(dir.join("no/unforgotten-test")), ..t };
        assert!(record(&file, &t).is_err());
        assert!(file.exists());
    }

    #[test]
    fn an_heir_forgets_a_killed_holders_connections_of_its_address_first() {
        let (d, _, dir) = dirs();
        // Killed holders: of the heir's address (with IPv6, which the heir has not), and
        // of another one.
        let killed = Tracked {
            connections: super::super::job_connections(
                "azp0000000000a1".into(),
                vec!["10.87.0.5".parse().unwrap(), "fd61::a57:5".parse().unwrap()],
            ),
            markers: Some(dir.clone()),
        };
        record(&d.path().join("a.json"), &killed).unwrap();
        record(&d.path().join("b.json"), &tracked("azp0000000000b2", "10.87.0.50", &dir)).unwrap();
        let heir = Tracked {
            connections: super::super::job_connections("azp0000000000c3".into(), vec!["10.87.0.5".parse().unwrap()]),
            markers: Some(dir.clone()),
        };
        let rec = Recorder::default();
        assert_eq!(before_its_job(&heir, &rec).unwrap(), 0);
        // The killed link's own addresses, whoever holds them now.
        assert_eq!(
            rec.calls(),
            ["forget_connections 10.87.0.5 fd61::a57:5 of azp0000000000a1 Always heir azp0000000000c3"]
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
        let (d, _, dir) = dirs();
        record(&d.path().join("a.json"), &tracked("azp0000000000a1", "10.87.0.5", &dir)).unwrap();
        let rec = Recorder::failing_at(0, nix::errno::Errno::EPERM);
        let e = before_its_job(&tracked("azp0000000000c3", "10.87.0.5", &dir), &rec).unwrap_err();
        let e = format!("{e:#}");
        assert!(e.starts_with("the job is not started (it would get their replies; run it again"), "{e}");
        assert!(e.contains("cannot forget the tracked connections a killed job left on 10.87.0.5"), "{e}");
        assert_eq!(names(&dir), ["10.87.0.5@azp0000000000a1"]);
    }

    #[test]
    fn a_clean_up_removes_the_markers_only_once_sure() {
        let (_d, file, dir) = dirs();
        let t = tracked("azp0000000000a1", "10.87.0.5", &dir);
        let marker = ["10.87.0.5@azp0000000000a1"];
        // Failed: they expire on their own; the marker stays.
        record(&file, &t).unwrap();
        assert_eq!(
            left_by_a_killed_helper(&file, &Recorder::failing_at(1, nix::errno::Errno::EIO)),
            Some(Left::default())
        );
        assert!(!file.exists());
        assert_eq!(names(&dir), marker);
        // The link's removal failed: they are forgotten all the same (once it is gone).
        record(&file, &t).unwrap();
        let rec = Recorder::failing_at(0, nix::errno::Errno::EPERM);
        *rec.forgotten.borrow_mut() = Forgotten { entries: 2, ..Default::default() };
        assert_eq!(left_by_a_killed_helper(&file, &rec), Some(Left { entries: 2, link: None }));
        assert_eq!(rec.calls()[1], format!("forget_connections 10.87.0.5 {V6} of azp0000000000a1 Always"));
        assert!(!file.exists() && names(&dir).is_empty());
        // The job's link still there (its removal failed and its namespace is still
        // going), or its address another job's by now: the marker stays.
        for f in [
            Forgotten { link_present: true, ..Default::default() },
            Forgotten { kept: vec!["10.87.0.5".parse().unwrap()], ..Default::default() },
        ] {
            record(&file, &t).unwrap();
            let rec = Recorder::default();
            *rec.forgotten.borrow_mut() = f;
            assert_eq!(left_by_a_killed_helper(&file, &rec), Some(Left::default()));
            assert!(!file.exists());
            assert_eq!(names(&dir), marker);
        }
        // Forgotten, the link gone: no marker left.
        record(&file, &t).unwrap();
        let rec = Recorder::default();
        *rec.forgotten.borrow_mut() = Forgotten { entries: 7, ..Default::default() };
        rec.link_there.set(true);
        let left = Left { entries: 7, link: Some("azp0000000000a1".into()) };
        assert_eq!(left_by_a_killed_helper(&file, &rec), Some(left));
        let forget = format!("forget_connections 10.87.0.5 {V6} of azp0000000000a1 Always");
        assert_eq!(rec.calls(), ["remove_job_link azp0000000000a1".to_string(), forget]);
        assert!(!file.exists() && names(&dir).is_empty());
        // A record of an older azp-sandbox (no markers) still reads; a forged one is not
        // acted on.
        std::fs::write(&file, br#"{"link":"azp0000000000a1","sources":["10.87.0.5"]}"#).unwrap();
        assert_eq!(left_by_a_killed_helper(&file, &Recorder::default()), Some(Left::default()));
        for forged in [
            r#"{"link":"../../etc","sources":["10.87.0.5"]}"#,
            r#"{"link":"azp0000000000a1","sources":["10.87.0.5"],"markers":"/etc"}"#,
        ] {
            std::fs::write(&file, forged).unwrap();
            let rec = Recorder::default();
            assert_eq!(left_by_a_killed_helper(&file, &rec), Some(Left::default()));
            assert!(rec.calls().is_empty(), "{forged}: {:?}", rec.calls());
        }
    }

    #[test]
    fn gc_sweeps_the_markers_of_links_gone_and_keeps_the_others() {
        let (d, _, dir) = dirs();
        record(&d.path().join("a.json"), &tracked("azp0000000000a1", "10.87.0.5", &dir)).unwrap();
        std::fs::write(dir.join("not-a-marker"), "").unwrap();
        // Its link still there (a running job's, or a namespace still going): kept.
        let rec = Recorder::default();
        *rec.forgotten.borrow_mut() = Forgotten { link_present: true, ..Default::default() };
        assert_eq!(sweep(&dir, &rec).unwrap(), None);
        assert_eq!(rec.calls(), [format!("forget_connections 10.87.0.5 {V6} of azp0000000000a1 IfGone")]);
        assert_eq!(names(&dir), ["10.87.0.5@azp0000000000a1", "not-a-marker"]);
        // Gone: forgotten and removed.
        let rec = Recorder::default();
        *rec.forgotten.borrow_mut() = Forgotten { entries: 3, ..Default::default() };
        assert_eq!(sweep(&dir, &rec).unwrap().as_deref(), Some("3 tracked connections of 1 killed job(s)"));
        assert_eq!(names(&dir), ["not-a-marker"]);
        assert_eq!(sweep(&d.path().join("none"), &Recorder::default()).unwrap(), None);
    }
}
