//! The default seccomp profile of every job: allow by default, deny (EPERM) the syscalls
//! that only serve to attack or reconfigure the host kernel. A denylist rather than
//! Docker's allowlist, because CI jobs run arbitrary toolchains (new syscalls must not
//! break them), and the capability set already removes what the denied calls would
//! need; seccomp is the second wall, and blocks what capabilities do not cover
//! (unprivileged user namespaces, keyrings, userfaultfd, perf, bpf).
//!
//! Reviewed line by line against Docker's default profile (moby/profiles
//! `seccomp/default.json`): every call Docker denies a container with its default
//! capabilities is denied here too, except the NUMA calls (`mbind`, `get_mempolicy`,
//! `set_mempolicy`, `migrate_pages`, `move_pages`, which CUDA, NCCL, hwloc and MPI use to
//! place memory), and this profile denies more: `name_to_handle_at`, `memfd_secret`,
//! `socketcall`, every socket family but the five a CI job needs, netlink's device
//! events and IPv6 flow labels. SECURITY.md has the comparison.
//!
//! Compiled once, at build time: build.rs includes this file, turns [`rules`] into a BPF
//! program with libseccomp (as libcontainer would in every job's init, where that took
//! ~1.8 ms of a ~16 ms cycle, see bench/NOTES.md), and the job's init
//! (`src/sys/init/main.rs`) carries the program and installs it before it runs the
//! command: it is the init of every job, and a spec without it is refused
//! (`sandbox::spec`). A name the build host's libseccomp does not know (a call newer than
//! it) is left out, with a warning in the build's output. This file is plain data and
//! `libc` constants, so that build.rs can include it.
//!
//! ptrace stays allowed: a job's pid namespace holds only its own processes, and
//! debuggers (gdb, cuda-gdb, strace) are common in CI.

pub const DENIED: &[&str] = &[
    // Mounts and root changes (also need CAP_SYS_ADMIN, which jobs lack).
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    // New namespaces, including unprivileged user namespaces (a large kernel attack surface).
    "unshare",
    "setns",
    // Kernel code and kernel state.
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "bpf",
    "perf_event_open",
    "iopl",
    "ioperm",
    "reboot",
    "swapon",
    "swapoff",
    "syslog",
    "acct",
    "quotactl",
    "quotactl_fd",
    "lookup_dcookie",
    "nfsservctl",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "stime",
    "vhangup",
    "clock_settime64",
    // The hostname is the job's own (UTS namespace), and changing it needs CAP_SYS_ADMIN.
    "sethostname",
    "setdomainname",
    // Keyrings are not namespaced.
    "add_key",
    "request_key",
    "keyctl",
    // userfaultfd: a favourite of kernel exploits.
    "userfaultfd",
    // File handles bypass path-based confinement (the "shocker" escape).
    "open_by_handle_at",
    "name_to_handle_at",
    // Other processes' fds, memory advice and kernel object comparison: Docker allows
    // them only with CAP_SYS_PTRACE; a debugger needs none of them.
    "kcmp",
    "pidfd_getfd",
    "process_madvise",
    // Filesystem-wide event monitoring (unprivileged since Linux 5.13, in a limited form).
    "fanotify_init",
    // Memory the kernel hides from itself (a secret area no debugger or dump can read):
    // nothing a CI job needs, and a young kernel surface. memfd_create stays (CUDA IPC).
    "memfd_secret",
    // The 32-bit socket multiplexer: it takes its arguments in memory, where the socket
    // family rules below cannot look, so it would bypass them. 32-bit x86 programs create
    // sockets with the direct calls since Linux 4.3 (socket, socketpair).
    "socketcall",
    // Obsolete or dangerous.
    "uselib",
    "get_kernel_syms",
    "query_module",
    "_sysctl",
    "ustat",
    "sysfs",
    // Old 32-bit x86 entry points Docker's profile does not allow either (what it also
    // denies but the kernel no longer implements, `break`, `ftime`, `vm86`, `bdflush` and
    // the like, answers ENOSYS with or without a rule, and is not listed: each name is a
    // rule libseccomp compiles in every job's init).
    "oldfstat",
    "oldlstat",
    "oldstat",
    "olduname",
    "oldolduname",
    "readdir",
    "sgetmask",
    "ssetmask",
    "sigaction",
    "signal",
    "sigpending",
    "sigsuspend",
    "nice",
    // io_uring: a large, fast-moving kernel surface and the source of many recent local
    // privilege escalations; denied by Docker's default profile since 25.0. Programs fall
    // back to ordinary I/O when io_uring_setup fails.
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
];

