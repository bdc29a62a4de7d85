//! Rootless mode: an ordinary user (a service account) runs sandboxes with user namespaces.
//!
//! The whole azp-sandbox process enters one user namespace at start, before any thread
//! exists (see [`userns`]): container uid/gid 0 = the user, 1..=65536 = the user's range
//! from /etc/subuid and /etc/subgid. Everything it then creates (the rootfs store, job
//! dirs, upper layers) is owned by ids of that mapping, so a rootfs imported by the user is
//! a *shifted copy*: its root-owned files belong to the user, its `_apt` files to a
//! subordinate id, and jobs see the owners the image meant. Why not idmapped mounts: an
//! idmapped mount of a host filesystem needs CAP_SYS_ADMIN in the user namespace that owns
//! that filesystem (the initial one for ext4/xfs), which a rootless user never has; the
//! shifted copy costs nothing extra because the user unpacks the rootfs anyway.
//!
//! Inside, the helper mounts the overlay with `userxattr` (overlayfs in a user namespace
//! keeps its metadata in `user.` xattrs) and libcontainer runs as root of the namespace.
//! Cgroups: see [`cgroups`]. Devices: libcontainer bind-mounts nodes instead of mknod (a
//! user namespace cannot create device nodes), so GPU nodes work when their host mode
//! lets the user open them.

pub mod cgroups;
pub mod subid;
pub mod userns;

use anyhow::{Context, Result};
use cgroups::{CgroupHost, CgroupPlacement};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// How this process runs sandboxes, decided once at start.
#[derive(Debug, Clone)]
pub struct Mode {
    /// In a user namespace (ids mapped to the user's subordinate range).
    pub rootless: bool,
    pub cgroups: CgroupPlacement,
}

impl Mode {
    /// Root mode with the default cgroup parent (library use, tests).
    fn root() -> Mode {
        Mode { rootless: false, cgroups: CgroupPlacement::Enforced { parent: cgroups::ROOT_PARENT.into() } }
    }

    /// The cgroup of job `id` of the home tagged `home_tag` (relative to the cgroup
    /// root): `<parent>/<home_tag>-<id>`; empty when jobs get none. The tag keeps two homes
    /// on one host (two `run`s for two pools, both naming agents after the host) out of
    /// each other's cgroups. One level, not a dir per home: every level is a mkdir and
    /// an rmdir in each hierarchy per job.
    pub fn cgroup_path_for(&self, home_tag: &str, id: &str) -> PathBuf {
        self.cgroups.parent().map(|p| p.join(format!("{home_tag}-{id}"))).unwrap_or_default()
    }

    /// The loud line printed at start and shown by `status` when limits cannot be enforced.
    pub fn limits_warning(&self) -> Option<String> {
        match &self.cgroups {
            CgroupPlacement::NotEnforced { why } => {
                Some(format!("WARNING: memory/pids/cpu limits are NOT enforced for jobs: {why}"))
            }
            CgroupPlacement::Enforced { .. } => None,
        }
    }
}

static MODE: OnceLock<Mode> = OnceLock::new();

/// The mode set by [`init`] (root mode with `/azp-sandbox` if `init` was not called).
pub fn mode() -> &'static Mode {
    MODE.get_or_init(Mode::root)
}

/// Decides the mode. As an ordinary user with `enter_namespace`, first enters the user
/// namespace (so call this before any thread is started). `cgroup_parent` is
/// `--cgroup-parent`. `service`: the caller is `run`, which as root under a systemd unit
/// that delegates its cgroup (cgroup v2) keeps its jobs below it (see
/// [`cgroups::service_cgroup`]); it moves itself into the unit's leaf here.
pub fn init(cgroup_parent: Option<&Path>, enter_namespace: bool, service: bool) -> Result<&'static Mode> {
    let euid = nix::unistd::geteuid();
    if !euid.is_root() && enter_namespace {
        let uid = euid.as_raw();
        let gid = nix::unistd::getegid().as_raw();
        let user = nix::unistd::User::from_uid(euid)
            .ok()
            .flatten()
            .map(|u| u.name)
            .with_context(|| format!("uid {uid} has no user name (needed to look up /etc/subuid)"))?;
        let map = userns::Mapping {
            uid,
            gid,
            subuid: subid::lookup(Path::new("/etc/subuid"), &user, uid)?,
            subgid: subid::lookup(Path::new("/etc/subgid"), &user, uid)?,
        };
        userns::enter(&map)?;
    }
    let in_ns = userns::in_child_user_namespace();
    let rootless = in_ns || !nix::unistd::geteuid().is_root();
    let host_uid = if in_ns { host_uid_of_root() } else { nix::unistd::getuid().as_raw() };
    let mut placement = cgroups::place(&CgroupHost::detect, cgroup_parent, rootless, host_uid, &cgroups::writable);
    if service && !rootless && cgroup_parent.is_none() {
        if let Some(parent) = below_service() {
            placement = CgroupPlacement::Enforced { parent };
        }
    }
    Ok(MODE.get_or_init(|| Mode { rootless, cgroups: placement }))
}

/// A root service under systemd on cgroup v2: the parent of its jobs' cgroups when its
/// unit delegates (the manager moved into the unit's leaf first), with one line saying
/// where jobs go either way. None: the default layout.
fn below_service() -> Option<PathBuf> {
    use crate::sys::cgroup::{delegated, move_self_to};
    let own = crate::sys::procfile::read("/proc/self/cgroup").unwrap_or_default();
    let mounts = crate::sys::procfile::read("/proc/self/mountinfo").unwrap_or_default();
    let root = Path::new(libcgroups::common::DEFAULT_CGROUP_ROOT);
    let abs = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    match cgroups::service_cgroup(&own, &mounts, &delegated) {
        cgroups::ServiceCgroup::Below { unit, manager_leaf } => match move_self_to(&abs(&manager_leaf)) {
            Ok(()) => {
                tracing::info!(
                    "jobs' cgroups go below this service's own cgroup {} (delegated; the manager is in {}): \
                     the unit's limits and `systemctl stop` cover them",
                    unit.display(),
                    manager_leaf.display()
                );
                Some(unit)
            }
            Err(e) => {
                tracing::warn!("jobs' cgroups go below {}: {e:#}", cgroups::ROOT_PARENT);
                None
            }
        },
        cgroups::ServiceCgroup::NotDelegated { unit } => {
            tracing::info!(
                "jobs' cgroups go below {}, outside this service's cgroup {} (add Delegate=yes to its unit, as \
                 `azp-sandbox service install` writes it, to keep them below it)",
                cgroups::ROOT_PARENT,
                unit.display()
            );
            None
        }
        cgroups::ServiceCgroup::Elsewhere => None,
    }
}

/// The host uid that uid 0 of this user namespace maps to.
pub fn host_uid_of_root() -> u32 {
    crate::sys::procfile::read("/proc/self/uid_map")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.first() == Some(&"0")).then(|| f.get(1).and_then(|v| v.parse().ok())).flatten()
            })
        })
        .unwrap_or(0)
}
