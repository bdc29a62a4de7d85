//! The mounts the helper makes in the job's tree itself, before libcontainer creates the
//! container: `/dev`, `/dev/shm`, `/dev/pts`, `/dev/mqueue` (of the IPC namespace the
//! helper made for the job), `/tmp`, the job's own `/sys`, `/etc/resolv.conf`,
//! `/etc/hosts` and the init.
//!
//! Why not in the spec: libcontainer 0.7 puts every mount of the spec through pathrs'
//! procfs checks, ~50 system calls and ~0.1 ms per mount in the job's init, all of it on
//! the path from `exec` to the job's first instruction. Here each is one mount (two for a
//! read-only bind) on a target resolved inside the tree ([`inroot`]: `openat2` with
//! `RESOLVE_IN_ROOT`, so a symlink in the image leads inside it as it does for the
//! runtime), ~20 us.
//!
//! Behind the jobs' seccomp filter, which refuses them mount(2) anyway, they also hold
//! better where the job has a user namespace of its own (the default): made in the
//! helper's mount namespace, they reach the job's through libcontainer's recursive bind
//! of the tree and its unshare from the job's user namespace, which locks them: the job's
//! root could not unmount them or make a read-only bind writable, nor remount `/tmp` and
//! `/dev/shm` past their size (each tmpfs belongs to the helper's user namespace, not the
//! job's). With `--userns host` (or rootless in the process's own namespace) seccomp and
//! the job's capabilities alone keep them, as before.
//!
//! In a user namespace the device nodes of the job's GPUs are bound here too.
//!
//! What stays in the spec: `/proc` (it shows the pid namespace of whoever mounts it, and
//! libcontainer makes that namespace), a `/sys` without a network namespace
//! of the job's own, nodes made with mknod (no user namespace), volumes and the edits'
//! binds (recursive, read-only below too: libcontainer's `rro`), the scratch dir and
//! caches.

use super::inroot;
use super::plan::JobPlan;
use crate::sys::{InTree, MsFlags, Sys};
use anyhow::{Context, Result};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// What goes on a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// A new filesystem of `fstype`: `source` names it in the mount table, `data` its
    /// options (a tmpfs's mode, size and owner).
    Fs { fstype: &'static str, source: &'static str, data: String },
    /// A bind of the host's `from` (a dir when `dir`), then remounted with the flags.
    Bind { from: PathBuf, dir: bool },
}

impl What {
    /// A new filesystem whose root is given to the job's root after the mount: a tmpfs is
    /// its by the options (uid=/gid=); devpts and mqueue have none for their root, which
    /// is then whoever mounted them, the helper.
    pub fn chowned(&self) -> bool {
        matches!(self, What::Fs { fstype, .. } if *fstype != "tmpfs")
    }
}

/// One mount at `dst` (a path in the job) with `flags`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeMount {
    pub dst: PathBuf,
    pub what: What,
    pub flags: MsFlags,
}

fn tmpfs(dst: &str, source: &'static str, flags: MsFlags, data: String) -> TreeMount {
    TreeMount { dst: dst.into(), what: What::Fs { fstype: "tmpfs", source, data }, flags }
}

fn bind_ro(from: &Path, dst: &str, dir: bool, extra: MsFlags) -> TreeMount {
    let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | extra;
    TreeMount { dst: dst.into(), what: What::Bind { from: from.into(), dir }, flags }
}

