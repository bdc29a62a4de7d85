//! Before the crate compiles:
//! - sets `cfg(test_as_root)` when the build runs as root, so that tests needing root are
//!   marked ignored, with their reason, in a build by anyone else (tests/common/skip.rs);
//! - compiles the jobs' seccomp profile (`src/sandbox/seccomp.rs`, included here) into a
//!   BPF program, `$OUT_DIR/seccomp.bpf`, with libseccomp, for the jobs' init to install;
//! - compiles the jobs' init (`src/sys/init/main.rs`, see `sandbox::init`) into
//!   `$OUT_DIR/azp-init`: a small static program that needs no libc of the job's rootfs
//!   (which brings its own, or none): on x86_64 it links no libc at all, elsewhere
//!   glibc's `libc.a`. The crate embeds it
//!   (`include_bytes!`), named by `AZP_INIT_HASH`, a hash of its bytes;
//! - in release builds linked by rust-lld, places the functions an `exec` cycle runs
//!   next to each other (`build/hot-text.order`, see [`link_hot_text_order`]);
//! - in release builds for x86_64 glibc, links libgcc's unwinder and libseccomp from their
//!   static archives (see [`link_runtime_libs_statically`]).

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "src/sandbox/seccomp.rs"]
#[allow(dead_code)]
mod seccomp;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(test_as_root)");
    println!("cargo::rustc-check-cfg=cfg(azp_init_bin)");
    println!("cargo::rerun-if-changed=build.rs");
    // sudo and su set USER: a target dir built by a user and then tested by root (or the
    // other way round) is rebuilt with the cfg of whoever builds now.
    println!("cargo::rerun-if-env-changed=USER");
    if effective_uid() == Some(0) {
        println!("cargo::rustc-cfg=test_as_root");
    }
    build_seccomp_filters();
    build_init();
    link_hot_text_order();
    link_runtime_libs_statically();
}

/// In release builds for x86_64 glibc, libgcc's unwinder and libseccomp are linked into
/// the binary from their static archives. Each shared library is a file the loader opens,
/// maps and binds at every start of the CLI, once per `exec`, and libgcc_s's constructor
/// queries the CPU's features (each `cpuid` traps to the hypervisor in a VM): a C
/// `main(){}` that also loads these two took ~0.15 ms more to start (interleaved, 400
/// rounds). libc stays shared, so that name lookups (NSS: a cluster's LDAP or SSSD users)
/// load the host's modules as they should; libm too, as its archive's CPU dispatch needs
/// glibc's private symbols of a static libc.
///
/// How: rustc links them as `-lgcc_s` and `-lseccomp` (std's and libseccomp-sys's link
/// attributes, std's with no static choice), so a dir searched before the system's holds
/// linker scripts of those names that name the archives instead. A one-line program must
/// link with them first, as for the hot text.
fn link_runtime_libs_statically() {
    if !release_for_x86_64_gnu() {
        return;
    }
    let dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("static-runtime");
    let scripts = [("libgcc_s.so", "-lgcc_eh"), ("libseccomp.so", "-l:libseccomp.a")];
    // Made anew: a script an earlier build left there would still be searched.
    let _ = std::fs::remove_dir_all(&dir);
    let written = std::fs::create_dir_all(&dir).is_ok()
        && scripts.iter().all(|(name, archive)| std::fs::write(dir.join(name), format!("INPUT({archive})\n")).is_ok());
    let search = format!("-L{}", dir.display());
    if !written || !links_with(&[search, "-lseccomp".into()]) {
        println!("cargo::warning=libgcc_eh.a or libseccomp.a (libseccomp-dev) does not link: the release binary loads libgcc_s and libseccomp as shared libraries (build.rs)");
        return;
    }
    println!("cargo::rustc-link-search=native={}", dir.display());
}

