//! The privileged boundary: every privileged or `unsafe` call of the program, behind
//! named functions (on `nix` where it has them), each failure a variant of one
//! [`Error`] that names the step, the object and what to fix.
//!
//! - [`fs_at`]: directory-fd-relative file calls (`*at`, `openat2`) for the unpacker,
//!   the store and in-tree writes;
//! - [`mount`], [`ns`], [`cgroup`], [`net`]: what the sandbox helper sets up ([`netlink`]:
//!   the messages of [`net`]);
//! - [`process`], [`signals`]: forks, the helper's spawn, waits, kills, handlers;
//! - [`lifeline`], [`tty`]: the job's init's lifeline and the terminal of `exec -t`;
//! - [`ids`]: setuid mode's and the user namespace's identity changes;
//! - [`userns`]: a job's own user namespace and the layers idmapped with it;
//! - [`runtime_tmpfs`], [`dir_flags`]: the home's runtime dir and layer buckets;
//! - [`quota`]: the disk quota (a project id and its limits) of a job's layer dir;
//! - [`btrfs`]: the same as a btrfs subvolume with a qgroup limit.
//!
//! What the sandbox helper, the edit layer and teardown do goes through the [`Sys`]
//! trait, so the order of their steps and what happens when one fails are unit-tested
//! without root on [`Recorder`].

pub mod address_watch;
pub mod btrfs;
pub mod cache_dir;
pub mod cgroup;
pub mod dir_flags;
mod error;
pub mod forwarding;
pub mod fs_at;
pub mod ids;
pub mod isolate;
pub mod job_filter;
pub mod lifeline;
pub mod mount;
pub mod move_window;
pub mod net;
pub mod netlink;
pub mod ns;
pub mod nvml_mig;
pub mod pasta_linger;
pub mod process;
pub mod procfile;
pub mod quota;
pub mod runtime_tmpfs;
pub mod signals;
pub mod sockstat;
pub mod tty;
pub mod userns;

pub use cgroup::{CgroupDir, CgroupJoin, WayBack};
pub use dir_flags::spread_subdirs;
pub use error::{Error, Result};
pub use mount::{InTree, Overlay};
pub use nix::mount::MsFlags;
pub use nix::sys::signal::Signal;
pub use quota::{DiskQuota, Mechanism};

