//! How our HTTP clients are built: blocking reqwest on rustls (webpki roots, plus any CA
//! certificates the caller trusts), our user agent, time limits, and the proxy from the
//! environment.

use super::{error_chain_full, HttpError};
use reqwest::blocking::Client;
use reqwest::{Certificate, Url};
use std::path::Path;
use std::time::Duration;

/// `azp-sandbox/<version>` on every request.
pub const USER_AGENT: &str = concat!("azp-sandbox/", env!("CARGO_PKG_VERSION"));

/// Connecting never waits longer than this, whatever the client's time limit.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// What a client is built with; [`ClientSettings::build`] makes it.
///
/// Proxies: the client takes `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` and `NO_PROXY`
/// (or their lower-case forms) from the environment, as curl does (reqwest's system
/// proxy, which we leave on), except for a loopback target, which is always reached
/// directly (tests and local registries must not go through a site's proxy).
#[derive(Debug)]
pub struct ClientSettings {
    timeout: Duration,
    connect_timeout: Duration,
    roots: Vec<Certificate>,
}

impl ClientSettings {
    /// `timeout` limits connecting (at most 20 s), waiting for an answer's headers and each
    /// read of a body, so that a long download is fine as long as data keeps coming.
    pub fn new(timeout: Duration) -> ClientSettings {
        ClientSettings { timeout, connect_timeout: timeout.min(MAX_CONNECT_TIMEOUT), roots: Vec::new() }
    }

    /// Also trusts `certs` as CA roots (besides the built-in ones).
    pub fn trust(mut self, certs: impl IntoIterator<Item = Certificate>) -> ClientSettings {
        self.roots.extend(certs);
        self
    }

    /// A client for requests to `target`'s host (which decides whether a proxy applies).
    pub fn build(self, target: &Url) -> Result<Client, HttpError> {
        let mut b =
            Client::builder().user_agent(USER_AGENT).timeout(self.timeout).connect_timeout(self.connect_timeout);
        if is_loopback(target) {
            b = b.no_proxy();
        }
        for cert in self.roots {
            b = b.add_root_certificate(cert);
        }
        b.build().map_err(|e| HttpError::Setup { cause: error_chain_full(&e) })
    }
}

/// `localhost` or a loopback address (`127.x`, `[::1]`).
pub fn is_loopback(u: &Url) -> bool {
    let Some(h) = u.host_str() else { return false };
    let h = h.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost") || h.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The certificates of the PEM bundle at `path` (at least one), for [`ClientSettings::trust`].
pub fn pem_bundle(path: &Path) -> anyhow::Result<Vec<Certificate>> {
    let pem = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("cannot read the CA certificates in {}: {e}", path.display()))?;
    let certs = Certificate::from_pem_bundle(&pem)
        .map_err(|e| anyhow::anyhow!("{} is not a PEM certificate bundle: {}", path.display(), error_chain_full(&e)))?;
    if certs.is_empty() {
        anyhow::bail!("{} is not a PEM certificate bundle: it holds no certificate", path.display());
    }
    Ok(certs)
}

/// A URL for messages: without credentials, query (SAS tokens) or fragment.
pub fn redact_url(u: &Url) -> String {
    let mut u = u.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for (u, want) in [
            ("http://127.0.0.1:5000/v2/", true),
            ("http://127.1.2.3/", true),
            ("http://LOCALHOST:8080/org", true),
            ("http://[::1]:5000/", true),
            ("https://dev.azure.com/org", false),
            ("https://10.0.0.1/", false),
            ("https://localhost.example.com/", false),
        ] {
            assert_eq!(is_loopback(&Url::parse(u).unwrap()), want, "{u}");
        }
    }

    #[test]
    fn clients_build_with_or_without_extra_roots() {
        assert!(ClientSettings::new(Duration::from_secs(5))
            .build(&Url::parse("https://dev.azure.com/o").unwrap())
            .is_ok());
        let d = tempfile::tempdir().unwrap();
        let bad = d.path().join("ca.crt");
        std::fs::write(&bad, b"not a certificate").unwrap();
        let e = pem_bundle(&bad).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{} is not a PEM certificate bundle", bad.display())), "{e}");
        let e = pem_bundle(&d.path().join("none.pem")).unwrap_err().to_string();
        assert!(e.starts_with("cannot read the CA certificates in "), "{e}");
    }

    #[test]
    fn redacted_urls_lose_secrets() {
        let u = Url::parse("https://u:p@host/a/b.tar.gz?sig=SECRET#x").unwrap();
        assert_eq!(redact_url(&u), "https://host/a/b.tar.gz");
    }
}
