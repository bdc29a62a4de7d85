//! Joining a job's cgroup: the writes into cgroupfs that `sandbox::cgroup` plans
//! ([`CgroupJoin`]), done in order: controllers passed down (v2), each dir created
//! (a v1 cpuset level gets its parent's cpus and mems), device rules, limits, and the
//! calling process moved in last, so that everything it forks is born limited.

use super::error::{Error, Result};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// Everything joining a job's cgroup writes, decided beforehand (see
/// `sandbox::cgroup::plan_join`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupJoin {
    /// cgroup v2: the levels from the cgroup root down to the job's parent. Each level
    /// below the root is created when missing, and each passes `v2_controllers` down
    /// (both best effort: levels above a delegated subtree are not ours).
    pub v2_levels: Vec<PathBuf>,
    pub v2_controllers: Vec<&'static str>,
    /// The job's dir in each hierarchy it uses.
    pub dirs: Vec<CgroupDir>,
    /// The cgroups the process is in before it enters, one in each hierarchy of `dirs`
    /// (see [`open_way_back`]); empty where it stays in the job's (rootless).
    pub back: Vec<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupDir {
    pub dir: PathBuf,
    /// In the v1 cpuset hierarchy: each new level needs its parent's cpus and mems
    /// before any task can join it.
    pub cpuset: bool,
    /// Some: the v1 devices hierarchy as root: deny everything, then allow these rules.
    pub device_rules: Option<Vec<String>>,
    /// The process joins `<dir>/<leaf>` (made here) instead of `<dir>` itself: on a
    /// cgroup v2 host, where the job's init must go below the helper's cgroup and a cgroup
    /// whose children get controllers may hold no process (see `sandbox::cgroup`).
    pub leaf: Option<&'static str>,
    /// Files and values, written in this order. `memory.swap.max` (v2) and
    /// `memory.memsw.limit_in_bytes` (v1) are skipped where the file is missing (swap
    /// accounting off: the memory limit alone is the limit), as are v1's
    /// `memory.kmem.tcp.limit_in_bytes` (a kernel that dropped it; the start line says so)
    /// (the hugetlb controller's reservation limits are required: see [`OPTIONAL_FILES`]).
    pub limits: Vec<(Cow<'static, str>, String)>,
}

/// The limit files that exist only where the kernel has the feature: swap accounted per
/// cgroup, socket buffers limited per cgroup v1. (The hugetlb controller's reservation
/// limits are not among them: a huge page limit is planned only on kernels that have
/// them, and without them a job could reserve a whole pool at `mmap` and hold it.)
const OPTIONAL_FILES: [&str; 3] = ["memory.swap.max", "memory.memsw.limit_in_bytes", "memory.kmem.tcp.limit_in_bytes"];

fn optional(file: &str) -> bool {
    OPTIONAL_FILES.contains(&file)
}

pub fn join(j: &CgroupJoin) -> Result<()> {
    prepare(j)?;
    enter(j)
}

/// Everything [`join`] does before the move: the dirs, device rules and limits. Anyone
/// may do it (an `exec` runner does it while its helper mounts the job's tree); the
/// process that then [`enter`]s is born into a cgroup that is already limited.
pub fn prepare(j: &CgroupJoin) -> Result<()> {
    for w in j.v2_levels.windows(2) {
        let _ = std::fs::create_dir(&w[1]);
        enable_v2_controllers(&w[0], &j.v2_controllers);
    }
    if let Some(last) = j.v2_levels.last() {
        enable_v2_controllers(last, &j.v2_controllers);
    }
    for d in &j.dirs {
        create_levels(&d.dir, d.cpuset)?;
        if let Some(rules) = &d.device_rules {
            write_device_rules(&d.dir, rules)?;
        }
        for (file, value) in &d.limits {
            let path = d.dir.join(file.as_ref());
            let written = if optional(file) {
                // Opened without O_CREAT: a file the kernel lacks is ENOENT, no stat first.
                match std::fs::OpenOptions::new().write(true).open(&path) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    opened => opened.and_then(|mut f| std::io::Write::write_all(&mut f, value.as_bytes())),
                }
            } else {
                std::fs::write(&path, value)
            };
            written.map_err(|source| Error::CgroupLimit { file: path, value: value.clone(), source })?;
        }
    }
    Ok(())
}

/// The rest of [`join`], once the dirs are [`prepare`]d: the calling process moves into
/// each (into its leaf, made here, where there is one).
pub fn enter(j: &CgroupJoin) -> Result<()> {
    enter_pid(j, std::process::id() as i32)
}

