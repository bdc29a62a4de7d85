//! The HTTP layer under the Azure DevOps client ([`crate::azure`]) and the OCI registry
//! client ([`crate::rootfs::oci::registry`]): how a client is built (user agent, time
//! limits, proxy from the environment, extra CA roots), what a failed request was
//! ([`HttpError`]: unreachable, TLS, timeout, an HTTP status with the body's start), and
//! one retry loop with backoff and jitter ([`retry`], [`RetryPolicy`]).
//!
//! What a status means stays with each service: to Azure DevOps a 401 is the PAT and a
//! 404 a missing pool or organization; to a registry a 401 starts the token flow and a
//! 404 is `NAME_UNKNOWN` or `MANIFEST_UNKNOWN`.

mod client;
mod error;
mod retry;

pub use client::{is_loopback, pem_bundle, redact_url, ClientSettings, USER_AGENT};
pub use error::{
    error_chain, error_chain_full, one_line, read_limited, read_small, retry_after, ErrorAnswer, HttpError,
};
pub use retry::{retry, RetryPolicy};