use nix::errno::Errno;
use std::cell::{Cell, RefCell};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The privileged steps of the sandbox helper (in the order it takes them), of the
/// edit layer's build, and of a job's teardown.
pub trait Sys {
    /// Drops every supplementary group of the calling process (the job inherits none).
    fn clear_groups(&self) -> Result<()>;
    /// Gives the calling process its own mount namespace with private propagation, so the
    /// job's mounts exist only there and vanish with it (even on SIGKILL).
    fn private_mount_namespace(&self) -> Result<()>;
    /// The job's IPC namespace, made here for the container to inherit (see
    /// [`ns::own_ipc_namespace`]).
    fn own_ipc_namespace(&self) -> Result<()>;
    /// Creates the job's cgroup, writes its limits and moves the calling process in.
    fn join_cgroup(&self, join: &CgroupJoin) -> Result<()>;
    /// Moves the job's pasta (rootless: forked with the network, before the helper
    /// joined) into the cgroup [`Sys::join_cgroup`] made: the CPU it spends and the
    /// memory and socket buffers it takes from then on for the job's traffic are the
    /// job's, under its limits.
    fn charge_pasta(&self, join: &CgroupJoin, pid: i32) -> Result<()>;
    /// Kills the job's pasta (a child of this process) once the job is over and reaps
    /// it: gone before the helper exits, so its runner finds the job's cgroup empty.
    fn stop_pasta(&self, pid: i32) -> Result<()>;
    /// Before [`Sys::stop_pasta`]: the TCP sockets of the job's pasta (pid `pid`, the
    /// caller's unreaped child) set to reset as it stops (see [`pasta_linger`]); how many.
    fn linger_pasta(&self, pid: i32) -> Result<u32>;
    /// Deletes the host's conntrack entries of connections from `sources` (a root-mode
    /// job's addresses, once the job is over; `look` says when it reads the table: see
    /// [`net::forget_connections`]): how many, which addresses another link holds now,
    /// and whether the job's link was still there.
    fn forget_connections(&self, job: &net::JobConnections, look: net::Look) -> Result<net::Forgotten>;
    /// Removes the host's link `link` of a job whose processes are gone (see
    /// [`net::remove_link`]); false: it was gone already.
    fn remove_job_link(&self, link: &str) -> Result<bool>;
    /// In the job's network namespace: its TCP socket counts, for [`Sys::job_tcp_sockets`]
    /// after the job (see [`sockstat`]).
    fn job_socket_counts(&self) -> Result<sockstat::SocketCounts>;
    /// The TCP sockets the job's namespace has now: once its processes are gone, the
    /// connections that outlive them (orphans), which keep the namespace and its link.
    fn job_tcp_sockets(&self, counts: &sockstat::SocketCounts) -> Result<u64>;
    /// Aborts the TCP sockets the job left in its namespace (see [`sockstat::abort_tcp`]).
    fn abort_job_tcp(&self, counts: &sockstat::SocketCounts) -> Result<u64>;
    /// The first part of [`Sys::join_cgroup`]: the dirs and limits, no move.
    fn prepare_cgroup(&self, join: &CgroupJoin) -> Result<()>;
    /// The rest of it, after a [`Sys::prepare_cgroup`] (here or in the runner): the move.
    fn enter_cgroup(&self, join: &CgroupJoin) -> Result<()>;
    /// Before entering: the way back to the cgroups the process is in now (see
    /// [`cgroup::open_way_back`]).
    fn open_cgroup_way_back(&self, join: &CgroupJoin) -> Result<WayBack>;
    /// Once the job's init is started: the process goes back (see [`cgroup::leave`]).
    fn leave_cgroup(&self, back: WayBack) -> Result<()>;
    /// Covers the host's cgroup tree in this (private) mount namespace with a cgroup2
    /// view rooted at the cgroup this process is in: libcontainer's cgroup manager can
    /// change nothing outside the job's cgroup.
    fn hide_cgroupfs(&self) -> Result<()>;
    /// A new user namespace with these maps (`/proc/PID/uid_map` text): the job's, owned
    /// by host uid `owner` when given (see [`userns::new_user_namespace`]).
    fn new_user_namespace(&self, uid_map: &str, gid_map: &str, owner: Option<u32>) -> Result<OwnedFd>;
    /// `layer` read-only at `target`, idmapped with the namespace `userns`.
    fn idmap_layer(&self, layer: &Path, userns: BorrowedFd, target: &Path) -> Result<()>;
    /// Owner of `path` (not followed).
    fn chown(&self, path: &Path, uid: u32, gid: u32) -> Result<()>;
    fn mount_overlay(&self, overlay: &Overlay) -> Result<()>;
    /// A new filesystem (tmpfs, devpts, mqueue) on a target in a job's tree (see
    /// [`mount::mount_fs_in_tree`]).
    fn mount_fs_in_tree(
        &self,
        at: InTree,
        fstype: &'static str,
        source: &str,
        flags: MsFlags,
        data: &str,
    ) -> Result<()>;
    /// The root of the mount whose root `at` is, given to `owner` (see
    /// [`mount::chown_in_tree`]).
    fn chown_in_tree(&self, at: InTree, owner: (u32, u32)) -> Result<()>;
    /// A plain bind of the host's `from` on a target in a job's tree (or a layer's being
    /// built), in this process's private mount namespace.
    fn bind_in_tree(&self, from: &Path, at: InTree) -> Result<()>;
    /// `flags` added to the bind mount whose root `at` is (see [`mount::restrict_in_tree`]).
    fn restrict_in_tree(&self, at: InTree, flags: MsFlags) -> Result<()>;
    /// Lazy unmount (MNT_DETACH), of the mounts below `target` too.
    fn unmount(&self, target: &Path) -> Result<()>;
    /// Mount points at or below `dir` in this process's mount namespace, deepest first.
    fn mounts_under(&self, dir: &Path) -> Result<Vec<PathBuf>>;
    fn kill(&self, pid: i32, signal: Signal) -> Result<()>;
    /// rmdir: an empty directory (a cgroup whose processes are gone).
    fn remove_dir(&self, dir: &Path) -> Result<()>;
    /// A directory tree, never following a symlink in it; a missing one is no error.
    fn remove_tree(&self, dir: &Path) -> Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> Result<()>;
    /// Gives a job's new, empty layer dir a project id of its own with `quota`'s limits
    /// (see [`quota`]); returns the id.
    fn claim_disk_quota(&self, dir: &Path, quota: &DiskQuota) -> Result<u32>;
    /// Clears the limits of project `id`, if `dir` still has it.
    fn release_disk_quota(&self, dir: &Path, id: u32) -> Result<()>;
    /// Whether project quotas are on for the filesystem of `dir` (see [`quota::probe`]).
    fn probe_project_quota(&self, dir: &Path) -> Result<()>;
    /// Whether `dir` is on btrfs with quotas enabled (see [`btrfs::probe`]).
    fn probe_btrfs_quota(&self, dir: &Path) -> Result<()>;
    /// Makes `dir` (not there yet) a btrfs subvolume whose qgroup is limited to `bytes`
    /// (see [`btrfs`]); returns the qgroup's id. Nothing is left on an error.
    fn create_quota_subvolume(&self, dir: &Path, bytes: u64) -> Result<u64>;
    /// A watch of the host's local destinations (see [`address_watch`]; `ipv6`: IPv6 ones
    /// too), subscribed before it reads them (its addresses among them): isolated jobs.
    fn watch_host_addresses(&self, ipv6: bool) -> Result<Box<dyn address_watch::HostAddresses>>;
    /// The job's own network namespace, set up as `setup` says, with its sysfs at `sysfs`
    /// (see [`net::isolate`]); the helper is in it after [`Sys::enter_network`].
    fn isolate_network(&self, setup: &net::Setup, sysfs: &Path) -> Result<net::Made>;
    /// A `none` job's namespace that its runner is making (see [`net::loopback_maker`]):
    /// `ready` is the helper's end of the maker's socket; its
    /// sysfs goes at `sysfs`. In place of [`Sys::isolate_network`].
    fn adopt_network(&self, ready: OwnedFd, sysfs: &Path) -> Result<net::Made>;
    /// Moves the helper into the namespace [`Sys::isolate_network`] made (see
    /// [`net::Made::enter`]): before the job's tree binds its sysfs.
    fn enter_network(&self, made: &mut net::Made) -> Result<()>;
    /// Waits for what [`Sys::isolate_network`] left under way (a veth's configuration,
    /// see [`net::Made::finish`]): before the job starts.
    fn finish_network(&self, made: &mut net::Made) -> Result<()>;
    /// Moves the helper back into its own namespace (see [`net::Made::leave`]): once the
    /// job's container is in the job's.
    fn leave_network(&self, made: &mut net::Made) -> Result<()>;
    /// Mounts the dir of the job's network files on `dir` (see [`net::mount_job_net_dir`]),
    /// with `dir/sys` for the sysfs of the job's network namespace.
    fn mount_job_net_dir(&self, dir: &Path) -> Result<()>;
    /// Mounts the dir the job's cache overlays go in (see [`cache_dir`]).
    fn mount_cache_dir(&self, dir: &Path) -> Result<()>;
    /// Gives the directory `dir` (not a symlink) to `uid`:`gid`: a job's scratch dir, made
    /// by its runner, handed to the job's user.
    fn give_dir(&self, dir: &Path, uid: u32, gid: u32) -> Result<()>;
}

