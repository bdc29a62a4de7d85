//! Which host ids a job runs as: a job is nobody on the host.
//!
//! - **Root and setuid modes**: every sandbox gets a user namespace of its own, mapping
//!   its container ids 0..=65535 onto a block of 65536 host ids leased for its life
//!   ([`lease`]) from the range reserved for azp-sandbox ([`range`]). The shared
//!   read-only layers (rootfs, GPU edit layer, agent package) are mounted *idmapped*
//!   with the job's namespace (Linux >= 5.19 for overlayfs lower layers), so their
//!   root-owned files belong to the job's root, and the job's upper layer belongs to it
//!   too. Two jobs, two blocks: different host uids, and none of them host root or an
//!   account's.
//! - **Rootless mode**: the process already runs in the user's namespace (container 0
//!   = the user, 1..=65536 = the user's subordinate ids). Each job gets a namespace
//!   nested in it mapping its ids 0..=65535 onto 1..=65536 of the outer one, so a job
//!   never runs as the user's own uid; the rootfs store is unpacked shifted by one
//!   ([`store_shift`]) to match. A user can idmap no host filesystem (that needs
//!   CAP_SYS_ADMIN in the initial namespace) and an overlayfs mount cannot be idmapped,
//!   so jobs of one user over one rootfs share these ids: per-slot ids are a root-mode
//!   property.
//! - **`--userns host`** (root mode only): the old behaviour, container ids are host
//!   ids; for kernels or filesystems without idmapped mounts. Said loudly at start.
//!
//! The privileged steps (the namespace, the idmapped mounts, the chowns) are the
//! helper's, in `src/sys/userns.rs`; this module decides the ids.

pub mod lease;
pub mod range;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// `--userns` / `userns =`: what the administrator chose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Choice {
    /// A user namespace and host ids of its own for every job (the default).
    #[default]
    Auto,
    /// No user namespace in root mode: container ids are host ids (container root is host
    /// root). For kernels without idmapped overlayfs lower layers (< 5.19).
    Host,
}

impl std::str::FromStr for Choice {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Choice> {
        match s {
            "auto" => Ok(Choice::Auto),
            "host" => Ok(Choice::Host),
            _ => bail!("bad userns '{s}': use \"auto\" (a user namespace per job, the default) or \"host\""),
        }
    }
}

/// How this process gives jobs their ids, decided once at start ([`init`]).
#[derive(Debug, Clone)]
pub enum Mode {
    /// Root: a leased block of the reserved range per job.
    Blocks(range::Range),
    /// Rootless: the nested namespace (outer ids 1..=65536).
    Nested,
    /// Root with `--userns host`.
    Host,
}

static MODE: OnceLock<Mode> = OnceLock::new();

/// The WARNING printed at start (and its reason) when jobs run with host ids.
pub const HOST_WARNING: &str = "WARNING: --userns host: jobs run with host ids, without a user namespace \
     (container root is host root, the rootfs's users are host users); see SECURITY.md";

/// Decides the mode for `choice` (call once, before the first sandbox); in rootless mode
/// (see [`crate::rootless::mode`]) only `auto` exists.
pub fn init(choice: Choice) -> Result<&'static Mode> {
    if let Some(m) = MODE.get() {
        return Ok(m);
    }
    let mode = decide(choice, crate::rootless::mode().rootless, || range::load(&range::Files::host()))?;
    if matches!(mode, Mode::Host) {
        tracing::warn!("{HOST_WARNING}");
    }
    Ok(MODE.get_or_init(|| mode))
}

fn decide(choice: Choice, rootless: bool, load: impl FnOnce() -> Result<range::Range>) -> Result<Mode> {
    match (choice, rootless) {
        (Choice::Host, true) => bail!(
            "--userns host is for root mode only: rootless jobs always run in a user namespace of their own, as \
             subordinate ids of the user"
        ),
        (Choice::Host, false) => Ok(Mode::Host),
        (Choice::Auto, true) => Ok(Mode::Nested),
        (Choice::Auto, false) => Ok(Mode::Blocks(load()?)),
    }
}

