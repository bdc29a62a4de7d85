//! The PAT: from the token file (preferred) or AZP_TOKEN.

use anyhow::{bail, Context, Result};
use std::path::Path;

/// The PAT, from the token file (preferred) or AZP_TOKEN (visible in /proc: discouraged).
pub fn read_token(token_file: Option<&Path>, env_token: Option<String>) -> Result<String> {
    if let Some(path) = token_file {
        let t = read_token_file(path)?;
        if let Some(w) = mode_warning(path) {
            tracing::warn!("{w}");
        }
        return Ok(t);
    }
    if let Some(t) = env_token.filter(|t| !t.is_empty()) {
        tracing::warn!("using AZP_TOKEN from the environment: it is visible in /proc; prefer --token-file");
        return Ok(t);
    }
    bail!("no PAT: pass --token-file FILE (or AZP_TOKEN_FILE) with a PAT of scope Agent Pools (read, manage)")
}

/// The PAT in `path`, trimmed, never empty (without [`mode_warning`]'s log line).
pub fn read_token_file(path: &Path) -> Result<String> {
    let t = std::fs::read_to_string(path).with_context(|| {
        format!("cannot read the token file {}: check --token-file / AZP_TOKEN_FILE", path.display())
    })?;
    let t = t.trim().to_string();
    if t.is_empty() {
        bail!("the token file {} is empty: put the PAT in it", path.display());
    }
    Ok(t)
}

/// The loud warning for a token file others may read, with the fix; None when only its
/// owner may. Warned, not refused: a service that ran yesterday keeps running after an
/// upgrade, and `check` shows the line (see docs/check.md).
pub fn mode_warning(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "WARNING: the token file {p} is readable by {who} (mode {mode:04o}): whoever reads the PAT can register \
             agents in the pool and take its jobs; fix: chmod 600 {p}",
            p = path.display(),
            who = if mode & 0o007 != 0 { "every user" } else { "its group" },
        )
    })
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

    #[test]
    fn a_token_file_others_can_read_is_named_with_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("pat");
        std::fs::write(&f, "secret\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(mode_warning(&f), None);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        let w = mode_warning(&f).unwrap();
        assert!(
            w.contains("readable by its group (mode 0640)") && w.ends_with(&format!("chmod 600 {}", f.display())),
            "{w}"
        );
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let w = mode_warning(&f).unwrap();
        assert!(w.contains("readable by every user (mode 0644)"), "{w}");
        let e = read_token(None, Some(String::new())).unwrap_err().to_string();
        assert!(e.contains("--token-file"), "{e}");
    }
}
