//! Named caches shared by throwaway jobs, written only by trusted ones (issue 24).
//!
//! Each cache is a chain of immutable snapshots in `<home>/caches/<name>/` ([`store`]).
//! Every job gets each cache at its path as a copy-on-write view of the current snapshot
//! (an overlay: the snapshot read-only below, a job-private upper in the job's layer
//! dir above; mounted by the sandbox helper, see `sandbox::cachemount`). Nothing a job
//! writes is seen by any other job unless its upper is committed ([`commit`]) into the
//! next snapshot, which the manager does only for a job whose trust it learned from Azure
//! DevOps after the job ([`trust`]), and `exec --cache NAME:PATH:commit` on an operator's
//! explicit request.

pub mod commit;
pub mod size;
pub mod store;
pub mod trust;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::path::{Component, Path, PathBuf};

/// One job's use of one cache (part of its plan).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheMount {
    pub name: String,
    /// The cache's dir in the home (`<home>/caches/<name>`).
    pub store: PathBuf,
    /// Where the job sees it (absolute, inside the job's tree).
    pub container: PathBuf,
    /// Commit the job's changes after it, whatever its trust (`exec --cache N:P:commit`).
    #[serde(default)]
    pub commit: bool,
    /// Refuse a commit that would make the snapshot larger (bytes).
    #[serde(default)]
    pub max_size: Option<u64>,
}

/// A cache as the operator declares it: `[[cache]]` in config.toml, or `exec --cache`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheDecl {
    pub name: String,
    pub path: PathBuf,
    pub max_size: Option<u64>,
    /// `exec --cache NAME:PATH:commit`.
    pub commit: bool,
}

impl CacheDecl {
    /// This cache in the plan of a job of `home`.
    pub fn mount(&self, home: &crate::config::Home) -> CacheMount {
        CacheMount {
            name: self.name.clone(),
            store: store::dir(home, &self.name),
            container: self.path.clone(),
            commit: self.commit,
            max_size: self.max_size,
        }
    }
}

impl std::str::FromStr for CacheDecl {
    type Err = anyhow::Error;
    /// `NAME:PATH[:commit]` (`exec --cache`).
    fn from_str(s: &str) -> Result<CacheDecl> {
        let mut parts = s.splitn(3, ':');
        let (name, path, flag) = (parts.next().unwrap_or(""), parts.next(), parts.next());
        let Some(path) = path else {
            bail!("bad --cache '{s}': use NAME:PATH[:commit], e.g. pip:/root/.cache/pip");
        };
        let commit = match flag {
            None => false,
            Some("commit") => true,
            Some(other) => bail!("bad --cache '{s}': the third part must be 'commit', not '{other}'"),
        };
        let name = check_name(name)?;
        let path = check_path(&name, Path::new(path))?;
        Ok(CacheDecl { name, path, max_size: None, commit })
    }
}

/// A cache name: it becomes a dir name.
pub fn check_name(s: &str) -> Result<String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !ok {
        bail!("bad cache name '{s}': use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit");
    }
    Ok(s.to_string())
}

/// The path a job sees a cache at: absolute, inside the job's tree (no `..`), and not
/// one of the sandbox's own mounts.
pub fn check_path(name: &str, p: &Path) -> Result<PathBuf> {
    if !p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir)) {
        bail!("cache '{name}': path {} must be absolute and inside the job's tree (no '..')", p.display());
    }
    let norm: PathBuf = p.components().collect();
    if norm == Path::new("/") || crate::config::in_kernel_filesystem(&norm) {
        bail!("cache '{name}': path {} is the job's root or a kernel filesystem: choose a dir such as /root/.cache/{name}", p.display());
    }
    if norm.as_os_str().to_str().is_none_or(|s| s.contains([',', ':', '\n'])) {
        bail!("cache '{name}': path {} must be UTF-8 without ',' ':' or newlines", p.display());
    }
    Ok(norm)
}

/// Caches given twice, or two at one path: refused in one line.
pub fn check_unique(decls: &[CacheDecl]) -> Result<()> {
    for (i, a) in decls.iter().enumerate() {
        for b in &decls[i + 1..] {
            if a.name == b.name {
                bail!("cache '{}' is given twice: give each cache once", a.name);
            }
            if a.path.starts_with(&b.path) || b.path.starts_with(&a.path) {
                bail!(
                    "caches '{}' ({}) and '{}' ({}) overlap: give each its own dir",
                    a.name,
                    a.path.display(),
                    b.name,
                    b.path.display()
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_cache_flags() {
        let d: CacheDecl = "pip:/root/.cache/pip".parse().unwrap();
        assert_eq!((d.name.as_str(), d.path.as_path(), d.commit), ("pip", Path::new("/root/.cache/pip"), false));
        let d: CacheDecl = "cc:/ccache/:commit".parse().unwrap();
        assert_eq!((d.path.as_path(), d.commit), (Path::new("/ccache"), true));
        let e = |s: &str| s.parse::<CacheDecl>().unwrap_err().to_string();
        assert!(e("pip").contains("use NAME:PATH[:commit]"), "{}", e("pip"));
        assert!(e("pip:relative/dir").contains("must be absolute"));
        assert!(e("pip:/a/../../etc").contains("inside the job's tree"));
        assert!(e("pip:/").contains("the job's root"));
        assert!(e("pip:/proc/x").contains("kernel filesystem"));
        assert!(e("../x:/a").contains("bad cache name"));
        assert!(e("pip:/a:write").contains("must be 'commit'"));
        let two = |a: &str, b: &str| check_unique(&[a.parse().unwrap(), b.parse().unwrap()]);
        assert!(two("a:/x", "b:/y").is_ok());
        assert!(two("a:/x", "a:/y").unwrap_err().to_string().contains("given twice"));
        assert!(two("a:/x", "b:/x/y").unwrap_err().to_string().contains("overlap"));
    }
}