/// The mode [`init`] set, or `auto`'s when nothing did (library use).
pub fn mode() -> Result<&'static Mode> {
    init(Choice::Auto)
}

/// How far the rootless store's ids are shifted: a file owned by uid N in an image is
/// owned by N + 1 in the process's namespace, the id a job's N maps to (see [`Mode::Nested`]).
/// 0 in root mode, where the store keeps the image's ids.
pub fn store_shift() -> u32 {
    if crate::rootless::mode().rootless {
        NESTED_OFFSET
    } else {
        0
    }
}

/// Rootless: where a job's container id 0 lies in the process's namespace.
pub const NESTED_OFFSET: u32 = 1;

/// One line of a uid_map or gid_map: `inside outside count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMap {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// The ids of one job's user namespace (part of its plan).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobIds {
    pub uid_map: Vec<IdMap>,
    pub gid_map: Vec<IdMap>,
    /// Mount the lower layers idmapped with the job's namespace (root mode); rootless the
    /// store is shifted instead.
    pub idmap_layers: bool,
    /// The leased block (root mode), recorded for `gc`.
    pub block: Option<u32>,
}

impl JobIds {
    /// Root mode: container ids 0..=65535 onto the block at `uid`/`gid`, for a job that
    /// runs as `job_uid`/`job_gid`. A job id above the block (setuid mode runs jobs as the
    /// caller, whose uid may be a directory service's 1234567) takes the block's last id
    /// instead of container id 65535, which no image uses.
    pub fn block(index: u32, (uid, gid): (u32, u32), (job_uid, job_gid): (u32, u32)) -> JobIds {
        JobIds {
            uid_map: block_map(uid, job_uid),
            gid_map: block_map(gid, job_gid),
            idmap_layers: true,
            block: Some(index),
        }
    }

    /// Rootless: container ids 0..=65535 onto the outer namespace's 1..=65536.
    pub fn nested() -> JobIds {
        let map = vec![IdMap { inside: 0, outside: NESTED_OFFSET, count: range::BLOCK }];
        JobIds { uid_map: map.clone(), gid_map: map, idmap_layers: false, block: None }
    }

    /// The host uid that owns the job's user namespace: its root's (root mode: its
    /// block's first id), so that the kernel's per-user budgets its processes use are
    /// charged to the job's own host uid, not to host root's (see
    /// `sys::userns::new_user_namespace`). None rootless: the namespace is the user's,
    /// nested in the user's own, whose budgets are the user's anyway.
    pub fn owner(&self) -> Option<u32> {
        self.block.and_then(|_| self.uid_outside(0))
    }
    /// The id outside (host, or the rootless process's namespace) of container uid `uid`.
    pub fn uid_outside(&self, uid: u32) -> Option<u32> {
        outside(&self.uid_map, uid)
    }
    pub fn gid_outside(&self, gid: u32) -> Option<u32> {
        outside(&self.gid_map, gid)
    }

    /// `/proc/PID/uid_map` text.
    pub fn uid_map_text(&self) -> String {
        map_text(&self.uid_map)
    }
    pub fn gid_map_text(&self) -> String {
        map_text(&self.gid_map)
    }
}

fn block_map(start: u32, job_id: u32) -> Vec<IdMap> {
    if job_id < range::BLOCK {
        return vec![IdMap { inside: 0, outside: start, count: range::BLOCK }];
    }
    vec![
        IdMap { inside: 0, outside: start, count: range::BLOCK - 1 },
        IdMap { inside: job_id, outside: start + range::BLOCK - 1, count: 1 },
    ]
}

fn outside(map: &[IdMap], id: u32) -> Option<u32> {
    map.iter().find(|m| id >= m.inside && id - m.inside < m.count).map(|m| m.outside + (id - m.inside))
}

