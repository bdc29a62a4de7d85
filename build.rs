//! Two things, before the crate compiles:
//! - sets `cfg(test_as_root)` when the build runs as root, so that tests needing root are
//!   marked ignored, with their reason, in a build by anyone else (tests/common/skip.rs);
//! - compiles the jobs' init (`src/sys/init/main.rs`, see `sandbox::init`) into
//!   `$OUT_DIR/azp-init`: a small static program, linked against glibc's `libc.a`, since a
//!   job's rootfs brings its own libc (or none). The crate embeds it
//!   (`include_bytes!`), named by `AZP_INIT_HASH`, a hash of its bytes.

use std::path::{Path, PathBuf};
use std::process::Command;

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
    build_init();
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
    let status = Command::new(&rustc)
        .args(["--edition", "2021", "--crate-type", "bin", "--crate-name", "azp_init", "--cfg", "azp_init_bin"])
        .args(["--target", &target])
        .args(["-C", "target-feature=+crt-static", "-C", "relocation-model=static"])
        .args(["-C", "panic=abort", "-C", "opt-level=s"])
        .args(["-C", "codegen-units=1", "-C", "lto=fat", "-C", "strip=symbols", "-C", "debuginfo=0"])
        .arg("-o")
        .arg(&out)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", Path::new(&rustc).display()));
    assert!(
        status.success(),
        "compiling the jobs' init (src/sys/init/main.rs) failed: a static glibc is needed \
         (Debian: apt-get install libc6-dev, see scripts/setup.sh)"
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
