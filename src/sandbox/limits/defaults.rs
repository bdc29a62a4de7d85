//! From what was asked and what the node has to the limits a job runs with. Pure.
//!
//! The defaults, for `slots` jobs at once (`run`: one per slot; `exec`: 1):
//! - memory: (memory - max(2 GiB, 10%)) / slots, at least 256 MiB;
//! - swap: none beyond the memory limit (cgroup v1 memsw, v2 swap.max = 0);
//! - pids: 4096, but at most 3/4 of the node's pid_max shared by the slots;
//! - cpus: cores / slots, at least 1;
//! - disk: a project quota of (free space - max(1 GiB, 5%)) / slots (the reserve at
//!   most half the free space), and (free inodes - 5%) / slots inodes, where the home's
//!   filesystem has project quotas; the same bytes (btrfs has no inode limit) as a
//!   qgroup limit where it is btrfs with quotas enabled; none (and a warning with the
//!   fix) where it has neither;
//! - /tmp: the memory limit; /dev/shm: half of it (tmpfs pages are charged to the
//!   job's memory cgroup: a bigger tmpfs only invites the OOM killer). Without a memory
//!   limit, the sizes of before: half the RAM, 1 GiB.
//! - socket buffers (cgroup v1 only): the kernel's socket memory pressure point
//!   (`net.ipv4.tcp_mem`) / (slots + 1), at least 32 MiB but never above the memory
//!   limit. The pool is one for the whole node and v1 charges a job's buffers to nothing
//!   else: 100 loopback connections whose readers never read held 406 MB in a job with
//!   `--memory 64M`, and past the pool's top every socket of the node (other slots, the
//!   agents' connections to Azure DevOps, sshd) is starved. With a share each, the jobs
//!   together stay under the pressure point and one share is the host's own. cgroup v2
//!   counts them in the memory limit and has no limit of their own (see SECURITY.md).
//! - ptys: the node's (`kernel.pty.max` - `kernel.pty.reserve`, which every devpts
//!   instance but the host's own draws from) / (slots + 1), at least 16: one job took
//!   all 3072 and the next job's `script`, `ssh -t` or Python pty got ENOSPC.
//! - huge pages: none, of every size, where the job's cgroup has the hugetlb controller
//!   (root mode, on cgroup v2 or a v1 hugetlb hierarchy), as Kubernetes gives a pod that
//!   asks for none: `MAP_HUGETLB` needs no privilege and the pages count in no memory
//!   limit, so one job with `--memory 64M` took a whole pool an operator had reserved.
//!   `--huge-pages SIZE` gives a job that needs them (DPDK, some HPC codes) SIZE of each
//!   page size. Where no hugetlb limit can be set and the node has a pool
//!   (`vm.nr_hugepages`, overcommit), the start line says that a job can take it all.
//! - aio events (`io_setup`): bounded by the memory limit (each ~64 bytes of it), but
//!   the node's `fs.aio-max-nr` is one budget (65536 by default): where the jobs' limits
//!   hold more events than it, the start line says so (one job took all 65536 with 4.8 MB,
//!   and host root's `io_setup(1)` failed: MySQL's InnoDB, QEMU, fio use it).
//! - OOM reports and the commit limit: host settings the start line names where they
//!   let one job hurt the others: `vm.oom_dump_tasks = 1` (each OOM kill lists every task
//!   of the job in the kernel log: one job floods it) and `vm.overcommit_memory = 2`
//!   (the commit limit is one pool that memory limits do not bound).
//! - open files: bounded by the memory limit (each ~220 bytes of it). Where the jobs'
//!   limits together hold more than the node's `fs.file-max`, the start line says so:
//!   jobs that take them all stop every unprivileged process of the node (ENFILE).

use super::node::{Hugetlb, Node, SocketLimit};
use super::{human_size, Ask, LimitsAsk};
use crate::sandbox::plan::{HugePages, Limits};
use crate::sys::Mechanism;