fn map_text(map: &[IdMap]) -> String {
    map.iter().map(|m| format!("{} {} {}\n", m.inside, m.outside, m.count)).collect()
}

/// The ids of a new sandbox whose job runs as `job_uid`/`job_gid`, with its block's lease
/// (root mode; held until the sandbox is gone), for the job recorded at `record`. None:
/// host ids (`--userns host`).
pub fn for_sandbox(
    record: &std::path::Path,
    job_uid: u32,
    job_gid: u32,
) -> Result<Option<(JobIds, Option<lease::BlockLease>)>> {
    match mode()? {
        Mode::Host => Ok(None),
        Mode::Nested => Ok(Some((JobIds::nested(), None))),
        Mode::Blocks(range) => {
            let l = lease::lease(std::path::Path::new(lease::DIR), range.blocks(), record)?;
            let ids = JobIds::block(l.index, range.block_start(l.index), (job_uid, job_gid));
            Ok(Some((ids, Some(l))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_is_owned_by_the_jobs_root_in_root_mode_only() {
        let b = JobIds::block(3, (2147483648 + 3 * 65536, 3000000000), (1000, 1000));
        assert_eq!(b.owner(), Some(2147483648 + 3 * 65536));
        assert_eq!(JobIds::nested().owner(), None);
    }

    #[test]
    fn a_block_maps_container_ids_onto_it() {
        let ids = JobIds::block(3, (2147483648 + 3 * 65536, 3000000000), (1000, 1000));
        assert_eq!(ids.uid_map_text(), format!("0 {} 65536\n", 2147483648u32 + 3 * 65536));
        assert_eq!(ids.uid_outside(0), Some(2147483648 + 3 * 65536));
        assert_eq!(ids.uid_outside(1000), Some(2147483648 + 3 * 65536 + 1000));
        assert_eq!(ids.gid_outside(65535), Some(3000000000 + 65535));
        assert_eq!(ids.uid_outside(65536), None);
        assert!(ids.idmap_layers);
        assert_eq!(ids.block, Some(3));
    }

    #[test]
    fn a_caller_uid_above_the_block_gets_its_last_id() {
        let ids = JobIds::block(0, (1 << 31, 1 << 31), (1234567, 100));
        assert_eq!(ids.uid_map_text(), "0 2147483648 65535\n1234567 2147549183 1\n");
        assert_eq!(ids.uid_outside(1234567), Some((1 << 31) + 65535));
        assert_eq!(ids.uid_outside(65535), None, "given up for the caller's id");
        assert_eq!(ids.gid_map_text(), "0 2147483648 65536\n");
    }

    #[test]
    fn rootless_jobs_are_shifted_by_one_in_the_users_namespace() {
        let ids = JobIds::nested();
        assert_eq!(ids.uid_map_text(), "0 1 65536\n");
        assert_eq!(ids.uid_outside(0), Some(1), "never the user (0 in its namespace)");
        assert_eq!(ids.gid_outside(65535), Some(65536));
        assert!(!ids.idmap_layers);
    }

    #[test]
    fn the_choice_per_mode() {
        let range = || -> Result<range::Range> { bail!("no range: {}", range::how_to_add()) };
        assert!(matches!(decide(Choice::Auto, true, range).unwrap(), Mode::Nested));
        assert!(matches!(decide(Choice::Host, false, range).unwrap(), Mode::Host));
        let e = decide(Choice::Host, true, range).unwrap_err().to_string();
        assert!(e.contains("root mode only"), "{e}");
        let e = decide(Choice::Auto, false, range).unwrap_err().to_string();
        assert!(e.contains("--userns host"), "the missing range's line: {e}");
        assert_eq!("host".parse::<Choice>().unwrap(), Choice::Host);
        assert!("none".parse::<Choice>().unwrap_err().to_string().contains("bad userns"));
    }
}
