//! The shell scripts of the chroot steps, made from the recipe's validated values.

use super::schema::{Recipe, User};

/// Purges `remove_packages` (or deletes their files when purging would remove others),
/// deletes `remove_paths`, and records what went in `/usr/share/azp-sandbox/removed-files`.
pub(super) fn removal(r: &Recipe) -> String {
    // The patterns are validated ([A-Za-z0-9._-+@*?[]/] only): safe unquoted.
    let globs: Vec<String> = r.remove_paths.iter().map(|p| format!("/{}", p.trim_start_matches('/'))).collect();
    r#"set -e
rec=/usr/share/azp-sandbox/removed-files
mkdir -p /usr/share/azp-sandbox
: > "$rec.tmp"
installed=
for p in @PKGS@; do
    if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ]; then installed="$installed $p"; fi
done
if [ -n "$installed" ]; then
    others=$(apt-get -s -q purge $installed | awk '/^(Purg|Remv) / {print $2}' | while read -r q; do
        case " $installed " in *" $q "*) ;; *) echo "$q" ;; esac
    done)
    if [ -z "$others" ]; then
        echo "azp-sandbox: purging$installed"
        apt-get -q -y purge $installed
        apt-get -q -y autoremove --purge
    else
        echo "azp-sandbox: purging$installed would also remove: $(echo $others)"
        echo "azp-sandbox: deleting their files instead (dpkg keeps listing the packages)"
        for p in $installed; do
            dpkg-query -L "$p" | while IFS= read -r f; do
                if [ -L "$f" ] || { [ -e "$f" ] && [ ! -d "$f" ]; }; then rm -f -- "$f"; echo "$f" >> "$rec.tmp"; fi
            done
        done
    fi
else
    echo "azp-sandbox: none of @PKGS@ is installed"
fi
for f in @GLOBS@; do
    if [ -L "$f" ] || [ -e "$f" ]; then rm -rf -- "$f"; echo "$f" >> "$rec.tmp"; fi
done
sort -u "$rec.tmp" > "$rec"
rm -f "$rec.tmp"
echo "azp-sandbox: removed $(wc -l < "$rec") file(s), listed in $rec"
[ -s "$rec" ] || rm -f "$rec"
ldconfig
"#
    .replace("@PKGS@", &r.remove_packages.join(" "))
    .replace("@GLOBS@", &globs.join(" "))
}

/// Creates the recipe's unprivileged user (refused when the name or uid is taken).
pub(super) fn user(u: &User) -> String {
    r#"set -e
if getent passwd @NAME@ >/dev/null || getent passwd @UID@ >/dev/null; then
    echo "azp-sandbox: user @NAME@ or uid @UID@ already exists in the rootfs" >&2; exit 1
fi
getent group @GID@ >/dev/null || groupadd --gid @GID@ @NAME@
useradd --uid @UID@ --gid @GID@ --create-home --home-dir @HOME@ --shell @SHELL@ @NAME@
id @NAME@
"#
    .replace("@NAME@", &u.name)
    .replace("@UID@", &u.uid.to_string())
    .replace("@GID@", &u.gid().to_string())
    .replace("@HOME@", &u.home())
    .replace("@SHELL@", &u.shell())
}

/// apt's caches and lists (unless kept), temp files; then ldconfig.
pub(super) fn cleanup(keep_apt_lists: bool) -> String {
    let mut s = String::from("set -e\n");
    if !keep_apt_lists {
        s.push_str("apt-get clean\nrm -rf /var/lib/apt/lists/*\nrm -f /var/cache/apt/*.bin\n");
    } else {
        // .debs never stay in the rootfs (they went to the bind-mounted cache).
        s.push_str("rm -f /var/cache/apt/archives/*.deb\n");
    }
    s.push_str("rm -rf /tmp/* /var/tmp/*\nldconfig\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn minimal() -> String {
        "name = \"t\"\narch = \"x86_64\"\ndistro = \"debian\"\nsuite = \"bookworm\"\n\
         mirror = \"http://deb.debian.org/debian\"\npackages = [\"busybox\"]\n"
            .to_string()
    }

    #[test]
    fn removal_script_lists() {
        let text = minimal() + "remove_packages = [\"libcuda1\"]\nremove_paths = [\"usr/lib/*/libcuda.so*\"]\n";
        let r = Recipe::parse(&text, Path::new("t.toml")).unwrap();
        let s = removal(&r);
        assert!(s.contains("for p in libcuda1; do"), "{s}");
        assert!(s.contains("for f in /usr/lib/*/libcuda.so*; do"), "{s}");
        assert!(!s.contains('@'), "{s}");
    }
}
