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
    #[error("cannot create the job's IPC namespace (unshare CLONE_NEWIPC)")]
    UnshareIpcNs(#[source] Errno),
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
    #[error("cannot mount a {fstype} on {} in the sandbox ({options})", dst.display())]
    MountFsInTree {
        fstype: &'static str,
        dst: PathBuf,
        options: String,
        #[source]
        source: Errno,
    },
    #[error("cannot give the root of the new mount on {} in the sandbox to the job's root ({uid}:{gid})", dst.display())]
    ChownInTree {
        dst: PathBuf,
        uid: u32,
        gid: u32,
        #[source]
        source: Errno,
    },
    #[error("cannot bind-mount {} on {} in the sandbox", from.display(), dst.display())]
    BindInTree {
        from: PathBuf,
        dst: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot set the flags of the bind mount on {} in the sandbox (remount; EPERM: a flag its source has locked)", dst.display())]
    RestrictInTree {
        dst: PathBuf,
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
    #[error("cannot mount a tmpfs at {} for the job's caches", dir.display())]
    MountCacheDir {
        dir: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot mount a tmpfs at {} for job records", dir.display())]
    MountTmpfs {
        dir: PathBuf,
        #[source]
        source: Errno,
    },

    // ---- the isolation of a rootfs build step (sys::isolate; fork-to-exec in the child) ----
    #[error("/{0} in the new rootfs is not a directory: refusing to mount on it")]
    StepMountPointNotADirectory(String),
    #[error("cannot create the mount point {}: {reason}", path.display())]
    StepCreateMountPoint { path: PathBuf, reason: String },
    #[error("NUL byte in {}", .0.display())]
    StepNulInPath(PathBuf),
    #[error("cannot have the build step killed when the build dies (prctl PR_SET_PDEATHSIG)")]
    StepDeathSignal(#[source] Errno),
    #[error("cannot give the build step its own mount namespace (unshare CLONE_NEWNS): run as root")]
    StepUnshareMountNs(#[source] Errno),
    #[error("cannot make the build step's mounts private (MS_REC|MS_PRIVATE on /)")]
    StepMakeMountsPrivate(#[source] Errno),
    #[error("cannot mount /proc in the tree: a new proc: {fresh}; a bind of the host's: {bind}")]
    StepMountProc { fresh: Errno, bind: Errno },
    #[error("cannot mount /sys in the tree: a new sysfs: {fresh}; a bind of the host's: {bind}")]
    StepMountSys { fresh: Errno, bind: Errno },
    #[error("cannot bind the host's /dev into the tree")]
    StepBindDev(#[source] Errno),
    #[error("cannot bind the .deb cache on /var/cache/apt/archives in the tree: check --cache-dir")]
    StepBindAptCache(#[source] Errno),
    #[error("cannot chroot into the tree")]
    StepChroot(#[source] Errno),
    #[error("cannot chdir to / in the tree")]
    StepChdir(#[source] Errno),
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
    /// Step 2 failed in the child making the namespace (see `net::isolate`): its message.
    #[error("cannot make the job's network namespace: {0}")]
    MakeJobNetns(String),
    #[error("cannot open the helper's own network namespace (/proc/thread-self/ns/net)")]
    OwnNetns(#[source] Errno),
    #[error("cannot enter the job's network namespace (setns)")]
    EnterNetns(#[source] Errno),
    #[error("cannot return to the helper's own network namespace (setns)")]
    LeaveNetns(#[source] Errno),
    #[error("cannot create the veth pair {name} <-> eth0 for the job")]
    CreateVeth {
        name: String,
        #[source]
        source: Errno,
    },
    #[error("cannot look up the link with index {index}")]
    LinkName {
        index: i32,
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
    /// A veth step that failed in the child doing them (see `net::isolate`): its message.
    #[error("{0}")]
    ConfigureVeth(String),
    #[error("cannot give the job its address {addr}")]
    AddAddress {
        addr: std::net::IpAddr,
        #[source]
        source: Errno,
    },
    #[error("cannot add the routing rule '{rule}' in the job's network namespace")]
    AddRule {
        rule: &'static str,
        #[source]
        source: Errno,
    },
    #[error("cannot add the route {route} in the job's network namespace")]
    AddRoute {
        route: String,
        #[source]
        source: Errno,
    },
    #[error("cannot add the neighbour entry of {addr} (the job's gateway, or the job on the host end)")]
    AddNeighbour {
        addr: std::net::IpAddr,
        #[source]
        source: Errno,
    },
    #[error("cannot open {}", path.display())]
    OpenSysctl {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot write {} in the job's network namespace", path.display())]
    JobSysctl {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot set net.ipv6.conf.{link}.{key} on the job's host end")]
    HostEndSysctl {
        link: String,
        key: &'static str,
        #[source]
        source: Errno,
    },
    #[error("cannot turn IPv4 forwarding {} (/proc/sys/net/ipv4/ip_forward)", if *on { "on for jobs" } else { "back off" })]
    Ipv4Forwarding {
        on: bool,
        #[source]
        source: io::Error,
    },
    #[error("cannot turn net.ipv6.conf.{link}.force_forwarding {} (jobs' IPv6 replies come in on that uplink)", if *on { "on" } else { "back off" })]
    UplinkForceForwarding {
        link: String,
        on: bool,
        #[source]
        source: io::Error,
    },
    #[error("{link:?} is not a network link's name (an IPv6 uplink of the jobs' table)")]
    UplinkName { link: String },
    #[error("cannot add the host's route {route} to the job")]
    AddHostRoute {
        route: String,
        #[source]
        source: Errno,
    },
    #[error("cannot open a sysfs for the job's network namespace (fsopen)")]
    SysfsOpen(#[source] Errno),
    #[error("cannot create the sysfs of the job's network namespace (fsconfig)")]
    SysfsCreate(#[source] Errno),
    #[error("cannot make a mount of the job's sysfs (fsmount)")]
    SysfsMount(#[source] Errno),
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
    #[error(
        "cannot make the job's own nftables table {table} in its network namespace (the kernel needs nf_tables; \
         rootless also nft_ct, nf_conntrack, nft_limit and nft_connlimit)"
    )]
    JobFilter { table: &'static str, source: Errno },
    #[error("cannot watch the host's route changes (a netlink socket subscribed to RTMGRP_IPV4/6_ROUTE)")]
    WatchAddresses(#[source] Errno),
    #[error("cannot have the watch of the host's addresses signal the helper (fcntl F_SETOWN_EX, F_SETSIG, O_ASYNC)")]
    ArmAddressWatch(#[source] Errno),
    #[error("cannot read the host's address changes (netlink)")]
    ReadAddressWatch(#[source] Errno),
    #[error("cannot watch the host's nftables changes (a netfilter netlink socket subscribed to NFNLGRP_NFTABLES)")]
    WatchNftables(#[source] Errno),
    #[error("cannot read the host's nftables changes (netlink)")]
    ReadNftablesWatch(#[source] Errno),
    #[error("the watch of the host's addresses was asked to refuse one before it was armed in the job's namespace")]
    AddressWatchNotArmed,
    #[error("cannot add a rule to the job's own nftables table {table} in its network namespace")]
    JobFilterRule { table: &'static str, source: Errno },

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
    #[error("cannot move the job's pasta (pid {pid}) into {}", procs.display())]
    ChargePasta {
        pid: i32,
        procs: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read the host's nftables set {set} (whether the job's link has tracked connections)")]
    NftSetElement {
        set: &'static str,
        #[source]
        source: Errno,
    },
    #[error("cannot read the host's conntrack table for the job's connections")]
    ConntrackDump(#[source] Errno),
    #[error("cannot remove the link {name} of a job whose processes are gone")]
    RemoveLink {
        name: String,
        #[source]
        source: Errno,
    },
    #[error("cannot delete the job's tracked connections from the host's conntrack table")]
    ConntrackDelete(#[source] Errno),
    #[error("cannot open {path} in the job's network namespace (its TCP sockets are not counted after it)")]
    OpenSocketCounts {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot read {path} of the job's network namespace")]
    ReadSocketCounts {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("{path} of the job's network namespace has no `TCP: inuse N` line")]
    ParseSocketCounts { path: PathBuf },
    #[error("cannot list the TCP sockets left in the job's network namespace")]
    DumpJobSockets(#[source] Errno),
    #[error("cannot abort a TCP socket left in the job's network namespace{}", if *.0 == Errno::EOPNOTSUPP { " (the kernel lacks CONFIG_INET_DIAG_DESTROY)" } else { "" })]
    AbortJobSocket(#[source] Errno),
    #[error("cannot tell whether the job's pasta still runs")]
    LingerPastaWait(#[source] Errno),
    #[error("cannot open a pidfd of the job's pasta")]
    LingerPastaPidfd(#[source] Errno),
    #[error("cannot list the job's pasta's fds")]
    LingerPastaFds(#[source] Errno),
    #[error(
        "cannot take a copy of a socket of the job's pasta (pidfd_getfd: ptrace restricted, or a kernel before 5.6?)"
    )]
    LingerPastaFdCopy(#[source] Errno),
    #[error("cannot set a TCP socket of the job's pasta to reset as it closes (SO_LINGER)")]
    LingerPastaSocket(#[source] Errno),
    #[error("cannot stop the job's pasta (pid {pid}) after the job")]
    StopPasta {
        pid: i32,
        #[source]
        source: io::Error,
    },
    #[error("cannot move the helper into {}", procs.display())]
    CgroupJoin {
        procs: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot open {} to go back there after the job's start", procs.display())]
    CgroupWayBack {
        procs: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot move the helper back into {}", procs.display())]
    CgroupLeave {
        procs: PathBuf,
        #[source]
        source: io::Error,
    },

    // ---- disk quotas of the jobs' layer dirs (see sys::quota) ----
    #[error("no project quotas on the filesystem of {}", dir.display())]
    QuotaProbe {
        dir: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot open {} to give it a disk quota", dir.display())]
    ProjectOpen {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read the project id of {} (FS_IOC_FSGETXATTR)", dir.display())]
    ProjectGet {
        dir: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot give {} the project id {id} (FS_IOC_FSSETXATTR): is the filesystem's `project` feature on?", dir.display())]
    ProjectSet {
        dir: PathBuf,
        id: u32,
        #[source]
        source: Errno,
    },
    #[error("cannot read the disk quota of project {id} on the filesystem of {}", dir.display())]
    QuotaGet {
        dir: PathBuf,
        id: u32,
        #[source]
        source: Errno,
    },
    #[error("cannot set the disk quota of project {id} on the filesystem of {}", dir.display())]
    QuotaSet {
        dir: PathBuf,
        id: u32,
        #[source]
        source: Errno,
    },
    #[error(
        "every project id for job quotas (2052000000-2052999999) is in use on the filesystem of {}: \
         run `azp-sandbox gc`", dir.display()
    )]
    ProjectIdsExhausted { dir: PathBuf },

    // ---- btrfs subvolumes with a qgroup limit as disk quotas (see sys::btrfs) ----
    #[error("{} is not on btrfs", dir.display())]
    NotBtrfs { dir: PathBuf },
    #[error("quotas are not enabled on the btrfs filesystem of {}", dir.display())]
    BtrfsQuotaOff { dir: PathBuf },
    #[error("cannot open {} (btrfs)", dir.display())]
    BtrfsOpen {
        dir: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot read the btrfs filesystem id of {} (BTRFS_IOC_FS_INFO)", dir.display())]
    BtrfsFsInfo {
        dir: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot create the btrfs subvolume {} (BTRFS_IOC_SUBVOL_CREATE)", dir.display())]
    BtrfsSubvolCreate {
        dir: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot make the btrfs subvolume {} private (fchmod 0700)", dir.display())]
    BtrfsChmod {
        dir: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot read the subvolume id of {} (BTRFS_IOC_INO_LOOKUP)", dir.display())]
    BtrfsSubvolId {
        dir: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot limit qgroup 0/{id} of {} (BTRFS_IOC_QGROUP_LIMIT): are quotas enabled (`btrfs quota enable`)?", dir.display())]
    BtrfsQgroupLimit {
        dir: PathBuf,
        id: u64,
        #[source]
        source: Errno,
    },
    #[error("cannot read the btrfs qgroup usage {}", path.display())]
    BtrfsUsage {
        path: PathBuf,
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
    #[error("cannot give {} to uid {uid} gid {gid}", path.display())]
    GiveDir {
        path: PathBuf,
        uid: u32,
        gid: u32,
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
    #[error("cannot open {} to keep the cgroup-move window open", procs.display())]
    MoveWindowOpen {
        procs: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start the cgroup-move window's keeper (clone)")]
    MoveWindowClone(#[source] Errno),
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

    // ---- the job's init: its lifeline and its terminal ----
    #[error("cannot move one of the helper's pipes off fd 3 (the job's lifeline)")]
    MoveFd(#[source] Errno),
    #[error("cannot reserve fd 3 of the helper for the job's lifeline (open /dev/null)")]
    ReserveLifelineFd(#[source] Errno),
    #[error("cannot put the job's lifeline at fd 3")]
    LifelineFd(#[source] Errno),
    #[error("cannot listen on the job's console socket {}", path.display())]
    ConsoleSocket {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot receive the job's terminal from its console socket")]
    ReceiveConsole(#[source] Errno),
    #[error("cannot read the settings of the terminal on fd {fd}")]
    TerminalAttributes {
        fd: i32,
        #[source]
        source: Errno,
    },
    #[error("cannot change the size of the job's terminal")]
    TerminalSize(#[source] Errno),

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

    // ---- the job's own user namespace (root and setuid modes; rootless nested) ----
    #[error("cannot create the job's user namespace (clone CLONE_NEWUSER in the helper)")]
    UserNamespaceChild(#[source] Errno),
    #[error("cannot read the helper's parent-death signal, dumpable flag or securebits (prctl)")]
    HelperStateRead(#[source] Errno),
    #[error("cannot keep the helper's capabilities across a uid change (prctl PR_SET_SECUREBITS)")]
    KeepCapabilities(#[source] Errno),
    #[error("cannot make the job's user namespace as its owner, host uid {uid} (setresuid)")]
    BecomeNamespaceOwner {
        uid: u32,
        #[source]
        source: Errno,
    },
    #[error("cannot return to uid 0 after making the job's user namespace (setresuid)")]
    ResumeRoot(#[source] Errno),
    #[error("cannot restore the helper's securebits, dumpable flag or parent-death signal (prctl)")]
    RestoreHelperState(#[source] Errno),
    #[error("the helper's runner exited while the helper made the job's user namespace")]
    RunnerGoneMeanwhile,
    #[error("cannot open {}", path.display())]
    OpenUserNs {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot map the job's ids ({map}) in {}", file.display())]
    WriteIdMap {
        file: PathBuf,
        map: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot clone the mount of {} to give it the job's ids (open_tree)", layer.display())]
    IdmapOpenTree {
        layer: PathBuf,
        #[source]
        source: Errno,
    },
    #[error(
        "cannot mount {} with the job's ids: idmapped mounts need Linux >= 5.19 and a filesystem that \
         supports them (ext4, xfs, btrfs, tmpfs >= 6.3, ...; not NFS or ZFS): move the home there, or run jobs \
         with host ids with --userns host (NOT recommended, see SECURITY.md)",
        layer.display()
    )]
    IdmapLayer {
        layer: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot attach the idmapped mount of {} at {}", layer.display(), target.display())]
    IdmapMove {
        layer: PathBuf,
        target: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot give {} to the job's ids {uid}:{gid}", path.display())]
    Chown {
        path: PathBuf,
        uid: u32,
        gid: u32,
        #[source]
        source: Errno,
    },
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

    /// The message and its causes on one line, as `{:#}` of an `anyhow::Error` shows
    /// them: for an error that travels as text (a child's report to the helper), where
    /// the errno would otherwise be lost.
    pub fn with_causes(&self) -> String {
        let mut text = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            text = format!("{text}: {c}");
            cause = c.source();
        }
        text
    }

    /// The cause was ENOSPC or EDQUOT.
    pub fn is_disk_full(&self) -> bool {
        matches!(self.errno(), Some(Errno::ENOSPC | Errno::EDQUOT))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The errno of an I/O error from std (EIO when it carries none), for the variants
/// whose source is an `Errno`.
pub(crate) fn errno_of(e: &io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

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
        let e = Error::SysfsOpen(Errno::EPERM);
        assert_eq!(
            e.with_causes(),
            "cannot open a sysfs for the job's network namespace (fsopen): EPERM: Operation not permitted"
        );
        assert_eq!(Error::RegainedRoot.with_causes(), Error::RegainedRoot.to_string());
        let e = Error::RemoveDir { path: "/x".into(), source: io::Error::from_raw_os_error(libc::EBUSY) };
        assert_eq!(e.errno(), Some(Errno::EBUSY));
        let e = Error::CgroupLimit { file: "/m".into(), value: "1".into(), source: io::Error::other("x") };
        assert_eq!(e.errno(), None);
        assert!(Error::Fork { what: "x", source: Errno::ENOSPC }.is_disk_full());
        assert!(!Error::RegainedRoot.is_disk_full());
    }
}