/// Namespace flags of clone(2). Denying unshare(2) alone is not enough: clone(2) with
/// CLONE_NEWUSER makes an unprivileged user namespace just the same (and with it
/// CLONE_NEWNET, the netfilter attack surface behind many container escapes). Found by
/// tests/escape_suite.rs (t04, `clone-newuser`).
const CLONE_NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// Socket families a job may create: local sockets, IPv4, IPv6, netlink (routing
/// queries: `ip`, glibc's `getaddrinfo`) and packet sockets (which still need
/// CAP_NET_RAW, dropped: the kernel answers EPERM). Docker's profile allows every family
/// but AF_ALG and AF_VSOCK; the rest are rarely used protocol stacks (RDS, TIPC, CAN,
/// X.25, ...) with a long list of kernel bugs. NCCL's bootstrap and socket transport use
/// IPv4/IPv6; InfiniBand goes through /dev/infiniband, not a socket family.
pub const ALLOWED_SOCKET_FAMILIES: &[i32] =
    &[libc::AF_UNIX, libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK, libc::AF_PACKET];

/// Families below this are denied but for the allowed ones (the kernel has 46 in Linux
/// 6.18 and refuses larger numbers itself); the margin covers families added later.
const SOCKET_FAMILY_LIMIT: i32 = 64;
/// `SOCKET_FAMILY_LIMIT` as bits.
const SOCKET_FAMILY_BITS: u32 = 6;

/// `personality(2)` values Docker's profile allows: PER_LINUX, PER_LINUX32, UNAME26 and
/// their combination, and the query (0xffffffff). Denied: the flags that weaken the
/// process (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO, ...). gdb then warns
/// that it cannot disable address randomization, as it does under Docker.
pub const ALLOWED_PERSONALITIES: &[u32] = &[0, 0x8, 0x20000, 0x20008, 0xffff_ffff];
/// The calls that change a file's project id or PROJINHERIT: with them a job (the owner
/// of its files, or root with CAP_FOWNER) could move what it writes out of its layer's
/// disk quota (see `sys::quota`). The kernel refuses that only from a user namespace
/// other than the initial one. EPERM for the FS_IOC_FSSETXATTR and FS_IOC_SETFLAGS
/// ioctls (both ABIs' numbers; the kernel reads the command as 32 bits, so only those
/// are compared); `chattr` in a job fails with it. Not covered: file_setattr(2) (Linux
/// 6.17), which libseccomp 2.5 cannot name (libcontainer skips unknown names); a job
/// in a user namespace of its own is refused by the kernel itself (SECURITY.md).
const FS_IOC_FSSETXATTR: u64 = 0x401c_5820;
const FS_IOC_SETFLAGS: [u64; 2] = [0x4008_6602, 0x4004_6602];

/// One rule of the filter: `name` fails with `errno`, when every one of `args` matches
/// (always, when there is none). Whatever no rule denies is allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub name: &'static str,
    pub errno: i32,
    pub args: [Option<ArgMatch>; 2],
}

/// Argument `index` matches when `(arg & mask) == value` (`not`: when it differs, with
/// the whole argument: `mask` all ones). Masked, and only the low 32 bits where the
/// kernel reads the argument as a 32-bit int: a job that sets the upper half of the
/// register would otherwise slip past a plain comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgMatch {
    pub index: u32,
    pub mask: u64,
    pub value: u64,
    pub not: bool,
}

/// The architectures a filter for `target_arch` (Rust's name) covers, as libseccomp
/// names them: the native ABI and the compat ABIs the kernel also runs (32-bit x86 and
/// x32 programs on x86_64, 32-bit arm on aarch64). A call through an ABI not listed
/// kills the process (libseccomp's default for a foreign architecture).
pub fn architectures(target_arch: &str) -> Option<&'static [&'static str]> {
    match target_arch {
        "x86_64" => Some(&["x86_64", "x86", "x32"]),
        "aarch64" => Some(&["aarch64", "arm"]),
        _ => None,
    }
}

