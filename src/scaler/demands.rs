//! Azure Pipelines demands (`demands:` of a pipeline, the `demands` strings of a job
//! request) and whether the capabilities our agents advertise meet them.
//!
//! The forms the service itself knows: `name` (the capability exists), `name -equals
//! value` and `name -gtVersion value` (the capability, read as a version, is at least
//! `value`: the server's `DemandMinimumVersion`, despite the operator's name). We also
//! accept `name -ltVersion value` (at most `value`). Matching is case-sensitive (names
//! and values), as on a Linux agent. `Agent.Version` demands are ignored: the server adds
//! them to every job and checks them against the agent that actually connects. Any other
//! operator is not matched, with a reason, so that a job we cannot judge never starts
//! capacity it might not use.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Exists,
    Equals(String),
    /// At least this version (`-gtVersion`).
    MinVersion(String),
    /// At most this version (`-ltVersion`).
    MaxVersion(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand {
    pub name: String,
    pub op: Op,
}

/// Parses one demand string. Unknown operators and malformed strings are errors that say
/// what was wrong.
pub fn parse(s: &str) -> Result<Demand, String> {
    let s = s.trim();
    let (name, rest) = match s.split_once(char::is_whitespace) {
        Some((n, r)) => (n, r.trim_start()),
        None => (s, ""),
    };
    if name.is_empty() {
        return Err("empty demand".into());
    }
    if rest.is_empty() {
        return Ok(Demand { name: name.into(), op: Op::Exists });
    }
    let (op, value) = match rest.split_once(char::is_whitespace) {
        Some((o, v)) => (o, v.trim()),
        None => (rest, ""),
    };
    if !op.starts_with('-') {
        return Err(format!("'{s}': expected an operator like -equals after '{name}'"));
    }
    if value.is_empty() {
        return Err(format!("'{s}': operator {op} without a value"));
    }
    let op = match op {
        "-equals" => Op::Equals(value.into()),
        "-gtVersion" => Op::MinVersion(value.into()),
        "-ltVersion" => Op::MaxVersion(value.into()),
        other => return Err(format!("'{s}': unknown operator {other} (known: -equals, -gtVersion, -ltVersion)")),
    };
    Ok(Demand { name: name.into(), op })
}

/// Demands on the agent's own version are checked by the server against the agent that
/// connects; a queue reader ignores them.
pub fn is_ignored(name: &str) -> bool {
    name.eq_ignore_ascii_case("Agent.Version")
}

impl Demand {
    /// `Ok(())` when `caps` meet this demand, else why not.
    pub fn check(&self, caps: &BTreeMap<String, String>) -> Result<(), String> {
        if is_ignored(&self.name) {
            return Ok(());
        }
        let Some(have) = caps.get(&self.name) else {
            return Err(format!("no capability {}", self.name));
        };
        match &self.op {
            Op::Exists => Ok(()),
            Op::Equals(v) if have == v => Ok(()),
            Op::Equals(v) => Err(format!("{} is {have}, not {v}", self.name)),
            Op::MinVersion(v) => match compare_versions(have, v) {
                Some(Ordering::Less) => Err(format!("{} {have} is older than {v}", self.name)),
                Some(_) => Ok(()),
                None => Err(format!("{} '{have}' or '{v}' is not a version", self.name)),
            },
            Op::MaxVersion(v) => match compare_versions(have, v) {
                Some(Ordering::Greater) => Err(format!("{} {have} is newer than {v}", self.name)),
                Some(_) => Ok(()),
                None => Err(format!("{} '{have}' or '{v}' is not a version", self.name)),
            },
        }
    }
}

/// Short form for messages: `cuda_version 12.4`, `gpu_count >= 1`, `gpu_model`.
impl fmt::Display for Demand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.op {
            Op::Exists => write!(f, "{}", self.name),
            Op::Equals(v) => write!(f, "{} {v}", self.name),
            Op::MinVersion(v) => write!(f, "{} >= {v}", self.name),
            Op::MaxVersion(v) => write!(f, "{} <= {v}", self.name),
        }
    }
}

/// A version as the server reads it: up to 4 numeric dot-separated parts, anything from
/// the first '-' on dropped (`12.4.1-beta` -> 12.4.1), missing parts 0.
fn parse_version(s: &str) -> Option<[u64; 4]> {
    let s = s.trim();
    let s = s.split('-').next().unwrap_or("");
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut out = [0u64; 4];
    for (i, p) in parts.iter().enumerate() {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        out[i] = p.parse().ok()?;
    }
    Some(out)
}

pub fn compare_versions(a: &str, b: &str) -> Option<Ordering> {
    Some(parse_version(a)?.cmp(&parse_version(b)?))
}

/// Whether `caps` meet every demand of a job; the first reason why not otherwise.
pub fn check_all(demands: &[String], caps: &BTreeMap<String, String>) -> Result<(), String> {
    for d in demands {
        parse(d)?.check(caps)?;
    }
    Ok(())
}

