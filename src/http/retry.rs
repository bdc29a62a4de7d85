//! Bounded retries with exponential backoff and jitter, honouring `Retry-After`. What is
//! worth another try is the caller's to say: each service has its own error type.

use std::time::{Duration, Instant};

/// How often and how long to retry a transient failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = no retry).
    pub max_attempts: u32,
    /// Delay before the first retry; doubled each time, up to `max_delay`.
    pub initial_delay: Duration,
    pub max_delay: Duration,
    /// No retry starts once this much time has passed since the first attempt, and no
    /// wait goes past it (a longer `Retry-After` ends the retries).
    pub max_total: Duration,
}

impl Default for RetryPolicy {
    /// 5 attempts, 1 s doubling to 20 s, at most 90 s in all.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(20),
            max_total: Duration::from_secs(90),
        }
    }
}

impl RetryPolicy {
    /// One attempt only.
    pub fn none() -> RetryPolicy {
        RetryPolicy { max_attempts: 1, ..RetryPolicy::default() }
    }

    /// `attempts` attempts a few milliseconds apart (tests).
    pub fn fast(attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts: attempts.max(1),
            initial_delay: Duration::from_millis(2),
            max_delay: Duration::from_millis(20),
            max_total: Duration::from_secs(30),
        }
    }

    /// The backoff before retry number `retry` (1-based), with "equal jitter": a random
    /// point in the upper half of the exponential delay, so slots that failed together
    /// do not retry together.
    pub fn backoff(&self, retry: u32) -> Duration {
        let exp = self.initial_delay.saturating_mul(1u32 << retry.saturating_sub(1).min(20));
        let full = exp.min(self.max_delay);
        let half = full / 2;
        half + half.mul_f64(random_unit())
    }
}

/// A random number in [0, 1) without a RNG dependency (std's per-process random hash keys).
fn random_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        Instant::now().elapsed().as_nanos()
            ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Runs `f` until it succeeds, fails with an error `transient` does not retry, or `policy`
/// is spent; returns the last error then. `transient` says whether an error is worth
/// another try (`Some`) and how long the server asked us to wait (`Some(Some(d))`,
/// `Retry-After`). Each retry is logged (warn) with the error's message, so that message
/// must hold no secret.
pub fn retry<T, E: std::fmt::Display>(
    policy: &RetryPolicy,
    transient: impl Fn(&E) -> Option<Option<Duration>>,
    mut f: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let start = Instant::now();
    let mut attempt = 1u32;
    loop {
        let err = match f() {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let Some(retry_after) = transient(&err) else { return Err(err) };
        if attempt >= policy.max_attempts {
            return Err(err);
        }
        let wait = policy.backoff(attempt).max(retry_after.unwrap_or_default());
        let elapsed = start.elapsed();
        if elapsed + wait > policy.max_total {
            tracing::debug!(
                "giving up after {attempt} attempts in {elapsed:.1?}: the next retry would pass {:?}",
                policy.max_total
            );
            return Err(err);
        }
        tracing::warn!("{err} (attempt {attempt}/{}; retrying in {:.1}s)", policy.max_attempts, wait.as_secs_f64());
        std::thread::sleep(wait);
        attempt += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server answer: transient when 5xx or 429, with its `Retry-After`.
    #[derive(Debug)]
    struct Status(u16, Option<Duration>);

    impl std::fmt::Display for Status {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "HTTP {}", self.0)
        }
    }

    fn transient(e: &Status) -> Option<Option<Duration>> {
        (e.0 >= 500 || e.0 == 429).then_some(e.1)
    }

    #[test]
    fn retries_transient_until_success_within_the_attempts() {
        let mut n = 0;
        let r = retry(&RetryPolicy::fast(5), transient, || {
            n += 1;
            if n < 3 {
                Err(Status(503, None))
            } else {
                Ok(n)
            }
        });
        assert_eq!(r.unwrap(), 3);
        let mut n = 0;
        let r: Result<(), _> = retry(&RetryPolicy::fast(4), transient, || {
            n += 1;
            Err(Status(500, None))
        });
        assert_eq!(r.unwrap_err().0, 500);
        assert_eq!(n, 4);
        let mut n = 0;
        let r: Result<(), _> = retry(&RetryPolicy::fast(4), transient, || {
            n += 1;
            Err(Status(404, None))
        });
        assert!(r.is_err());
        assert_eq!(n, 1, "a permanent error is not retried");
    }

    #[test]
    fn backoff_grows_with_jitter_and_cap() {
        let p = RetryPolicy::default();
        for retry in 1..8 {
            let d = p.backoff(retry);
            let full = (p.initial_delay * (1 << (retry - 1))).min(p.max_delay);
            assert!(d >= full / 2 && d <= full, "retry {retry}: {d:?} not in [{:?}, {full:?}]", full / 2);
        }
        let samples: std::collections::HashSet<_> = (0..20).map(|_| p.backoff(3)).collect();
        assert!(samples.len() > 1, "no jitter");
    }
}