/// The real thing.
pub struct Real;

/// Whether `pid`, a child of the caller, still runs: still unreaped, so `pid` is that
/// child's and not a reused one. One that ended is reaped now (or was before, by the
/// helper's wait for its job).
fn still_running_child(pid: i32) -> std::result::Result<bool, Errno> {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    match waitpid(nix::unistd::Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::StillAlive) => Ok(true),
        Ok(_) | Err(Errno::ECHILD) => Ok(false),
        Err(e) => Err(e),
    }
}

impl Sys for Real {
    fn clear_groups(&self) -> Result<()> {
        ids::clear_groups()
    }
    fn private_mount_namespace(&self) -> Result<()> {
        ns::private_mount_namespace()
    }
    fn own_ipc_namespace(&self) -> Result<()> {
        ns::own_ipc_namespace()
    }
    fn join_cgroup(&self, join: &CgroupJoin) -> Result<()> {
        cgroup::join(join)
    }
    fn charge_pasta(&self, join: &CgroupJoin, pid: i32) -> Result<()> {
        // The move's own error names pasta, not the helper (the leaf exists: the helper made it).
        cgroup::enter_pid(join, pid).map_err(|e| match e {
            Error::CgroupJoin { procs, source } => Error::ChargePasta { pid, procs, source },
            other => other,
        })
    }
    fn linger_pasta(&self, pid: i32) -> Result<u32> {
        // Pinned by its pidfd from the check on.
        if !still_running_child(pid).map_err(Error::LingerPastaWait)? {
            return Ok(0);
        }
        let pidfd = pasta_linger::open(pid)?;
        pasta_linger::reset_on_close(pid, &pidfd)
    }
    fn stop_pasta(&self, pid: i32) -> Result<()> {
        if !still_running_child(pid).map_err(|e| Error::StopPasta { pid, source: e.into() })? {
            return Ok(());
        }
        process::kill(pid, Signal::SIGKILL)?;
        process::wait_exit_status(pid).map(drop).map_err(|source| Error::StopPasta { pid, source })
    }
    fn forget_connections(&self, job: &net::JobConnections, look: net::Look) -> Result<net::Forgotten> {
        net::forget_connections(job, look)
    }
    fn remove_job_link(&self, link: &str) -> Result<bool> {
        net::remove_link(link)
    }
    fn job_socket_counts(&self) -> Result<sockstat::SocketCounts> {
        sockstat::open_here()
    }
    fn job_tcp_sockets(&self, counts: &sockstat::SocketCounts) -> Result<u64> {
        sockstat::tcp_in_use(counts)
    }
    fn abort_job_tcp(&self, counts: &sockstat::SocketCounts) -> Result<u64> {
        sockstat::abort_tcp(counts)
    }
    fn prepare_cgroup(&self, join: &CgroupJoin) -> Result<()> {
        cgroup::prepare(join)
    }
    fn enter_cgroup(&self, join: &CgroupJoin) -> Result<()> {
        cgroup::enter(join)
    }
    fn open_cgroup_way_back(&self, join: &CgroupJoin) -> Result<WayBack> {
        cgroup::open_way_back(join)
    }
    fn leave_cgroup(&self, back: WayBack) -> Result<()> {
        cgroup::leave(back)
    }
    fn hide_cgroupfs(&self) -> Result<()> {
        ns::private_cgroup_view()
    }
    fn new_user_namespace(&self, uid_map: &str, gid_map: &str, owner: Option<u32>) -> Result<OwnedFd> {
        userns::new_user_namespace(uid_map, gid_map, owner)
    }
    fn idmap_layer(&self, layer: &Path, ns: BorrowedFd, target: &Path) -> Result<()> {
        userns::idmap_layer(layer, ns, target)
    }
    fn chown(&self, path: &Path, uid: u32, gid: u32) -> Result<()> {
        userns::chown(path, uid, gid)
    }
    fn mount_overlay(&self, overlay: &Overlay) -> Result<()> {
        mount::mount_overlay(overlay)
    }
    fn mount_fs_in_tree(
        &self,
        at: InTree,
        fstype: &'static str,
        source: &str,
        flags: MsFlags,
        data: &str,
    ) -> Result<()> {
        mount::mount_fs_in_tree(at, fstype, source, flags, data)
    }
    fn chown_in_tree(&self, at: InTree, owner: (u32, u32)) -> Result<()> {
        mount::chown_in_tree(at, owner)
    }
    fn bind_in_tree(&self, from: &Path, at: InTree) -> Result<()> {
        mount::bind_in_tree(from, at)
    }
    fn restrict_in_tree(&self, at: InTree, flags: MsFlags) -> Result<()> {
        mount::restrict_in_tree(at, flags)
    }
    fn unmount(&self, target: &Path) -> Result<()> {
        mount::unmount(target)
    }
    fn mounts_under(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        mount::mounts_under(dir)
    }
    fn kill(&self, pid: i32, signal: Signal) -> Result<()> {
        process::kill(pid, signal)
    }
    fn remove_dir(&self, dir: &Path) -> Result<()> {
        std::fs::remove_dir(dir).map_err(|source| Error::RemoveDir { path: dir.to_path_buf(), source })
    }
    fn remove_tree(&self, dir: &Path) -> Result<()> {
        fs_at::remove_tree(dir).map_err(|source| Error::RemoveTree { path: dir.to_path_buf(), source })
    }
    fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        std::fs::rename(from, to).map_err(|source| Error::Rename {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
            source,
        })
    }
    fn claim_disk_quota(&self, dir: &Path, quota: &DiskQuota) -> Result<u32> {
        quota::claim(dir, quota)
    }
    fn release_disk_quota(&self, dir: &Path, id: u32) -> Result<()> {
        quota::release(dir, id)
    }
    fn probe_project_quota(&self, dir: &Path) -> Result<()> {
        quota::probe(dir)
    }
    fn probe_btrfs_quota(&self, dir: &Path) -> Result<()> {
        btrfs::probe(dir)
    }
    fn create_quota_subvolume(&self, dir: &Path, bytes: u64) -> Result<u64> {
        btrfs::create_limited_subvolume(dir, bytes)
    }
    fn watch_host_addresses(&self, ipv6: bool) -> Result<Box<dyn address_watch::HostAddresses>> {
        Ok(Box::new(address_watch::Watch::subscribe(ipv6)?))
    }
    fn isolate_network(&self, setup: &net::Setup, sysfs: &Path) -> Result<net::Made> {
        net::isolate(setup, sysfs)
    }
    fn adopt_network(&self, ready: OwnedFd, sysfs: &Path) -> Result<net::Made> {
        Ok(net::adopt_loopback(ready, sysfs))
    }
    fn enter_network(&self, made: &mut net::Made) -> Result<()> {
        made.enter()
    }
    fn finish_network(&self, made: &mut net::Made) -> Result<()> {
        made.finish()
    }
    fn leave_network(&self, made: &mut net::Made) -> Result<()> {
        made.leave()
    }
    fn mount_job_net_dir(&self, dir: &Path) -> Result<()> {
        net::mount_job_net_dir(dir)
    }
    fn mount_cache_dir(&self, dir: &Path) -> Result<()> {
        cache_dir::mount_cache_dir(dir)
    }
    fn give_dir(&self, dir: &Path, uid: u32, gid: u32) -> Result<()> {
        use std::os::fd::AsRawFd;
        fs_at::open_dir(dir).and_then(|fd| fs_at::fchown(fd.as_raw_fd(), uid, gid)).map_err(|source| Error::GiveDir {
            path: dir.to_path_buf(),
            uid,
            gid,
            source,
        })
    }
}