/// The most processes and threads a job gets by default.
pub const PIDS: i64 = 4096;
const MIN_MEMORY: u64 = 256 << 20;
const MIN_PIDS: i64 = 64;
const MIN_SOCKETS: u64 = 32 << 20;
const MIN_PTYS: u64 = 16;
/// What an aio event costs a job's memory limit: its slot in the context's ring (64-byte
/// `io_event`s; 65536 of them charged 4.8 MB).
const AIO_EVENT_BYTES: u64 = 64;
/// What an open file costs a job's memory limit: its `struct file` and slot in the fd
/// table (221 bytes measured on Linux 6.18, cgroup v1).
const FILE_BYTES: u64 = 220;

/// The limits, and the warnings to print once at start (one line each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub limits: Limits,
    /// What was asked and is not what the job gets (`--disk` that cannot be enforced,
    /// `unlimited`, a tmpfs above the memory limit, swap not accounted).
    pub warnings: Vec<String>,
    /// Defaults the node cannot give, nobody having asked (no disk quota on this
    /// filesystem): a service's start warns of them; a one-off `exec` logs them at debug
    /// level (`-v`), not on every run's terminal.
    pub notes: Vec<String>,
}

/// The limits a job runs with when `slots` jobs share `node`.
pub fn resolve(ask: &LimitsAsk, node: &Node, slots: usize) -> Resolved {
    let slots = slots.max(1) as u64;
    let mut warnings = vec![];
    let mut notes = vec![];
    let mut unlimited = vec![];
    let mut pick = |what: &'static str, ask: Ask<u64>, default: Option<u64>| -> Option<u64> {
        match ask {
            Ask::Default => default,
            Ask::DefaultUpTo(max) => Some(default.map_or(max, |d| d.min(max))),
            Ask::Value(v) => Some(v),
            Ask::Unlimited => {
                unlimited.push(what);
                None
            }
        }
    };
    let memory = pick("memory", ask.memory, Some(default_memory(node, slots)));
    let pids = pick("pids", ask.pids.map(|p| p as u64), Some(default_pids(node, slots) as u64)).map(|p| p as i64);
    let cpus_milli = pick("cpus", ask.cpus_milli, Some((node.cores * 1000 / slots).max(1000)));
    let disk_said = !matches!(ask.disk, Ask::Default);
    let disk = pick("disk", ask.disk, node.disk.map(|d| default_disk(d.avail, d.size, slots)));
    let (disk_bytes, disk_inodes) = match (&node.no_quota, disk) {
        (_, None) => (None, None),
        (Some(why), Some(bytes)) => {
            if disk_said {
                warnings.push(format!("WARNING: --disk {} cannot be enforced: {why}", human_size(bytes)));
            } else {
                notes.push(format!("WARNING: no disk quota for jobs: {why}"));
            }
            (None, None)
        }
        // btrfs qgroups limit bytes only.
        (None, Some(bytes)) if node.disk_mechanism == Some(Mechanism::BtrfsQgroup) => (Some(bytes), None),
        (None, Some(bytes)) => (Some(bytes), node.disk.and_then(|d| default_inodes(d.inodes_avail, d.inodes, slots))),
    };
    let disk_mechanism = disk_bytes.and(node.disk_mechanism);
    let huge_pages = match (&node.hugetlb, node.huge_page_sizes.is_empty()) {
        // No huge pages on this kernel: nothing to take, nothing to limit.
        (_, true) => None,
        (Hugetlb::V1 | Hugetlb::V2, false) => {
            pick("huge pages", ask.huge_pages, Some(0)).map(|bytes| HugePages { bytes, sizes: node.huge_page_sizes })
        }
        (Hugetlb::No(why), false) => {
            // Asked for, or capped by a setuid site's max_huge_pages: said on every run, as
            // --disk's is. `why` is read only where the start line's notes are shown.
            let why =
                if why.is_empty() { "the jobs' cgroups have no hugetlb controller here (-v says why)" } else { why };
            match ask.huge_pages {
                Ask::Value(b) => {
                    warnings.push(format!("WARNING: --huge-pages {} cannot be enforced: {why}", human_size(b)))
                }
                Ask::DefaultUpTo(b) => warnings
                    .push(format!("WARNING: the site's max_huge_pages ({}) cannot be enforced: {why}", human_size(b))),
                Ask::Default | Ask::Unlimited => {}
            }
            None
        }
    };
    if !unlimited.is_empty() {
        warnings.push(format!(
            "WARNING: jobs have no {} limit (said unlimited): one job can exhaust the node",
            unlimited.join(", ")
        ));
    }
    if let (Some(_), false) = (memory, node.swap_limited) {
        warnings.push(format!(
            "WARNING: jobs may swap beyond their memory limit ({} of swap): this kernel does not account swap \
             per cgroup; boot it with swapaccount=1",
            human_size(node.swap_bytes)
        ));
    }
    let socket_bytes = match node.socket_limit {
        SocketLimit::Own => Some(default_sockets(node, slots, memory)),
        SocketLimit::InMemory | SocketLimit::Nothing => None,
    };
    notes.extend(pool_notes(node, slots, memory));
    let tmp_bytes = ask.tmp_size.or(memory);
    let shm_bytes = ask.shm_size.or(memory.map(|m| m / 2));
    for (flag, size) in [("--tmp-size", ask.tmp_size), ("--shm-size", ask.shm_size)] {
        if let (Some(s), Some(m)) = (size, memory) {
            if s > m {
                warnings.push(format!(
                    "WARNING: {flag} {} is above the memory limit {}: tmpfs pages count as the job's memory, \
                     so a job that fills it is OOM-killed first",
                    human_size(s),
                    human_size(m)
                ));
            }
        }
    }
    Resolved {
        limits: Limits {
            memory_bytes: memory,
            pids,
            cpus_milli,
            disk_bytes,
            disk_inodes,
            disk_mechanism,
            tmp_bytes,
            shm_bytes,
            socket_bytes,
            ptys: Some((node.ptys_shared / (slots + 1)).max(MIN_PTYS)),
            huge_pages,
        },
        warnings,
        notes,
    }
}

