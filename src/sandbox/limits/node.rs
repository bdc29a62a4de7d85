//! What the node has, read once per `exec` and once per `run`: memory, swap, cores,
//! pid_max, the kernel's socket memory pool and ptys, the home's filesystem and whether
//! project quotas work there, and where jobs' huge pages can be limited; for the start
//! line's notes, its file table, aio budget, huge page pools, OOM reports and commit
//! limit. A handful of syscalls and small reads (no mountinfo): this is on the `exec` path.

use crate::config::Home;
use crate::rootless::cgroups::CgroupHost;
use crate::sandbox::plan::HugePageSizes;
use std::path::Path;

/// The node as job defaults are derived from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Memory the jobs share: the RAM, or this process's cgroup memory limit when that
    /// is lower (a Slurm allocation, a systemd unit's MemoryMax).
    pub memory_bytes: u64,
    /// Where `memory_bytes` comes from, for the start line.
    pub memory_from: String,
    pub swap_bytes: u64,
    /// The kernel limits swap per cgroup (v1 `memory.memsw.*`, v2 `memory.swap.max`).
    pub swap_limited: bool,
    pub cores: u64,
    /// /proc/sys/kernel/pid_max: every task on the node counts against it.
    pub pid_max: u64,
    /// The filesystem of the home's layer dirs (None: statvfs failed).
    pub disk: Option<Disk>,
    /// Why jobs can get no disk quota here, and the fix (None: a mechanism works).
    pub no_quota: Option<String>,
    /// How jobs' layer dirs get their disk quota here (None: no way, see `no_quota`).
    pub disk_mechanism: Option<crate::sys::Mechanism>,
    /// Where the kernel puts every socket of the node under memory pressure, in bytes
    /// (`net.ipv4.tcp_mem`'s second value): one pool for all network namespaces.
    pub socket_pressure_bytes: u64,
    /// How a job's cgroup can limit its socket buffers.
    pub socket_limit: SocketLimit,
    /// Pseudo-terminals every devpts instance but the host's own shares: `kernel.pty.max`
    /// less `kernel.pty.reserve` (kept for the host's instance).
    pub ptys_shared: u64,
    /// The node's huge page pools (`vm.nr_hugepages` and `nr_overcommit_hugepages` of
    /// each size), in bytes: jobs map them (`MAP_HUGETLB`) outside their memory limit.
    pub huge_page_bytes: u64,
    /// The node's huge page sizes (`/sys/kernel/mm/hugepages/hugepages-<kB>kB`), where
    /// a job's cgroup can limit them (empty elsewhere: not read).
    pub huge_page_sizes: HugePageSizes,
    /// Whether a job's cgroup can limit its huge pages.
    pub hugetlb: Hugetlb,
    /// `fs.aio-max-nr`: asynchronous I/O events of the whole node (`io_setup`); past it
    /// every process's `io_setup` fails (EAGAIN). u64::MAX where not read.
    pub aio_max: u64,
    /// `vm.oom_dump_tasks`: each OOM kill lists every task of the cgroup in the kernel log
    /// (false where not read).
    pub oom_dump_tasks: bool,
    /// The node's commit limit (`CommitLimit`) where `vm.overcommit_memory` is 2 (strict
    /// accounting): one pool, which memory limits do not bound. None elsewhere or unread.
    pub commit_limit: Option<u64>,
    /// `fs.file-max`: open files of the whole node; past it every process without
    /// CAP_SYS_ADMIN gets ENFILE. systemd raises it to the largest value at boot.
    pub file_max: u64,
}

/// How a job's cgroup limits its socket buffers (TCP and UDP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketLimit {
    /// cgroup v1's `memory.kmem.tcp.limit_in_bytes`: a limit of their own (which counts
    /// UDP too), the only one, as v1 charges them to nothing else.
    Own,
    /// cgroup v2: they count in the memory limit, and have no limit of their own (also
    /// where no v1 hierarchy has the memory controller).
    InMemory,
    /// cgroup v1 without it (a kernel that dropped it): nothing limits them.
    Nothing,
}

