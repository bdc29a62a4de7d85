//! JSON documents that other processes read while we rewrite them (the manager's and the
//! Slurm mode's status, read by `azp-sandbox status`): written whole to a temp file
//! beside, then renamed over the old one, so a reader gets the old or the new document,
//! never half of one.

use anyhow::{Context, Result};
use serde::Serialize;
use std::path::Path;

/// Replaces `path` with `value` as pretty JSON, atomically (`<path>.json.tmp`, renamed).
pub fn write_atomic<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot update {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_document_and_leaves_no_temp_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("status.json");
        write_atomic(&p, &serde_json::json!({"n": 1})).unwrap();
        write_atomic(&p, &serde_json::json!({"n": 2})).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(v["n"], 2);
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["status.json"]);
        let e = write_atomic(&d.path().join("no/such/dir/status.json"), &1).unwrap_err().to_string();
        assert!(e.starts_with("cannot write ") && e.contains("status.json.tmp"), "{e}");
    }
}
