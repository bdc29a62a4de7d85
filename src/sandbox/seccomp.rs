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
use oci_spec::runtime::{Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompBuilder, LinuxSyscallBuilder};

pub const DENIED: &[&str] = &[
    // Mounts and root changes (also need CAP_SYS_ADMIN, which jobs lack).
    "mount", "umount", "umount2", "pivot_root", "mount_setattr", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick",
    // New namespaces, including unprivileged user namespaces (a large kernel attack surface).
    "unshare", "setns",
    // Kernel code and kernel state.
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "create_module", "bpf", "perf_event_open", "iopl", "ioperm", "reboot", "swapon",
    "swapoff", "syslog", "acct", "quotactl", "quotactl_fd", "lookup_dcookie", "nfsservctl",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "stime", "vhangup",
    // Keyrings are not namespaced.
    "add_key", "request_key", "keyctl",
    // userfaultfd: a favourite of kernel exploits.
    "userfaultfd",
    // File handles bypass path-based confinement (the "shocker" escape).
    "open_by_handle_at", "name_to_handle_at",
    // Obsolete or dangerous.
    "uselib", "get_kernel_syms", "query_module", "_sysctl", "ustat", "sysfs",
];

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
    Ok(LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActAllow)
        .architectures(arches)
        .syscalls(vec![deny])
        .build()?)
}