/// How a job's cgroup can limit its huge pages: the hugetlb controller, where the job's
/// cgroup has it. Root mode only: a rootless account's delegated cgroups have no hugetlb
/// controller (systemd delegates none; `delegate-cgroups.sh` makes no v1 dir for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hugetlb {
    /// In the job's v1 dir of the hugetlb hierarchy.
    V1,
    /// In the job's cgroup v2 dir, the controller passed down to it.
    V2,
    /// Nowhere; why (for the start line; empty where the notes are not shown).
    No(String),
}

/// Space and inodes of the home's filesystem (statvfs, for unprivileged users).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disk {
    pub avail: u64,
    pub size: u64,
    pub inodes_avail: u64,
    pub inodes: u64,
}

impl Node {
    /// Reads the node; `rootless`: no quota (quotactl needs CAP_SYS_ADMIN in the initial
    /// user namespace). `notes`: whether the start line's notes will be shown (`run`,
    /// `exec -v`); without, what only they need is not read (the node's file table, aio
    /// budget and huge page pools: eleven system calls on every `exec`'s path).
    pub fn read(home: &Home, rootless: bool, notes: bool) -> Node {
        let (ram, swap) = ram_and_swap();
        let (disk_mechanism, why) = match no_quota(home, rootless) {
            Ok(m) => (Some(m), None),
            Err(why) => (None, Some(why)),
        };
        let cgroups = CgroupHost::get();
        let own = crate::sys::procfile::read("/proc/self/cgroup").unwrap_or_default();
        let hugetlb = hugetlb(cgroups, rootless, notes);
        let (memory_bytes, memory_from) = match own_memory_limit(cgroups, &own) {
            Some((limit, at)) if limit < ram => (limit, format!("the memory limit of cgroup {at}")),
            _ => (ram, "RAM".into()),
        };
        Node {
            memory_bytes,
            memory_from,
            swap_bytes: swap,
            swap_limited: swap == 0 || swap_limited(cgroups, &own),
            cores: cores(),
            pid_max: number("/proc/sys/kernel/pid_max").unwrap_or(32768),
            disk: disk(&home.layers_dir()),
            no_quota: why,
            disk_mechanism,
            socket_pressure_bytes: socket_pressure(
                crate::sys::procfile::read("/proc/sys/net/ipv4/tcp_mem").ok().as_deref(),
                ram,
            ),
            ptys_shared: ptys_shared(number("/proc/sys/kernel/pty/max"), number("/proc/sys/kernel/pty/reserve")),
            huge_page_bytes: if notes { huge_page_pools(Path::new("/sys/kernel/mm/hugepages")) } else { 0 },
            // The sizes only where a limit is written (a dir read less on every `exec` elsewhere).
            huge_page_sizes: if matches!(hugetlb, Hugetlb::No(_)) {
                HugePageSizes::default()
            } else {
                huge_page_sizes(Path::new("/sys/kernel/mm/hugepages"))
            },
            hugetlb,
            file_max: notes.then(|| number("/proc/sys/fs/file-max")).flatten().unwrap_or(u64::MAX),
            aio_max: notes.then(|| number("/proc/sys/fs/aio-max-nr")).flatten().unwrap_or(u64::MAX),
            oom_dump_tasks: notes && number("/proc/sys/vm/oom_dump_tasks").is_some_and(|n| n != 0),
            commit_limit: if notes && number("/proc/sys/vm/overcommit_memory") == Some(2) {
                commit_limit(&crate::sys::procfile::read("/proc/meminfo").unwrap_or_default())
            } else {
                None
            },
            socket_limit: if cgroups.unified || cgroups.v1_memory_mount().is_none() {
                // cgroup v2's memory controller (or none: then no memory limit either).
                SocketLimit::InMemory
            } else if cgroups.v1_memory_file("memory.kmem.tcp.limit_in_bytes") {
                SocketLimit::Own
            } else {
                SocketLimit::Nothing
            },
        }
    }
}