/// (memory - max(2 GiB, 10%)) / slots, at least 256 MiB, in whole MiB (the cgroup rounds
/// a limit down to pages, a tmpfs its size up: /tmp is then exactly the limit).
fn default_memory(node: &Node, slots: u64) -> u64 {
    let reserve = (2u64 << 30).max(node.memory_bytes / 10);
    mib_floor(node.memory_bytes.saturating_sub(reserve) / slots).max(MIN_MEMORY)
}

/// What the jobs can take of the node's pools with no limit of theirs to stop them: one
/// line each, for the start line (the notes).
fn pool_notes(node: &Node, slots: u64, memory: Option<u64>) -> Vec<String> {
    let mut notes = vec![];
    if node.socket_limit == SocketLimit::Nothing {
        notes.push(
            "WARNING: jobs' socket buffers have no limit: this kernel's cgroup v1 has no \
             memory.kmem.tcp.limit_in_bytes, so one job can take the node's whole socket memory \
             (net.ipv4.tcp_mem) from every other socket; use cgroup v2, which counts them in the \
             job's memory limit"
                .into(),
        );
    }
    if let (true, Hugetlb::No(why)) = (node.huge_page_bytes > 0, &node.hugetlb) {
        notes.push(format!(
            "WARNING: one job can take every huge page of the node ({} in its pools, vm.nr_hugepages and \
             overcommit): they count in no memory limit, and jobs get no hugetlb limit here: {why}",
            human_size(node.huge_page_bytes)
        ));
    }
    if let (true, Some(_)) = (node.oom_dump_tasks, memory) {
        notes.push(
            "WARNING: vm.oom_dump_tasks is 1: each OOM kill in a job lists every task of the job in the kernel \
             log (up to its pids limit), so a job that runs into its memory limit over and over floods the log, \
             and other slots' OOM reports are lost; set vm.oom_dump_tasks = 0"
                .into(),
        );
    }
    if let Some(limit) = node.commit_limit {
        notes.push(format!(
            "WARNING: vm.overcommit_memory is 2: the node's commit limit ({}) is one pool that memory limits do \
             not bound (a job's writable mappings count in it before it touches them), so one job can make every \
             allocation of the node fail; run slots on nodes with vm.overcommit_memory = 0 (the default)",
            human_size(limit)
        ));
    }
    let files = memory.map(|m| m.saturating_mul(slots) / FILE_BYTES);
    if fillable(node.file_max, files) {
        let held = files.map_or("any number of".to_string(), |f| format!("~{f}"));
        notes.push(format!(
            "WARNING: the jobs can open every file of the node: fs.file-max is {}, and their memory limits \
             together hold {held} open files (~{FILE_BYTES} bytes each); past it every unprivileged process of \
             the node gets ENFILE. Set fs.file-max = 9223372036854775807 (systemd does at boot): memory limits \
             then bound each job's files",
            node.file_max
        ));
    }
    let events = memory.map(|m| m.saturating_mul(slots) / AIO_EVENT_BYTES);
    if fillable(node.aio_max, events) {
        // The fix: what the jobs' memory holds, and the kernel's default budget on top.
        let fix = events.map_or("its largest value".to_string(), |e| (e + 65536).to_string());
        notes.push(format!(
            "WARNING: the jobs can take every aio event of the node: fs.aio-max-nr is {}, which {} of job memory \
             holds (~{AIO_EVENT_BYTES} bytes each); past it every io_setup of the node fails (EAGAIN: InnoDB, \
             QEMU, fio). Set fs.aio-max-nr to {fix} or more: memory limits then bound each job's events",
            node.aio_max,
            human_size(node.aio_max.saturating_mul(AIO_EVENT_BYTES))
        ));
    }
    notes
}

