#!/usr/bin/env bash
# Builds a tiny rootfs tarball from Debian's busybox-static: /bin/busybox plus one
# symlink per applet, /etc/passwd and group with an unprivileged `azp` user.
# Usage: make-busybox-rootfs.sh OUT.tar
set -euo pipefail
out=${1:?usage: $0 OUT.tar}
bb=/bin/busybox
[ -x "$bb" ] || { echo "busybox-static is not installed: run scripts/setup.sh" >&2; exit 1; }
file -L "$bb" 2>/dev/null | grep -q 'statically linked' || ldd "$bb" 2>&1 | grep -q 'not a dynamic' \
  || { echo "$bb is not static: install busybox-static" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
r=$tmp/root
mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,proc,sys,dev,root,home/azp,var/tmp}
cp "$bb" "$r/bin/busybox"
for a in $("$bb" --list); do
  [ "$a" = busybox ] || ln -sf busybox "$r/bin/$a"
done
printf 'root:x:0:0:root:/root:/bin/sh\nazp:x:1000:1000:azp:/home/azp:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$r/etc/passwd"
printf 'root:x:0:\nazp:x:1000:\nnogroup:x:65534:\n' >"$r/etc/group"
chmod 1777 "$r/tmp" "$r/var/tmp"
chown 1000:1000 "$r/home/azp"
tar --numeric-owner -C "$r" -cf "$out.partial" .
mv "$out.partial" "$out"