/// [`enter`] for process `pid` (one the caller may move: its own child, same owner).
pub fn enter_pid(j: &CgroupJoin, pid: i32) -> Result<()> {
    let me = pid.to_string();
    for d in &j.dirs {
        let dir = match d.leaf {
            Some(leaf) => {
                let dir = d.dir.join(leaf);
                match std::fs::create_dir(&dir) {
                    Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                        return Err(Error::CgroupCreate { dir, source: e });
                    }
                    _ => dir,
                }
            }
            None => d.dir.clone(),
        };
        let procs = dir.join("cgroup.procs");
        std::fs::write(&procs, &me).map_err(|source| Error::CgroupJoin { procs, source })?;
    }
    Ok(())
}

/// The `cgroup.procs` files of the cgroups a process came from, opened before it
/// entered a job's (see [`open_way_back`]): once the job's init is started, the process
/// goes back there ([`leave`]) and the job's cgroup holds the job alone, so the runner
/// may remove it while this process is still exiting.
#[derive(Debug, Default)]
pub struct WayBack {
    procs: Vec<(PathBuf, std::os::fd::OwnedFd)>,
}

/// Opens [`CgroupJoin::back`]'s `cgroup.procs` (write-only) while the host's cgroupfs is
/// still in view: the helper covers it with its own cgroup2 view after it enters.
pub fn open_way_back(j: &CgroupJoin) -> Result<WayBack> {
    let mut procs = Vec::with_capacity(j.back.len());
    for dir in &j.back {
        let path = dir.join("cgroup.procs");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|source| Error::CgroupWayBack { procs: path.clone(), source })?;
        procs.push((path, file.into()));
    }
    Ok(WayBack { procs })
}

/// Moves the calling process back into the cgroups of `back` ("0": the writer itself).
pub fn leave(back: WayBack) -> Result<()> {
    for (path, fd) in back.procs {
        std::io::Write::write_all(&mut std::fs::File::from(fd), b"0")
            .map_err(|source| Error::CgroupLeave { procs: path, source })?;
    }
    Ok(())
}

/// Moves the calling process into `dir` (made when missing): a delegated service's
/// manager into its leaf, before any job's cgroup passes controllers down from the
/// unit's (see `rootless::cgroups::service_cgroup`).
pub fn move_self_to(dir: &Path) -> Result<()> {
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(Error::CgroupCreate { dir: dir.to_path_buf(), source: e });
        }
        _ => {}
    }
    let procs = dir.join("cgroup.procs");
    std::fs::write(&procs, std::process::id().to_string()).map_err(|source| Error::CgroupJoin { procs, source })
}

/// Where the keeper of `sys::move_window` has no raw system calls (architectures other
/// than x86_64): starts, in a forked child, the wait that the first cgroup move after a
/// quiet spell makes, once, without holding the window open after it: every write to a
/// `cgroup.procs` takes the kernel's global cgroup_threadgroup_rwsem for writing, whose
/// rcu_sync waits for a normal RCU grace period unless a writer held it within about a
/// grace period before (5-15 ms here; none where cgroups are mounted `favordynmods`,
/// which this then costs only forks).
/// The writer moves itself into the cgroup it is already in (`procs`: that cgroup's
/// `cgroup.procs`, opened without O_CREAT) and exits: no process changes cgroups. A
/// move made while that wait is under way waits only for what is left of it, and one
/// within a grace period after it not at all: the job's own moves then overlap its
/// set-up instead of adding to it. The kernel holds cgroup_mutex meanwhile, so a cgroup
/// mkdir waits for the rest of it too: the cost moves, it is not added.
///
/// Two forks: the middle child forks the writer and exits at once (the writer,
/// reparented, is no zombie of ours for the job's whole life); the middle is reaped when
/// the returned [`MiddleChild`] drops, not waited for here: its fork and exit run on the
/// other CPU while this process goes on (~0.3 ms less on `exec`'s path). The writer
/// closes every fd first: it must not keep our stdout open (a reader waiting for its
/// end) or a lock alive after we exit. Best effort: a failed write costs nothing.
/// Ok(None): this process has threads, nothing forked.
pub fn start_move_grace_period(procs: &Path) -> Result<Option<MiddleChild>> {
    use super::process::{exit_now, fork_if_single_threaded, run_forked, Forked};
    let what = "the cgroup move's grace period";
    let procs = procs.to_path_buf();
    let middle = run_forked(what, procs, |procs| {
        if let Ok(Some(Forked::Child)) = fork_if_single_threaded(what) {
            // SAFETY: close_range(2) takes integers and closes this process's own fds;
            // this child uses none of them (it opens `procs` itself below).
            unsafe { libc::close_range(0, u32::MAX, 0) };
            let written = std::fs::OpenOptions::new()
                .write(true)
                .open(&procs)
                .and_then(|mut f| std::io::Write::write_all(&mut f, std::process::id().to_string().as_bytes()));
            exit_now(i32::from(written.is_err()));
        }
        0
    })?;
    Ok(middle.ok().map(|pid| MiddleChild { pid: pid.as_raw() }))
}

