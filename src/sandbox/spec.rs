//! JobPlan -> OCI runtime spec. Pure: no I/O, unit-tested without root.
//!
//! Defaults follow runc/Docker where they are sound (masked /proc paths, minimal /dev,
//! device allow-list), with these deliberate differences: CAP_MKNOD, CAP_NET_RAW and
//! CAP_SETFCAP are dropped, no_new_privileges is on, oom_score_adj is 1000 (jobs die
//! before the host's services), and every bind is nosuid,nodev.

use super::plan::{JobPlan, DEFAULT_PATH};
use crate::edits::{DeviceKind, HookStage};
use anyhow::{Context, Result};
use oci_spec::runtime::{
    Capability, HookBuilder, HooksBuilder, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxCpuBuilder, LinuxDeviceBuilder,
    LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType, LinuxHugepageLimitBuilder, LinuxMemoryBuilder,
    LinuxNamespaceBuilder, LinuxNamespaceType, LinuxPidsBuilder, LinuxResourcesBuilder, Mount, MountBuilder,
    PosixRlimitBuilder, PosixRlimitType, ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// oom_score_adj for every job process: the kernel's OOM killer picks jobs first.
pub const JOB_OOM_SCORE_ADJ: i32 = 1000;

/// Capabilities a job keeps (as root inside). Docker's default set minus MKNOD (the
/// NVIDIA libraries mknod /dev/nvidiactl when they can), NET_RAW and SETFCAP.
pub const JOB_CAPABILITIES: &[Capability] = &[
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fsetid,
    Capability::Fowner,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::Kill,
    Capability::AuditWrite,
];

/// /proc and /sys paths hidden from jobs (as runc does).
const MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const READONLY_PATHS: &[&str] = &["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

/// Options of every bind into the sandbox that is not a device. "ro", "nosuid" and "nodev"
/// apply to the top mount only: with "rbind" every mount below the source (e.g. /dev/shm,
/// /sys/fs/cgroup/* and /proc under `--volume /:/host`, or an NFS mount inside a dataset
/// dir) would stay writable, setuid-capable and with devices. The "r" forms make
/// libcontainer apply them to the whole tree (mount_setattr AT_RECURSIVE, which its
/// fd-based mounts need anyway). Found by tests/escape_suite.rs (t15b).
const BIND_RO: &[&str] = &["rbind", "ro", "nosuid", "nodev", "rro", "rnosuid", "rnodev", "rprivate"];

/// Who puts the job's processes into its cgroup (see [`super::cgroup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupOwner {
    /// libcontainer's v1 manager, from the spec's cgroupsPath and resources: root mode on
    /// a host with no cgroup2 hierarchy mounted. `memsw`: the kernel accounts swap, so
    /// memory + swap is limited to the memory limit too (libcontainer fails on a host
    /// without the file).
    Libcontainer { memsw: bool },
    /// The helper has joined the job's cgroup and applied its limits; libcontainer sees a
    /// private cgroup2 view rooted there and moves the job's init into `leaf` below it
    /// (root mode), or nowhere (rootless: it may not create one).
    Helper { leaf: Option<PathBuf> },
}

pub fn build(plan: &JobPlan, rootfs: &Path, cgroup: &CgroupOwner) -> Result<Spec> {
    // The init installs the job's seccomp filter (see super::seccomp): no job runs
    // without it.
    plan.init()?;
    let caps: HashSet<Capability> = JOB_CAPABILITIES.iter().copied().collect();
    let capabilities = LinuxCapabilitiesBuilder::default()
        .bounding(caps.clone())
        .effective(caps.clone())
        .permitted(caps)
        .inheritable(HashSet::new())
        .ambient(HashSet::new())
        .build()?;
    let rlimit = |typ, soft, hard| PosixRlimitBuilder::default().typ(typ).soft(soft).hard(hard).build();
    let nofile = nofile_limit();
    let core = core_dumps();
    let rlimits = vec![
        rlimit(PosixRlimitType::RlimitNofile, nofile, nofile)?,
        rlimit(PosixRlimitType::RlimitCore, core.soft, core.hard)?,
        // No real-time scheduling and no priority above normal, whatever the service was
        // started with: a job's SCHED_FIFO loop would starve the node's CPUs.
        rlimit(PosixRlimitType::RlimitRtprio, 0, 0)?,
        rlimit(PosixRlimitType::RlimitNice, 0, 0)?,
    ];
    let process = ProcessBuilder::default()
        .terminal(plan.process.terminal)
        .user(UserBuilder::default().uid(plan.uid).gid(plan.gid).build()?)
        .args(super::init::args(&plan.args, core.fixed))
        .env(environment(plan))
        .cwd(plan.cwd.clone())
        .capabilities(capabilities)
        .rlimits(rlimits)
        .no_new_privileges(true)
        .oom_score_adj(JOB_OOM_SCORE_ADJ)
        .build()?;

    // No network namespace entry: the container inherits the helper's, which is the job's
    // own (made by the helper, see super::network) or the host's (`--network host`). No
    // IPC namespace entry either: the helper made the job's, to mount its /dev/mqueue (see
    // super::treemount).
    let namespaces =
        [LinuxNamespaceType::Pid, LinuxNamespaceType::Mount, LinuxNamespaceType::Uts, LinuxNamespaceType::Cgroup]
            .into_iter()
            .map(|t| LinuxNamespaceBuilder::default().typ(t).build())
            .collect::<Result<Vec<_>, _>>()?;

    let mut devices = Vec::new();
    for node in plan.edits.device_nodes.iter().filter(|_| !plan.in_user_namespace()) {
        devices.push(
            LinuxDeviceBuilder::default()
                .path(node.path.clone())
                .typ(device_type(node.kind))
                .major(node.major)
                .minor(node.minor)
                .file_mode(node.file_mode)
                .uid(node.uid)
                .gid(node.gid)
                .build()?,
        );
    }
    let mut linux = LinuxBuilder::default().namespaces(namespaces).devices(devices);
    match cgroup {
        CgroupOwner::Libcontainer { memsw } if !plan.cgroup_path.as_os_str().is_empty() => {
            linux = linux.resources(resources(plan, *memsw)?).cgroups_path(plan.cgroup_path.clone());
        }
        CgroupOwner::Helper { leaf: Some(leaf) } => linux = linux.cgroups_path(leaf.clone()),
        _ => {}
    }
    let linux = linux
        .masked_paths(MASKED_PATHS.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .readonly_paths(READONLY_PATHS.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .build()?;

    let mut spec = SpecBuilder::default()
        .version("1.0.2")
        .root(RootBuilder::default().path(rootfs).readonly(false).build()?)
        .hostname(plan.hostname.clone())
        .process(process)
        .mounts([mounts(plan)?, scratch_mount(plan)?].concat())
        .linux(linux)
        .build()?;
    if let Some(hooks) = hooks(plan, rootfs)? {
        spec.set_hooks(Some(hooks));
    }
    Ok(spec)
}

/// The job joins the user namespace its helper made (see [`crate::identity`]) at `path`
/// (`/proc/self/fd/N` of the helper: libcontainer's processes are its forks). libcontainer
/// then binds device nodes instead of making them, and writes no id maps.
pub fn join_user_namespace(spec: &mut Spec, path: &Path) -> Result<()> {
    let ns = LinuxNamespaceBuilder::default().typ(LinuxNamespaceType::User).path(path).build()?;
    let linux = spec.linux_mut().as_mut().context("the spec has no linux section")?;
    let mut namespaces = linux.namespaces().clone().unwrap_or_default();
    namespaces.insert(0, ns);
    linux.set_namespaces(Some(namespaces));
    Ok(())
}

fn device_type(kind: DeviceKind) -> LinuxDeviceType {
    match kind {
        DeviceKind::Char => LinuxDeviceType::C,
        DeviceKind::Block => LinuxDeviceType::B,
    }
}

/// The job's device cgroup rules: deny all, the defaults, the GPU nodes it owns. None
/// rootless: the devices cgroup cannot be written without host root; device access is
/// limited by what is bound in (a user namespace cannot mknod).
pub fn device_rules(plan: &JobPlan) -> Result<Vec<LinuxDeviceCgroup>> {
    if plan.rootless {
        return Ok(vec![]);
    }
    let mut rules = default_device_rules()?;
    for node in &plan.edits.device_nodes {
        rules.push(
            LinuxDeviceCgroupBuilder::default()
                .allow(true)
                .typ(device_type(node.kind))
                .major(node.major)
                .minor(node.minor)
                .access(node.access.clone())
                .build()?,
        );
    }
    Ok(rules)
}

/// The allow rules of [`device_rules`] as cgroup v1 `devices.allow` lines ("c 195:1 rw").
pub fn v1_device_allow_lines(plan: &JobPlan) -> Result<Vec<String>> {
    let num = |n: Option<i64>| n.map(|n| n.to_string()).unwrap_or_else(|| "*".into());
    Ok(device_rules(plan)?
        .iter()
        .filter(|r| r.allow())
        .map(|r| {
            let typ = match r.typ() {
                Some(LinuxDeviceType::B) => "b",
                Some(LinuxDeviceType::A) | None => "a",
                _ => "c",
            };
            format!("{typ} {}:{} {}", num(r.major()), num(r.minor()), r.access().as_deref().unwrap_or("rwm"))
        })
        .collect())
}

/// The spec's resources, for libcontainer's own cgroup manager. `memsw`: memory + swap
/// gets the memory limit too (OCI's `swap` is memory + swap), as the helper's own join
/// does (see [`super::cgroup::limit_writes`]).
fn resources(plan: &JobPlan, memsw: bool) -> Result<oci_spec::runtime::LinuxResources> {
    let mut resources = LinuxResourcesBuilder::default().devices(device_rules(plan)?);
    if plan.limits.memory_bytes.is_some() || plan.limits.socket_bytes.is_some() {
        let mut memory = LinuxMemoryBuilder::default();
        if let Some(bytes) = plan.limits.memory_bytes {
            memory = memory.limit(bytes as i64);
            if memsw {
                memory = memory.swap(bytes as i64);
            }
        }
        // Socket buffers (planned on cgroup v1 only, where the kernel has the file):
        // libcgroups' v1 manager writes memory.kmem.tcp.limit_in_bytes.
        if let Some(bytes) = plan.limits.socket_bytes {
            memory = memory.kernel_tcp(bytes as i64);
        }
        resources = resources.memory(memory.build()?);
    }
    if let Some(pids) = plan.limits.pids {
        resources = resources.pids(LinuxPidsBuilder::default().limit(pids).build()?);
    }
    if let Some(milli) = plan.limits.cpus_milli {
        const PERIOD: u64 = 100_000;
        let quota = (milli * PERIOD / 1000).max(1000) as i64;
        resources = resources.cpu(LinuxCpuBuilder::default().quota(quota).period(PERIOD).build()?);
    }
    // libcgroups' v1 manager writes hugetlb.<size>.limit_in_bytes, and the reservation
    // limit where the kernel has it, as the helper's own join does.
    if let Some(h) = plan.limits.huge_pages {
        let limits = h
            .sizes
            .cgroup_names()
            .map(|size| LinuxHugepageLimitBuilder::default().page_size(size).limit(h.bytes as i64).build())
            .collect::<std::result::Result<Vec<_>, _>>()?;
        resources = resources.hugepage_limits(limits);
    }
    Ok(resources.build()?)
}

/// What a job's crashes may dump: its RLIMIT_CORE, and whether the job may change it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CoreDumps {
    soft: u64,
    hard: u64,
    /// The jobs' filter that refuses changes of the limit (`seccomp::core_fixed_rules`).
    fixed: bool,
}

/// [`core_limit`] for this host.
fn core_dumps() -> CoreDumps {
    let pattern = crate::sys::procfile::read("/proc/sys/kernel/core_pattern").ok();
    core_limit(pattern.as_deref(), host_hard_limit(nix::sys::resource::Resource::RLIMIT_CORE))
}

/// Where the host hands core dumps to a program or a socket (`kernel.core_pattern`
/// `|...`: systemd-coredump, apport; `@...`, Linux 6.16), the kernel starts that program
/// as root on the host, outside the job's cgroup, for every crash of every job process,
/// whatever RLIMIT_CORE is, except 1: the value the kernel keeps for a core helper's own
/// crashes, which it then does not dump. So 1, fixed (lowering a limit needs no
/// privilege: `ulimit -c 0` would start the helpers again), and jobs dump no cores there
/// (a red-team pass: 4096 processes crashing together start 4096 root helpers, each
/// reading a core as large as the job's memory). A pattern that cannot be read is taken
/// for such a one. Never above the host's hard limit, which a job cannot be given (a
/// host whose hard limit is 0, as CIS hardening sets, keeps 0: its own processes start
/// the helper the same way). Elsewhere a core file lands in the job's own filesystem:
/// off (0) unless the job raises it, up to the host's hard limit.
fn core_limit(core_pattern: Option<&str>, host_hard: u64) -> CoreDumps {
    let to_host = core_pattern.is_none_or(|p| p.starts_with('|') || p.starts_with('@'));
    match to_host {
        true => CoreDumps { soft: host_hard.min(1), hard: host_hard.min(1), fixed: true },
        false => CoreDumps { soft: 0, hard: host_hard, fixed: false },
    }
}

/// The calling process's hard limit of `resource` (raising one needs CAP_SYS_RESOURCE).
fn host_hard_limit(resource: nix::sys::resource::Resource) -> u64 {
    nix::sys::resource::getrlimit(resource).map_or(nix::sys::resource::RLIM_INFINITY, |(_, hard)| hard)
}

/// Open files for jobs: 65536 (builds and the .NET agent open many), but never above the
/// host's hard limit: raising it needs CAP_SYS_RESOURCE, which some hosts do not grant.
fn nofile_limit() -> u64 {
    const WANT: u64 = 65536;
    WANT.min(host_hard_limit(nix::sys::resource::Resource::RLIMIT_NOFILE))
}

/// The job's environment: PATH/HOME defaults, then device env, volume env, explicit env
/// (later wins).
pub fn environment(plan: &JobPlan) -> Vec<String> {
    let mut vars: Vec<(String, String)> = vec![
        ("PATH".into(), DEFAULT_PATH.into()),
        ("HOME".into(), if plan.uid == 0 { "/root".into() } else { "/home/azp".into() }),
    ];
    vars.extend(plan.edits.env.iter().cloned());
    for v in &plan.volumes {
        if let Some(name) = &v.env {
            vars.push((name.clone(), v.container.display().to_string()));
        }
    }
    vars.extend(plan.env.iter().cloned());
    // Last assignment wins, first position kept: stable and readable in /proc/1/environ.
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in vars {
        match out.iter_mut().find(|(ek, _)| *ek == k) {
            Some(slot) => slot.1 = v,
            None => out.push((k, v)),
        }
    }
    out.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

fn mount(dst: &str, typ: &str, src: &str, opts: &[&str]) -> Result<Mount> {
    Ok(MountBuilder::default()
        .destination(dst)
        .typ(typ)
        .source(src)
        .options(opts.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .build()?)
}

fn bind(src: &Path, dst: &Path, opts: &[String]) -> Result<Mount> {
    Ok(MountBuilder::default().destination(dst).typ("bind").source(src).options(opts.to_vec()).build()?)
}

/// Read-only /sys when the job has no network namespace of its own (with one, the helper
/// binds the sysfs it mounted in it: see super::treemount). In a user namespace a fresh
/// sysfs needs a network namespace owned by it, which `--network host` does not have; as
/// runc does rootless, bind the host's /sys read-only (recursively) instead.
fn sysfs(plan: &JobPlan) -> Result<Option<Mount>> {
    if plan.net.sysfs.is_some() {
        return Ok(None);
    }
    if plan.in_user_namespace() {
        return Ok(Some(bind(
            Path::new("/sys"),
            Path::new("/sys"),
            &["rbind", "ro", "rro", "nosuid", "rnosuid", "nodev", "rnodev", "noexec", "rnoexec", "rprivate"]
                .map(String::from),
        )?));
    }
    Ok(Some(mount("/sys", "sysfs", "sysfs", &["nosuid", "noexec", "nodev", "ro"])?))
}

/// The spec's mounts: those the helper does not make itself (see super::treemount, whose
/// come first: /dev, /dev/shm, /tmp, ...), in the order libcontainer makes them.
fn mounts(plan: &JobPlan) -> Result<Vec<Mount>> {
    let ro: Vec<String> = BIND_RO.iter().map(|s| s.to_string()).collect();
    let mut m = vec![mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?];
    // No /sys/fs/cgroup: libcontainer 0.7 mounts the v1 hierarchies read-write despite
    // "ro", which would let a root job raise its own limits. /sys is read-only sysfs,
    // so nothing can be mounted there either.
    m.extend(sysfs(plan)?);
    for v in &plan.volumes {
        m.push(bind(&v.host, &v.container, &ro)?);
    }
    // In a user namespace the device nodes are the helper's binds (see super::treemount):
    // libcontainer would bind the node's *container* path from the host, which is wrong
    // when the host node lives elsewhere (--driver-root, CDI).
    for b in &plan.edits.mounts {
        let mut opts = b.options.clone();
        // A recursive edit bind (CDI may say "rbind") gets the flags on its submounts too.
        let recursive = opts.iter().any(|o| o == "rbind");
        let required: &[&str] =
            if recursive { &["nosuid", "nodev", "rnosuid", "rnodev"] } else { &["nosuid", "nodev"] };
        if recursive && opts.iter().any(|o| o == "ro") && !opts.iter().any(|o| o == "rro") {
            opts.push("rro".into());
        }
        for &required in required {
            if !opts.iter().any(|o| o == required) {
                opts.push(required.into());
            }
        }
        m.push(bind(&b.host_path, &b.container_path, &opts)?);
    }
    Ok(m)
}

/// The job's scratch dir (see [`super::ScratchDir`]), read-write: its own, empty at start.
fn scratch_mount(plan: &JobPlan) -> Result<Vec<Mount>> {
    let Some(s) = &plan.scratch else { return Ok(vec![]) };
    Ok(vec![bind(&s.host, &s.container, &["rbind", "rw", "nosuid", "nodev", "rprivate"].map(String::from))?])
}

/// The host's `ldconfig`, which rebuilds a tree's linker cache with `-r TREE`.
pub fn host_ldconfig() -> Result<&'static Path> {
    ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .context("ldconfig not found on the host (/sbin/ldconfig): install libc-bin")
}

/// Hooks from the edits, plus the linker-cache refresh: host `ldconfig -r <rootfs>` in the
/// container's mount namespace once the driver libraries are bound, before pivot_root.
/// Only for edits that carry CDI hooks: other GPU jobs get their linker cache from their
/// edit layer (see [`super::editlayer`]).
fn hooks(plan: &JobPlan, rootfs: &Path) -> Result<Option<oci_spec::runtime::Hooks>> {
    let mut create_container = Vec::new();
    let mut create_runtime = Vec::new();
    let mut start_container = Vec::new();
    let mut poststart = Vec::new();
    let mut poststop = Vec::new();
    if plan.edits.update_ldcache {
        let ldconfig = host_ldconfig()?;
        create_container.push(
            HookBuilder::default()
                .path(ldconfig)
                .args(vec!["ldconfig".to_string(), "-r".to_string(), rootfs.display().to_string()])
                .timeout(30)
                .build()?,
        );
    }
    for h in &plan.edits.hooks {
        let mut b = HookBuilder::default().path(h.path.clone()).args(h.args.clone()).env(h.env.clone());
        if let Some(t) = h.timeout {
            b = b.timeout(t);
        }
        let hook = b.build()?;
        match h.stage {
            HookStage::CreateRuntime => create_runtime.push(hook),
            HookStage::CreateContainer => create_container.push(hook),
            HookStage::StartContainer => start_container.push(hook),
            HookStage::Poststart => poststart.push(hook),
            HookStage::Poststop => poststop.push(hook),
        }
    }
    if create_container.is_empty()
        && create_runtime.is_empty()
        && start_container.is_empty()
        && poststart.is_empty()
        && poststop.is_empty()
    {
        return Ok(None);
    }
    Ok(Some(
        HooksBuilder::default()
            .create_runtime(create_runtime)
            .create_container(create_container)
            .start_container(start_container)
            .poststart(poststart)
            .poststop(poststop)
            .build()?,
    ))
}

/// Deny everything, then allow what every container needs (as runc): null, zero, full,
/// random, urandom, tty, console, ptmx and the pty slaves.
fn default_device_rules() -> Result<Vec<LinuxDeviceCgroup>> {
    let rule = |typ, major: Option<i64>, minor: Option<i64>, access: &str, allow| -> Result<LinuxDeviceCgroup> {
        let mut b = LinuxDeviceCgroupBuilder::default().allow(allow).typ(typ).access(access);
        if let Some(m) = major {
            b = b.major(m);
        }
        if let Some(m) = minor {
            b = b.minor(m);
        }
        Ok(b.build()?)
    };
    use LinuxDeviceType::C;
    Ok(vec![
        rule(LinuxDeviceType::A, None, None, "rwm", false)?,
        rule(C, Some(1), Some(3), "rwm", true)?, // null
        rule(C, Some(1), Some(5), "rwm", true)?, // zero
        rule(C, Some(1), Some(7), "rwm", true)?, // full
        rule(C, Some(1), Some(8), "rwm", true)?, // random
        rule(C, Some(1), Some(9), "rwm", true)?, // urandom
        rule(C, Some(5), Some(0), "rwm", true)?, // tty
        rule(C, Some(5), Some(1), "rwm", true)?, // console
        rule(C, Some(5), Some(2), "rwm", true)?, // ptmx
        rule(C, Some(136), None, "rwm", true)?,  // pts/*
    ])
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::{Network, Volume};
    use crate::edits::{BindMount, ContainerEdits, DeviceNode};
    use crate::sandbox::plan::Limits;

    pub(crate) fn plan() -> JobPlan {
        JobPlan {
            id: "t-1".into(),
            lower: vec!["/store/busybox/tree".into()],
            args: vec!["/bin/sh".into(), "-c".into(), "true".into()],
            env: vec![("FOO".into(), "bar".into()), ("PATH".into(), "/custom".into())],
            cwd: "/".into(),
            uid: 0,
            gid: 0,
            hostname: "azp-t-1".into(),
            volumes: vec![Volume {
                host: "/data/set".into(),
                container: "/datasets/set".into(),
                env: Some("DATASET".into()),
            }],
            limits: Limits {
                memory_bytes: Some(64 << 20),
                pids: Some(100),
                cpus_milli: Some(1500),
                ..Default::default()
            },
            network: Network::Host,
            net: Default::default(),
            edits: ContainerEdits::default(),
            cgroup_path: "/azp-sandbox/t-1".into(),
            owned_dirs: vec![],
            rootless: false,
            process: crate::sandbox::plan::ProcessPlan {
                init: Some("/home/cache/init/azp-init-1".into()),
                terminal: false,
            },
            userns: None,
            scratch: None,
            caches: vec![],
        }
    }

    #[test]
    fn the_init_is_pid_1_and_a_plan_without_it_has_no_spec() {
        let mut p = plan();
        p.process.init = None;
        let e = build(&p, Path::new("/m"), &CgroupOwner::Libcontainer { memsw: false }).unwrap_err();
        assert!(e.to_string().contains("seccomp filter"), "no init, no seccomp filter: refused ({e})");
        let mut p = plan();
        p.process.terminal = true;
        let spec = build(&p, Path::new("/m"), &CgroupOwner::Libcontainer { memsw: false }).unwrap();
        let process = spec.process().as_ref().unwrap();
        assert_eq!(
            process.args().as_ref().unwrap(),
            &["/dev/.azp-init", "--seccomp", "--", "/bin/sh", "-c", "true"],
            "the init installs the seccomp filter, then runs the command"
        );
        assert!(spec.linux().as_ref().unwrap().seccomp().is_none(), "not compiled again by libcontainer");
        assert_eq!(process.terminal(), Some(true));
        // Its bind, /dev's and the other fixed ones are the helper's (see super::treemount).
        let mounts = spec.mounts().as_ref().unwrap();
        for dst in
            ["/dev", "/dev/.azp-init", "/dev/shm", "/dev/pts", "/dev/mqueue", "/tmp", "/etc/resolv.conf", "/etc/hosts"]
        {
            assert!(mounts.iter().all(|m| m.destination() != Path::new(dst)), "{dst} is in the spec");
        }
        let order: Vec<_> = mounts.iter().take(2).map(|m| m.destination().clone()).collect();
        assert_eq!(order, [Path::new("/proc"), Path::new("/sys")]);
    }

    #[test]
    fn env_order_and_override() {
        let env = environment(&plan());
        assert_eq!(env, vec!["PATH=/custom", "HOME=/root", "DATASET=/datasets/set", "FOO=bar"]);
    }

    #[test]
    fn limits_namespaces_and_security() {
        let spec = build(&plan(), Path::new("/jobs/t-1/merged"), &CgroupOwner::Libcontainer { memsw: false }).unwrap();
        let linux = spec.linux().as_ref().unwrap();
        let res = linux.resources().as_ref().unwrap();
        assert_eq!(res.memory().as_ref().unwrap().limit(), Some(64 << 20));
        assert_eq!(res.pids().as_ref().unwrap().limit(), 100);
        assert_eq!(res.cpu().as_ref().unwrap().quota(), Some(150_000));
        let ns: Vec<_> = linux.namespaces().as_ref().unwrap().iter().map(|n| n.typ()).collect();
        assert!(ns.contains(&LinuxNamespaceType::Pid) && ns.contains(&LinuxNamespaceType::Cgroup));
        assert!(!ns.contains(&LinuxNamespaceType::Network), "the helper's network namespace is inherited");
        assert!(!ns.contains(&LinuxNamespaceType::Ipc), "the helper's IPC namespace (the job's) is inherited");
        let proc_ = spec.process().as_ref().unwrap();
        assert_eq!(proc_.no_new_privileges(), Some(true));
        assert_eq!(proc_.oom_score_adj(), Some(JOB_OOM_SCORE_ADJ));
        let bounding = proc_.capabilities().as_ref().unwrap().bounding().as_ref().unwrap();
        assert!(!bounding.contains(&Capability::Mknod));
        assert!(!bounding.contains(&Capability::SysAdmin));
        assert_eq!(linux.cgroups_path().as_deref(), Some(Path::new("/azp-sandbox/t-1")));
        assert_eq!(&proc_.args().as_ref().unwrap()[..2], ["/dev/.azp-init", "--seccomp"], "the init's seccomp filter");
    }

    #[test]
    fn a_scratch_dir_is_bound_read_write_nosuid_nodev() {
        let mut p = plan();
        assert!(scratch_mount(&p).unwrap().is_empty());
        p.scratch =
            Some(crate::sandbox::ScratchDir { host: "/nvme/h-1/t-1".into(), container: "/azp/agent/_work".into() });
        let spec = build(&p, Path::new("/m"), &CgroupOwner::Libcontainer { memsw: false }).unwrap();
        let m =
            spec.mounts().as_ref().unwrap().iter().find(|m| m.destination() == Path::new("/azp/agent/_work")).unwrap();
        assert_eq!(m.source().as_deref(), Some(Path::new("/nvme/h-1/t-1")));
        let o = m.options().as_ref().unwrap();
        for want in ["rw", "nosuid", "nodev"] {
            assert!(o.iter().any(|x| x == want), "{o:?} lacks {want}");
        }
        assert!(!o.iter().any(|x| x == "ro"), "{o:?}");
    }

    #[test]
    fn libcontainers_v1_manager_limits_swap_where_the_kernel_accounts_it() {
        let swap = |memsw| {
            let spec = build(&plan(), Path::new("/m"), &CgroupOwner::Libcontainer { memsw }).unwrap();
            let res = spec.linux().as_ref().unwrap().resources().clone().unwrap();
            res.memory().as_ref().unwrap().swap()
        };
        assert_eq!(swap(true), Some(64 << 20), "memory + swap = the memory limit: no swap beyond it");
        assert_eq!(swap(false), None, "no memsw file to write");
    }

    #[test]
    fn no_core_reaches_a_host_program_and_none_is_written_unasked() {
        let inf = nix::sys::resource::RLIM_INFINITY;
        let fixed = |v| CoreDumps { soft: v, hard: v, fixed: true };
        assert_eq!(core_limit(Some("|/usr/lib/systemd/systemd-coredump %P %u %g %s %t %c %h"), inf), fixed(1));
        assert_eq!(core_limit(Some("|/usr/share/apport/apport -p%p -s%s -c%c -d%d -P%P -- %E\n"), inf), fixed(1));
        assert_eq!(core_limit(Some("@/run/systemd/coredump"), inf), fixed(1), "a socket (Linux 6.16)");
        assert_eq!(core_limit(None, inf), fixed(1), "unread: taken for a pipe");
        assert_eq!(core_limit(Some("|/bin/helper"), 0), fixed(0), "a hard limit of 0 cannot be raised");
        let free = |hard| CoreDumps { soft: 0, hard, fixed: false };
        assert_eq!(core_limit(Some("core\n"), inf), free(inf), "a file in the job's own tree, if it asks");
        assert_eq!(core_limit(Some("/var/crash/core.%p"), 4096), free(4096), "never above the host's hard limit");
    }

    #[test]
    fn a_jobs_rlimits_are_set_not_inherited() {
        let spec = build(&plan(), Path::new("/m"), &CgroupOwner::Libcontainer { memsw: true }).unwrap();
        let limits = spec.process().as_ref().unwrap().rlimits().clone().unwrap();
        let get = |t| limits.iter().find(|l| l.typ() == t).map(|l| (l.soft(), l.hard()));
        assert_eq!(get(PosixRlimitType::RlimitRtprio), Some((0, 0)));
        assert_eq!(get(PosixRlimitType::RlimitNice), Some((0, 0)));
        assert!(get(PosixRlimitType::RlimitNofile).is_some() && get(PosixRlimitType::RlimitCore).is_some());
    }

    #[test]
    fn libcontainers_v1_manager_limits_socket_buffers_too() {
        let memory = |p: &JobPlan| {
            let spec = build(p, Path::new("/m"), &CgroupOwner::Libcontainer { memsw: true }).unwrap();
            *spec.linux().as_ref().unwrap().resources().clone().unwrap().memory()
        };
        let mut p = plan();
        assert_eq!(memory(&p).unwrap().kernel_tcp(), None);
        p.limits.socket_bytes = Some(32 << 20);
        assert_eq!(memory(&p).unwrap().kernel_tcp(), Some(32 << 20));
        p.limits.memory_bytes = None;
        let m = memory(&p).unwrap();
        assert_eq!((m.limit(), m.swap(), m.kernel_tcp()), (None, None, Some(32 << 20)), "without a memory limit");
    }

    #[test]
    fn a_job_with_its_own_network_gets_its_sysfs_from_the_helper_not_the_spec() {
        let mut p = plan();
        p.network = Network::Isolated;
        p.net.sysfs = Some("/run/j/bundle/sys".into());
        p.net.resolv_conf = Some("/run/j/bundle/resolv.conf".into());
        for rootless in [false, true] {
            p.rootless = rootless;
            let spec = build(&p, Path::new("/m"), &CgroupOwner::Libcontainer { memsw: false }).unwrap();
            let ns: Vec<_> =
                spec.linux().as_ref().unwrap().namespaces().as_ref().unwrap().iter().map(|n| n.typ()).collect();
            assert!(!ns.contains(&LinuxNamespaceType::Network), "inherited from the helper");
            let m = spec.mounts().as_ref().unwrap();
            assert!(m.iter().all(|m| m.destination() != Path::new("/sys")), "bound by the helper (treemount)");
        }
        // Without one: the host's /sys, read-only (in a user namespace, a recursive bind).
        p.net = Default::default();
        for (rootless, typ) in [(false, "sysfs"), (true, "bind")] {
            p.rootless = rootless;
            let spec = build(&p, Path::new("/m"), &CgroupOwner::Libcontainer { memsw: false }).unwrap();
            let m = spec.mounts().as_ref().unwrap();
            let sys = m.iter().find(|m| m.destination() == Path::new("/sys")).unwrap();
            assert_eq!(sys.typ().as_deref(), Some(typ));
            assert!(sys.options().as_ref().unwrap().iter().any(|x| x == "ro"));
        }
    }

    #[test]
    fn volumes_and_edit_mounts_are_nosuid_nodev() {
        let mut p = plan();
        p.edits.mounts.push(BindMount {
            host_path: "/usr/lib/libcuda.so.1".into(),
            container_path: "/usr/lib/libcuda.so.1".into(),
            options: vec!["ro".into(), "bind".into()],
            optional: false,
        });
        let spec = build(&p, Path::new("/m"), &CgroupOwner::Libcontainer { memsw: false }).unwrap();
        let binds: Vec<_> =
            spec.mounts().as_ref().unwrap().iter().filter(|m| m.typ().as_deref() == Some("bind")).collect();
        assert_eq!(binds.len(), 2); // the volume and the lib (resolv.conf, hosts, the init: treemount)
                                    // The volume is an rbind: its submounts must be read-only, nosuid, nodev too.
        let vol = binds.iter().find(|b| b.destination() == Path::new("/datasets/set")).unwrap();
        for want in ["rbind", "rro", "rnosuid", "rnodev"] {
            assert!(vol.options().as_ref().unwrap().iter().any(|x| x == want), "volume lacks {want}");
        }
        for b in binds {
            let o = b.options().as_ref().unwrap();
            for want in ["ro", "nosuid", "nodev"] {
                assert!(o.iter().any(|x| x == want), "{:?} lacks {want}: {o:?}", b.destination());
            }
        }
    }

    /// GPU 1's node as discovery reports it, found on the host at `host`.
    pub(crate) fn nvidia1(host: &str) -> DeviceNode {
        DeviceNode {
            path: "/dev/nvidia1".into(),
            host_path: host.into(),
            kind: DeviceKind::Char,
            major: 195,
            minor: 1,
            file_mode: 0o666,
            uid: 0,
            gid: 0,
            access: "rwm".into(),
        }
    }

    #[test]
    fn gpu_nodes_are_created_and_allowed_exactly() {
        let mut p = plan();
        p.edits.device_nodes.push(nvidia1("/dev/nvidia1"));
        p.edits.update_ldcache = true;
        let spec = build(&p, Path::new("/m"), &CgroupOwner::Libcontainer { memsw: false }).unwrap();
        let linux = spec.linux().as_ref().unwrap();
        let devs = linux.devices().as_ref().unwrap();
        assert_eq!(devs.len(), 1);
        assert_eq!(devs[0].path(), &PathBuf::from("/dev/nvidia1"));
        let rules = linux.resources().as_ref().unwrap().devices().as_ref().unwrap();
        let nv: Vec<_> = rules.iter().filter(|r| r.major() == Some(195)).collect();
        assert_eq!(nv.len(), 1);
        assert_eq!(nv[0].minor(), Some(1));
        assert!(!rules[0].allow(), "first rule denies all");
        let hooks = spec.hooks().as_ref().unwrap();
        let cc = hooks.create_container().as_ref().unwrap();
        assert_eq!(cc[0].args().as_ref().unwrap(), &vec!["ldconfig".to_string(), "-r".into(), "/m".into()]);
    }

    #[test]
    fn rootless_binds_sys_and_leaves_cgroups_to_the_helper() {
        let mut p = plan();
        p.rootless = true;
        let spec = build(&p, Path::new("/m"), &CgroupOwner::Helper { leaf: None }).unwrap();
        let linux = spec.linux().as_ref().unwrap();
        // The helper joins the cgroup (sandbox::cgroup): libcontainer gets neither.
        assert!(linux.cgroups_path().is_none(), "{:?}", linux.cgroups_path());
        assert!(linux.resources().as_ref().is_none_or(|r| r.memory().is_none() && r.pids().is_none()));
        let sys = spec.mounts().as_ref().unwrap().iter().find(|m| m.destination() == Path::new("/sys")).unwrap();
        assert_eq!(sys.typ().as_deref(), Some("bind"));
        for o in ["rro", "rnosuid", "rnodev", "rnoexec"] {
            assert!(sys.options().as_ref().unwrap().iter().any(|x| x == o), "{o}");
        }
        // GPU nodes become binds of the host node (a user namespace cannot mknod).
        p.edits.device_nodes.push(nvidia1("/drv/dev/nvidia1"));
        let spec = build(&p, Path::new("/m"), &CgroupOwner::Helper { leaf: None }).unwrap();
        assert!(v1_device_allow_lines(&p).unwrap().is_empty(), "rootless writes no device rules");
        assert!(spec.linux().as_ref().unwrap().devices().as_ref().is_none_or(|d| d.is_empty()));
        assert_node_is_the_helpers_bind(&p, &spec);
    }

    /// /dev/nvidia1 is bound from its host path by the helper (treemount), not the spec.
    fn assert_node_is_the_helpers_bind(p: &JobPlan, spec: &Spec) {
        use crate::sandbox::treemount::{list, What};
        let mounts = spec.mounts().as_ref().unwrap();
        assert!(mounts.iter().all(|m| m.destination() != Path::new("/dev/nvidia1")), "{mounts:?}");
        let tree = list(p, (0, 0)).unwrap();
        let nv = tree.iter().find(|m| m.dst == Path::new("/dev/nvidia1")).unwrap();
        assert_eq!(nv.what, What::Bind { from: "/drv/dev/nvidia1".into(), dir: false });
        assert!(!nv.flags.contains(crate::sys::MsFlags::MS_NODEV) && nv.flags.contains(crate::sys::MsFlags::MS_NOSUID));
    }

    #[test]
    fn a_root_job_with_ids_of_its_own_binds_devices_and_sys_and_joins_its_namespace() {
        let mut p = plan();
        p.userns = Some(crate::identity::JobIds::block(0, (1 << 31, 1 << 31), (0, 0)));
        p.edits.device_nodes.push(nvidia1("/drv/dev/nvidia1"));
        let mut spec = build(&p, Path::new("/m"), &CgroupOwner::Helper { leaf: Some("/job".into()) }).unwrap();
        let mounts = spec.mounts().as_ref().unwrap();
        let sys = mounts.iter().find(|m| m.destination() == Path::new("/sys")).unwrap();
        assert_eq!(sys.typ().as_deref(), Some("bind"), "a fresh sysfs needs a netns the job's userns owns");
        assert_node_is_the_helpers_bind(&p, &spec);
        assert!(spec.linux().as_ref().unwrap().devices().as_ref().is_none_or(|d| d.is_empty()), "no mknod");
        assert_eq!(v1_device_allow_lines(&p).unwrap().last().unwrap(), "c 195:1 rwm", "the cgroup still allows it");
        join_user_namespace(&mut spec, Path::new("/proc/self/fd/7")).unwrap();
        let ns = spec.linux().as_ref().unwrap().namespaces().as_ref().unwrap();
        assert_eq!(ns[0].typ(), LinuxNamespaceType::User, "joined first, before the others are made");
        assert_eq!(ns[0].path().as_deref(), Some(Path::new("/proc/self/fd/7")));
        assert!(spec.linux().as_ref().unwrap().uid_mappings().is_none(), "the helper wrote the maps");
    }

    #[test]
    fn root_with_helper_cgroups_gives_libcontainer_only_the_leaf() {
        let mut p = plan();
        p.edits.device_nodes.push(nvidia1("/dev/nvidia1"));
        let spec = build(&p, Path::new("/m"), &CgroupOwner::Helper { leaf: Some("/job".into()) }).unwrap();
        let linux = spec.linux().as_ref().unwrap();
        assert_eq!(linux.cgroups_path().as_deref(), Some(Path::new("/job")));
        // (oci-spec's builder fills in empty resources.)
        let empty = |r: &oci_spec::runtime::LinuxResources| {
            r.memory().is_none()
                && r.pids().is_none()
                && r.cpu().is_none()
                && r.devices().as_ref().is_none_or(|d| d.is_empty())
        };
        assert!(linux.resources().as_ref().is_none_or(empty), "limits and device rules are the helper's");
        assert_eq!(linux.devices().as_ref().unwrap().len(), 1, "the GPU node is still created");
        let lines = v1_device_allow_lines(&p).unwrap();
        assert_eq!(lines[0], "c 1:3 rwm");
        assert!(lines.contains(&"c 136:* rwm".to_string()));
        assert_eq!(lines.last().unwrap(), "c 195:1 rwm");
        assert!(!lines.iter().any(|l| l.starts_with('a')), "deny-all is written separately: {lines:?}");
    }
}