/// `--symbol-ordering-file=build/hot-text.order` for the release binary: the functions an
/// `exec` cycle runs, grouped by the processes that run them, so that each of a job's
/// processes faults the binary's text in from few 64 KB windows (why and how the list is
/// made: docs/architecture.md, "The release build"). A name the linker does not find (a
/// function changed since the list was made) is skipped.
///
/// Only where the linker takes the option: rust-lld, rustc's default for this target since
/// 1.90 in the Rust project's builds. GNU ld (a distribution's rustc, or flags that choose
/// it) has no such option and would fail the link, so a one-line program is linked with
/// it first, with the same flags and linker as the crate.
fn link_hot_text_order() {
    println!("cargo::rerun-if-changed=build/hot-text.order");
    println!("cargo::rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
    let list = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("build/hot-text.order");
    if !(release_for_x86_64_gnu() && list.exists()) {
        return;
    }
    let args = [format!("-Wl,--symbol-ordering-file={}", list.display()), "-Wl,--no-warn-symbol-ordering".into()];
    if !links_with(&args) {
        println!("cargo::warning=the linker does not take --symbol-ordering-file (not rust-lld): the release binary's hot text is not grouped (build.rs)");
        return;
    }
    for a in args {
        println!("cargo::rustc-link-arg-bins={a}");
    }
}

/// A release build (`cargo build --release`, or the bench profile that inherits it) for
/// x86_64 glibc: the `exec` binary whose start the link steps above shorten.
fn release_for_x86_64_gnu() -> bool {
    std::env::var("PROFILE").is_ok_and(|p| p == "release")
        && std::env::var("TARGET").is_ok_and(|t| t == "x86_64-unknown-linux-gnu")
}

/// Whether `$RUSTC` links a one-line program with `link_args` added, under the flags
/// (`CARGO_ENCODED_RUSTFLAGS`) and the linker (`RUSTC_LINKER`) cargo gives the crate.
fn links_with(link_args: &[String]) -> bool {
    let dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let src = dir.join("link-probe.rs");
    if std::fs::write(&src, "fn main() {}\n").is_err() {
        return false;
    }
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut cmd = Command::new(rustc);
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    cmd.args(flags.split('\x1f').filter(|f| !f.is_empty()));
    if let Some(linker) = std::env::var_os("RUSTC_LINKER") {
        cmd.arg("-C").arg(format!("linker={}", linker.to_string_lossy()));
    }
    for a in link_args {
        cmd.arg("-C").arg(format!("link-arg={a}"));
    }
    cmd.arg("-o").arg(dir.join("link-probe")).arg(&src);
    cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    cmd.status().is_ok_and(|s| s.success())
}

/// The jobs' two filters: [`seccomp::rules`] (`seccomp.bpf`), and the same with
/// [`seccomp::core_fixed_rules`] (`seccomp-core-fixed.bpf`, for hosts that pipe core dumps
/// to a program).
fn build_seccomp_filters() {
    println!("cargo::rerun-if-changed=src/sandbox/seccomp.rs");
    let rules = seccomp::rules();
    build_seccomp_filter(&rules, "seccomp.bpf");
    let core_fixed: Vec<seccomp::Rule> = rules.into_iter().chain(seccomp::core_fixed_rules()).collect();
    build_seccomp_filter(&core_fixed, "seccomp-core-fixed.bpf");
}

/// `rules` as the BPF program libseccomp would load (`seccomp_export_bpf`) into `OUT_DIR/
/// name`: the architecture checks (a call through an ABI the filter does not cover
/// kills), then the rules; every other call is allowed. Rules are added as libcontainer
/// added them from an OCI profile: their comparisons ANDed, a name this libseccomp does
/// not know left out (with a warning here).
fn build_seccomp_filter(rules: &[seccomp::Rule], name: &str) {
    use libseccomp::{ScmpAction, ScmpArch, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join(name);
    let target_arch = std::env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets CARGO_CFG_TARGET_ARCH");
    let arches = seccomp::architectures(&target_arch)
        .unwrap_or_else(|| panic!("no seccomp architectures for {target_arch} (src/sandbox/seccomp.rs)"));
    let arch = |name: &str| match name {
        "x86_64" => ScmpArch::X8664,
        "x86" => ScmpArch::X86,
        "x32" => ScmpArch::X32,
        "aarch64" => ScmpArch::Aarch64,
        "arm" => ScmpArch::Arm,
        _ => panic!("unknown seccomp architecture {name}"),
    };
    let fail = |what: &str, e: libseccomp::error::SeccompError| -> ! {
        panic!("compiling the jobs' seccomp filter: {what}: {e} (needs libseccomp-dev, see scripts/setup.sh)")
    };
    let mut ctx = ScmpFilterContext::new(ScmpAction::Allow).unwrap_or_else(|e| fail("new filter", e));
    // A binary tree of syscall numbers (libseccomp's "optimize 2") instead of one linear
    // chain: the kernel emulates the program for every syscall number when it installs
    // it (to cache the calls it always allows), which took ~0.17 ms more per job with
    // the chain (interleaved `perf stat -r 400` of the init, 3 rounds).
    ctx.set_ctl_optimize(2).unwrap_or_else(|e| fail("optimize", e));
    for a in arches {
        ctx.add_arch(arch(a)).unwrap_or_else(|e| fail("add arch", e));
    }
    // A context starts with the build host's architecture; it stays only if listed.
    if !arches.iter().any(|&a| arch(a) == ScmpArch::native()) {
        ctx.remove_arch(ScmpArch::native()).unwrap_or_else(|e| fail("remove the build host's arch", e));
    }
    for rule in rules {
        let Ok(call) = ScmpSyscall::from_name(rule.name) else {
            println!("cargo::warning=seccomp: this libseccomp does not know {}: left out of the filter", rule.name);
            continue;
        };
        let action = ScmpAction::Errno(rule.errno);
        // The comparisons of one rule are ANDed (libseccomp); rules are ORed.
        let compare: Vec<ScmpArgCompare> = rule
            .args
            .iter()
            .flatten()
            .map(|m| match m.not {
                // The whole argument (libseccomp has no masked "not equal").
                true if m.mask == u64::MAX => ScmpArgCompare::new(m.index, ScmpCompareOp::NotEqual, m.value),
                true => panic!("seccomp: {}: a masked 'not' comparison", rule.name),
                false => ScmpArgCompare::new(m.index, ScmpCompareOp::MaskedEqual(m.mask), m.value),
            })
            .collect();
        match compare.is_empty() {
            true => ctx.add_rule(action, call),
            false => ctx.add_rule_conditional(action, call, &compare),
        }
        .unwrap_or_else(|e| fail(rule.name, e));
    }
    let file = std::fs::File::create(&out).unwrap_or_else(|e| panic!("cannot create {}: {e}", out.display()));
    ctx.export_bpf(&file).unwrap_or_else(|e| fail("export", e));
    let len = std::fs::metadata(&out).expect("the filter just written").len();
    // struct sock_filter is 8 bytes; the kernel takes at most BPF_MAXINSNS (4096) of them.
    assert!(len > 0 && len % 8 == 0 && len / 8 <= 4096, "a malformed seccomp filter: {len} bytes");
}

/// The effective uid of this build script (the second field of `Uid:` in
/// /proc/self/status): the user cargo builds as.
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().nth(1)?.parse().ok()
}

/// `$RUSTC` on src/sys/init/main.rs: static (crt-static, and not position-independent: no
/// self-relocation at start), no unwinding, small, stripped.
fn build_init() {
    let src = Path::new("src/sys/init/main.rs");
    println!("cargo::rerun-if-changed={}", src.display());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("azp-init");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    println!("cargo::rerun-if-changed=src/sys/init/raw_x86_64.rs");
    println!("cargo::rerun-if-changed=src/sys/init/glibc.rs");
    println!("cargo::rerun-if-changed=src/sys/init/abi.rs");
    // x86_64: no libc at all (the init makes its system calls itself and brings its own
    // `_start`); elsewhere glibc's static archive.
    let link: &[&str] = if target.starts_with("x86_64-") {
        &["-C", "link-arg=-nostdlib", "-C", "link-arg=-nostartfiles", "-C", "link-arg=-static"]
    } else {
        &["-C", "target-feature=+crt-static"]
    };
    let status = Command::new(&rustc)
        .args(["--edition", "2021", "--crate-type", "bin", "--crate-name", "azp_init", "--cfg", "azp_init_bin"])
        .args(["--target", &target])
        .args(link)
        .args(["-C", "relocation-model=static"])
        .args(["-C", "panic=abort", "-C", "opt-level=s"])
        .args(["-C", "codegen-units=1", "-C", "lto=fat", "-C", "strip=symbols", "-C", "debuginfo=0"])
        .arg("-o")
        .arg(&out)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", Path::new(&rustc).display()));
    assert!(
        status.success(),
        "compiling the jobs' init (src/sys/init/main.rs) failed: a C toolchain is needed, and off \
         x86_64 a static glibc (Debian: apt-get install build-essential libc6-dev, see scripts/setup.sh)"
    );
    let bytes = std::fs::read(&out).expect("the init just built");
    println!("cargo::rustc-env=AZP_INIT_HASH={:016x}", fnv1a64(&bytes));
}

/// FNV-1a, 64 bits: names the init's file in the home's cache by its content, so that two
/// versions of azp-sandbox never share one (not a security check: only root or the home's
/// owner can write there).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}