/// The middle child of [`start_move_grace_period`], reaped on drop: it exits right after
/// its fork, so the wait only collects its exit status.
#[must_use = "dropping it at once waits for the middle child"]
#[derive(Debug)]
pub struct MiddleChild {
    pid: i32,
}

impl Drop for MiddleChild {
    fn drop(&mut self) {
        let _ = super::process::wait_exit_status(self.pid);
    }
}

/// systemd marks a cgroup it delegates (`Delegate=yes`) with the xattr
/// `trusted.delegate=1` (v251+), and `user.delegate=1` too (v252+).
pub fn delegated(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return false };
    [c"trusted.delegate", c"user.delegate"].iter().any(|name| {
        let mut value = [0u8; 8];
        // SAFETY: getxattr writes at most `value.len()` bytes into `value`, a live local
        // buffer borrowed mutably for the call; `path` and `name` are NUL-terminated and
        // outlive it. The length it returns is checked before the bytes are read.
        let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
        n > 0 && value[..n as usize].starts_with(b"1")
    })
}

fn enable_v2_controllers(dir: &Path, controllers: &[&str]) {
    for c in controllers {
        let _ = std::fs::write(dir.join("cgroup.subtree_control"), c);
    }
}

/// Deny everything, then allow the job's rules. Done before any process is in the cgroup.
/// The kernel takes one rule per write(2): the rules go through one open `devices.allow`,
/// a write each (an open and a close less per rule, on every job's path).
fn write_device_rules(dir: &Path, rules: &[String]) -> Result<()> {
    use std::io::Write;
    let deny = dir.join("devices.deny");
    std::fs::write(&deny, "a").map_err(|source| Error::CgroupDenyDevices { file: deny, source })?;
    let allow = dir.join("devices.allow");
    let failed = |rule: &str, source| Error::CgroupAllowDevice { file: allow.clone(), rule: rule.to_string(), source };
    let Some(first) = rules.first() else { return Ok(()) };
    let mut file = std::fs::OpenOptions::new().write(true).open(&allow).map_err(|e| failed(first, e))?;
    for r in rules {
        // One write(2) per rule: a rule is a few bytes, far below a short write's size.
        let n = file.write(r.as_bytes()).map_err(|e| failed(r, e))?;
        if n != r.len() {
            return Err(failed(r, std::io::Error::other(format!("short write: {n} of {} bytes", r.len()))));
        }
    }
    Ok(())
}

/// mkdir -p of a job's cgroup. Retried: the teardown of another job of the same home
/// removes the (then empty) home level, possibly between our two mkdirs.
fn create_levels(dir: &Path, cpuset: bool) -> Result<()> {
    let mut tries = 0;
    loop {
        match create_levels_once(dir, cpuset) {
            Err(Error::CgroupCreate { source, .. }) if tries < 3 && source.kind() == std::io::ErrorKind::NotFound => {
                tries += 1
            }
            r => return r,
        }
    }
}

/// mkdir -p of a job's cgroup; every new v1 cpuset level gets its parent's cpus/mems.
fn create_levels_once(dir: &Path, cpuset: bool) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_levels_once(parent, cpuset)?;
    }
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(Error::CgroupCreate { dir: dir.to_path_buf(), source: e });
        }
        _ => {}
    }
    if cpuset {
        inherit_cpuset(dir)?;
    }
    Ok(())
}

