//! Where a recipe named on the command line is found: a path, the site's and packaged
//! recipe dirs, or the recipes compiled into the binary.

use super::schema::{is_plain_word, Recipe};
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// Recipes compiled into the binary: the last place a name is looked up, so an installed
/// binary builds the shipped recipes without the repository.
const BUILTIN: &[(&str, &str)] = &[
    ("debian-trixie-cuda12.4", include_str!("../../../rootfs-recipes/debian-trixie-cuda12.4.toml")),
    ("debian-bookworm-cuda11.8", include_str!("../../../rootfs-recipes/debian-bookworm-cuda11.8.toml")),
    ("debian-bookworm-cuda11.8-runtime", include_str!("../../../rootfs-recipes/debian-bookworm-cuda11.8-runtime.toml")),
    ("debian-bookworm-minbase", include_str!("../../../rootfs-recipes/debian-bookworm-minbase.toml")),
    ("debian-bookworm-agent", include_str!("../../../rootfs-recipes/debian-bookworm-agent.toml")),
    ("ubuntu-22.04-cuda12.4", include_str!("../../../rootfs-recipes/ubuntu-22.04-cuda12.4.toml")),
];

/// Where it came from, for messages and `source`.
const BUILTIN_PREFIX: &str = "(built-in)/";

/// Directories searched for `NAME.toml`, in order: the site's (`/etc`), the repository
/// next to the binary (`<repo>/target/*/azp-sandbox` -> `<repo>/rootfs-recipes`), the
/// packaged ones (`/usr/share`); the recipes compiled into the binary come last.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from("/etc/azp-sandbox/rootfs-recipes")];
    if let Ok(exe) = std::env::current_exe() {
        if let Some(d) = exe.ancestors().skip(1).take(4).map(|a| a.join("rootfs-recipes")).find(|d| d.is_dir()) {
            dirs.push(d);
        }
    }
    dirs.push(PathBuf::from("/usr/share/azp-sandbox/rootfs-recipes"));
    dirs
}

/// Names of the recipes found in [`search_dirs`] and built in, sorted, without duplicates.
pub fn available() -> Vec<String> {
    let mut names: Vec<String> = BUILTIN.iter().map(|(n, _)| n.to_string()).collect();
    for d in search_dirs() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            if let Some(n) = e.file_name().to_str().and_then(|n| n.strip_suffix(".toml")) {
                names.push(n.to_string());
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

/// Every recipe [`find`] would take by name, with its one-line description and where it
/// was found (`rootfs build --list`). A recipe that does not parse says why instead.
pub fn list() -> Vec<(String, String, String)> {
    available()
        .into_iter()
        .map(|n| match find(&n) {
            Ok(r) => (n, r.description, r.path.display().to_string()),
            Err(e) => (n, format!("(invalid: {e:#})"), String::new()),
        })
        .collect()
}

/// The recipes compiled into the binary, parsed.
pub fn builtin() -> Vec<Recipe> {
    BUILTIN
        .iter()
        .map(|(n, text)| Recipe::parse(text, &Path::new(BUILTIN_PREFIX).join(format!("{n}.toml"))))
        .collect::<Result<_>>()
        .expect("built-in recipes are valid (checked by the tests)")
}

/// RECIPE as given on the command line: a path (contains `/` or ends in `.toml`), or a
/// name looked up in [`search_dirs`], then among the built-in recipes.
pub fn find(spec: &str) -> Result<Recipe> {
    if spec.contains('/') || spec.ends_with(".toml") {
        let p = Path::new(spec);
        if !p.exists() {
            bail!("recipe file {spec} not found");
        }
        return Recipe::load(p);
    }
    if !is_plain_word(spec) {
        bail!("'{}' is neither a recipe name nor a .toml file", spec.escape_debug());
    }
    for d in search_dirs() {
        let p = d.join(format!("{spec}.toml"));
        if p.is_file() {
            return Recipe::load(&p);
        }
    }
    if let Some((n, text)) = BUILTIN.iter().find(|(n, _)| *n == spec) {
        return Recipe::parse(text, &Path::new(BUILTIN_PREFIX).join(format!("{n}.toml")));
    }
    bail!(
        "unknown recipe '{spec}': known recipes are {} (looked in {}); or give the path of a .toml file",
        available().join(", "),
        search_dirs().iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_parse() {
        let all = builtin();
        assert_eq!(all.len(), BUILTIN.len());
        for r in all {
            assert!(!r.packages.is_empty(), "{}", r.name);
        }
    }

    #[test]
    fn the_list_has_every_builtin_with_its_description() {
        let listed = list();
        for (name, text) in BUILTIN {
            let r = Recipe::parse(text, Path::new("x.toml")).unwrap();
            let row = listed.iter().find(|(n, ..)| n == name).unwrap_or_else(|| panic!("{name} not listed"));
            assert_eq!(row.1, r.description, "{name}");
            assert!(!row.1.is_empty() && !row.1.contains('\n'), "{name}: one line");
        }
    }
}
