//! The job's cgroup, set up by the helper itself before libcontainer runs: created in
//! every hierarchy, limits (and, as root on cgroup v1, device rules) written, the helper
//! moved in, so the job's processes are born there. Planned here ([`plan_join`], pure),
//! done by `Sys::join_cgroup`. libcontainer then sees only a private
//! cgroup2 view rooted at the job (`Sys::hide_cgroupfs`).
//!
//! Why not libcontainer's own cgroup manager:
//! - rootless, its v1 manager always writes `devices.allow` (host root only) and joins
//!   every hierarchy;
//! - as root, it re-reads mountinfo through its hardened procfs once per controller, on
//!   create and again on delete: 24 reads, about a fifth of a whole `exec` cycle in the
//!   profile. Here the host is read once.
//!
//! The helper stays in the job's cgroup while the job runs: it counts as one process
//! towards the pids limit, and its few MB of memory towards the memory limit.
//!
//! On a cgroup v2 host the helper joins the leaf [`HELPER_LEAF`] of the job's cgroup, and
//! the limits are on the job's cgroup above it. libcontainer, in the view rooted at the
//! helper's cgroup, enables every controller it finds in its root and moves the job's
//! init into a child: in the job's cgroup itself that made it a thread root (the
//! threaded controllers, pids and cpu, may be enabled beside a process) and the child an
//! invalid domain (EOPNOTSUPP: no job could start). In the leaf no controller is
//! available, so there is nothing to enable. (The hybrid host's cgroup2 tree has no
//! controllers at all; v1 hierarchies have no such rule.)

use super::plan::Limits;
use crate::rootless::cgroups::CgroupHost;
use crate::sys::{CgroupDir, CgroupJoin};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// The leaf of a job's cgroup the helper joins on a cgroup v2 host (see above).
pub const HELPER_LEAF: &str = "sandbox";

/// CFS period used for `--cpus`.
const CPU_PERIOD_US: u64 = 100_000;

/// Controllers a job's v2 cgroup needs from its ancestors.
const V2_CONTROLLERS: [&str; 3] = ["+memory", "+pids", "+cpu"];

/// Who sets the cgroup up, which decides what besides the limits is set up.
#[derive(Debug, Clone)]
pub enum Setup {
    /// In a user namespace: no device rules (they can be neither written nor needed: a
    /// user namespace cannot create device nodes, so access is limited to the nodes bound
    /// in), and only the delegated hierarchies (the devices one is never delegated).
    Rootless,
    /// As root: `device_rules` as `devices.allow` lines (cgroup v1; everything else is
    /// denied first; on v2 device rules are an eBPF program, not written here). On a
    /// hybrid host the job's dir in the cgroup2 tree is joined too: the helper's private
    /// cgroup2 view, where libcontainer puts the job's init, is then the job's own dir
    /// and not shared with anyone.
    Root { device_rules: Vec<String> },
}

/// The cgroup-move window of one `exec` (see `sys::move_window`): held open from the
/// command line's first steps until the job's own moves are made, so that they do not
/// wait for a grace period of their own. Hold it until the job is done: its drop stops
/// and reaps what it started.
#[derive(Debug)]
pub enum MoveWindow {
    /// The keeper (x86_64).
    Kept(crate::sys::move_window::MoveWindow),
    /// Elsewhere: one move, in a grandchild, that starts the grace period (see
    /// `sys::cgroup::start_move_grace_period`); the middle child is reaped on drop.
    Started(crate::sys::cgroup::MiddleChild),
}

/// A window opened early, by [`open_move_window_early`], for the `exec` to take.
static EARLY: std::sync::Mutex<Option<MoveWindow>> = std::sync::Mutex::new(None);

/// Opens the window as soon as the command line knows it will make a sandbox (root mode:
/// it is known right after the mode), before it plans the job: the grace period then
/// runs while it plans. [`move_window`] takes it.
pub fn open_move_window_early(host: &CgroupHost, rootless: bool) {
    let window = open_move_window(host, rootless);
    *EARLY.lock().unwrap_or_else(|e| e.into_inner()) = window;
}