/// The whole profile, in the order the filter is built from.
pub fn rules() -> Vec<Rule> {
    let mut rules: Vec<Rule> =
        DENIED.iter().map(|&name| Rule { name, errno: libc::EPERM, args: [None, None] }).collect();
    // clone(2) with any namespace flag (its flags are argument 0 on x86 and arm): one rule
    // per flag, as rules are ORed and the conditions within one rule ANDed.
    for &flag in CLONE_NAMESPACE_FLAGS {
        rules.push(masked("clone", 0, flag, flag, libc::EPERM));
    }
    rules.extend(project_quota_rules());
    rules.extend(init_tamper_rules());
    // clone3(2) passes its flags in memory, which seccomp cannot inspect: ENOSYS (not
    // EPERM) makes glibc >= 2.34 and other libcs fall back to clone(2), as Docker's default
    // profile does.
    rules.push(Rule { name: "clone3", errno: libc::ENOSYS, args: [None, None] });
    // Every other socket family: EAFNOSUPPORT, what a kernel without that family says, so
    // that libraries probing one (OpenSSL's afalg engine, vsock-aware tools) fall back.
    // Ten rules rather than 59: fewer comparisons for every `socket` call of a job.
    for (mask, value) in denied_family_cubes() {
        rules.push(masked("socket", 0, mask, value, libc::EAFNOSUPPORT));
    }
    rules.extend(personality_rules());
    rules.extend(classic_bpf_rules());
    rules.extend(shared_network_state_rules());
    rules
}

/// Where the host pipes core dumps to a program (`kernel.core_pattern` `|...`), the job's
/// RLIMIT_CORE is 1, the one value for which the kernel starts no helper (see
/// `sandbox::spec`). Lowering a limit needs no privilege, so the job may not change that
/// one: `setrlimit(RLIMIT_CORE)`, and `prlimit64` of it with a new value (reading it,
/// with a NULL new value, stays allowed: glibc's `getrlimit` is that call). The jobs'
/// filter with these rules added is the init's `--seccomp-core-fixed`.
pub fn core_fixed_rules() -> [Rule; 2] {
    const RLIMIT_CORE: u64 = 4;
    let resource = |index| int_arg(index, RLIMIT_CORE);
    let new_limit = Some(ArgMatch { index: 2, mask: u64::MAX, value: 0, not: true });
    [
        Rule { name: "setrlimit", errno: libc::EPERM, args: [resource(0), None] },
        Rule { name: "prlimit64", errno: libc::EPERM, args: [resource(1), new_limit] },
    ]
}

/// Classic BPF programs a job would load into the kernel: seccomp filters (`seccomp(2)`
/// with SECCOMP_SET_MODE_FILTER, `prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)`) and socket
/// filters (`SO_ATTACH_FILTER`, `SO_ATTACH_REUSEPORT_CBPF`). Each is JIT-compiled into
/// one budget for the whole node (`net.core.bpf_jit_limit`), charged to no memory limit;
/// past it every filter of the node fails (ENOTSUPP where the JIT is always on, as in
/// Debian's, Ubuntu's and RHEL's kernels), the next job's own seccomp filter included (a
/// red-team pass filled it in 4 s from one job). The job's filter is installed by its
/// init before any of the job's code runs. Docker's profile allows these; Chromium
/// already needs `--no-sandbox` here (user namespaces are denied).
fn classic_bpf_rules() -> [Rule; 4] {
    const SECCOMP_SET_MODE_FILTER: u64 = 1;
    const SECCOMP_MODE_FILTER: u64 = 2;
    const PR_SET_SECCOMP: u64 = 22;
    const SOL_SOCKET: u64 = 1;
    const SO_ATTACH_FILTER: u64 = 26;
    const SO_ATTACH_REUSEPORT_CBPF: u64 = 51;
    let arg = int_arg;
    let rule = |name, args| Rule { name, errno: libc::EPERM, args };
    [
        rule("seccomp", [arg(0, SECCOMP_SET_MODE_FILTER), None]),
        rule("prctl", [arg(0, PR_SET_SECCOMP), arg(1, SECCOMP_MODE_FILTER)]),
        // The level too: 26 is IPV6_V6ONLY at IPPROTO_IPV6, 51 IP_LOCAL_PORT_RANGE at IPPROTO_IP.
        rule("setsockopt", [arg(1, SOL_SOCKET), arg(2, SO_ATTACH_FILTER)]),
        rule("setsockopt", [arg(1, SOL_SOCKET), arg(2, SO_ATTACH_REUSEPORT_CBPF)]),
    ]
}

