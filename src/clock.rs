//! Wall-clock time as the status files and records store it.

/// Seconds since the Unix epoch (0 for a clock set before it).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
