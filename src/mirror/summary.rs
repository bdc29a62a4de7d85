//! What `status` and `check` show of each git mirror: its size and its last fetch, read
//! from the mirror itself (the keeper writes nothing else).

use crate::config::Home;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub name: String,
    /// The remote (`remote.origin.url` of the mirror's config).
    pub url: String,
    /// Bytes of the mirror's files (objects and refs).
    pub size_bytes: u64,
    /// Seconds since its last successful fetch (None: never fetched).
    pub fetched_age_secs: Option<u64>,
}

impl Summary {
    /// The mirror in one line (`check`).
    pub fn line(&self) -> String {
        format!(
            "{} ({}): {}, {}",
            self.name,
            self.url,
            crate::config::human_size(self.size_bytes),
            fetched(self.fetched_age_secs)
        )
    }
}

fn fetched(age: Option<u64>) -> String {
    match age {
        Some(a) => format!("fetched {}", crate::cache::store::age(a)),
        None => "never fetched".into(),
    }
}

/// The mirror at `dir` (`<home>/git-mirrors/<name>.git`).
pub fn summary(dir: &Path) -> Summary {
    let name = dir.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let config = std::fs::read_to_string(dir.join("config")).unwrap_or_default();
    let url =
        config.lines().find_map(|l| l.trim().strip_prefix("url = ")).map(str::to_string).unwrap_or_else(|| "?".into());
    // A fetch rewrites FETCH_HEAD when it succeeds (an unreachable remote leaves it).
    let fetched_age_secs = std::fs::metadata(dir.join("FETCH_HEAD"))
        .and_then(|m| m.modified())
        .ok()
        .map(|t| t.elapsed().map(|d| d.as_secs()).unwrap_or(0));
    let size_bytes = crate::cache::size::tree_size(dir).unwrap_or(0);
    Summary { name, url, size_bytes, fetched_age_secs }
}

/// Every mirror of the home, by name.
pub fn summaries(home: &Home) -> Vec<Summary> {
    let mut dirs: Vec<_> = std::fs::read_dir(super::mirrors_dir(home))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "git") && p.join("objects").is_dir())
        .collect();
    dirs.sort();
    dirs.iter().map(|d| summary(d)).collect()
}

/// The mirrors' table (`status`); empty without mirrors.
pub fn render(all: &[Summary]) -> String {
    if all.is_empty() {
        return String::new();
    }
    let mut out = format!("git mirrors:\n  {:<24} {:>9} {:>16}  URL\n", "NAME", "SIZE", "FETCHED");
    for m in all {
        out.push_str(&format!(
            "  {:<24} {:>9} {:>16}  {}\n",
            m.name,
            crate::config::human_size(m.size_bytes),
            fetched(m.fetched_age_secs),
            m.url
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mirror_is_summed_up_from_its_own_files() {
        let t = tempfile::tempdir().unwrap();
        let home = Home::new(t.path());
        assert!(summaries(&home).is_empty());
        let dir = super::super::mirrors_dir(&home).join("big-0123abcd.git");
        std::fs::create_dir_all(dir.join("objects/pack")).unwrap();
        std::fs::write(dir.join("config"), "[remote \"origin\"]\n\turl = https://h/big.git\n").unwrap();
        std::fs::write(dir.join("objects/pack/p.pack"), vec![1u8; 64 << 10]).unwrap();
        let s = &summaries(&home)[0];
        assert_eq!((s.name.as_str(), s.url.as_str(), s.fetched_age_secs), ("big-0123abcd", "https://h/big.git", None));
        assert!(s.size_bytes >= 64 << 10, "{s:?}");
        assert_eq!(
            s.line(),
            format!("big-0123abcd (https://h/big.git): {}, never fetched", crate::config::human_size(s.size_bytes))
        );
        std::fs::write(dir.join("FETCH_HEAD"), "").unwrap();
        let s = &summaries(&home)[0];
        assert!(s.line().ends_with("fetched 0s ago"), "{}", s.line());
        assert!(render(&summaries(&home)).starts_with("git mirrors:\n"));
    }
}