/// `net.ipv4.tcp_mem`'s pressure value in bytes; where it cannot be read (it exists in
/// the initial network namespace only) the kernel's default for this RAM (RAM / 16).
fn socket_pressure(tcp_mem: Option<&str>, ram: u64) -> u64 {
    let pages = tcp_mem.and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok());
    match pages {
        Some(p) => p.saturating_mul(page_size()),
        None => ram / 16,
    }
}

/// The bytes of every huge page pool under `dir` (`hugepages-<size>kB/`): the pages
/// reserved and those the kernel may add (overcommit).
fn huge_page_pools(dir: &Path) -> u64 {
    let Ok(sizes) = std::fs::read_dir(dir) else { return 0 };
    let mut bytes = 0u64;
    for e in sizes.flatten() {
        let name = e.file_name();
        let kb = name.to_str().and_then(|n| n.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse::<u64>().ok());
        let Some(kb) = kb else { continue };
        let count = |f: &str| number(e.path().join(f)).unwrap_or(0);
        let pages = count("nr_hugepages").saturating_add(count("nr_overcommit_hugepages"));
        bytes = bytes.saturating_add(pages.saturating_mul(kb << 10));
    }
    bytes
}

/// The sizes of the huge page pools under `dir` (`hugepages-<size>kB/`; none where the
/// kernel has no huge pages).
fn huge_page_sizes(dir: &Path) -> HugePageSizes {
    let Ok(sizes) = std::fs::read_dir(dir) else { return HugePageSizes::default() };
    HugePageSizes::of(
        sizes.flatten().filter_map(|e| {
            e.file_name().to_str()?.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse::<u64>().ok()
        }),
    )
}

/// Where a job's cgroup can have the hugetlb controller (see [`Hugetlb`]). `why`: whether
/// to find out why not (a read more).
pub fn hugetlb(host: &CgroupHost, rootless: bool, why: bool) -> Hugetlb {
    let v2_has = |dir: &Path| {
        crate::sys::procfile::read(dir.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "hugetlb"))
    };
    if rootless {
        return Hugetlb::No(
            "rootless mode: the account's delegated cgroups have no hugetlb controller; run as root or in setuid \
             mode"
                .into(),
        );
    }
    let controller = if host.unified {
        v2_has(&host.root).then_some(Hugetlb::V2)
    } else {
        host.v1_mounts.iter().any(|m| crate::rootless::cgroups::v1_has(m, "hugetlb")).then_some(Hugetlb::V1)
    };
    if let Some(controller) = controller {
        let release = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned());
        return match release {
            Ok(r) if !reservations_limited(&r) => Hugetlb::No(format!(
                "this kernel ({r}) limits huge pages only where they are touched (reservations from Linux 5.7): a \
                 limit would kill with SIGBUS the programs that try huge pages and fall back (PostgreSQL, the JVM)"
            )),
            _ => controller,
        };
    }
    if !why {
        return Hugetlb::No(String::new());
    }
    let enabled = crate::sys::procfile::read("/proc/cgroups").is_ok_and(|t| hugetlb_enabled(&t));
    match &host.v2_mount {
        Some(v2) if !host.unified && v2_has(v2) => Hugetlb::No(format!(
            "this hybrid host has its hugetlb controller in the cgroup2 tree ({}), where jobs get no limits: \
             mount it as a v1 hierarchy (`mkdir /sys/fs/cgroup/hugetlb && mount -t cgroup -o hugetlb hugetlb \
             /sys/fs/cgroup/hugetlb`) or boot with cgroup v2 alone",
            v2.display()
        )),
        _ if enabled => Hugetlb::No(
            "the hugetlb controller is not available to these cgroups (no v1 hierarchy named hugetlb is mounted, \
             or it is outside this cgroup namespace)"
                .into(),
        ),
        _ => Hugetlb::No("this kernel has no hugetlb cgroup controller (CONFIG_CGROUP_HUGETLB)".into()),
    }
}

/// Whether `/proc/cgroups` lists the hugetlb controller, enabled.
fn hugetlb_enabled(proc_cgroups: &str) -> bool {
    proc_cgroups.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.first() == Some(&"hugetlb") && f.get(3) == Some(&"1")
    })
}