/// The test double: records each call (one line, `name args`) instead of making it,
/// and fails the call numbered `fail_at` (0-based) with `fail_errno`. Seams outside
/// this module (the helper's container) log into the same list through
/// [`Recorder::step`], so one list shows the order of everything.
pub struct Recorder {
    /// Shared with what the recorder hands out (its watch of the host's addresses).
    steps: std::rc::Rc<Steps>,
    /// What [`Sys::mounts_under`] reports (filtered to the dir asked for).
    pub mounts: RefCell<Vec<PathBuf>>,
    /// What [`Sys::forget_connections`] reports.
    pub forgotten: RefCell<net::Forgotten>,
    /// What [`Sys::remove_job_link`] reports: the link was there (and is removed).
    pub link_there: Cell<bool>,
    /// What [`Sys::job_tcp_sockets`] reports.
    pub tcp_sockets_left: Cell<u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            steps: std::rc::Rc::new(Steps {
                calls: RefCell::default(),
                fail_at: Cell::new(None),
                fail_errno: Cell::new(Errno::EIO),
            }),
            mounts: RefCell::default(),
            forgotten: RefCell::default(),
            link_there: Cell::new(false),
            tcp_sockets_left: Cell::new(0),
        }
    }
}

impl Recorder {
    /// A recorder whose call number `k` (0-based) fails with `errno`.
    pub fn failing_at(k: usize, errno: Errno) -> Recorder {
        let r = Recorder::default();
        r.steps.fail_at.set(Some(k));
        r.steps.fail_errno.set(errno);
        r
    }