/// The mounts, in the order they are made. `owner`: the host ids (the helper's, rootless)
/// of the job's root, whose the tmpfs roots are, as if the job had mounted them.
pub fn list(plan: &JobPlan, owner: (u32, u32)) -> Result<Vec<TreeMount>> {
    let init = plan.init()?;
    let ids = format!("uid={},gid={}", owner.0, owner.1);
    let shm_size = plan.limits.shm_bytes.map(|b| format!("size={b}")).unwrap_or_else(|| "size=1g".into());
    let tmp_size = plan.limits.tmp_bytes.map(|b| format!(",size={b}")).unwrap_or_default();
    let ptys = plan.limits.ptys.map(|n| format!(",max={n}")).unwrap_or_default();
    // In a user namespace every node in /dev is a bind of its own (libcontainer's and
    // ours), so its tmpfs can be nodev: mounted in the job's namespace, the kernel made it
    // so; mounted here, it would not be.
    let dev_flags = if plan.in_user_namespace() { MsFlags::MS_NODEV } else { MsFlags::empty() };
    let mut m = vec![
        tmpfs(
            "/dev",
            "tmpfs",
            MsFlags::MS_NOSUID | MsFlags::MS_STRICTATIME | dev_flags,
            format!("mode=755,size=65536k,{ids}"),
        ),
        tmpfs(
            "/dev/shm",
            "shm",
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC | MsFlags::MS_NODEV,
            format!("mode=1777,{shm_size},{ids}"),
        ),
        // The job's own pty instance (as runc and libcontainer mount it: ptys are the
        // opener's, /dev/ptmx links to its ptmx), not nodev: its nodes are the ptys. At
        // most its share of the node's (`max=`): every instance but the host's draws from
        // one count.
        TreeMount {
            dst: "/dev/pts".into(),
            what: What::Fs {
                fstype: "devpts",
                source: "devpts",
                data: format!("newinstance,ptmxmode=0666,mode=0620{ptys}"),
            },
            flags: MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        },
        // The queues of the job's IPC namespace, which the helper made for it (see
        // `Sys::own_ipc_namespace`): mqueue shows the namespace of whoever mounts it.
        TreeMount {
            dst: "/dev/mqueue".into(),
            what: What::Fs { fstype: "mqueue", source: "mqueue", data: String::new() },
            flags: MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC | MsFlags::MS_NODEV,
        },
    ];
    m.push(tmpfs("/tmp", "tmpfs", MsFlags::MS_NOSUID | MsFlags::MS_NODEV, format!("mode=1777{tmp_size},{ids}")));
    // Name resolution as on the host (the agent must reach Azure DevOps), or through the
    // job's gateway when the host's resolver is out of its reach (super::network).
    let resolv = plan.net.resolv_conf.as_deref().unwrap_or(Path::new("/etc/resolv.conf"));
    m.push(bind_ro(resolv, "/etc/resolv.conf", false, MsFlags::empty()));
    m.push(bind_ro(Path::new("/etc/hosts"), "/etc/hosts", false, MsFlags::empty()));
    // The job's pid 1 (see super::init): read-only, in the job's own /dev.
    m.push(bind_ro(init, super::init::PATH_IN_JOB, false, MsFlags::empty()));
    if plan.in_user_namespace() {
        // A user namespace cannot mknod: the host's node (its mode decides who may open
        // it), bound from where the host has it (--driver-root, CDI), not from its path
        // in the job. Not read-only: that would not stop writes to a device anyway.
        for node in &plan.edits.device_nodes {
            let flags = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
            m.push(TreeMount {
                dst: node.path.clone(),
                what: What::Bind { from: node.host_path.clone(), dir: false },
                flags,
            });
        }
    }
    // A /sys of the job's own network namespace (see super::network), last: see
    // [`split_off_network`]. Else the spec's.
    if let Some(sysfs) = &plan.net.sysfs {
        m.push(bind_ro(sysfs, "/sys", true, MsFlags::MS_NOEXEC));
    }
    Ok(m)
}

/// Takes out of `mounts` those that need the job's network namespace made: the bind of
/// its sysfs, which the child making the namespace mounts (see `sys::net::isolate`). The
/// helper makes the others while that child is still at work (~0.5 ms here), then waits
/// for it.
pub fn split_off_network(plan: &JobPlan, mounts: &mut Vec<TreeMount>) -> Vec<TreeMount> {
    let needs = |m: &TreeMount| matches!(&m.what, What::Bind { from, .. } if Some(from) == plan.net.sysfs.as_ref());
    let (network, rest): (Vec<_>, Vec<_>) = std::mem::take(mounts).into_iter().partition(needs);
    *mounts = rest;
    network
}