/// The window opened early, or one opened now. Root mode on a host with a cgroup2
/// hierarchy (the helper's own cgroup set-up); elsewhere none. Best effort: a window
/// that cannot be opened costs the job only the wait it would have saved.
pub fn move_window(host: &CgroupHost, rootless: bool) -> Option<MoveWindow> {
    let early = EARLY.lock().unwrap_or_else(|e| e.into_inner()).take();
    early.or_else(|| open_move_window(host, rootless))
}

fn open_move_window(host: &CgroupHost, rootless: bool) -> Option<MoveWindow> {
    if rootless {
        return None;
    }
    let procs = host.own_v2_procs()?;
    match crate::sys::move_window::hold(&procs) {
        Ok(Some(kept)) => Some(MoveWindow::Kept(kept)),
        Ok(None) => crate::sys::cgroup::start_move_grace_period(&procs).ok().flatten().map(MoveWindow::Started),
        Err(e) => {
            tracing::debug!("no cgroup-move window for this job: {e}");
            None
        }
    }
}

/// The files to write in one cgroup dir, in order, for `limits` (v1 or v2 names).
pub fn limit_writes(limits: &Limits, v2: bool, hierarchy: &str) -> Vec<(Cow<'static, str>, String)> {
    let quota = limits.cpus_milli.map(|m| (m * CPU_PERIOD_US / 1000).max(1000));
    let mut w: Vec<(Cow<'static, str>, String)> = vec![];
    if v2 {
        if let Some(b) = limits.memory_bytes {
            w.push(("memory.max".into(), b.to_string()));
            w.push(("memory.swap.max".into(), "0".to_string()));
        }
        if let Some(p) = limits.pids {
            w.push(("pids.max".into(), p.to_string()));
        }
        if let Some(q) = quota {
            w.push(("cpu.max".into(), format!("{q} {CPU_PERIOD_US}")));
        }
        w.extend(huge_page_writes(limits, "max", "rsvd.max"));
        return w;
    }
    let has = |c: &str| hierarchy.split(',').any(|h| h == c);
    if let (Some(b), true) = (limits.memory_bytes, has("memory")) {
        // Memory + swap at the same value: no swap beyond the limit (cgroup v2's
        // memory.swap.max = 0). Skipped by the join where the kernel does not account
        // swap (no such file); the start line says so where the node has swap.
        w.push(("memory.limit_in_bytes".into(), b.to_string()));
        w.push(("memory.memsw.limit_in_bytes".into(), b.to_string()));
    }
    if let (Some(b), true) = (limits.socket_bytes, has("memory")) {
        // TCP and UDP buffers, charged to nothing else on v1 (see limits::defaults).
        w.push(("memory.kmem.tcp.limit_in_bytes".into(), b.to_string()));
    }
    if let (Some(p), true) = (limits.pids, has("pids")) {
        w.push(("pids.max".into(), p.to_string()));
    }
    if let (Some(q), true) = (quota, has("cpu")) {
        w.push(("cpu.cfs_period_us".into(), CPU_PERIOD_US.to_string()));
        w.push(("cpu.cfs_quota_us".into(), q.to_string()));
    }
    if has("hugetlb") {
        w.extend(huge_page_writes(limits, "limit_in_bytes", "rsvd.limit_in_bytes"));
    }
    w
}

/// The hugetlb controller's files for each page size: the pages a job faults in
/// (`hugetlb.<size>.<limit>`) and those it reserves at `mmap` (`<rsvd>`, Linux 5.7, the
/// only kernels a limit is planned on): with both at the limit an `mmap` past it fails
/// with ENOMEM, instead of a SIGBUS at the first touch of a page.
fn huge_page_writes(limits: &Limits, limit: &str, rsvd: &str) -> Vec<(Cow<'static, str>, String)> {
    let Some(h) = limits.huge_pages else { return vec![] };
    h.sizes
        .cgroup_names()
        .flat_map(|size| [limit, rsvd].map(|f| (Cow::Owned(format!("hugetlb.{size}.{f}")), h.bytes.to_string())))
        .collect()
}

/// One cgroup dir of the job: where, in which hierarchy (its mount; its v1 mount dir's
/// name, "" for v2), and whether limits apply there (not in the controller-less v2 tree
/// of a hybrid host).
struct JobDir {
    dir: PathBuf,
    mount: PathBuf,
    hierarchy: String,
    v2: bool,
    limits: bool,
}

/// The dirs of `cgroup` (relative to the cgroup root) the job uses on this host.
fn job_dirs(host: &CgroupHost, cgroup: &Path, setup: &Setup) -> Vec<JobDir> {
    let rel = cgroup.strip_prefix("/").unwrap_or(cgroup);
    if host.unified {
        let mount = host.root.clone();
        return vec![JobDir { dir: mount.join(rel), mount, hierarchy: String::new(), v2: true, limits: true }];
    }
    let mut dirs: Vec<JobDir> = host
        .v1_mounts
        .iter()
        .filter(|m| matches!(setup, Setup::Root { .. }) || !crate::rootless::cgroups::root_only_v1(m))
        .map(|m| JobDir {
            dir: m.join(rel),
            mount: m.clone(),
            hierarchy: m.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            v2: false,
            limits: true,
        })
        .collect();
    if let (Setup::Root { .. }, Some(v2)) = (setup, &host.v2_mount) {
        dirs.push(JobDir { dir: v2.join(rel), mount: v2.clone(), hierarchy: String::new(), v2: true, limits: false });
    }
    dirs
}

/// What joining `cgroup` (relative to the cgroup root) means on this host: the dir in
/// every hierarchy the job uses, the device rules and limits to write there, and (v2)
/// the ancestors that must pass the controllers down. Done by [`crate::sys::Sys::join_cgroup`],
/// which moves the calling process in last.
pub fn plan_join(host: &CgroupHost, cgroup: &Path, limits: &Limits, setup: &Setup) -> CgroupJoin {
    let mut join = CgroupJoin::default();
    if host.unified {
        // Every ancestor must pass the controllers down. Levels that are not ours (above
        // a delegated subtree) or that already do are left as they are.
        let rel = cgroup.strip_prefix("/").unwrap_or(cgroup);
        let mut at = host.root.clone();
        join.v2_levels.push(at.clone());
        for part in rel.parent().into_iter().flat_map(|p| p.components()) {
            at.push(part);
            join.v2_levels.push(at.clone());
        }
        join.v2_controllers = V2_CONTROLLERS.to_vec();
        if limits.huge_pages.is_some() {
            join.v2_controllers.push("+hugetlb");
        }
    }
    let dirs = job_dirs(host, cgroup, setup);
    if let Setup::Root { .. } = setup {
        // Where the helper goes back once the job's init is started (see
        // `Sys::leave_cgroup`): all of its cgroups, or it stays.
        join.back = dirs.iter().map(|d| host.own_dir(&d.mount)).collect::<Option<Vec<_>>>().unwrap_or_default();
    }
    for d in dirs {
        let devices = d.hierarchy.split(',').any(|h| h == "devices");
        let device_rules = match setup {
            Setup::Root { device_rules } if devices => Some(device_rules.clone()),
            _ => None,
        };
        let limits = if d.limits { limit_writes(limits, d.v2, &d.hierarchy) } else { vec![] };
        let leaf = host.unified.then_some(HELPER_LEAF);
        join.dirs.push(CgroupDir { cpuset: d.hierarchy.contains("cpuset"), dir: d.dir, device_rules, leaf, limits });
    }
    join
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Limit writes as (file, value) pairs of plain strings, to compare.
    fn plain<'a>(w: &'a [(Cow<'static, str>, String)]) -> Vec<(&'a str, &'a str)> {
        w.iter().map(|(f, v)| (f.as_ref(), v.as_str())).collect()
    }

    #[test]
    fn limit_files_per_hierarchy() {
        let l = Limits { memory_bytes: Some(64 << 20), pids: Some(100), cpus_milli: Some(1500), ..Default::default() };
        let mem = (64u64 << 20).to_string();
        assert_eq!(
            plain(&limit_writes(&l, false, "memory")),
            [("memory.limit_in_bytes", mem.as_str()), ("memory.memsw.limit_in_bytes", &mem)],
            "memory, then memory + swap at the same value (in this order: memsw may not be below it)"
        );
        assert_eq!(plain(&limit_writes(&l, false, "pids")), [("pids.max", "100")]);
        assert_eq!(
            plain(&limit_writes(&l, false, "cpu,cpuacct")),
            [("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "150000")]
        );
        assert!(limit_writes(&l, false, "cpuacct").is_empty());
        assert!(limit_writes(&l, false, "blkio").is_empty());
        let v2 = limit_writes(&l, true, "");
        assert_eq!(
            v2.iter().map(|(f, _)| f.as_ref()).collect::<Vec<_>>(),
            ["memory.max", "memory.swap.max", "pids.max", "cpu.max"]
        );
        assert_eq!(v2[3].1, "150000 100000");
        assert!(limit_writes(&Limits::default(), true, "").is_empty());
        let sockets = Limits { socket_bytes: Some(32 << 20), ..l };
        assert_eq!(
            plain(&limit_writes(&sockets, false, "memory"))[2],
            ("memory.kmem.tcp.limit_in_bytes", (32u64 << 20).to_string().as_str()),
            "socket buffers: v1 only"
        );
        assert_eq!(limit_writes(&sockets, true, "").len(), 4, "v2: in memory.max");
    }

    fn hybrid() -> CgroupHost {
        CgroupHost {
            unified: false,
            v1_mounts: ["cpu,cpuacct", "devices", "memory"].map(|m| PathBuf::from("/cg").join(m)).to_vec(),
            root: "/cg".into(),
            own_v2: None,
            own_v1: vec![],
            v2_mount: Some("/cg/unified".into()),
        }
    }

    fn names(dirs: &[JobDir]) -> Vec<String> {
        dirs.iter().map(|d| format!("{}{}", d.dir.display(), if d.limits { "" } else { " (no limits)" })).collect()
    }

    #[test]
    fn rootless_skips_devices_hugetlb_and_the_v2_tree() {
        let mut host = hybrid();
        host.v1_mounts.push("/cg/hugetlb".into());
        host.v1_mounts.push("/cg/net_cls,hugetlb".into());
        let d = job_dirs(&host, Path::new("/a/j"), &Setup::Rootless);
        assert_eq!(names(&d), ["/cg/cpu,cpuacct/a/j", "/cg/memory/a/j"]);
        let root = job_dirs(&host, Path::new("/a/j"), &Setup::Root { device_rules: vec![] });
        assert!(names(&root).contains(&"/cg/hugetlb/a/j".to_string()), "root: its limit");
    }

    #[test]
    fn huge_pages_limited_per_size_with_their_reservations() {
        use crate::sandbox::plan::{HugePageSizes, HugePages};
        let sizes = HugePageSizes::of([2048, 1 << 20]);
        let l = Limits { huge_pages: Some(HugePages { bytes: 0, sizes }), pids: Some(9), ..Default::default() };
        assert_eq!(
            plain(&limit_writes(&l, false, "hugetlb")),
            [
                ("hugetlb.2MB.limit_in_bytes", "0"),
                ("hugetlb.2MB.rsvd.limit_in_bytes", "0"),
                ("hugetlb.1GB.limit_in_bytes", "0"),
                ("hugetlb.1GB.rsvd.limit_in_bytes", "0")
            ]
        );
        assert_eq!(plain(&limit_writes(&l, false, "pids")), [("pids.max", "9")], "v1: in its own hierarchy only");
        let v2 = limit_writes(&l, true, "");
        assert_eq!(
            plain(&v2)[1..],
            [
                ("hugetlb.2MB.max", "0"),
                ("hugetlb.2MB.rsvd.max", "0"),
                ("hugetlb.1GB.max", "0"),
                ("hugetlb.1GB.rsvd.max", "0")
            ]
        );
        // v2: the controller passed down only where a limit is planned (it is there).
        let unified = CgroupHost { unified: true, v1_mounts: vec![], v2_mount: Some("/cg".into()), ..hybrid() };
        let setup = Setup::Root { device_rules: vec![] };
        let j = plan_join(&unified, Path::new("/a/j"), &l, &setup);
        assert_eq!(j.v2_controllers, ["+memory", "+pids", "+cpu", "+hugetlb"]);
        let none = Limits { huge_pages: None, ..l };
        assert_eq!(plan_join(&unified, Path::new("/a/j"), &none, &setup).v2_controllers.len(), 3);
    }

    #[test]
    fn root_joins_devices_and_the_hybrid_v2_tree_without_limits() {
        let setup = Setup::Root { device_rules: vec!["c 1:3 rwm".into()] };
        let d = job_dirs(&hybrid(), Path::new("/a/j"), &setup);
        assert_eq!(
            names(&d),
            ["/cg/cpu,cpuacct/a/j", "/cg/devices/a/j", "/cg/memory/a/j", "/cg/unified/a/j (no limits)"]
        );
        let v2 = CgroupHost { unified: true, v1_mounts: vec![], v2_mount: Some("/cg".into()), ..hybrid() };
        assert_eq!(names(&job_dirs(&v2, Path::new("/a/j"), &setup)), ["/cg/a/j"]);
    }

    #[test]
    fn a_join_plan_per_host() {
        let limits = Limits { memory_bytes: Some(1 << 20), ..Default::default() };
        let setup = Setup::Root { device_rules: vec!["c 1:3 rwm".into()] };
        let j = plan_join(&hybrid(), Path::new("/a/j"), &limits, &setup);
        assert!(j.v2_levels.is_empty(), "v1 hierarchies pass nothing down");
        let dev = j.dirs.iter().find(|d| d.dir == Path::new("/cg/devices/a/j")).unwrap();
        assert_eq!(dev.device_rules.as_deref(), Some(&["c 1:3 rwm".to_string()][..]));
        let mem = j.dirs.iter().find(|d| d.dir == Path::new("/cg/memory/a/j")).unwrap();
        assert_eq!((mem.device_rules.as_ref(), mem.limits.len()), (None, 2));
        let v2 = j.dirs.iter().find(|d| d.dir == Path::new("/cg/unified/a/j")).unwrap();
        assert!(v2.limits.is_empty(), "the hybrid v2 tree has no controllers");
        let unified = CgroupHost { unified: true, v1_mounts: vec![], v2_mount: Some("/cg".into()), ..hybrid() };
        let j = plan_join(&unified, Path::new("/a/b/j"), &limits, &Setup::Rootless);
        assert_eq!(j.v2_levels, [PathBuf::from("/cg"), "/cg/a".into(), "/cg/a/b".into()]);
        assert_eq!(j.v2_controllers, ["+memory", "+pids", "+cpu"]);
        assert_eq!(plain(&j.dirs[0].limits), [("memory.max", "1048576"), ("memory.swap.max", "0")]);
        assert_eq!(j.dirs[0].leaf, Some(HELPER_LEAF), "v2: the limits above, the helper in the leaf");
        let hybrid = plan_join(&hybrid(), Path::new("/a/j"), &limits, &setup);
        assert!(hybrid.dirs.iter().all(|d| d.leaf.is_none()), "v1 and the controller-less v2 tree: the dir itself");
    }

    #[test]
    fn a_root_helper_goes_back_to_its_own_cgroups_only_where_it_knows_all() {
        let setup = Setup::Root { device_rules: vec![] };
        let own = |v1: &[&str]| CgroupHost {
            own_v2: Some("/user.slice".into()),
            own_v1: v1.iter().map(|c| (c.to_string(), PathBuf::from("/svc"))).collect(),
            ..hybrid()
        };
        let all = own(&["cpu,cpuacct", "devices", "memory"]);
        let j = plan_join(&all, Path::new("/a/j"), &Limits::default(), &setup);
        let back: Vec<String> = j.back.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(back, ["/cg/cpu,cpuacct/svc", "/cg/devices/svc", "/cg/memory/svc", "/cg/unified/user.slice"]);
        let some = own(&["cpu,cpuacct", "memory"]);
        assert!(plan_join(&some, Path::new("/a/j"), &Limits::default(), &setup).back.is_empty(), "devices unknown");
        let rootless = plan_join(&all, Path::new("/a/j"), &Limits::default(), &Setup::Rootless);
        assert!(rootless.back.is_empty(), "a rootless helper stays: its own cgroup may not be its to move into");
    }
}
