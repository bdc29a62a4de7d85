//! Sets `cfg(test_as_root)` when the build runs as root, so that tests needing root are
//! marked ignored, with their reason, in a build by anyone else (tests/common/skip.rs).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(test_as_root)");
    println!("cargo::rerun-if-changed=build.rs");
    // sudo and su set USER: a target dir built by a user and then tested by root (or the
    // other way round) is rebuilt with the cfg of whoever builds now.
    println!("cargo::rerun-if-env-changed=USER");
    if effective_uid() == Some(0) {
        println!("cargo::rustc-cfg=test_as_root");
    }
}

/// The effective uid of this build script (the second field of `Uid:` in
/// /proc/self/status): the user cargo builds as.
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().nth(1)?.parse().ok()
}
