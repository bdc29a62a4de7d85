//! The default seccomp profile of every job: allow by default, deny (EPERM) the syscalls
//! that only serve to attack or reconfigure the host kernel. A denylist rather than
//! Docker's allowlist, because CI jobs run arbitrary toolchains (new syscalls must not
//! break them), and the capability set already removes what the denied calls would
//! need; seccomp is the second wall, and blocks what capabilities do not cover
//! (unprivileged user namespaces, keyrings, userfaultfd, perf, bpf).
//!
//! libcontainer is built with its `libseccomp` feature: a profile that cannot be
//! installed fails the job instead of being silently ignored.
//!
//! ptrace stays allowed: a job's pid namespace holds only its own processes, and
//! debuggers (gdb, cuda-gdb, strace) are common in CI.

use anyhow::Result;
use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder, LinuxSeccompBuilder, LinuxSeccompOperator,
    LinuxSyscallBuilder,
};

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
    // Keyrings are not namespaced.
    "add_key",
    "request_key",
    "keyctl",
    // userfaultfd: a favourite of kernel exploits.
    "userfaultfd",
    // File handles bypass path-based confinement (the "shocker" escape).
    "open_by_handle_at",
    "name_to_handle_at",
    // Obsolete or dangerous.
    "uselib",
    "get_kernel_syms",
    "query_module",
    "_sysctl",
    "ustat",
    "sysfs",
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

fn project_quota_rules() -> Result<Vec<oci_spec::runtime::LinuxSyscall>> {
    let mut rules = vec![];
    for cmd in [FS_IOC_FSSETXATTR, FS_IOC_SETFLAGS[0], FS_IOC_SETFLAGS[1]] {
        let is_cmd = LinuxSeccompArgBuilder::default()
            .index(1usize)
            .value(cmd)
            .value_two(0xffff_ffffu64)
            .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
            .build()?;
        rules.push(
            LinuxSyscallBuilder::default()
                .names(vec!["ioctl".to_string()])
                .action(LinuxSeccompAction::ScmpActErrno)
                .errno_ret(libc::EPERM as u32)
                .args(vec![is_cmd])
                .build()?,
        );
    }
    Ok(rules)
}

pub fn default_profile() -> Result<LinuxSeccomp> {
    let arches = match std::env::consts::ARCH {
        "aarch64" => vec![Arch::ScmpArchAarch64, Arch::ScmpArchArm],
        _ => vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32],
    };
    let deny = LinuxSyscallBuilder::default()
        .names(DENIED.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .action(LinuxSeccompAction::ScmpActErrno)
        .errno_ret(libc::EPERM as u32)
        .build()?;
    let mut syscalls = vec![deny];
    // clone(2) with any namespace flag (its flags are argument 0 on x86 and arm): one rule
    // per flag, as rules are ORed and the conditions within one rule ANDed.
    for &flag in CLONE_NAMESPACE_FLAGS {
        let has_flag = LinuxSeccompArgBuilder::default()
            .index(0usize)
            .value(flag)
            .value_two(flag)
            .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
            .build()?;
        syscalls.push(
            LinuxSyscallBuilder::default()
                .names(vec!["clone".to_string()])
                .action(LinuxSeccompAction::ScmpActErrno)
                .errno_ret(libc::EPERM as u32)
                .args(vec![has_flag])
                .build()?,
        );
    }
    syscalls.extend(project_quota_rules()?);
    // clone3(2) passes its flags in memory, which seccomp cannot inspect: ENOSYS (not
    // EPERM) makes glibc >= 2.34 and other libcs fall back to clone(2), as Docker's default
    // profile does.
    syscalls.push(
        LinuxSyscallBuilder::default()
            .names(vec!["clone3".to_string()])
            .action(LinuxSeccompAction::ScmpActErrno)
            .errno_ret(libc::ENOSYS as u32)
            .build()?,
    );
    Ok(LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActAllow)
        .architectures(arches)
        .syscalls(syscalls)
        .build()?)
}