/// Whether kernel `release` (`uname -r`) limits huge page reservations too (Linux 5.7:
/// `hugetlb.<size>.rsvd.*`), so that an `mmap` past the limit fails (ENOMEM) instead of
/// a later touch of a page (SIGBUS). Unparsable: taken for a recent one.
fn reservations_limited(release: &str) -> bool {
    let mut n = release.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().ok());
    match (n.next().flatten(), n.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= (5, 7),
        _ => true,
    }
}

/// `CommitLimit` of a /proc/meminfo text, in bytes.
fn commit_limit(meminfo: &str) -> Option<u64> {
    let kb = meminfo.lines().find_map(|l| l.strip_prefix("CommitLimit:"))?.split_whitespace().next()?;
    kb.parse::<u64>().ok().map(|kb| kb << 10)
}

/// `kernel.pty.max` - `kernel.pty.reserve`; the kernel's defaults (4096, 1024) where
/// either cannot be read.
fn ptys_shared(max: Option<u64>, reserve: Option<u64>) -> u64 {
    max.unwrap_or(4096).saturating_sub(reserve.unwrap_or(1024))
}

/// The number a `/proc/sys` or sysfs file holds.
fn number(path: impl AsRef<Path>) -> Option<u64> {
    crate::sys::procfile::read(path).ok()?.trim().parse().ok()
}

fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().map_or(4096, |p| p as u64)
}

fn ram_and_swap() -> (u64, u64) {
    nix::sys::sysinfo::sysinfo().map(|s| (s.ram_total(), s.swap_total())).unwrap_or((0, 0))
}

/// CPUs this process may run on (its affinity mask; a cgroup's CFS quota is not read:
/// jobs' cgroups are not below ours on cgroup v1).
fn cores() -> u64 {
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..nix::sched::CpuSet::count()).filter(|&i| set.is_set(i).unwrap_or(false)).count().max(1) as u64,
        Err(_) => 1,
    }
}

fn disk(dir: &Path) -> Option<Disk> {
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    let frag = s.fragment_size() as u64;
    Some(Disk {
        avail: s.blocks_available() as u64 * frag,
        size: s.blocks() as u64 * frag,
        inodes_avail: s.files_available() as u64,
        inodes: s.files() as u64,
    })
}

/// The memory limit of this process's cgroup and its ancestors, and the cgroup that has
/// it (None: no limit, or no memory controller).
pub fn own_memory_limit(host: &CgroupHost, proc_self_cgroup: &str) -> Option<(u64, String)> {
    if host.unified {
        let own = v2_path(proc_self_cgroup)?;
        let mut best: Option<(u64, String)> = None;
        let mut at = Some(Path::new(own));
        while let Some(p) = at.filter(|p| *p != Path::new("/")) {
            let rel = p.strip_prefix("/").unwrap_or(p);
            let max = std::fs::read_to_string(host.root.join(rel).join("memory.max")).ok();
            if let Some(b) = max.as_deref().and_then(parse_limit) {
                if best.as_ref().is_none_or(|(m, _)| b < *m) {
                    best = Some((b, p.display().to_string()));
                }
            }
            at = p.parent();
        }
        return best;
    }
    let (mount, path) = v1_memory(host, proc_self_cgroup)?;
    let rel = path.strip_prefix('/').unwrap_or(&path);
    // In one read (see sys::procfile): a cgroup file's size is 0 too, and v1 sums every
    // descendant's counters again for each read.
    let stat = crate::sys::procfile::read(mount.join(rel).join("memory.stat")).ok()?;
    let limit = stat.lines().find_map(|l| l.strip_prefix("hierarchical_memory_limit "))?;
    parse_limit(limit).map(|b| (b, path.to_string()))
}

/// The `0::` path of /proc/self/cgroup.
fn v2_path(proc_self_cgroup: &str) -> Option<&str> {
    proc_self_cgroup.lines().find_map(|l| l.strip_prefix("0::"))
}