/// Whether the jobs, whose memory limits hold `held` items (None: no limit), can fill a
/// node-wide table of `table` items. systemd's value (the largest; also what an unread
/// table is taken for) leaves memory limits as the bound.
fn fillable(table: u64, held: Option<u64>) -> bool {
    table < i64::MAX as u64 && held.is_none_or(|h| h >= table)
}

/// The socket pressure point shared by the slots and the host, in whole MiB, at least
/// 32 MiB, but never above the memory limit (what cgroup v2 would let them take).
fn default_sockets(node: &Node, slots: u64, memory: Option<u64>) -> u64 {
    let share = mib_floor(node.socket_pressure_bytes / (slots + 1)).max(MIN_SOCKETS);
    memory.map_or(share, |m| share.min(m))
}

fn mib_floor(b: u64) -> u64 {
    b & !((1 << 20) - 1)
}

/// 4096, or 3/4 of pid_max shared by the slots when that is less (at least 64).
fn default_pids(node: &Node, slots: u64) -> i64 {
    let share = (node.pid_max * 3 / 4 / slots) as i64;
    PIDS.min(share).max(MIN_PIDS)
}

/// (free space - max(1 GiB, 5% of the filesystem)) / slots; on a nearly full or small
/// filesystem the reserve is half of what is free (a floor above the free space would
/// let one job fill it).
fn default_disk(avail: u64, size: u64, slots: u64) -> u64 {
    let reserve = (1u64 << 30).max(size / 20).min(avail / 2);
    mib_floor((avail - reserve) / slots)
}

/// (free inodes - 5%) / slots; None on filesystems that report no inode count.
fn default_inodes(avail: u64, total: u64, slots: u64) -> Option<u64> {
    (total > 0).then(|| (avail.saturating_sub(total / 20) / slots).max(10_000))
}

/// What the defaults were derived from, for the start line.
pub fn basis(node: &Node, slots: usize) -> String {
    let disk =
        node.disk.map(|d| format!(", {} free on the home's filesystem", human_size(d.avail))).unwrap_or_default();
    format!(
        "{} slot(s) sharing {} of {}, {} core(s), pid_max {}{disk}",
        slots.max(1),
        human_size(node.memory_bytes),
        node.memory_from,
        node.cores,
        node.pid_max
    )
}

#[cfg(test)]
mod tests {
    use super::super::node::Disk;
    use super::*;
    use crate::sandbox::plan::{HugePageSizes, HugePages};

    const G: u64 = 1 << 30;

