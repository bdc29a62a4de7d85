//! Visible skips: a test that cannot run here must say so, never pass in silence.
//!
//! Two kinds, by when the reason is known:
//! * **Needs root**, known when the tests are built: `build.rs` sets `cfg(test_as_root)`
//!   when the build runs as root, and such tests carry
//!   `#[cfg_attr(not(test_as_root), ignore = "needs root: ...")]`. libtest then lists
//!   each as `ignored, needs root: ...` and counts them. (Their `require_root!()` stays,
//!   for tests built as root and run as another user.)
//! * **Anything else**, known only when the test runs (a tool on PATH, a fixture that must
//!   be downloaded, the rootless pass's test user, the filesystem): the test calls
//!   [`skip`] and returns. Stable libtest has no way to turn a running test into an
//!   ignored one, so `skip` writes `SKIPPED <binary>::<test>: <reason>` to stderr itself
//!   (libtest captures `print!`/`eprint!`, not writes to `std::io::stderr()`), appends
//!   the line to `$AZP_SANDBOX_SKIP_LOG` when set (scripts/test.sh prints them all in
//!   its summary), and when the test binary exits it prints how many of the tests that
//!   libtest counted as passed were skipped, and why.
//!
//! Also compiled into the library's unit tests (`crate::test_skip`).
#![allow(dead_code)]

use std::io::Write;
use std::sync::{Mutex, Once};

/// The log file scripts/test.sh gathers skips in, one `<binary>::<test>: <reason>` a line.
pub const LOG_ENV: &str = "AZP_SANDBOX_SKIP_LOG";

static SKIPPED: Mutex<Vec<String>> = Mutex::new(Vec::new());
static AT_EXIT: Once = Once::new();

/// The running test does not run here, for `reason`: says so and records it. The caller
/// returns right after: `return skip("needs skopeo ...")`.
pub fn skip(reason: impl std::fmt::Display) {
    record("SKIPPED", format!("{}: {reason}", test_name()));
}

/// Part of the running test is not checked here, for `reason` (the rest ran and passed).
pub fn skip_part(reason: impl std::fmt::Display) {
    record("PARTLY SKIPPED", format!("{} (in part): {reason}", test_name()));
}

fn record(label: &str, line: String) {
    let _ = writeln!(std::io::stderr(), "{label} {line}");
    if let Some(log) = std::env::var_os(LOG_ENV).filter(|v| !v.is_empty()) {
        // One short write in append mode: lines of parallel tests do not interleave.
        let f = std::fs::OpenOptions::new().create(true).append(true).open(&log);
        if let Err(e) = f.and_then(|mut f| f.write_all(format!("{line}\n").as_bytes())) {
            let _ = writeln!(std::io::stderr(), "cannot append to {}: {e}", std::path::Path::new(&log).display());
        }
    }
    SKIPPED.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    AT_EXIT.call_once(|| {
        // SAFETY: `report` is a function without arguments that lives as long as the
        // process; atexit only stores its address. A failed registration (no memory)
        // loses the summary, not the lines printed above.
        unsafe { libc::atexit(report) };
    });
}

/// At exit: the skips again, under libtest's summary, which counted them as passed.
extern "C" fn report() {
    let skipped = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    let partly = skipped.iter().filter(|l| l.contains(" (in part): ")).count();
    let mut out = format!(
        "\n{}: of the tests counted as passed above, {} did not run and {partly} ran only in part (skipped):\n",
        binary_name(),
        skipped.len() - partly
    );
    for line in skipped.iter() {
        out.push_str(&format!("    {line}\n"));
    }
    let _ = std::io::stderr().write_all(out.as_bytes());
}

/// `<binary>::<test>`: libtest runs each test on a thread named after it.
fn test_name() -> String {
    let thread = std::thread::current();
    format!("{}::{}", binary_name(), thread.name().unwrap_or("?"))
}

/// The test binary's crate name (`oci_pull`), without cargo's hash suffix.
fn binary_name() -> String {
    let exe = std::env::current_exe().ok();
    let stem = exe.as_deref().and_then(|p| p.file_stem()).map(|s| s.to_string_lossy().into_owned());
    let stem = stem.unwrap_or_else(|| "?".into());
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => name.to_owned(),
        _ => stem,
    }
}