/// The v1 memory hierarchy's mount and this process's path in it.
fn v1_memory<'a>(host: &'a CgroupHost, proc_self_cgroup: &str) -> Option<(&'a Path, String)> {
    let (_, path) = crate::rootless::cgroups::own_v1_cgroups(proc_self_cgroup)
        .into_iter()
        .find(|(controllers, _)| controllers.split(',').any(|c| c == "memory"))?;
    let path = path.to_string_lossy().into_owned();
    let mount = host
        .v1_mounts
        .iter()
        .find(|m| m.file_name().is_some_and(|n| n.to_string_lossy().split(',').any(|c| c == "memory")))?;
    Some((mount, path))
}

/// A limit file's value; None for "max" and v1's "unlimited" (2^63 rounded to pages).
fn parse_limit(s: &str) -> Option<u64> {
    let b: u64 = s.trim().parse().ok()?;
    (b < 1 << 62).then_some(b)
}

/// Whether a job's cgroup can limit its swap: v1 with swap accounting has
/// `memory.memsw.limit_in_bytes`, v2 has `memory.swap.max` in every non-root cgroup.
fn swap_limited(host: &CgroupHost, proc_self_cgroup: &str) -> bool {
    if host.unified {
        let own = v2_path(proc_self_cgroup).unwrap_or("/");
        let rel = own.strip_prefix('/').unwrap_or(own);
        // The root cgroup has no memory.swap.max: then the question stays open (true).
        return rel.is_empty() || host.root.join(rel).join("memory.swap.max").exists();
    }
    host.v1_memsw()
}

/// How jobs get a disk quota on the home's filesystem, or why they get none (with the
/// fix).
fn no_quota(home: &Home, rootless: bool) -> Result<crate::sys::Mechanism, String> {
    if rootless {
        return Err("rootless mode: setting a quota (quotactl, btrfs qgroup limits) needs CAP_SYS_ADMIN in the \
             initial user namespace; run as root or in setuid mode for disk quotas"
            .into());
    }
    // The jobs' layer dirs live here (a site may mount it apart from the rest of the home).
    let layers = home.layers_dir();
    quota_mechanism(&crate::sys::Real, &layers).map_err(|err| {
        let fs = nix::sys::statfs::statfs(&layers).map(|s| s.filesystem_type()).ok();
        quota_why(&layers, fs, &err)
    })
}

/// The disk quota a dir's filesystem can give jobs: project quotas where they work
/// (they also limit inodes), else a btrfs qgroup where it is btrfs with quotas on. The
/// error is the btrfs probe's on btrfs, else the project quota probe's.
pub fn quota_mechanism(sys: &dyn crate::sys::Sys, dir: &Path) -> crate::sys::Result<crate::sys::Mechanism> {
    use crate::sys::{Error, Mechanism};
    let project = match sys.probe_project_quota(dir) {
        Ok(()) => return Ok(Mechanism::Project),
        Err(e) => e,
    };
    match sys.probe_btrfs_quota(dir) {
        Ok(()) => Ok(Mechanism::BtrfsQgroup),
        Err(Error::NotBtrfs { .. }) => Err(project),
        Err(btrfs) => Err(btrfs),
    }
}

