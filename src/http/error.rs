//! What went wrong with a request, in HTTP terms. Each service maps these onto its own
//! errors, which say what to fix there (an Azure 401 is the PAT, a registry 401 starts
//! the token flow): the text here names the URL and the cause only.

use reqwest::blocking::Response;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use std::io::Read;
use std::time::Duration;

/// Error bodies are read up to this size (a server's JSON error, not a page of HTML).
const BODY_LIMIT: u64 = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The client could not be built (the TLS backend, a CA certificate).
    #[error("cannot set up the HTTP client: {cause}")]
    Setup { cause: String },
    /// No answer at all: connection refused or reset, DNS, a proxy's refusal.
    #[error("cannot reach {url}: {cause}")]
    Unreachable { url: String, cause: String },
    /// The TLS handshake failed on the server's certificate: trying again will not help.
    #[error("cannot reach {url}: {cause}")]
    Tls { url: String, cause: String },
    /// No connection, headers or data within the client's time limit.
    #[error("no answer from {url} within {}s", .after.as_secs_f64())]
    Timeout { url: String, after: Duration },
    /// An answer with a status its caller does not take.
    #[error("{url} answered HTTP {}{}", .answer.status, excerpt(&.answer.body))]
    Status { url: String, answer: ErrorAnswer },
}

/// What an error answer said: its status, `Retry-After`, and the start of its body (64 KiB
/// at most), for the caller to find the server's own message in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorAnswer {
    pub status: u16,
    pub retry_after: Option<Duration>,
    pub body: Vec<u8>,
}

impl ErrorAnswer {
    pub fn read(resp: Response) -> ErrorAnswer {
        let status = resp.status().as_u16();
        let retry_after = retry_after(resp.headers());
        ErrorAnswer { status, retry_after, body: read_small(resp) }
    }
}

impl HttpError {
    /// Classifies a failed send or body read of a client whose time limit is `timeout`;
    /// `url` is how messages name the server (never with credentials or a query).
    pub fn from_reqwest(e: reqwest::Error, url: &str, timeout: Duration) -> HttpError {
        if e.is_timeout() {
            return HttpError::Timeout { url: url.to_owned(), after: timeout };
        }
        let cause = error_chain_full(&e.without_url());
        // rustls' verdict reaches us only as the text of hyper's io::Error source.
        if cause.contains("certificate") {
            HttpError::Tls { url: url.to_owned(), cause }
        } else {
            HttpError::Unreachable { url: url.to_owned(), cause }
        }
    }

    /// An answer whose status the caller does not take.
    pub fn status(resp: Response, url: &str) -> HttpError {
        HttpError::Status { url: url.to_owned(), answer: ErrorAnswer::read(resp) }
    }
}

/// The server's `Retry-After` in seconds (the HTTP-date form is not used by the services
/// we talk to, and is ignored).
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers.get(RETRY_AFTER)?.to_str().ok()?.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// At most 64 KiB of a body (for an error message); a read error ends it early.
pub fn read_small(resp: Response) -> Vec<u8> {
    let mut v = Vec::new();
    let _ = resp.take(BODY_LIMIT).read_to_end(&mut v);
    v
}

/// The whole body, refused when it is larger than `max` bytes (by its length or its
/// content); the error says why.
pub fn read_limited(resp: Response, max: u64) -> Result<Vec<u8>, String> {
    if resp.content_length().is_some_and(|n| n > max) {
        return Err(format!("it is larger than {max} bytes"));
    }
    let mut v = Vec::new();
    resp.take(max + 1).read_to_end(&mut v).map_err(|e| error_chain_full(&e))?;
    if v.len() as u64 > max {
        return Err(format!("it is larger than {max} bytes"));
    }
    Ok(v)
}

/// "a: b: c" from an error and its sources, repeated parts dropped, at most 300 chars.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    one_line(&error_chain_full(e), 300)
}

/// "a: b: c" from an error and its sources, repeated parts dropped, on one line.
pub fn error_chain_full(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![];
    let mut cur: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = cur {
        let s = err.to_string();
        if !s.is_empty() && !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        cur = err.source();
    }
    parts.join(": ").replace('\n', " ")
}

/// `s` with its white space folded to single spaces, cut at `max` chars ("..." added).
pub fn one_line(s: &str, max: usize) -> String {
    let s: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.chars().count() > max {
        let t: String = s.chars().take(max).collect();
        format!("{t}...")
    } else {
        s
    }
}

/// `: <the body's start>` for a body that is text, or nothing.
fn excerpt(body: &[u8]) -> String {
    match std::str::from_utf8(body) {
        Ok(s) if !s.trim().is_empty() => format!(": {}", one_line(s, 200)),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[derive(Debug)]
    struct Chain(&'static str, Option<Box<Chain>>);

    impl std::fmt::Display for Chain {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Chain {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|c| c as _)
        }
    }

    #[test]
    fn chains_drop_repeats_and_fold_lines() {
        let e = Chain("error sending request", Some(Box::new(Chain("connect: refused\nretry", None))));
        assert_eq!(error_chain_full(&e), "error sending request: connect: refused retry");
        let e = Chain("tcp connect error: Connection refused", Some(Box::new(Chain("Connection refused", None))));
        assert_eq!(error_chain_full(&e), "tcp connect error: Connection refused");
        let long = Chain(Box::leak("x ".repeat(400).into_boxed_str()), None);
        let s = error_chain(&long);
        assert!(s.ends_with("...") && s.chars().count() == 303, "{s}");
    }

    #[test]
    fn status_messages_carry_one_line_of_the_body() {
        let answer = |status, body: &[u8]| ErrorAnswer { status, retry_after: None, body: body.to_vec() };
        let e = HttpError::Status { url: "u".into(), answer: answer(502, b"bad\n gateway") };
        assert_eq!(e.to_string(), "u answered HTTP 502: bad gateway");
        let e = HttpError::Status { url: "u".into(), answer: answer(500, &[0xff, 0xfe]) };
        assert_eq!(e.to_string(), "u answered HTTP 500");
        let e = HttpError::Timeout { url: "u".into(), after: Duration::from_millis(1500) };
        assert_eq!(e.to_string(), "no answer from u within 1.5s");
    }

    #[test]
    fn retry_after_in_seconds_only() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static(" 7 "));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert(RETRY_AFTER, HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"));
        assert_eq!(retry_after(&h), None);
    }
}
