//! The one error type of the privileged boundary: a variant per named step (as
//! Firecracker's jailer has), each with the errno and the path or object it was about,
//! and a message that says what to fix. The cause follows the message (`{e:#}` prints
//! "message: EPERM: Operation not permitted").

use nix::errno::Errno;
use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // ---- namespaces and mounts (the helper, the edit layer) ----
    #[error("cannot create a mount namespace (unshare CLONE_NEWNS): run as root or enable user namespaces")]
    UnshareMountNs(#[source] Errno),
    #[error("cannot make / private in the helper's mount namespace")]
    MakeRootPrivate(#[source] Errno),
    #[error("cannot create a cgroup namespace for the helper")]
    UnshareCgroupNs(#[source] Errno),
    #[error("cannot mount a private cgroup2 view on /sys/fs/cgroup in the helper")]
    MountCgroupView(#[source] Errno),
    #[error("overlay path {} is not UTF-8", path.display())]
    OverlayPathNotUtf8 { path: PathBuf },
    #[error("overlay path {} contains ',' or ':'; choose a --home without them", path.display())]
    OverlayPathSeparator { path: PathBuf },
    #[error("overlay needs at least one lower layer")]
    OverlayNoLower,
    #[error("cannot mount the job's overlay on {} ({options})", target.display())]
    MountOverlay {
        target: PathBuf,
        options: String,
        #[source]
        source: Errno,
    },
    #[error("cannot bind-mount {} on {}", from.display(), target.display())]
    BindMount {
        from: PathBuf,
        target: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot unmount {}", target.display())]
    Unmount {
        target: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot read /proc/self/mountinfo")]
    ReadMountinfo(#[source] io::Error),
    #[error("cannot mount a tmpfs at {} for job records", dir.display())]
    MountTmpfs {
        dir: PathBuf,
        #[source]
        source: Errno,
    },

    // ---- the job's network namespace (the helper; see sys::net) ----
    #[error("cannot create a network namespace for the job (unshare CLONE_NEWNET)")]
    UnshareNetNs(#[source] Errno),
    #[error("cannot open a netlink socket")]
    NetlinkSocket(#[source] Errno),
    #[error("cannot list the host's {what} (netlink)")]
    NetlinkDump {
        what: &'static str,
        #[source]
        source: Errno,
    },
    #[error("cannot bring {name} up in the job's network namespace")]
    LinkUp {
        name: String,
        #[source]
        source: Errno,
    },
    #[error("cannot open the job's network namespace (/proc/self/ns/net)")]
    OpenNetns(#[source] io::Error),
    #[error("cannot create the veth pair {name} <-> eth0 for the job")]
    CreateVeth {
        name: String,
        #[source]
        source: Errno,
    },
    #[error("cannot find the link {name}")]
    LinkIndex {
        name: String,
        #[source]
        source: Errno,
    },
    #[error("cannot configure the link {name}")]
    ConfigureLink {
        name: String,
        #[source]
        source: Errno,
    },
    #[error("cannot claim the address {addr} for the job (its host route)")]
    ClaimAddress {
        addr: std::net::Ipv4Addr,
        #[source]
        source: Errno,
    },
    #[error("no free job address left in {pool}: set a larger network_subnet")]
    NoFreeAddress { pool: String },
    #[error("cannot give the job its address {addr}")]
    AddAddress {
        addr: std::net::Ipv4Addr,
        #[source]
        source: Errno,
    },
    #[error("cannot add the route {route} in the job's network namespace")]
    AddRoute {
        route: String,
        #[source]
        source: Errno,
    },
    #[error("cannot add the job's gateway {addr} as a neighbour")]
    AddNeighbour {
        addr: std::net::Ipv4Addr,
        #[source]
        source: Errno,
    },
    #[error("cannot mount a sysfs for the job on {}", target.display())]
    MountSysfs {
        target: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot lock {}", path.display())]
    NetLock {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot look up the nftables table inet {table}")]
    NftQuery {
        table: String,
        #[source]
        source: Errno,
    },
    #[error(
        "the nftables table inet {table} that filters jobs' traffic is gone (gc, or a firewall reload \
         flushed the ruleset): this job does not start without it; the next one re-creates it"
    )]
    NftTableMissing { table: String },
    #[error("pasta ({}) exited before the job's network was ready: {said}", program.display())]
    PastaFailed { program: PathBuf, said: String },

    // ---- the job's cgroup (the helper joins it; teardown removes it) ----
    #[error("cannot create the job's cgroup {}", dir.display())]
    CgroupCreate {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot give the new cpuset {} its parent's cpus and mems ({})", dir.display(), file.display())]
    CgroupCpuset {
        dir: PathBuf,
        file: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot deny all devices in {}", file.display())]
    CgroupDenyDevices {
        file: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot allow device '{rule}' in {}", file.display())]
    CgroupAllowDevice {
        file: PathBuf,
        rule: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot set {} to {value}: lower the limit or check what the cgroup allows", file.display())]
    CgroupLimit {
        file: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot move the helper into {}", procs.display())]
    CgroupJoin {
        procs: PathBuf,
        #[source]
        source: io::Error,
    },

    // ---- removal and kills (teardown, gc, failed builds) ----
    #[error("cannot send {signal} to pid {pid}")]
    Kill {
        pid: i32,
        signal: nix::sys::signal::Signal,
        #[source]
        source: Errno,
    },
    #[error("cannot remove the directory {}", path.display())]
    RemoveDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot remove {}", path.display())]
    RemoveTree {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot move {} to {}", from.display(), to.display())]
    Rename {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create the runtime dir {}", dir.display())]
    CreateRuntimeDir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot statfs {}", path.display())]
    Statfs {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot lock {}", path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: Errno,
    },

    // ---- processes ----
    #[error("cannot create a pipe")]
    Pipe(#[source] Errno),
    #[error("cannot fork {what}: it must be forked before any thread exists ({threads} threads now)")]
    ForkThreaded { what: &'static str, threads: usize },
    #[error("cannot fork {what}")]
    Fork {
        what: &'static str,
        #[source]
        source: Errno,
    },
    #[error("cannot wait for {what}")]
    Wait {
        what: &'static str,
        #[source]
        source: Errno,
    },
    #[error("cannot start the sandbox helper (re-exec of /proc/self/exe)")]
    SpawnHelper(#[source] io::Error),
    #[error("cannot block signals in the helper")]
    BlockSignals(#[source] Errno),

    // ---- identities (setuid mode, the rootless user namespace) ----
    #[error("cannot make the setuid process non-dumpable")]
    NotDumpable(#[source] Errno),
    #[error("cannot clear supplementary groups")]
    ClearGroups(#[source] Errno),
    #[error("cannot set real, effective and saved gid to {gid}")]
    SetGid {
        gid: u32,
        #[source]
        source: Errno,
    },
    #[error("cannot set real, effective and saved uid to {uid}")]
    SetUid {
        uid: u32,
        #[source]
        source: Errno,
    },
    #[error("could regain root after dropping it: refusing to continue")]
    RegainedRoot,
    #[error(
        "cannot create a user namespace: enable unprivileged user namespaces \
         (sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1)"
    )]
    UnshareUserNs(#[source] Errno),
    #[error(
        "newuidmap/newgidmap could not map ids {uid_args:?} / {gid_args:?} (see their message above): \
         check /etc/subuid and /etc/subgid"
    )]
    MapIds { uid_args: Vec<String>, gid_args: Vec<String> },
}

impl Error {
    /// The errno of the failed call, when the cause carries one.
    pub fn errno(&self) -> Option<Errno> {
        let source = std::error::Error::source(self)?;
        if let Some(e) = source.downcast_ref::<Errno>() {
            return Some(*e);
        }
        source.downcast_ref::<io::Error>()?.raw_os_error().map(Errno::from_raw)
    }

    /// The cause was ENOSPC or EDQUOT.
    pub fn is_disk_full(&self) -> bool {
        matches!(self.errno(), Some(Errno::ENOSPC | Errno::EDQUOT))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_says_what_and_the_cause_follows() {
        let e =
            Error::MountOverlay { target: "/j/merged".into(), options: "lowerdir=/a".into(), source: Errno::ENOENT };
        let full = format!("{:#}", anyhow::Error::new(e));
        assert_eq!(
            full,
            "cannot mount the job's overlay on /j/merged (lowerdir=/a): ENOENT: No such file or directory"
        );
        let e = Error::RemoveDir { path: "/x".into(), source: io::Error::from_raw_os_error(libc::EBUSY) };
        assert_eq!(e.errno(), Some(Errno::EBUSY));
        let e = Error::CgroupLimit { file: "/m".into(), value: "1".into(), source: io::Error::other("x") };
        assert_eq!(e.errno(), None);
        assert!(Error::Fork { what: "x", source: Errno::ENOSPC }.is_disk_full());
        assert!(!Error::RegainedRoot.is_disk_full());
    }
}
