//! Which Azure DevOps failures are retried: [`AzureError::is_transient`], with the
//! server's `Retry-After`, in the shared loop of [`crate::http::retry`].

use super::AzureError;
use crate::http::{retry, RetryPolicy};

/// Runs `f` until it succeeds, fails with a non-transient error, or `policy` is spent;
/// returns the last error then. Each retry is logged (warn) with the error's one-line
/// message (which never contains the PAT).
pub fn with_retry<T>(policy: &RetryPolicy, f: impl FnMut() -> Result<T, AzureError>) -> Result<T, AzureError> {
    retry(policy, |e: &AzureError| e.is_transient().then(|| e.retry_after()), f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn server(status: u16, retry_after: Option<Duration>) -> AzureError {
        AzureError::Server { status, what: "x".into(), detail: String::new(), retry_after }
    }

    #[test]
    fn retries_transient_until_success() {
        let mut n = 0;
        let r = with_retry(&RetryPolicy::fast(5), || {
            n += 1;
            if n < 3 {
                Err(server(503, None))
            } else {
                Ok(n)
            }
        });
        assert_eq!(r.unwrap(), 3);
    }

    #[test]
    fn bounded_attempts() {
        let mut n = 0;
        let r: Result<(), _> = with_retry(&RetryPolicy::fast(4), || {
            n += 1;
            Err(server(500, None))
        });
        assert!(matches!(r, Err(AzureError::Server { status: 500, .. })));
        assert_eq!(n, 4);
    }

    #[test]
    fn permanent_errors_are_not_retried() {
        let mut n = 0;
        let r: Result<(), _> = with_retry(&RetryPolicy::fast(5), || {
            n += 1;
            Err(AzureError::BadToken { how: "HTTP 401".into() })
        });
        assert!(r.is_err());
        assert_eq!(n, 1);
        let mut n = 0;
        let _ = with_retry(&RetryPolicy::fast(5), || -> Result<(), _> {
            n += 1;
            Err(server(404, None))
        });
        assert_eq!(n, 1, "4xx other than 429 is permanent");
    }

    #[test]
    fn honours_retry_after_and_total_budget() {
        let p = RetryPolicy { max_total: Duration::from_millis(500), ..RetryPolicy::fast(5) };
        let t = Instant::now();
        let mut n = 0;
        let r = with_retry(&p, || {
            n += 1;
            if n == 1 {
                Err(server(429, Some(Duration::from_millis(200))))
            } else {
                Ok(())
            }
        });
        assert!(r.is_ok());
        assert!(t.elapsed() >= Duration::from_millis(200), "{:?}", t.elapsed());
        // A Retry-After past the budget ends the retries at once.
        let t = Instant::now();
        let mut n = 0;
        let r: Result<(), _> = with_retry(&p, || {
            n += 1;
            Err(server(429, Some(Duration::from_secs(5))))
        });
        assert!(r.is_err());
        assert_eq!(n, 1);
        assert!(t.elapsed() < Duration::from_millis(400));
    }
}