    fn node() -> Node {
        Node {
            memory_bytes: 64 * G,
            memory_from: "RAM".into(),
            swap_bytes: 0,
            swap_limited: true,
            cores: 16,
            pid_max: 4 << 20,
            disk: Some(Disk { avail: 500 * G, size: 1000 * G, inodes_avail: 60_000_000, inodes: 64_000_000 }),
            no_quota: None,
            disk_mechanism: Some(Mechanism::Project),
            socket_pressure_bytes: 4 * G,
            socket_limit: SocketLimit::InMemory,
            file_max: i64::MAX as u64,
            aio_max: i64::MAX as u64,
            ptys_shared: 3072,
            huge_page_bytes: 0,
            huge_page_sizes: HugePageSizes::default(),
            oom_dump_tasks: false,
            commit_limit: None,
            hugetlb: Hugetlb::No("no controller in this test".into()),
        }
    }

    #[test]
    fn with_no_flags_every_limit_has_a_default_that_shares_the_node() {
        let r = resolve(&LimitsAsk::default(), &node(), 4);
        let l = r.limits;
        // (64 - 6.4) / 4 GiB; 4096 pids; 16 / 4 cpus; (500 - 50) / 4 GiB of disk.
        assert_eq!(l.memory_bytes, Some(mib_floor((64 * G - 64 * G / 10) / 4)));
        assert_eq!((l.pids, l.cpus_milli), (Some(4096), Some(4000)));
        assert_eq!(l.disk_bytes, Some(450 * G / 4));
        assert_eq!(l.disk_inodes, Some((60_000_000 - 3_200_000) / 4));
        assert_eq!((l.tmp_bytes, l.shm_bytes), (l.memory_bytes, l.memory_bytes.map(|m| m / 2)));
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        // One job (exec) gets the whole node less the reserves.
        let one = resolve(&LimitsAsk::default(), &node(), 1).limits;
        assert_eq!((one.memory_bytes, one.cpus_milli), (Some(mib_floor(64 * G - 64 * G / 10)), Some(16000)));
        assert_eq!(one.memory_bytes.unwrap() % (1 << 20), 0, "whole MiB");
    }

    #[test]
    fn small_nodes_keep_a_floor_and_the_host_its_share() {
        let small = Node {
            memory_bytes: 3 * G,
            cores: 2,
            pid_max: 32768,
            disk: Some(Disk { avail: G, size: 8 * G, inodes_avail: 0, inodes: 0 }),
            ..node()
        };
        let l = resolve(&LimitsAsk::default(), &small, 8).limits;
        assert_eq!(l.memory_bytes, Some(256 << 20), "2 GiB reserve leaves 1 GiB: the floor per slot");
        assert_eq!(l.pids, Some(32768 * 3 / 4 / 8), "8 slots of 4096 would take every pid of the node");
        assert_eq!(l.cpus_milli, Some(1000), "at least one CPU");
        assert_eq!((l.disk_bytes, l.disk_inodes), (Some(G / 2 / 8), None), "half of what is free; no inode count");
    }

    #[test]
    fn values_win_and_unlimited_is_warned_about_once() {
        let ask = LimitsAsk {
            memory: Ask::Value(2 * G),
            pids: Ask::Unlimited,
            cpus_milli: Ask::Unlimited,
            disk: Ask::Value(50 * G),
            ..Default::default()
        };
        let r = resolve(&ask, &node(), 4);
        assert_eq!((r.limits.memory_bytes, r.limits.pids, r.limits.cpus_milli), (Some(2 * G), None, None));
        assert_eq!(r.limits.disk_bytes, Some(50 * G));
        assert_eq!(
            r.warnings,
            ["WARNING: jobs have no pids, cpus limit (said unlimited): one job can exhaust the node"]
        );
        let r = resolve(&LimitsAsk { memory: Ask::Unlimited, ..Default::default() }, &node(), 1);
        assert_eq!((r.limits.memory_bytes, r.limits.tmp_bytes, r.limits.shm_bytes), (None, None, None), "as before");
    }