/// The demands of a job for messages, without the ignored ones: `cuda_version 12.4,
/// gpu_count >= 1`; "no demands" when none is left.
pub fn describe(demands: &[String]) -> String {
    let parts: Vec<String> = demands
        .iter()
        .filter_map(|d| match parse(d) {
            Ok(p) if is_ignored(&p.name) => None,
            Ok(p) => Some(p.to_string()),
            Err(_) => Some(d.trim().to_string()),
        })
        .collect();
    if parts.is_empty() {
        "no demands".into()
    } else {
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn parses_the_three_forms_and_rejects_the_rest() {
        assert_eq!(parse("gpu_model").unwrap(), Demand { name: "gpu_model".into(), op: Op::Exists });
        assert_eq!(parse("cuda_version -equals 12.4").unwrap().op, Op::Equals("12.4".into()));
        assert_eq!(parse("  gpu_count   -gtVersion  1 ").unwrap().op, Op::MinVersion("1".into()));
        assert_eq!(parse("cuda_version -ltVersion 12.6").unwrap().op, Op::MaxVersion("12.6".into()));
        // A value may contain spaces (gpu_model -equals NVIDIA A100 80GB PCIe).
        assert_eq!(parse("gpu_model -equals NVIDIA A100 80GB").unwrap().op, Op::Equals("NVIDIA A100 80GB".into()));
        let e = parse("cuda_version -notEquals 12.4").unwrap_err();
        assert!(e.contains("unknown operator -notEquals"), "{e}");
        assert!(parse("cuda_version -equals").unwrap_err().contains("without a value"));
        assert!(parse("cuda_version 12.4").unwrap_err().contains("expected an operator"));
        assert!(parse("").is_err());
    }

    #[test]
    fn matching_is_exact_and_case_sensitive() {
        let c = caps(&[("cuda_version", "12.4"), ("gpu_model", "NVIDIA A100"), ("gpu_count", "2")]);
        assert!(check_all(&["cuda_version -equals 12.4".into()], &c).is_ok());
        assert!(check_all(&["cuda_version -equals 12.40".into()], &c).is_err());
        assert!(check_all(&["gpu_model -equals nvidia a100".into()], &c).is_err(), "-equals is case-sensitive");
        assert!(check_all(&["CUDA_VERSION".into()], &c).is_err(), "names are case-sensitive");
        assert!(check_all(&["gpu_model".into()], &c).is_ok());
        let e = check_all(&["gpu_model".into(), "cuda_version -equals 11.8".into()], &c).unwrap_err();
        assert_eq!(e, "cuda_version is 12.4, not 11.8");
        assert_eq!(check_all(&["nccl".into()], &c).unwrap_err(), "no capability nccl");
        assert!(check_all(&["nccl -bogus 1".into()], &c).unwrap_err().contains("unknown operator"));
        assert!(check_all(&[], &c).is_ok());
    }

    #[test]
    fn versions_compare_numerically() {
        let c = caps(&[("cuda_version", "12.10"), ("gpu_count", "2"), ("drv", "550.54.15"), ("odd", "abc")]);
        assert!(check_all(&["cuda_version -gtVersion 12.4".into()], &c).is_ok(), "12.10 > 12.4, not as strings");
        assert!(check_all(&["cuda_version -gtVersion 12.10".into()], &c).is_ok(), "-gtVersion is 'at least'");
        assert!(check_all(&["cuda_version -gtVersion 12.11".into()], &c).is_err());
        assert!(check_all(&["gpu_count -gtVersion 1".into()], &c).is_ok());
        assert!(check_all(&["gpu_count -gtVersion 3".into()], &c).is_err());
        assert!(check_all(&["drv -gtVersion 535".into(), "drv -ltVersion 560.1".into()], &c).is_ok());
        assert!(check_all(&["drv -ltVersion 550.54.14".into()], &c).is_err());
        assert!(check_all(&["cuda_version -gtVersion 12.4.0-rc1".into()], &c).is_ok(), "suffix after '-' dropped");
        assert!(check_all(&["odd -gtVersion 1".into()], &c).unwrap_err().contains("not a version"));
    }

    #[test]
    fn agent_version_is_ignored() {
        let c = caps(&[]);
        assert!(check_all(&["Agent.Version -gtVersion 99.0".into()], &c).is_ok());
        assert_eq!(
            describe(&["Agent.Version -gtVersion 3.0".into(), "cuda_version -equals 12.4".into()]),
            "cuda_version 12.4"
        );
        assert_eq!(describe(&["Agent.Version -gtVersion 3.0".into()]), "no demands");
        assert_eq!(describe(&["gpu_count -gtVersion 1".into(), "gpu_model".into()]), "gpu_count >= 1, gpu_model");
    }
}