/// What every network namespace of the node shares and a job's own namespace does not
/// separate (a red-team pass):
/// - IPv6 flow labels (`setsockopt(IPPROTO_IPV6, IPV6_FLOWLABEL_MGR)`): one table of
///   4096 for the node, of which processes without CAP_NET_ADMIN in the host's user
///   namespace get 3072, each label kept up to 150 s after its socket closed. One job
///   took them all, and the other jobs and the host's users got ENOBUFS. Denied (EPERM);
///   `getsockopt` stays, and packets of jobs still carry the kernel's automatic labels.
/// - The kernel's device events (`socket(AF_NETLINK, _, NETLINK_KOBJECT_UEVENT)`): sent
///   to every network namespace the host's user namespace owns, as a root-mode job's is.
///   A job heard the host's device, block, GPU and module events. Denied with
///   EPROTONOSUPPORT, what a kernel without the protocol says (udev's monitor gives up);
///   no udev runs in a job. Other netlink protocols stay (`ip`, `ss`, RDMA tools).
fn shared_network_state_rules() -> [Rule; 2] {
    const IPPROTO_IPV6: u64 = 41;
    const IPV6_FLOWLABEL_MGR: u64 = 32;
    const AF_NETLINK: u64 = 16;
    const NETLINK_KOBJECT_UEVENT: u64 = 15;
    let arg = int_arg;
    [
        Rule { name: "setsockopt", errno: libc::EPERM, args: [arg(1, IPPROTO_IPV6), arg(2, IPV6_FLOWLABEL_MGR)] },
        Rule {
            name: "socket",
            errno: libc::EPROTONOSUPPORT,
            args: [arg(0, AF_NETLINK), arg(2, NETLINK_KOBJECT_UEVENT)],
        },
    ]
}

/// The job's init (pid 1 in the job's pid namespace) is what ties the job to its
/// supervisor (see `sys::lifeline`): it runs as the job's user, so without this rule a job
/// could PTRACE_SEIZE it and hold it stopped, never seeing the lifeline close, and outlive
/// `kill -9` of its supervisor until `gc`. EPERM for `ptrace` (any request; its pid is
/// the second argument) and `process_vm_writev` (the first) aimed at pid 1; other pids
/// are the job's own business (gdb, strace). Not covered: writing `/proc/1/mem`, which
/// seccomp cannot see by pid (SECURITY.md).
fn init_tamper_rules() -> [Rule; 2] {
    [masked("ptrace", 1, 0xffff_ffff, 1, libc::EPERM), masked("process_vm_writev", 0, 0xffff_ffff, 1, libc::EPERM)]
}

fn project_quota_rules() -> [Rule; 3] {
    [FS_IOC_FSSETXATTR, FS_IOC_SETFLAGS[0], FS_IOC_SETFLAGS[1]]
        .map(|cmd| masked("ioctl", 1, 0xffff_ffff, cmd, libc::EPERM))
}

/// Socket families below [`SOCKET_FAMILY_LIMIT`] that are not allowed.
pub fn denied_socket_families() -> impl Iterator<Item = i32> {
    (0..SOCKET_FAMILY_LIMIT).filter(|f| !ALLOWED_SOCKET_FAMILIES.contains(f))
}