    #[test]
    fn a_site_maximum_caps_the_default() {
        let ask = LimitsAsk { memory: Ask::DefaultUpTo(G), pids: Ask::DefaultUpTo(100_000), ..Default::default() };
        let l = resolve(&ask, &node(), 1).limits;
        assert_eq!((l.memory_bytes, l.pids), (Some(G), Some(4096)), "the lower of the two");
    }

    #[test]
    fn no_quota_no_disk_limit_and_one_line_why() {
        let n = Node { no_quota: Some("/h is on ext4 without project quotas: fix it".into()), ..node() };
        let r = resolve(&LimitsAsk::default(), &n, 2);
        assert_eq!((r.limits.disk_bytes, r.limits.disk_inodes), (None, None));
        assert_eq!(r.notes, ["WARNING: no disk quota for jobs: /h is on ext4 without project quotas: fix it"]);
        assert!(r.warnings.is_empty(), "nobody asked: {:?}", r.warnings);
        let r = resolve(&LimitsAsk { disk: Ask::Value(50 * G), ..Default::default() }, &n, 2);
        assert!(
            r.warnings[0].starts_with("WARNING: --disk 50.0G cannot be enforced: /h is on ext4"),
            "{:?}",
            r.warnings
        );
        let r = resolve(&LimitsAsk { disk: Ask::Unlimited, ..Default::default() }, &n, 2);
        assert_eq!(r.warnings.len(), 1, "unlimited: only that warning: {:?}", r.warnings);
    }

    #[test]
    fn tmpfs_sizes_follow_memory_unless_said() {
        let ask = LimitsAsk { memory: Ask::Value(4 * G), tmp_size: Some(8 * G), ..Default::default() };
        let r = resolve(&ask, &node(), 1);
        assert_eq!((r.limits.tmp_bytes, r.limits.shm_bytes), (Some(8 * G), Some(2 * G)));
        assert!(
            r.warnings[0].starts_with("WARNING: --tmp-size 8.0G is above the memory limit 4.0G"),
            "{:?}",
            r.warnings
        );
    }

    #[test]
    fn swap_beyond_memory_is_warned_about_where_the_kernel_cannot_limit_it() {
        let n = Node { swap_bytes: 8 * G, swap_limited: false, ..node() };
        let r = resolve(&LimitsAsk::default(), &n, 1);
        assert!(r.warnings[0].contains("swapaccount=1") && r.warnings[0].contains("8.0G of swap"), "{:?}", r.warnings);
        let r = resolve(&LimitsAsk { memory: Ask::Unlimited, ..Default::default() }, &n, 1);
        assert!(!r.warnings.iter().any(|w| w.contains("swapaccount")), "no memory limit to swap beyond");
    }

    #[test]
    fn socket_buffers_get_a_share_of_the_pool_where_the_cgroup_can_limit_them() {
        let v1 = Node { socket_limit: SocketLimit::Own, ..node() };
        // 4 GiB pressure point, 3 slots and the host: 1 GiB each.
        let r = resolve(&LimitsAsk::default(), &v1, 3);
        assert_eq!(r.limits.socket_bytes, Some(G));
        assert!(r.notes.is_empty() && r.warnings.is_empty(), "{r:?}");
        // At most the memory limit (what v2 would let them take), even unasked for.
        let small = LimitsAsk { memory: Ask::Value(256 << 20), ..Default::default() };
        assert_eq!(resolve(&small, &v1, 1).limits.socket_bytes, Some(256 << 20));
        // Without a memory limit: the share all the same (it protects the others).
        let none = LimitsAsk { memory: Ask::Unlimited, ..Default::default() };
        assert_eq!(resolve(&none, &v1, 1).limits.socket_bytes, Some(2 * G));
        // A small pool: a floor, whole MiB.
        let tiny = Node { socket_pressure_bytes: 100 << 20, ..v1.clone() };
        assert_eq!(resolve(&LimitsAsk::default(), &tiny, 16).limits.socket_bytes, Some(32 << 20));
        let odd = Node { socket_pressure_bytes: 3 * G + 12345, ..v1 };
        assert_eq!(resolve(&LimitsAsk::default(), &odd, 1).limits.socket_bytes.map(|b| b % (1 << 20)), Some(0));
        // v2: in the memory limit, nothing of their own to write.
        let r = resolve(&LimitsAsk::default(), &node(), 3);
        assert_eq!(r.limits.socket_bytes, None);
        assert!(r.notes.is_empty(), "{:?}", r.notes);
        // v1 without the file: nothing limits them, and the start line says so.
        let bare = Node { socket_limit: SocketLimit::Nothing, ..node() };
        let r = resolve(&LimitsAsk::default(), &bare, 3);
        assert_eq!(r.limits.socket_bytes, None);
        assert!(r.notes.len() == 1 && r.notes[0].contains("memory.kmem.tcp.limit_in_bytes"), "{:?}", r.notes);
    }