    /// The calls so far, in order.
    pub fn calls(&self) -> Vec<String> {
        self.steps.calls.borrow().clone()
    }

    /// Records `call`; Err(errno) when it is the one to fail.
    pub fn step(&self, call: String) -> std::result::Result<(), Errno> {
        self.steps.step(call)
    }

    fn io(&self, e: Errno) -> std::io::Error {
        std::io::Error::from_raw_os_error(e as i32)
    }

    /// A cgroup call: `name` and the job's dirs.
    fn cgroup_step(&self, name: &str, join: &CgroupJoin) -> Result<()> {
        let dirs: Vec<String> = join.dirs.iter().map(|d| d.dir.display().to_string()).collect();
        self.step(format!("{name} {}", dirs.join(" "))).map_err(|e| Error::CgroupJoin {
            procs: join.dirs.first().map(|d| d.dir.join("cgroup.procs")).unwrap_or_default(),
            source: self.io(e),
        })
    }
}

/// The pid of the pasta a [`Recorder`] "forks".
pub const RECORDED_PASTA: i32 = 4242;

/// [`Recorder`]'s list of calls and the one to fail.
struct Steps {
    calls: RefCell<Vec<String>>,
    fail_at: Cell<Option<usize>>,
    fail_errno: Cell<Errno>,
}

impl Steps {
    fn step(&self, call: String) -> std::result::Result<(), Errno> {
        let mut calls = self.calls.borrow_mut();
        let k = calls.len();
        calls.push(call);
        match self.fail_at.get() {
            Some(f) if f == k => Err(self.fail_errno.get()),
            _ => Ok(()),
        }
    }
}

/// [`Recorder`]'s watch of the host's addresses: none ever comes. Its arming is a step
/// of the recorder's list (it must come while the helper is in the job's namespace).
struct QuietWatch(std::rc::Rc<Steps>);

impl address_watch::HostAddresses for QuietWatch {
    /// The host's loopback, 192.0.2.2 and 2001:db8::2.
    fn current(&mut self) -> Result<Vec<net::LocalNet>> {
        use std::net::Ipv4Addr;
        Ok(vec![
            net::LocalNet::V4(net::Ipv4Net::new(Ipv4Addr::new(127, 0, 0, 0), 8)),
            net::LocalNet::V4(net::Ipv4Net::host(Ipv4Addr::LOCALHOST)),
            net::LocalNet::V4(net::Ipv4Net::host(Ipv4Addr::new(192, 0, 2, 2))),
            net::LocalNet::V6(net::Ipv6Net::host(std::net::Ipv6Addr::LOCALHOST)),
            net::LocalNet::V6(net::Ipv6Net::host(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2))),
        ])
    }
    fn arm(&mut self) -> Result<()> {
        self.0.step("arm_address_watch".into()).map_err(Error::ArmAddressWatch)
    }
    fn added(&mut self) -> Result<Vec<net::LocalNet>> {
        Ok(vec![])
    }
    fn refuse(&mut self, _v4: &[net::Ipv4Net], _v6: &[net::Ipv6Net]) -> Result<()> {
        Ok(())
    }
}

