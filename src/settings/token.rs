//! The PAT: from the token file (preferred) or AZP_TOKEN.

use anyhow::{bail, Context, Result};
use std::path::Path;

/// The PAT, from the token file (preferred) or AZP_TOKEN (visible in /proc: discouraged).
pub fn read_token(token_file: Option<&Path>, env_token: Option<String>) -> Result<String> {
    if let Some(path) = token_file {
        let t = std::fs::read_to_string(path).with_context(|| {
            format!("cannot read the token file {}: check --token-file / AZP_TOKEN_FILE", path.display())
        })?;
        let t = t.trim().to_string();
        if t.is_empty() {
            bail!("the token file {} is empty: put the PAT in it", path.display());
        }
        return Ok(t);
    }
    if let Some(t) = env_token.filter(|t| !t.is_empty()) {
        tracing::warn!("using AZP_TOKEN from the environment: it is visible in /proc; prefer --token-file");
        return Ok(t);
    }
    bail!("no PAT: pass --token-file FILE (or AZP_TOKEN_FILE) with a PAT of scope Agent Pools (read, manage)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_first_then_env_never_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("pat");
        std::fs::write(&f, "  secret\n").unwrap();
        assert_eq!(read_token(Some(&f), Some("env".into())).unwrap(), "secret", "the file wins, trimmed");
        assert_eq!(read_token(None, Some("env".into())).unwrap(), "env");
        std::fs::write(&f, "\n").unwrap();
        assert!(read_token(Some(&f), None).unwrap_err().to_string().contains("is empty"));
        let e = read_token(None, Some(String::new())).unwrap_err().to_string();
        assert!(e.contains("--token-file"), "{e}");
    }
}