    #[test]
    fn an_aio_budget_the_jobs_can_fill_is_noted() {
        assert!(resolve(&LimitsAsk::default(), &node(), 4).notes.is_empty(), "a budget as large as it goes");
        let n = Node { aio_max: 65536, ..node() };
        let r = resolve(&LimitsAsk::default(), &n, 4);
        assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
        let total = 4 * resolve(&LimitsAsk::default(), &n, 4).limits.memory_bytes.unwrap();
        assert!(r.notes[0].contains("fs.aio-max-nr is 65536, which 4.0M of job memory holds"), "{:?}", r.notes);
        assert!(r.notes[0].contains(&format!("Set fs.aio-max-nr to {} or more", total / 64 + 65536)), "{:?}", r.notes);
        // Set so, the line goes.
        let fixed = Node { aio_max: total / 64 + 65536, ..n.clone() };
        assert!(resolve(&LimitsAsk::default(), &fixed, 4).notes.is_empty());
        // Jobs too small to hold the budget: nothing to say.
        let tiny = LimitsAsk { memory: Ask::Value(512 << 10), ..Default::default() };
        assert!(resolve(&tiny, &n, 4).notes.is_empty());
    }

    #[test]
    fn a_huge_page_pool_no_limit_can_guard_is_noted() {
        let sizes = HugePageSizes::of([2048]);
        let n = Node { huge_page_bytes: 32 << 20, huge_page_sizes: sizes, ..node() };
        let r = resolve(&LimitsAsk::default(), &n, 2);
        assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
        assert!(r.notes[0].contains("every huge page of the node (32.0M"), "{:?}", r.notes);
        assert!(r.notes[0].ends_with("here: no controller in this test"), "the reason, with its fix: {:?}", r.notes);
        assert!(r.warnings.is_empty());
        assert_eq!(r.limits.huge_pages, None);
        // Asked for, and not enforceable: said at once.
        let ask = LimitsAsk { huge_pages: Ask::Value(1 << 30), ..Default::default() };
        let r = resolve(&ask, &n, 2);
        assert_eq!(r.warnings, ["WARNING: --huge-pages 1.0G cannot be enforced: no controller in this test"]);
        // A setuid site's cap that cannot hold: said on every run too.
        let capped = LimitsAsk { huge_pages: Ask::DefaultUpTo(0), ..Default::default() };
        let r = resolve(&capped, &n, 2);
        assert_eq!(
            r.warnings,
            ["WARNING: the site's max_huge_pages (0) cannot be enforced: no controller in this test"]
        );
    }

    #[test]
    fn oom_reports_and_a_strict_commit_limit_are_noted() {
        let n = Node { oom_dump_tasks: true, ..node() };
        let r = resolve(&LimitsAsk::default(), &n, 2);
        assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
        assert!(r.notes[0].contains("set vm.oom_dump_tasks = 0") && !r.notes[0].contains('\n'), "{:?}", r.notes);
        let no_memory_limit = LimitsAsk { memory: Ask::Unlimited, ..Default::default() };
        assert!(
            !resolve(&no_memory_limit, &n, 2).notes.iter().any(|l| l.contains("oom_dump_tasks")),
            "no memory limit, no OOM kills of its own"
        );
        let n = Node { commit_limit: Some(12 * G), ..node() };
        let r = resolve(&LimitsAsk::default(), &n, 2);
        assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
        assert!(r.notes[0].contains("commit limit (12.0G)") && r.notes[0].contains("overcommit_memory = 0"));
        assert!(resolve(&LimitsAsk::default(), &node(), 2).notes.is_empty());
    }

