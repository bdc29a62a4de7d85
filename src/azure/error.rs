//! Errors of the REST client: each one line that says what to fix. None of them ever
//! carries the PAT (the client never puts it in a URL, and bodies are not echoed except
//! for the server's own one-line `message`).

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum AzureError {
    /// The org URL given is not usable (scheme, credentials in it, query...).
    #[error("invalid Azure DevOps URL '{url}': {why}; fix --url / AZP_URL (e.g. https://dev.azure.com/ORG)")]
    BadUrl { url: String, why: String },
    /// The PAT is empty or cannot be sent in a header.
    #[error("the PAT is {why}: the token file must hold the token only, on one line")]
    BadTokenFormat { why: &'static str },
    /// Connection refused, DNS, TLS, reset, proxy refusal.
    #[error("cannot reach {url}: {cause}; check --url / AZP_URL and the proxy")]
    Unreachable { url: String, cause: String },
    /// 401, 203 (sign-in page) or an HTML / non-JSON answer where JSON was expected.
    #[error("the PAT was rejected ({how}): it is wrong or expired; create a new one with Agent Pools (read, manage) scope and update the token file")]
    BadToken { how: String },
    /// `pools?poolName=` answered 200 with count 0.
    #[error("agent pool '{name}' not found in {org}: create it in Organization settings > Agent pools, or fix --pool")]
    PoolNotFound { name: String, org: String },
    /// 403.
    #[error("no permission to {what} (HTTP 403): grant the PAT's user Administrator on the pool (Organization settings > Agent pools > Security) and give the PAT the Agent Pools (read, manage) scope")]
    Forbidden { what: String },
    /// 404 on a resource that must exist (the org itself, a pool id).
    #[error("{what} does not exist (HTTP 404{detail}): check --url / AZP_URL (https://dev.azure.com/ORG) and --pool")]
    NotFound { what: String, detail: String },
    /// 5xx and 429: transient, retried.
    #[error("Azure DevOps answered HTTP {status} to {what}{detail} (a service problem or rate limit: retried with backoff; see https://status.dev.azure.com if it lasts)")]
    Server { status: u16, what: String, detail: String, retry_after: Option<Duration> },
    /// No answer in time.
    #[error("no answer from {url} within {}s ({what}): the server or the network is slow; check the proxy, or try later", .after.as_secs_f64())]
    Timeout { url: String, what: String, after: Duration },
    /// An answer of an unexpected shape (or an unexpected 4xx).
    #[error("unexpected answer from Azure DevOps to {what}: {detail}; is --url the organization URL (https://dev.azure.com/ORG)?")]
    Protocol { what: String, detail: String },
    /// Writing downloaded data failed (disk full...).
    #[error("cannot write the download of {url}: {cause}")]
    Write { url: String, cause: String },
}

impl AzureError {
    /// Worth retrying: the network or the service may recover.
    pub fn is_transient(&self) -> bool {
        match self {
            AzureError::Unreachable { .. } | AzureError::Timeout { .. } => true,
            AzureError::Server { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }

    /// The server's `Retry-After`, if it sent one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            AzureError::Server { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The PAT itself must be fixed (for callers that stop instead of retrying).
    pub fn is_auth(&self) -> bool {
        matches!(self, AzureError::BadToken { .. } | AzureError::BadTokenFormat { .. } | AzureError::Forbidden { .. })
    }
}