/// Makes `mounts` in the tree at `merged` (the job's overlay, in the helper's mount
/// namespace), creating their targets inside it where missing.
/// What it creates (mount points, missing dirs on the way) is `owner`'s, the job's root's,
/// as if the job had made it.
pub fn mount_all(merged: &Path, mounts: &[TreeMount], owner: (u32, u32), sys: &dyn Sys) -> Result<()> {
    for m in mounts {
        let target = || format!("cannot create the mount point {} in the sandbox", m.dst.display());
        match &m.what {
            What::Fs { fstype, source, data } => {
                let fd = inroot::open_dir_as(merged, &m.dst, owner).with_context(target)?;
                sys.mount_fs_in_tree(InTree { fd: fd.as_fd(), dst: &m.dst }, fstype, source, m.flags, data)?;
                if m.what.chowned() {
                    let root = inroot::open_existing(merged, &m.dst).with_context(target)?;
                    sys.chown_in_tree(InTree { fd: root.as_fd(), dst: &m.dst }, owner)?;
                }
            }
            What::Bind { from, dir } => {
                let fd = inroot::create_mount_target_as(merged, &m.dst, *dir, owner).with_context(target)?;
                sys.bind_in_tree(from, InTree { fd: fd.as_fd(), dst: &m.dst })?;
                // The bind's own root now: the flags go on it, not on what it covers.
                let root = inroot::open_existing(merged, &m.dst).with_context(target)?;
                sys.restrict_in_tree(InTree { fd: root.as_fd(), dst: &m.dst }, m.flags)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::Recorder;

    fn plan() -> JobPlan {
        let mut p = super::super::spec::tests::plan();
        p.limits.tmp_bytes = Some(64 << 20);
        p.limits.shm_bytes = Some(32 << 20);
        p
    }

    fn find<'a>(m: &'a [TreeMount], dst: &str) -> &'a TreeMount {
        m.iter().find(|m| m.dst == Path::new(dst)).unwrap_or_else(|| panic!("no {dst} in {m:?}"))
    }

    #[test]
    fn tmpfs_are_sized_from_the_limits_and_owned_by_the_jobs_root() {
        let m = list(&plan(), (100000, 100001)).unwrap();
        let data = |dst| match &find(&m, dst).what {
            What::Fs { data, .. } => data.clone(),
            w => panic!("{dst}: {w:?}"),
        };
        assert_eq!(data("/tmp"), format!("mode=1777,size={},uid=100000,gid=100001", 64 << 20));
        assert_eq!(data("/dev/shm"), format!("mode=1777,size={},uid=100000,gid=100001", 32 << 20));
        assert_eq!(data("/dev"), "mode=755,size=65536k,uid=100000,gid=100001");
        assert_eq!(find(&m, "/tmp").flags, MsFlags::MS_NOSUID | MsFlags::MS_NODEV);
        assert!(find(&m, "/dev/shm").flags.contains(MsFlags::MS_NOEXEC | MsFlags::MS_NODEV | MsFlags::MS_NOSUID));
        // No limits: the kernel's default for /tmp (half the RAM), 1 GiB for /dev/shm.
        let mut p = plan();
        (p.limits.tmp_bytes, p.limits.shm_bytes) = (None, None);
        let m = list(&p, (0, 0)).unwrap();
        assert!(matches!(&find(&m, "/tmp").what, What::Fs { data, .. } if data == "mode=1777,uid=0,gid=0"));
        assert!(matches!(&find(&m, "/dev/shm").what, What::Fs { data, .. } if data.contains("size=1g")));
    }

    #[test]
    fn the_jobs_ptys_and_message_queues_are_instances_of_its_own_on_its_dev() {
        let mut p = plan();
        p.limits.ptys = None;
        let m = list(&p, (0, 0)).unwrap();
        let pts = find(&m, "/dev/pts");
        let what = |fstype, data: &str| What::Fs { fstype, source: fstype, data: data.into() };
        assert_eq!(pts.what, what("devpts", "newinstance,ptmxmode=0666,mode=0620"));
        p.limits.ptys = Some(512);
        let limited = list(&p, (0, 0)).unwrap();
        assert_eq!(find(&limited, "/dev/pts").what, what("devpts", "newinstance,ptmxmode=0666,mode=0620,max=512"));
        // Its nodes are the ptys: nodev would make them unusable.
        assert_eq!(pts.flags, MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC);
        let mq = find(&m, "/dev/mqueue");
        assert_eq!(mq.what, what("mqueue", ""));
        assert_eq!(mq.flags, MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC | MsFlags::MS_NODEV);
        let pos = |dst: &str| m.iter().position(|m| m.dst == Path::new(dst)).unwrap();
        assert!(pos("/dev") < pos("/dev/pts") && pos("/dev") < pos("/dev/mqueue"), "on the job's /dev");
    }

    #[test]
    fn the_init_is_a_read_only_bind_in_the_jobs_dev_and_a_plan_without_it_has_none() {
        let m = list(&plan(), (0, 0)).unwrap();
        let init = find(&m, "/dev/.azp-init");
        assert_eq!(init.what, What::Bind { from: "/home/cache/init/azp-init-1".into(), dir: false });
        assert!(init.flags.contains(MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV));
        assert!(!init.flags.contains(MsFlags::MS_NOEXEC));
        let pos = |dst: &str| m.iter().position(|m| m.dst == Path::new(dst)).unwrap();
        assert!(pos("/dev") < pos("/dev/.azp-init"), "on the job's /dev, not under it");
        let mut p = plan();
        p.process.init = None;
        assert!(list(&p, (0, 0)).unwrap_err().to_string().contains("needs its init"));
    }

    #[test]
    fn device_nodes_are_bound_after_dev_only_in_a_user_namespace() {
        let mut p = plan();
        p.edits.device_nodes.push(super::super::spec::tests::nvidia1("/drv/dev/nvidia1"));
        // Without one, libcontainer makes the node (mknod, from the spec's devices).
        assert!(list(&p, (0, 0)).unwrap().iter().all(|m| m.dst != Path::new("/dev/nvidia1")));
        assert!(!find(&list(&p, (0, 0)).unwrap(), "/dev").flags.contains(MsFlags::MS_NODEV), "mknod'ed nodes");
        p.rootless = true;
        let m = list(&p, (0, 0)).unwrap();
        // Each node a bind of its own: /dev itself can be nodev, as in the job's namespace.
        assert!(find(&m, "/dev").flags.contains(MsFlags::MS_NODEV));
        let pos = |dst: &str| m.iter().position(|m| m.dst == Path::new(dst)).unwrap();
        assert!(pos("/dev") < pos("/dev/nvidia1"));
        assert_eq!(m[pos("/dev/nvidia1")].what, What::Bind { from: "/drv/dev/nvidia1".into(), dir: false });
    }

    #[test]
    fn resolv_conf_hosts_and_an_own_sysfs_are_read_only_binds() {
        let mut p = plan();
        let m = list(&p, (0, 0)).unwrap();
        assert!(m.iter().all(|m| m.dst != Path::new("/sys")), "the host's /sys is the spec's to bind");
        assert_eq!(find(&m, "/etc/resolv.conf").what, What::Bind { from: "/etc/resolv.conf".into(), dir: false });
        assert_eq!(find(&m, "/etc/hosts").what, What::Bind { from: "/etc/hosts".into(), dir: false });
        p.net.sysfs = Some("/run/j/bundle/sys".into());
        p.net.resolv_conf = Some("/run/j/bundle/resolv.conf".into());
        let m = list(&p, (0, 0)).unwrap();
        let sys = find(&m, "/sys");
        assert_eq!(sys.what, What::Bind { from: "/run/j/bundle/sys".into(), dir: true });
        assert!(sys.flags.contains(MsFlags::MS_RDONLY | MsFlags::MS_NOEXEC | MsFlags::MS_NODEV | MsFlags::MS_NOSUID));
        assert_eq!(
            find(&m, "/etc/resolv.conf").what,
            What::Bind { from: "/run/j/bundle/resolv.conf".into(), dir: false }
        );
        for dst in ["/etc/resolv.conf", "/etc/hosts"] {
            assert!(find(&m, dst).flags.contains(MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV));
        }
    }

    #[test]
    fn only_the_own_sysfs_waits_for_the_network_namespace() {
        let mut p = plan();
        let mut m = list(&p, (0, 0)).unwrap();
        let n = m.len();
        assert!(split_off_network(&p, &mut m).is_empty(), "host network: nothing to wait for");
        assert_eq!(m.len(), n);
        p.net.sysfs = Some("/run/j/bundle/sys".into());
        let mut m = list(&p, (0, 0)).unwrap();
        let all = m.len();
        let network = split_off_network(&p, &mut m);
        assert_eq!(network.iter().map(|m| m.dst.as_path()).collect::<Vec<_>>(), [Path::new("/sys")]);
        assert_eq!(m.len(), all - 1);
        assert!(m.iter().all(|m| m.dst != Path::new("/sys")));
    }

    #[test]
    fn targets_are_made_inside_the_tree_and_binds_restricted_after_they_land() {
        let t = tempfile::tempdir().unwrap();
        let (root, outside) = (t.path().join("root"), t.path().join("outside"));
        std::fs::create_dir_all(&outside).unwrap();
        // An image whose /etc leads to a host path: it resolves inside the tree.
        std::fs::create_dir_all(root.join(outside.strip_prefix("/").unwrap())).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("etc")).unwrap();
        let rec = Recorder::default();
        // What it makes is the job root's (as root: someone else's; otherwise our own).
        let me = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let owner = if me.0 == 0 { (7, 8) } else { me };
        let m = list(&plan(), owner).unwrap();
        mount_all(&root, &m, owner, &rec).unwrap();
        use std::os::unix::fs::MetadataExt;
        for made in [
            root.join("dev"),
            root.join("dev/shm"),
            root.join("dev/pts"),
            root.join("dev/mqueue"),
            root.join("dev/.azp-init"),
        ] {
            let md = std::fs::symlink_metadata(&made).unwrap();
            assert_eq!((md.uid(), md.gid()), owner, "{}", made.display());
        }
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing made outside the tree");
        let inside = root.join(outside.strip_prefix("/").unwrap());
        assert!(inside.join("hosts").is_file() && inside.join("resolv.conf").is_file(), "made inside instead");
        assert_eq!(std::fs::metadata(inside.join("hosts")).unwrap().uid(), owner.0);
        assert!(root.join("dev/shm").is_dir() && root.join("dev/.azp-init").is_file());
        let calls = rec.calls();
        let at = |p: &str| calls.iter().position(|c| c.starts_with(p)).unwrap_or_else(|| panic!("{p}: {calls:?}"));
        assert!(at("tmpfs_in_tree /dev tmpfs") < at("tmpfs_in_tree /dev/shm shm"));
        assert!(at("bind_in_tree /etc/hosts /etc/hosts") < at("restrict_in_tree /etc/hosts"));
        assert!(at("tmpfs_in_tree /dev/shm") < at("bind_in_tree /home/cache/init/azp-init-1 /dev/.azp-init"));
        // The job's ptys and queues are its own instances (in the spec before, see above),
        // their roots the job's root's as tmpfs's are by their options.
        assert!(at("tmpfs_in_tree /dev tmpfs") < at("devpts_in_tree /dev/pts devpts"));
        assert!(at("tmpfs_in_tree /dev tmpfs") < at("mqueue_in_tree /dev/mqueue mqueue"));
        for (fstype, dst) in [("devpts", "/dev/pts"), ("mqueue", "/dev/mqueue")] {
            let chown = format!("chown_in_tree {dst} {}:{}", owner.0, owner.1);
            assert_eq!(at(&chown), at(&format!("{fstype}_in_tree {dst} ")) + 1, "{calls:?}");
        }
        assert!(calls.iter().all(|c| !c.starts_with("chown_in_tree /dev ") && !c.starts_with("chown_in_tree /tmp")));
        assert_eq!(calls.len(), 5 + 2 + 2 * 3, "{calls:?}");
    }

    #[test]
    fn a_failed_mount_says_where_and_stops() {
        let t = tempfile::tempdir().unwrap();
        let rec = Recorder::failing_at(1, nix::errno::Errno::ENOSPC);
        let e = mount_all(t.path(), &list(&plan(), (0, 0)).unwrap(), (0, 0), &rec).unwrap_err();
        assert!(format!("{e:#}").contains("cannot mount a tmpfs on /dev/shm in the sandbox"), "{e:#}");
        assert_eq!(rec.calls().len(), 2);
    }
}