    #[test]
    fn jobs_get_no_huge_pages_where_the_controller_can_say_so() {
        let sizes = HugePageSizes::of([2048, 1 << 20]);
        for hugetlb in [Hugetlb::V1, Hugetlb::V2] {
            let n = Node { huge_page_bytes: 32 << 20, huge_page_sizes: sizes, hugetlb, ..node() };
            let r = resolve(&LimitsAsk::default(), &n, 2);
            assert_eq!(r.limits.huge_pages, Some(HugePages { bytes: 0, sizes }), "none by default");
            assert!(r.notes.is_empty() && r.warnings.is_empty(), "the pool is guarded: {r:?}");
            let ask = LimitsAsk { huge_pages: Ask::Value(1 << 30), ..Default::default() };
            assert_eq!(resolve(&ask, &n, 2).limits.huge_pages, Some(HugePages { bytes: 1 << 30, sizes }));
            let capped = LimitsAsk { huge_pages: Ask::DefaultUpTo(1 << 30), ..Default::default() };
            assert_eq!(resolve(&capped, &n, 2).limits.huge_pages.map(|h| h.bytes), Some(0));
            let r = resolve(&LimitsAsk { huge_pages: Ask::Unlimited, ..Default::default() }, &n, 2);
            assert_eq!(r.limits.huge_pages, None);
            assert!(r.warnings[0].contains("no huge pages limit (said unlimited)"), "{:?}", r.warnings);
        }
        // A kernel without huge pages: nothing to take, nothing to write.
        let none = Node { hugetlb: Hugetlb::V2, ..node() };
        assert_eq!(resolve(&LimitsAsk::default(), &none, 2).limits.huge_pages, None);
    }

    #[test]
    fn ptys_are_shared_by_the_slots_and_the_other_containers() {
        assert_eq!(resolve(&LimitsAsk::default(), &node(), 1).limits.ptys, Some(1536), "exec: half");
        assert_eq!(resolve(&LimitsAsk::default(), &node(), 5).limits.ptys, Some(512));
        let few = Node { ptys_shared: 100, ..node() };
        assert_eq!(resolve(&LimitsAsk::default(), &few, 16).limits.ptys, Some(16), "a floor");
    }

    #[test]
    fn a_file_table_the_jobs_can_fill_is_noted() {
        // systemd's largest value: memory limits bound open files, nothing to say.
        assert!(resolve(&LimitsAsk::default(), &node(), 4).notes.is_empty());
        // The kernel's own default (RAM-based): 4 jobs of ~14 GiB hold ~280 M files.
        let finite = Node { file_max: 6_000_000, ..node() };
        let r = resolve(&LimitsAsk::default(), &finite, 4);
        assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
        assert!(r.notes[0].contains("fs.file-max is 6000000") && r.notes[0].contains("ENFILE"), "{:?}", r.notes);
        assert!(r.warnings.is_empty(), "a note, not every exec's terminal: {:?}", r.warnings);
        // Small limits that hold fewer files than the table: nothing to say.
        let small = LimitsAsk { memory: Ask::Value(256 << 20), ..Default::default() };
        assert!(resolve(&small, &finite, 4).notes.is_empty());
        // No memory limit: any number; where the table is systemd's (or unread), nothing.
        let none = LimitsAsk { memory: Ask::Unlimited, ..Default::default() };
        assert!(resolve(&none, &finite, 1).notes[0].contains("together hold any number of open files"));
        assert!(resolve(&none, &node(), 1).notes.is_empty());
        assert!(resolve(&none, &Node { file_max: u64::MAX, ..node() }, 1).notes.is_empty());
    }

    #[test]
    fn the_basis_line() {
        assert_eq!(
            basis(&node(), 4),
            "4 slot(s) sharing 64.0G of RAM, 16 core(s), pid_max 4194304, 500.0G free on the home's filesystem"
        );
    }
}