/// The one line that says why a home has no project quotas, and what to do.
pub fn quota_why(home: &Path, fs: Option<nix::sys::statfs::FsType>, err: &crate::sys::Error) -> String {
    use nix::errno::Errno;
    use nix::sys::statfs::{EXT4_SUPER_MAGIC, XFS_SUPER_MAGIC};
    let h = home.display();
    if let crate::sys::Error::BtrfsQuotaOff { .. } = err {
        return format!(
            "{h} is on btrfs without quotas: enable quotas: `btrfs quota enable MOUNTPOINT` (any path on it, e.g. \
             `btrfs quota enable {h}`); each job then gets a subvolume with a qgroup limit (bytes; btrfs has no \
             inode limit)"
        );
    }
    let what = match fs {
        Some(t) if t == EXT4_SUPER_MAGIC => "ext4",
        Some(t) if t == XFS_SUPER_MAGIC => "XFS",
        _ => "",
    };
    match (what, err.errno()) {
        (_, Some(Errno::ENOSYS)) => format!("{h}: this kernel has no quota support (CONFIG_QUOTA, CONFIG_QFMT_V2)"),
        ("ext4", _) => format!(
            "{h} is on ext4 without project quotas: unmount it, run `tune2fs -O project,quota DEVICE` and mount it \
             with the `prjquota` option (the kernel needs CONFIG_QFMT_V2)"
        ),
        ("XFS", _) => format!(
            "{h} is on XFS without project quotas: mount it with the `prjquota` option (the kernel needs \
             CONFIG_XFS_QUOTA)"
        ),
        _ => format!(
            "{h} is not on ext4 or XFS with project quotas nor on btrfs with quotas ({}): put the home on one \
             (mount ext4/XFS with `prjquota`, or run `btrfs quota enable` on btrfs)",
            err.errno().map(|e| e.desc()).unwrap_or("unknown error")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn host(root: &Path, unified: bool) -> CgroupHost {
        CgroupHost {
            unified,
            v1_mounts: if unified { vec![] } else { vec![root.join("cpu,cpuacct"), root.join("memory")] },
            root: root.into(),
            own_v2: None,
            own_v1: vec![],
            v2_mount: Some(root.into()),
        }
    }

    #[test]
    fn huge_page_pools_of_every_size() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(huge_page_pools(&t.path().join("missing")), 0, "a kernel without huge pages");
        for (dir, nr, over) in [("hugepages-2048kB", "16\n", "4\n"), ("hugepages-1048576kB", "2\n", "0\n")] {
            std::fs::create_dir(t.path().join(dir)).unwrap();
            std::fs::write(t.path().join(dir).join("nr_hugepages"), nr).unwrap();
            std::fs::write(t.path().join(dir).join("nr_overcommit_hugepages"), over).unwrap();
        }
        std::fs::create_dir(t.path().join("not-a-size")).unwrap();
        assert_eq!(huge_page_pools(t.path()), 20 * (2 << 20) + 2 * (1 << 30));
    }

    #[test]
    fn huge_page_sizes_from_the_pools_dirs() {
        let t = tempfile::tempdir().unwrap();
        assert!(huge_page_sizes(&t.path().join("missing")).is_empty(), "a kernel without huge pages");
        for dir in ["hugepages-2048kB", "hugepages-1048576kB", "not-a-size"] {
            std::fs::create_dir(t.path().join(dir)).unwrap();
        }
        assert_eq!(huge_page_sizes(t.path()), HugePageSizes::of([2048, 1 << 20]));
    }

    #[test]
    fn where_a_jobs_cgroup_can_limit_its_huge_pages() {
        let t = tempfile::tempdir().unwrap();
        let v2 = host(t.path(), true);
        std::fs::write(t.path().join("cgroup.controllers"), "cpuset cpu io memory hugetlb pids rdma misc\n").unwrap();
        assert_eq!(hugetlb(&v2, false, false), Hugetlb::V2);
        let no = |h: Hugetlb| match h {
            Hugetlb::No(why) => why,
            other => panic!("{other:?}"),
        };
        assert!(no(hugetlb(&v2, true, true)).starts_with("rootless mode"), "delegated cgroups have none");
        std::fs::write(t.path().join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        let why = no(hugetlb(&v2, false, true));
        // Which of the two depends on this kernel's /proc/cgroups (see hugetlb_enabled).
        assert!(why.contains("CONFIG_CGROUP_HUGETLB") || why.contains("not available to these cgroups"), "{why}");
        assert!(hugetlb_enabled("#subsys_name\thierarchy\tnum_cgroups\tenabled\nhugetlb\t0\t2\t1\n"));
        assert!(!hugetlb_enabled("hugetlb\t0\t2\t0\npids\t8\t3\t1\n"), "cgroup_disable=hugetlb");
        assert!(!hugetlb_enabled("pids\t8\t3\t1\n"));
        assert_eq!(hugetlb(&v2, false, false), Hugetlb::No(String::new()), "why only where it is shown");
        // v1: the hugetlb hierarchy; a hybrid host whose controller is in the cgroup2 tree
        // (where jobs get no limits) is told how to mount it.
        let v1 =
            CgroupHost { v1_mounts: vec![t.path().join("memory"), t.path().join("hugetlb")], ..host(t.path(), false) };
        assert_eq!(hugetlb(&v1, false, false), Hugetlb::V1);
        let comounted = CgroupHost { v1_mounts: vec![t.path().join("hugetlb,perf_event")], ..host(t.path(), false) };
        assert_eq!(hugetlb(&comounted, false, false), Hugetlb::V1, "named by its controllers");
        let unified = t.path().join("unified");
        std::fs::create_dir(&unified).unwrap();
        std::fs::write(unified.join("cgroup.controllers"), "hugetlb\n").unwrap();
        let hybrid = CgroupHost { v2_mount: Some(unified), ..host(t.path(), false) };
        let why = no(hugetlb(&hybrid, false, true));
        assert!(why.contains("mount -t cgroup -o hugetlb") && !why.contains('\n'), "{why}");
    }

    #[test]
    fn reservations_are_limited_from_linux_5_7() {
        for (release, limited) in [
            ("6.18.44-fc-v595", true),
            ("5.7.0", true),
            ("5.15.0-91-generic", true),
            ("5.4.0-150-generic", false),
            ("4.18.0-553.el8_10.x86_64", false),
            ("weird", true),
        ] {
            assert_eq!(reservations_limited(release), limited, "{release}");
        }
    }

    #[test]
    fn the_commit_limit_from_meminfo() {
        assert_eq!(commit_limit("MemTotal:  100 kB\nCommitLimit:    12342048 kB\n"), Some(12342048 << 10));
        assert_eq!(commit_limit("MemTotal:  100 kB\n"), None);
    }

    #[test]
    fn the_ptys_all_jobs_share() {
        assert_eq!(ptys_shared(Some(4096), Some(1024)), 3072);
        assert_eq!(ptys_shared(Some(65536), None), 64512, "the kernel's reserve");
        assert_eq!(ptys_shared(None, Some(5000)), 0);
    }

    #[test]
    fn the_socket_pools_pressure_point_or_the_kernels_default() {
        let page = page_size();
        assert_eq!(socket_pressure(Some("287901\t383869\t575802\n"), 24 << 30), 383869 * page);
        // Outside the initial network namespace the file is missing: RAM / 16, as the
        // kernel sets it at boot.
        assert_eq!(socket_pressure(None, 24 << 30), 3 << 29);
        assert_eq!(socket_pressure(Some("garbage"), 16 << 30), 1 << 30);
    }

    #[test]
    fn the_lowest_memory_limit_above_us() {
        let t = tempfile::tempdir().unwrap();
        // v1: memory.stat's hierarchical limit already is the lowest on the way up.
        let me = t.path().join("memory/slurm/job_7");
        std::fs::create_dir_all(&me).unwrap();
        std::fs::write(me.join("memory.stat"), "cache 0\nhierarchical_memory_limit 8589934592\n").unwrap();
        let v1 = host(t.path(), false);
        let own = "4:memory:/slurm/job_7\n2:cpu,cpuacct:/\n0::/\n";
        assert_eq!(own_memory_limit(&v1, own), Some((8 << 30, "/slurm/job_7".into())));
        std::fs::write(me.join("memory.stat"), "hierarchical_memory_limit 9223372036854771712\n").unwrap();
        assert_eq!(own_memory_limit(&v1, own), None, "unlimited");
        assert_eq!(own_memory_limit(&v1, "0::/\n"), None, "no memory hierarchy line");
        // v2: the lowest memory.max from our cgroup up.
        let svc = t.path().join("system.slice/azp.service");
        std::fs::create_dir_all(svc.join("manager")).unwrap();
        std::fs::write(t.path().join("system.slice/memory.max"), "max\n").unwrap();
        std::fs::write(svc.join("memory.max"), "17179869184\n").unwrap();
        std::fs::write(svc.join("manager/memory.max"), "max\n").unwrap();
        let v2 = host(t.path(), true);
        let own = "0::/system.slice/azp.service/manager\n";
        assert_eq!(own_memory_limit(&v2, own), Some((16 << 30, "/system.slice/azp.service".into())));
        assert_eq!(own_memory_limit(&v2, "0::/\n"), None);
    }

    #[test]
    fn swap_can_be_limited_where_the_files_are() {
        let t = tempfile::tempdir().unwrap();
        let v1 = host(t.path(), false);
        std::fs::create_dir_all(t.path().join("memory")).unwrap();
        assert!(!swap_limited(&v1, ""), "no memsw: swap accounting is off");
        std::fs::write(t.path().join("memory/memory.memsw.limit_in_bytes"), "").unwrap();
        assert!(swap_limited(&v1, ""));
        let v2 = host(t.path(), true);
        std::fs::create_dir_all(t.path().join("a")).unwrap();
        assert!(!swap_limited(&v2, "0::/a\n"));
        std::fs::write(t.path().join("a/memory.swap.max"), "max\n").unwrap();
        assert!(swap_limited(&v2, "0::/a\n"));
    }

    #[test]
    fn project_quotas_first_then_btrfs_qgroups_then_the_reason() {
        use crate::sys::{Error, Mechanism, Recorder};
        use nix::errno::Errno;
        let dir = Path::new("/h/layers");
        let r = Recorder::default();
        assert_eq!(quota_mechanism(&r, dir).unwrap(), Mechanism::Project);
        assert_eq!(r.calls(), ["probe_project_quota /h/layers"], "btrfs is not even looked at");
        let r = Recorder::failing_at(0, Errno::ESRCH);
        assert_eq!(quota_mechanism(&r, dir).unwrap(), Mechanism::BtrfsQgroup);
        assert_eq!(r.calls(), ["probe_project_quota /h/layers", "probe_btrfs_quota /h/layers"]);
        // Neither, off btrfs (the real probes on a test dir): the project quota's reason.
        let t = tempfile::tempdir().unwrap();
        match quota_mechanism(&crate::sys::Real, t.path()) {
            Err(e) => assert!(matches!(e, Error::QuotaProbe { .. }), "{e}"),
            Ok(m) => crate::test_skip::skip_part(format!("{} has a {}", t.path().display(), m.name())),
        }
        // On btrfs with quotas off: the btrfs reason, with its fix.
        let why = quota_why(dir, None, &Error::BtrfsQuotaOff { dir: dir.into() });
        assert!(why.contains("btrfs quota enable") && why.contains("no inode limit") && !why.contains('\n'), "{why}");
    }

    #[test]
    fn why_no_quota_names_the_fix() {
        use nix::errno::Errno;
        use nix::sys::statfs::{EXT4_SUPER_MAGIC, TMPFS_MAGIC, XFS_SUPER_MAGIC};
        let e = |errno| crate::sys::Error::QuotaProbe { dir: PathBuf::from("/h"), source: errno };
        let ext4 = quota_why(Path::new("/h"), Some(EXT4_SUPER_MAGIC), &e(Errno::ESRCH));
        assert!(ext4.contains("tune2fs -O project,quota") && ext4.contains("prjquota"), "{ext4}");
        let xfs = quota_why(Path::new("/h"), Some(XFS_SUPER_MAGIC), &e(Errno::ESRCH));
        assert!(xfs.contains("XFS") && xfs.contains("prjquota") && !xfs.contains("tune2fs"), "{xfs}");
        let tmpfs = quota_why(Path::new("/h"), Some(TMPFS_MAGIC), &e(Errno::ESRCH));
        assert!(tmpfs.contains("not on ext4 or XFS"), "{tmpfs}");
        let kernel = quota_why(Path::new("/h"), Some(EXT4_SUPER_MAGIC), &e(Errno::ENOSYS));
        assert!(kernel.contains("CONFIG_QUOTA"), "{kernel}");
        for line in [ext4, xfs, tmpfs, kernel] {
            assert!(!line.contains('\n'));
        }
    }
}