/// The denied families as `(mask, value)` pairs of masked comparisons of the low 32 bits
/// (a family matches `(family & mask) == value`), each covering as many as it can: split
/// the range in halves, bit by bit from the top, until a half holds no allowed family.
fn denied_family_cubes() -> Vec<(u64, u64)> {
    fn split(prefix: u64, free_bits: u32, out: &mut Vec<(u64, u64)>) {
        let size = 1u64 << free_bits;
        let allowed_inside = ALLOWED_SOCKET_FAMILIES.iter().any(|&f| (f as u64) >> free_bits == prefix >> free_bits);
        if !allowed_inside {
            // Above the family bits every bit must be 0: a larger int is no family (and
            // the kernel refuses it), so it needs no rule.
            out.push((0xffff_ffff & !(size - 1), prefix));
        } else if free_bits > 0 {
            split(prefix, free_bits - 1, out);
            split(prefix | 1 << (free_bits - 1), free_bits - 1, out);
        }
    }
    let mut out = Vec::new();
    split(0, SOCKET_FAMILY_BITS, &mut out);
    out
}

/// `name` fails with `errno` when `(argument index & mask) == value`.
/// Argument `index` is `value`, compared as the kernel reads an int: its low 32 bits.
fn int_arg(index: u32, value: u64) -> Option<ArgMatch> {
    Some(ArgMatch { index, mask: 0xffff_ffff, value, not: false })
}

fn masked(name: &'static str, index: u32, mask: u64, value: u64, errno: i32) -> Rule {
    Rule { name, errno, args: [Some(ArgMatch { index, mask, value, not: false }), None] }
}

/// Rules that deny every `personality(2)` argument but [`ALLOWED_PERSONALITIES`] (low 32
/// bits; the kernel ignores the rest). A rule holds one comparison per argument, and
/// rules are ORed, so "not one of these" is spelled as bits: with bit 31 clear, any bit
/// other than 3 (PER_LINUX32) and 17 (UNAME26) denies; with bit 31 set, any clear bit
/// denies (only the query, 0xffffffff, has none).
fn personality_rules() -> Vec<Rule> {
    const HIGH: u64 = 1 << 31;
    let allowed_bits: u64 = ALLOWED_PERSONALITIES.iter().filter(|&&p| p != u32::MAX).fold(0, |a, &p| a | p as u64);
    let mut rules = Vec::new();
    for bit in 0..31 {
        let b = 1u64 << bit;
        if allowed_bits & b == 0 {
            rules.push(masked("personality", 0, HIGH | b, b, libc::EPERM));
        }
        rules.push(masked("personality", 0, HIGH | b, HIGH, libc::EPERM));
    }
    rules
}

/// Whether the rules for `name` deny a call whose argument is `arg` at the index each
/// rule compares, evaluated as seccomp would (for the unit tests of one-argument rules).
#[cfg(test)]
fn denies(name: &str, arg: u64) -> Option<i32> {
    denies_call(name, &[arg; 6])
}

/// Whether the rules for `name` deny a call with arguments `args`, as seccomp would.
#[cfg(test)]
fn denies_call(name: &str, args: &[u64; 6]) -> Option<i32> {
    denies_in(&rules(), name, args)
}