/// A new v1 cpuset has empty cpus/mems, and no task can join it until they are set.
fn inherit_cpuset(dir: &Path) -> Result<()> {
    let err = |file: &Path, source| Error::CgroupCpuset { dir: dir.to_path_buf(), file: file.to_path_buf(), source };
    for f in ["cpuset.cpus", "cpuset.mems"] {
        let own = dir.join(f);
        if std::fs::read_to_string(&own).map(|s| s.trim().is_empty()).unwrap_or(true) {
            let parent = dir.parent().unwrap_or(Path::new("/")).join(f);
            let value = std::fs::read_to_string(&parent).map_err(|e| err(&parent, e))?;
            std::fs::write(&own, value.trim()).map_err(|e| err(&own, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A join of one v2 job dir `dir` with a `sandbox` leaf and one limit.
    fn one_v2_dir(dir: &Path, file: &'static str, value: &str) -> CgroupJoin {
        CgroupJoin {
            dirs: vec![CgroupDir {
                dir: dir.to_path_buf(),
                cpuset: false,
                device_rules: None,
                leaf: Some("sandbox"),
                limits: vec![(file.into(), value.into())],
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_files_a_kernel_may_lack_are_optional() {
        for f in ["memory.swap.max", "memory.memsw.limit_in_bytes", "memory.kmem.tcp.limit_in_bytes"] {
            assert!(optional(f), "{f}");
        }
        for f in
            ["memory.max", "hugetlb.2MB.max", "hugetlb.2MB.rsvd.max", "hugetlb.1GB.rsvd.limit_in_bytes", "pids.max"]
        {
            assert!(!optional(f), "{f}: a limit the plan counts on");
        }
    }

    #[test]
    fn a_v2_job_dir_gets_its_limits_and_the_process_joins_its_leaf() {
        let t = tempfile::tempdir().unwrap();
        let job = t.path().join("a/j");
        super::join(&one_v2_dir(&job, "memory.max", "1048576")).unwrap();
        assert_eq!(std::fs::read_to_string(job.join("memory.max")).unwrap(), "1048576", "the limit on the job dir");
        assert!(!job.join("cgroup.procs").exists(), "no process in the job dir itself");
        let me = std::process::id().to_string();
        assert_eq!(std::fs::read_to_string(job.join("sandbox/cgroup.procs")).unwrap(), me);
    }

    #[test]
    fn a_prepared_job_dir_has_its_limits_and_no_process_until_one_enters() {
        let t = tempfile::tempdir().unwrap();
        let job = t.path().join("a/j");
        let join = one_v2_dir(&job, "pids.max", "77");
        prepare(&join).unwrap();
        assert_eq!(std::fs::read_to_string(job.join("pids.max")).unwrap(), "77");
        assert!(!job.join("sandbox").exists(), "no leaf, no move: whoever prepares stays where it is");
        enter(&join).unwrap();
        assert_eq!(std::fs::read_to_string(job.join("sandbox/cgroup.procs")).unwrap(), std::process::id().to_string());
        // Entering a dir nobody prepared fails with the dir's name, and makes nothing.
        let none = CgroupJoin {
            dirs: vec![CgroupDir {
                dir: t.path().join("b/j"),
                cpuset: false,
                device_rules: None,
                leaf: None,
                limits: vec![],
            }],
            ..Default::default()
        };
        let e = enter(&none).unwrap_err().to_string();
        assert!(e.contains("b/j/cgroup.procs"), "{e}");
        assert!(!t.path().join("b").exists());
    }

    #[test]
    fn the_way_back_is_opened_before_and_written_at_the_leave() {
        let t = tempfile::tempdir().unwrap();
        let (cpu, mem) = (t.path().join("cpu/svc"), t.path().join("memory/svc"));
        for d in [&cpu, &mem] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("cgroup.procs"), "").unwrap();
        }
        let join = CgroupJoin { back: vec![cpu.clone(), mem.clone()], ..Default::default() };
        let back = open_way_back(&join).unwrap();
        // Opened now: the files may go out of view before the leave (the helper's own
        // cgroup2 view covers the host's tree).
        std::fs::rename(t.path().join("memory"), t.path().join("gone")).unwrap();
        leave(back).unwrap();
        assert_eq!(std::fs::read_to_string(cpu.join("cgroup.procs")).unwrap(), "0", "0: the writer itself");
        assert_eq!(std::fs::read_to_string(t.path().join("gone/svc/cgroup.procs")).unwrap(), "0");
        let missing = CgroupJoin { back: vec![t.path().join("no/such")], ..Default::default() };
        let e = open_way_back(&missing).unwrap_err();
        assert!(matches!(e, Error::CgroupWayBack { .. }) && e.to_string().contains("no/such/cgroup.procs"), "{e}");
        assert!(open_way_back(&CgroupJoin::default()).unwrap().procs.is_empty(), "nothing to go back to");
    }

    #[test]
    fn a_service_moves_itself_into_its_leaf() {
        let t = tempfile::tempdir().unwrap();
        let leaf = t.path().join("manager");
        move_self_to(&leaf).unwrap();
        assert_eq!(std::fs::read_to_string(leaf.join("cgroup.procs")).unwrap(), std::process::id().to_string());
        move_self_to(&leaf).unwrap(); // exists: joined all the same
        let e = move_self_to(&t.path().join("no/such/leaf")).unwrap_err();
        assert!(matches!(e, Error::CgroupCreate { .. }), "{e}");
        assert!(!delegated(t.path()), "a plain dir has no delegate xattr");
    }

    #[test]
    fn device_rules_deny_all_first() {
        let t = tempfile::tempdir().unwrap();
        // A plain dir stands in for a cgroup, whose files exist: the allow file then holds
        // the rules one after the other, one write each, through the one open file.
        std::fs::write(t.path().join("devices.allow"), "").unwrap();
        write_device_rules(t.path(), &["c 1:3 rwm".into(), "c 136:* rwm".into()]).unwrap();
        assert_eq!(std::fs::read_to_string(t.path().join("devices.deny")).unwrap(), "a");
        assert_eq!(std::fs::read_to_string(t.path().join("devices.allow")).unwrap(), "c 1:3 rwmc 136:* rwm");
        // No allow file (not a devices cgroup): the error names the file and the rule.
        let u = tempfile::tempdir().unwrap();
        let e = write_device_rules(u.path(), &["c 1:3 rwm".into()]).unwrap_err().to_string();
        assert!(e.contains("devices.allow") && e.contains("c 1:3 rwm"), "{e}");
    }

    #[test]
    fn a_join_in_plain_dirs_writes_limits_then_moves_in_last() {
        let t = tempfile::tempdir().unwrap();
        let (mem, cpuset) = (t.path().join("memory"), t.path().join("cpuset"));
        std::fs::create_dir_all(&cpuset).unwrap();
        std::fs::write(cpuset.join("cpuset.cpus"), "0-1\n").unwrap();
        std::fs::write(cpuset.join("cpuset.mems"), "0\n").unwrap();
        let join = CgroupJoin {
            dirs: vec![
                CgroupDir {
                    dir: mem.join("a/j"),
                    cpuset: false,
                    device_rules: None,
                    leaf: None,
                    limits: vec![
                        ("memory.limit_in_bytes".into(), "1048576".into()),
                        ("memory.memsw.limit_in_bytes".into(), "1048576".into()),
                        ("memory.swap.max".into(), "0".into()),
                    ],
                },
                CgroupDir { dir: cpuset.join("a/j"), cpuset: true, device_rules: None, leaf: None, limits: vec![] },
            ],
            ..Default::default()
        };
        // Where the kernel accounts swap, the file is there (a v1 job dir gets it).
        std::fs::create_dir_all(mem.join("c/j")).unwrap();
        std::fs::write(mem.join("c/j/memory.memsw.limit_in_bytes"), "").unwrap();
        let memsw = CgroupJoin {
            dirs: vec![CgroupDir {
                dir: mem.join("c/j"),
                cpuset: false,
                device_rules: None,
                leaf: None,
                limits: vec![("memory.memsw.limit_in_bytes".into(), "1048576".into())],
            }],
            ..Default::default()
        };
        super::join(&memsw).unwrap();
        assert_eq!(std::fs::read_to_string(mem.join("c/j/memory.memsw.limit_in_bytes")).unwrap(), "1048576");
        super::join(&join).unwrap();
        assert_eq!(std::fs::read_to_string(mem.join("a/j/memory.limit_in_bytes")).unwrap(), "1048576");
        assert!(!mem.join("a/j/memory.swap.max").exists(), "skipped where swap accounting is off");
        assert!(!mem.join("a/j/memory.memsw.limit_in_bytes").exists(), "v1 too");
        assert_eq!(std::fs::read_to_string(cpuset.join("a/cpuset.cpus")).unwrap(), "0-1", "each new level");
        assert_eq!(std::fs::read_to_string(cpuset.join("a/j/cpuset.mems")).unwrap(), "0");
        let me = std::process::id().to_string();
        assert_eq!(std::fs::read_to_string(mem.join("a/j/cgroup.procs")).unwrap(), me);
        // A limit the kernel refuses names the file and the value.
        std::fs::create_dir_all(mem.join("b/j/memory.max")).unwrap(); // a dir: EISDIR
        let bad = CgroupJoin {
            dirs: vec![CgroupDir {
                dir: mem.join("b/j"),
                cpuset: false,
                device_rules: None,
                leaf: None,
                limits: vec![("memory.max".into(), "1".into())],
            }],
            ..Default::default()
        };
        let e = super::join(&bad).unwrap_err();
        assert!(matches!(e, Error::CgroupLimit { .. }), "{e}");
        assert!(e.to_string().starts_with(&format!("cannot set {} to 1", mem.join("b/j/memory.max").display())));
        assert!(!mem.join("b/j/cgroup.procs").exists(), "not moved in after a refused limit");
    }
}
