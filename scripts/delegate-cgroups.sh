#!/bin/sh
# Delegates a cgroup subtree to USER so that its rootless azp-sandbox enforces job limits.
#   sudo scripts/delegate-cgroups.sh USER          (create)
#   sudo scripts/delegate-cgroups.sh --remove USER (undo)
# cgroup v1: creates /sys/fs/cgroup/<hierarchy>/azp-sandbox/user-UID in every mounted
# controller hierarchy, owned by USER (libcontainer joins every hierarchy, so all of them
# must be delegated). Not persistent: run it at boot (e.g. from the rootless service unit's
# ExecStartPre=+...). cgroup v2: systemd already delegates user@UID.service; this only
# checks that memory, pids and cpu are offered there.
set -eu
remove=no
if [ "${1:-}" = "--remove" ]; then remove=yes; shift; fi
user="${1:?usage: delegate-cgroups.sh [--remove] USER}"
uid=$(id -u "$user")
gid=$(id -g "$user")
root=/sys/fs/cgroup

if [ "$(stat -f -c %T "$root")" = "cgroup2fs" ]; then
    svc="$root/user.slice/user-$uid.slice/user@$uid.service"
    if [ ! -d "$svc" ]; then
        echo "cgroup v2: $svc does not exist: start the user's systemd (loginctl enable-linger $user)" >&2
        exit 1
    fi
    ctrl=$(cat "$svc/cgroup.controllers")
    for c in memory pids cpu; do
        case " $ctrl " in *" $c "*) ;; *)
            echo "cgroup v2: $svc lacks '$c': add Delegate=memory pids cpu to user@.service (systemctl edit user@.service)" >&2
            exit 1 ;;
        esac
    done
    echo "cgroup v2: $svc is delegated to $user with: $ctrl"
    exit 0
fi

for h in "$root"/*; do
    [ -d "$h" ] || continue
    # Controller hierarchies only (not the named "systemd" one or the empty unified mount).
    case "$(basename "$h")" in systemd|unified) continue ;; esac
    [ "$(stat -f -c %T "$h")" = "cgroupfs" ] || continue
    d="$h/azp-sandbox/user-$uid"
    if [ "$remove" = yes ]; then
        # Leftover job cgroups first (empty once their jobs are gone), then the user's dir.
        find "$d" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true
        rmdir "$d" 2>/dev/null || true
        rmdir "$h/azp-sandbox" 2>/dev/null || true
        continue
    fi
    mkdir -p "$d"
    case "$(basename "$h")" in *cpuset*)
        # A new cpuset has no cpus/mems; a task cannot join it until they are set.
        for f in cpuset.cpus cpuset.mems; do
            [ -s "$h/azp-sandbox/$f" ] && [ -n "$(cat "$h/azp-sandbox/$f")" ] || cat "$h/$f" > "$h/azp-sandbox/$f"
            [ -n "$(cat "$d/$f")" ] || cat "$h/azp-sandbox/$f" > "$d/$f"
        done ;;
    esac
    chown "$uid:$gid" "$d" "$d"/cgroup.procs "$d"/tasks "$d"/cgroup.clone_children 2>/dev/null || chown "$uid:$gid" "$d"
    echo "delegated $d to $user"
done