impl Sys for Recorder {
    fn clear_groups(&self) -> Result<()> {
        self.step("clear_groups".into()).map_err(Error::ClearGroups)
    }
    fn private_mount_namespace(&self) -> Result<()> {
        self.step("private_mount_namespace".into()).map_err(Error::UnshareMountNs)
    }
    fn own_ipc_namespace(&self) -> Result<()> {
        self.step("own_ipc_namespace".into()).map_err(Error::UnshareIpcNs)
    }
    fn join_cgroup(&self, join: &CgroupJoin) -> Result<()> {
        self.cgroup_step("join_cgroup", join)
    }
    fn charge_pasta(&self, join: &CgroupJoin, pid: i32) -> Result<()> {
        self.cgroup_step(&format!("charge_pasta {pid}"), join)
    }
    fn stop_pasta(&self, pid: i32) -> Result<()> {
        self.step(format!("stop_pasta {pid}")).map_err(|e| Error::StopPasta { pid, source: self.io(e) })
    }
    fn linger_pasta(&self, pid: i32) -> Result<u32> {
        self.step(format!("linger_pasta {pid}")).map_err(Error::LingerPastaFdCopy)?;
        Ok(0)
    }
    fn forget_connections(&self, job: &net::JobConnections, look: net::Look) -> Result<net::Forgotten> {
        let list: Vec<String> = job.sources.iter().map(|a| a.to_string()).collect();
        let heir = job.heir.as_ref().map(|h| format!(" heir {h}")).unwrap_or_default();
        let step = format!("forget_connections {} of {} {look:?}{heir}", list.join(" "), job.link);
        self.step(step).map_err(Error::ConntrackDelete)?;
        Ok(self.forgotten.borrow().clone())
    }
    fn remove_job_link(&self, link: &str) -> Result<bool> {
        self.step(format!("remove_job_link {link}"))
            .map_err(|source| Error::RemoveLink { name: link.into(), source })?;
        Ok(self.link_there.get())
    }
    fn job_socket_counts(&self) -> Result<sockstat::SocketCounts> {
        self.step("job_socket_counts".into())
            .map_err(|source| Error::OpenSocketCounts { path: "sockstat".into(), source })?;
        Ok(sockstat::SocketCounts::none())
    }
    fn job_tcp_sockets(&self, _: &sockstat::SocketCounts) -> Result<u64> {
        self.step("job_tcp_sockets".into())
            .map_err(|source| Error::ReadSocketCounts { path: "sockstat".into(), source })?;
        Ok(self.tcp_sockets_left.get())
    }
    fn abort_job_tcp(&self, _: &sockstat::SocketCounts) -> Result<u64> {
        self.step("abort_job_tcp".into()).map_err(Error::AbortJobSocket)?;
        Ok(self.tcp_sockets_left.get())
    }
    fn prepare_cgroup(&self, join: &CgroupJoin) -> Result<()> {
        self.cgroup_step("prepare_cgroup", join)
    }
    fn enter_cgroup(&self, join: &CgroupJoin) -> Result<()> {
        self.cgroup_step("enter_cgroup", join)
    }
    fn open_cgroup_way_back(&self, join: &CgroupJoin) -> Result<WayBack> {
        let dirs: Vec<String> = join.back.iter().map(|d| d.display().to_string()).collect();
        self.step(format!("open_cgroup_way_back {}", dirs.join(" "))).map_err(|e| Error::CgroupWayBack {
            procs: join.back.first().map(|d| d.join("cgroup.procs")).unwrap_or_default(),
            source: self.io(e),
        })?;
        Ok(WayBack::default())
    }
    fn leave_cgroup(&self, _back: WayBack) -> Result<()> {
        self.step("leave_cgroup".into()).map_err(|e| Error::CgroupLeave { procs: PathBuf::new(), source: self.io(e) })
    }
    fn hide_cgroupfs(&self) -> Result<()> {
        self.step("hide_cgroupfs".into()).map_err(Error::MountCgroupView)
    }
    fn new_user_namespace(&self, uid_map: &str, gid_map: &str, owner: Option<u32>) -> Result<OwnedFd> {
        let maps = |m: &str| m.trim().replace('\n', ",");
        let owner = owner.map(|u| format!(" owner {u}")).unwrap_or_default();
        self.step(format!("new_user_namespace {} {}{owner}", maps(uid_map), maps(gid_map)))
            .map_err(Error::UserNamespaceChild)?;
        // Any fd stands for the namespace here.
        std::fs::File::open("/dev/null")
            .map(OwnedFd::from)
            .map_err(|source| Error::OpenUserNs { path: "/dev/null".into(), source })
    }
    fn idmap_layer(&self, layer: &Path, _ns: BorrowedFd, target: &Path) -> Result<()> {
        self.step(format!("idmap_layer {} {}", layer.display(), target.display()))
            .map_err(|source| Error::IdmapLayer { layer: layer.into(), source })
    }
    fn chown(&self, path: &Path, uid: u32, gid: u32) -> Result<()> {
        self.step(format!("chown {} {uid}:{gid}", path.display())).map_err(|source| Error::Chown {
            path: path.into(),
            uid,
            gid,
            source,
        })
    }
    fn mount_overlay(&self, overlay: &Overlay) -> Result<()> {
        let options = overlay.options()?;
        self.step(format!("mount_overlay {}", overlay.target.display())).map_err(|source| Error::MountOverlay {
            target: overlay.target.clone(),
            options,
            source,
        })
    }
    fn mount_fs_in_tree(
        &self,
        at: InTree,
        fstype: &'static str,
        source: &str,
        flags: MsFlags,
        data: &str,
    ) -> Result<()> {
        self.step(format!("{fstype}_in_tree {} {source} {flags:?} {data}", at.dst.display()))
            .map_err(|e| Error::MountFsInTree { fstype, dst: at.dst.into(), options: data.into(), source: e })
    }
    fn chown_in_tree(&self, at: InTree, owner: (u32, u32)) -> Result<()> {
        self.step(format!("chown_in_tree {} {}:{}", at.dst.display(), owner.0, owner.1))
            .map_err(|source| Error::ChownInTree { dst: at.dst.into(), uid: owner.0, gid: owner.1, source })
    }
    fn bind_in_tree(&self, from: &Path, at: InTree) -> Result<()> {
        self.step(format!("bind_in_tree {} {}", from.display(), at.dst.display())).map_err(|source| Error::BindInTree {
            from: from.into(),
            dst: at.dst.into(),
            source,
        })
    }
    fn restrict_in_tree(&self, at: InTree, flags: MsFlags) -> Result<()> {
        self.step(format!("restrict_in_tree {} {flags:?}", at.dst.display()))
            .map_err(|source| Error::RestrictInTree { dst: at.dst.into(), source })
    }
    fn unmount(&self, target: &Path) -> Result<()> {
        self.step(format!("unmount {}", target.display()))
            .map_err(|source| Error::Unmount { target: target.into(), source })
    }
    fn mounts_under(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        self.step(format!("mounts_under {}", dir.display())).map_err(|e| Error::ReadMountinfo(self.io(e)))?;
        Ok(self.mounts.borrow().iter().filter(|m| m.starts_with(dir)).cloned().collect())
    }
    fn kill(&self, pid: i32, signal: Signal) -> Result<()> {
        self.step(format!("kill {pid} {signal}")).map_err(|source| Error::Kill { pid, signal, source })
    }
    fn remove_dir(&self, dir: &Path) -> Result<()> {
        self.step(format!("remove_dir {}", dir.display()))
            .map_err(|e| Error::RemoveDir { path: dir.into(), source: self.io(e) })
    }
    fn remove_tree(&self, dir: &Path) -> Result<()> {
        self.step(format!("remove_tree {}", dir.display()))
            .map_err(|e| Error::RemoveTree { path: dir.into(), source: self.io(e) })
    }
    fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        self.step(format!("rename {} {}", from.display(), to.display())).map_err(|e| Error::Rename {
            from: from.into(),
            to: to.into(),
            source: self.io(e),
        })
    }
    /// Claims the first id of the range.
    fn claim_disk_quota(&self, dir: &Path, quota: &DiskQuota) -> Result<u32> {
        let id = *quota::PROJECT_IDS.start();
        self.step(format!("claim_disk_quota {} {}", dir.display(), quota.bytes)).map_err(|source| Error::QuotaSet {
            dir: dir.into(),
            id,
            source,
        })?;
        Ok(id)
    }
    fn release_disk_quota(&self, dir: &Path, id: u32) -> Result<()> {
        self.step(format!("release_disk_quota {} {id}", dir.display())).map_err(|source| Error::QuotaSet {
            dir: dir.into(),
            id,
            source,
        })
    }
    fn probe_project_quota(&self, dir: &Path) -> Result<()> {
        self.step(format!("probe_project_quota {}", dir.display()))
            .map_err(|source| Error::QuotaProbe { dir: dir.into(), source })
    }
    /// Fails as a filesystem with quotas off.
    fn probe_btrfs_quota(&self, dir: &Path) -> Result<()> {
        self.step(format!("probe_btrfs_quota {}", dir.display())).map_err(|_| Error::BtrfsQuotaOff { dir: dir.into() })
    }
    /// The first subvolume id btrfs gives (256), made as a plain dir.
    fn create_quota_subvolume(&self, dir: &Path, bytes: u64) -> Result<u64> {
        self.step(format!("create_quota_subvolume {} {bytes}", dir.display()))
            .map_err(|source| Error::BtrfsSubvolCreate { dir: dir.into(), source })?;
        std::fs::create_dir(dir)
            .map_err(|e| Error::BtrfsSubvolCreate { dir: dir.into(), source: error::errno_of(&e) })?;
        Ok(256)
    }
    /// A watch that never sees a new address.
    fn watch_host_addresses(&self, ipv6: bool) -> Result<Box<dyn address_watch::HostAddresses>> {
        let v6 = if ipv6 { " ipv6" } else { "" };
        self.step(format!("watch_host_addresses{v6}")).map_err(Error::WatchAddresses)?;
        Ok(Box::new(QuietWatch(self.steps.clone())))
    }
    /// A veth job gets the pool's third address.
    fn adopt_network(&self, _ready: OwnedFd, _sysfs: &Path) -> Result<net::Made> {
        self.step("adopt_network loopback".into()).map_err(Error::UnshareNetNs)?;
        Ok(net::Made::default())
    }
    fn isolate_network(&self, setup: &net::Setup, _sysfs: &Path) -> Result<net::Made> {
        let what = match setup {
            net::Setup::Loopback => "loopback".to_string(),
            net::Setup::Veth(v) => format!("veth {}", v.host_name),
            net::Setup::Pasta(_) => "pasta".to_string(),
        };
        self.step(format!("isolate_network {what}")).map_err(Error::UnshareNetNs)?;
        Ok(match setup {
            net::Setup::Veth(v) => {
                let mut made = net::Made::default();
                made.address = Some(v.pool.nth(2));
                made.address6 = v.v6.as_ref().map(|v6| v6.address(v.pool.nth(2)));
                made
            }
            net::Setup::Pasta(_) => {
                let mut made = net::Made::default();
                made.pasta_pid = Some(RECORDED_PASTA);
                made
            }
            _ => net::Made::default(),
        })
    }
    fn enter_network(&self, _made: &mut net::Made) -> Result<()> {
        self.step("enter_network".into()).map_err(Error::EnterNetns)
    }
    fn finish_network(&self, _made: &mut net::Made) -> Result<()> {
        self.step("finish_network".into()).map_err(|e| Error::ConfigureVeth(e.to_string()))
    }
    fn leave_network(&self, _made: &mut net::Made) -> Result<()> {
        self.step("leave_network".into()).map_err(Error::LeaveNetns)
    }
    /// Makes `dir/sys`, as the tmpfs would hold it.
    fn mount_job_net_dir(&self, dir: &Path) -> Result<()> {
        self.step(format!("mount_job_net_dir {}", dir.display()))
            .map_err(|source| Error::MountTmpfs { dir: dir.into(), source })?;
        let _ = std::fs::create_dir_all(dir.join("sys"));
        Ok(())
    }
    fn mount_cache_dir(&self, dir: &Path) -> Result<()> {
        self.step(format!("mount_cache_dir {}", dir.display()))
            .map_err(|source| Error::MountCacheDir { dir: dir.into(), source })
    }
    fn give_dir(&self, dir: &Path, uid: u32, gid: u32) -> Result<()> {
        self.step(format!("give_dir {} {uid}:{gid}", dir.display())).map_err(|e| Error::GiveDir {
            path: dir.into(),
            uid,
            gid,
            source: self.io(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorder_fails_exactly_the_call_it_was_told_to() {
        let r = Recorder::failing_at(1, Errno::ENOSPC);
        r.private_mount_namespace().unwrap();
        let e = r.remove_tree(Path::new("/j")).unwrap_err();
        assert!(matches!(e, Error::RemoveTree { .. }) && e.is_disk_full(), "{e}");
        r.unmount(Path::new("/j/merged")).unwrap();
        assert_eq!(r.calls(), ["private_mount_namespace", "remove_tree /j", "unmount /j/merged"]);
        r.mounts.borrow_mut().extend(["/j/merged".into(), "/other".into()]);
        assert_eq!(r.mounts_under(Path::new("/j")).unwrap(), [PathBuf::from("/j/merged")]);
    }
}