#[cfg(test)]
fn denies_in(rules: &[Rule], name: &str, args: &[u64; 6]) -> Option<i32> {
    rules.iter().filter(|r| r.name == name).find_map(|r| {
        r.args.iter().flatten().all(|m| (args[m.index as usize] & m.mask == m.value) != m.not).then_some(r.errno)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn personality_allowed(arg: u64) -> bool {
        denies("personality", arg).is_none()
    }

    #[test]
    fn personality_allows_exactly_dockers_values() {
        for &p in ALLOWED_PERSONALITIES {
            assert!(personality_allowed(p as u64), "{p:#x} must stay allowed");
            assert!(personality_allowed((p as u64) | (7 << 32)), "{p:#x}: the kernel ignores the upper half");
        }
        // READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO, ADDR_LIMIT_32BIT, alone,
        // with PER_LINUX32, and with bit 31 set (not the query).
        for flag in [0x0400000u64, 0x0040000, 0x0100000, 0x0800000, 0x1, 0x80000000, 0xfffffffe, 0x7fffffff] {
            for base in [0u64, 0x8, 0x20008] {
                assert!(!personality_allowed(flag | base), "{:#x} must be denied", flag | base);
            }
        }
        let allowed = (0..=u32::MAX as u64).step_by(40009).filter(|&v| personality_allowed(v)).count();
        assert_eq!(allowed, 1, "a sweep finds only 0 among multiples of 40009");
    }

    #[test]
    fn socket_families_denied_are_all_but_five() {
        let denied: Vec<i32> = denied_socket_families().collect();
        for f in [libc::AF_ALG, libc::AF_VSOCK, 21 /* RDS */, 30 /* TIPC */, 29 /* CAN */, 0, 63] {
            assert!(denied.contains(&f), "{f}");
        }
        assert_eq!(denied.len(), SOCKET_FAMILY_LIMIT as usize - ALLOWED_SOCKET_FAMILIES.len());
        // The family rules: one comparison each (the device events' rule has two).
        let socket_rules: Vec<_> = rules().into_iter().filter(|r| r.name == "socket" && r.args[1].is_none()).collect();
        assert_eq!(socket_rules.len(), 10, "the smallest cover of 0..63 without 1, 2, 10, 16, 17");
        assert!(socket_rules.iter().all(|r| r.errno == libc::EAFNOSUPPORT));
        // As seccomp evaluates them: a family is denied exactly when it is not allowed,
        // also with a bit set above the 32 the kernel reads.
        let denied_family = |arg: u64| denies("socket", arg).is_some();
        for f in 0..SOCKET_FAMILY_LIMIT as u64 {
            assert_eq!(denied_family(f), denied.contains(&(f as i32)), "family {f}");
            assert_eq!(denied_family(f | 1 << 32), denied.contains(&(f as i32)), "family {f} with a high bit");
        }
        assert!(!denied_family(4096), "a number the kernel refuses itself needs no rule");
    }

    #[test]
    fn clone_with_any_namespace_flag_and_clone3_are_refused() {
        for &flag in CLONE_NAMESPACE_FLAGS {
            assert_eq!(denies("clone", flag | libc::SIGCHLD as u64), Some(libc::EPERM), "{flag:#x}");
        }
        let fork_flags = (libc::CLONE_CHILD_CLEARTID | libc::CLONE_CHILD_SETTID | libc::SIGCHLD) as u64;
        assert_eq!(denies("clone", fork_flags), None, "fork stays allowed");
        assert_eq!(denies("clone3", 0), Some(libc::ENOSYS), "libcs fall back to clone on ENOSYS");
        assert_eq!(denies("ptrace", 1), Some(libc::EPERM), "the init (pid 1) is not traced");
        assert_eq!(denies("ptrace", 2), None, "the job's own processes are");
    }

    #[test]
    fn classic_bpf_programs_are_refused_and_nothing_beside_them() {
        const EPERM: Option<i32> = Some(libc::EPERM);
        let call = |a: [u64; 3]| [a[0], a[1], a[2], 0, 0, 0];
        assert_eq!(denies_call("seccomp", &call([1, 0, 0x7ffd_0000])), EPERM, "SECCOMP_SET_MODE_FILTER");
        assert_eq!(denies_call("seccomp", &call([1 | 1 << 32, 0, 0])), EPERM, "the kernel reads an int");
        assert_eq!(denies_call("seccomp", &call([2, 0, 0])), None, "SECCOMP_GET_ACTION_AVAIL");
        assert_eq!(denies_call("seccomp", &call([0, 0, 0])), None, "strict mode loads no program");
        assert_eq!(denies_call("prctl", &call([22, 2, 0x7ffd_0000])), EPERM, "PR_SET_SECCOMP, FILTER");
        assert_eq!(denies_call("prctl", &call([22, 1, 0])), None, "strict mode");
        assert_eq!(denies_call("prctl", &call([38, 1, 0])), None, "PR_SET_NO_NEW_PRIVS");
        assert_eq!(denies_call("prctl", &call([15, 2, 0])), None, "PR_SET_NAME with a 2");
        let setsockopt = |level, name| denies_call("setsockopt", &[3, level, name, 0x7ffd_0000, 16, 0]);
        assert_eq!(setsockopt(1, 26), EPERM, "SO_ATTACH_FILTER");
        assert_eq!(setsockopt(1, 51), EPERM, "SO_ATTACH_REUSEPORT_CBPF");
        assert_eq!(setsockopt(41, 26), None, "IPV6_V6ONLY");
        assert_eq!(setsockopt(0, 51), None, "IP_LOCAL_PORT_RANGE");
        assert_eq!(setsockopt(1, 2), None, "SO_REUSEADDR");
        assert_eq!(setsockopt(1, 27), None, "SO_DETACH_FILTER");
    }

    #[test]
    fn flow_labels_and_device_events_are_refused_and_nothing_beside_them() {
        let setsockopt = |level, name| denies_call("setsockopt", &[3, level, name, 0x7ffd_0000, 32, 0]);
        assert_eq!(setsockopt(41, 32), Some(libc::EPERM), "IPV6_FLOWLABEL_MGR");
        assert_eq!(setsockopt(41 | 1 << 32, 32 | 1 << 32), Some(libc::EPERM), "the kernel reads ints");
        assert_eq!(setsockopt(0, 32), None, "IP_MULTICAST_IF at IPPROTO_IP");
        assert_eq!(setsockopt(41, 26), None, "IPV6_V6ONLY");
        assert_eq!(denies_call("getsockopt", &[3, 41, 32, 0x7ffd_0000, 0x7ffd_0100, 0]), None, "reading one");
        let socket = |family, kind, proto| denies_call("socket", &[family, kind, proto, 0, 0, 0]);
        let cloexec = libc::SOCK_CLOEXEC as u64;
        assert_eq!(socket(16, 2, 15), Some(libc::EPROTONOSUPPORT), "NETLINK_KOBJECT_UEVENT");
        assert_eq!(socket(16, 3 | cloexec, 15 | 1 << 32), Some(libc::EPROTONOSUPPORT), "any type, an int");
        assert_eq!(socket(16, 3, 0), None, "NETLINK_ROUTE");
        assert_eq!(socket(16, 3, 4), None, "NETLINK_SOCK_DIAG");
        assert_eq!(socket(16, 3, 20), None, "NETLINK_RDMA");
        assert_eq!(socket(2, 3, 15), None, "another family's protocol 15");
    }

    #[test]
    fn a_fixed_core_limit_cannot_be_changed_but_read() {
        let fixed: Vec<Rule> = rules().into_iter().chain(core_fixed_rules()).collect();
        const EPERM: Option<i32> = Some(libc::EPERM);
        let ptr = 0x7ffd_0000;
        assert_eq!(denies_in(&fixed, "setrlimit", &[4, ptr, 0, 0, 0, 0]), EPERM, "ulimit -c 0");
        assert_eq!(denies_in(&fixed, "setrlimit", &[7, ptr, 0, 0, 0, 0]), None, "RLIMIT_NOFILE");
        assert_eq!(denies_in(&fixed, "prlimit64", &[0, 4, ptr, 0, 0, 0]), EPERM, "a new core limit");
        assert_eq!(denies_in(&fixed, "prlimit64", &[0, 4, 0, ptr, 0, 0]), None, "getrlimit(RLIMIT_CORE)");
        assert_eq!(denies_in(&fixed, "prlimit64", &[0, 7, ptr, 0, 0, 0]), None, "another limit");
        assert_eq!(denies_in(&fixed, "prlimit64", &[0, 4 | 1 << 32, ptr, 0, 0, 0]), EPERM, "an int resource");
        assert_eq!(denies_call("setrlimit", &[4, ptr, 0, 0, 0, 0]), None, "the default filter leaves it");
    }

    #[test]
    fn the_list_covers_docker_denials_and_the_issue() {
        for s in ["socketcall", "memfd_secret", "kcmp", "pidfd_getfd", "fanotify_init", "sethostname", "unshare"] {
            assert!(DENIED.contains(&s), "{s}");
        }
        for s in ["memfd_create", "ioctl", "mmap", "ptrace", "mbind", "set_mempolicy", "socket", "personality"] {
            assert!(!DENIED.contains(&s), "{s} is needed by CUDA, NCCL or debuggers (or filtered by argument)");
        }
        for s in ["mount", "unshare", "bpf", "keyctl", "userfaultfd", "kexec_load", "open_by_handle_at"] {
            assert_eq!(denies(s, 0), Some(libc::EPERM), "{s} not denied");
        }
        let mut sorted = DENIED.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), DENIED.len(), "no duplicates");
    }
}
