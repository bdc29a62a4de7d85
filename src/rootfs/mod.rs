//! Root filesystems: the read-only lower layers of every sandbox.
//!
//! `azp-sandbox rootfs import FILE|- --name NAME` streams a tar archive (plain, gzip or
//! zstd, recognised by magic bytes) into the [`Store`]; `rootfs list` and `rootfs rm`
//! manage it; a sandbox takes a [`RootfsLease`] on the rootfs it runs on.
//!
//! * [`archive`]: format detection, hashing, the read/decompress + unpack pipeline;
//! * [`unpack`]: safe extraction (hostile archives, run as root), callable per image layer;
//! * [`Store`]: atomic imports, leases, removal, gc of dead imports.

pub mod archive;
pub mod oci;
pub(crate) mod probe;
pub mod recipe;
pub mod select;
mod size;
mod store;
mod tarstream;
pub mod unpack;

pub use archive::{detect, Compression};
pub use size::tree_size;
pub use store::{RootfsInfo, RootfsLease, Store};
pub use unpack::{unpack, unpack_at, UnpackError, UnpackOptions, UnpackStats};

use std::sync::atomic::AtomicBool;

/// Set from a SIGINT/SIGTERM handler to stop a running import: it fails with
/// "import of 'x' interrupted" at the next chunk or entry and removes its temp dir.
/// Without a handler, the signal kills the process and [`Store::gc`] removes the temp dir
/// later. Reset it before starting another import in the same process.
pub static CANCEL: AtomicBool = AtomicBool::new(false);

/// Rootfs names: `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`.
pub fn validate_name(name: &str) -> anyhow::Result<()> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        anyhow::bail!(
            "invalid rootfs name '{}': use 1 to 64 characters from A-Z a-z 0-9 . _ -, starting with a letter or digit",
            name.escape_debug()
        )
    }
}

/// The rootfs name `rootfs import FILE` takes when no `--name` is given: the file's name
/// without its archive extensions (`cuda-12.4.tar.zst` -> `cuda-12.4`), checked as
/// [`validate_name`] checks it.
pub fn name_from_file(file: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context as _;
    const ARCHIVE: &[&str] =
        &[".tar.gz", ".tar.zst", ".tar.xz", ".tar.bz2", ".tgz", ".tzst", ".txz", ".tbz2", ".tar", ".oci"];
    let Some(base) = file.file_name().and_then(|n| n.to_str()) else {
        anyhow::bail!("cannot take a rootfs name from '{}': give --name NAME", file.display());
    };
    // An image layout's `DIR:REF` (see `oci::detect_local`) is named `DIR-REF`, as `rootfs
    // pull` names `REPO:TAG` `REPO-TAG`.
    let (base_path, reference) = match base.rsplit_once(':') {
        Some((p, r)) if !file.exists() && !r.is_empty() => (p, Some(r)),
        _ => (base, None),
    };
    let stem = ARCHIVE.iter().find_map(|ext| base_path.strip_suffix(ext)).unwrap_or(base_path);
    let stem = match reference {
        Some(r) => format!("{stem}-{r}"),
        None => stem.to_string(),
    };
    let stem = stem.as_str();
    validate_name(stem).with_context(|| format!("no --name given and the file name '{base}' is not a rootfs name"))?;
    Ok(stem.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_files() {
        let name = |f: &str| name_from_file(std::path::Path::new(f)).map_err(|e| format!("{e:#}"));
        for (file, want) in [
            ("/x/cuda-rootfs.tar.zst", "cuda-rootfs"),
            ("ubuntu-22.04.tar.gz", "ubuntu-22.04"),
            ("a.tgz", "a"),
            ("b.tar", "b"),
            ("img.oci", "img"),
            ("dir/layout", "layout"),
            ("c.tar.xz", "c"),
            ("/nonexistent/layout:12.4", "layout-12.4"),
            ("saved.tar:latest", "saved-latest"),
        ] {
            assert_eq!(name(file).as_deref(), Ok(want), "{file}");
        }
        for bad in ["my rootfs.tar", ".tar.gz", "/", "-"] {
            let e = name(bad).unwrap_err();
            assert!(e.contains("invalid rootfs name") || e.contains("give --name"), "{bad}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn names() {
        for good in ["a", "ubuntu-22.04", "cuda_12.4", "0", &"x".repeat(64)] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".tmp", "-x", "_x", "a/b", "..", "a b", "é", "a\nb", &"x".repeat(65)] {
            let e = validate_name(bad).unwrap_err().to_string();
            assert!(e.starts_with("invalid rootfs name"), "{bad}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }
}
