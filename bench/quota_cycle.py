"""The disk quota's cost on the `exec` cycle (run by scripts/guest-tests.sh --bench N, in a
guest whose kernel has project quotas): one `exec -- true` on a home on ext4 mounted
`prjquota` (each job's layer dir gets a project id and limits at its start, loses them at
its end) against one on plain ext4 (no quota step), interleaved, the order alternating
each round. Prints each side's median and the median of the per-round ratios.

    python3 bench/quota_cycle.py BINARY QUOTA_HOME PLAIN_HOME ROUNDS
"""
import os, shutil, statistics, subprocess, sys, time

binary, quota_home, plain_home, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
homes = {"prjquota": quota_home, "plain": plain_home}
for h in homes.values():
    shutil.rmtree(h, ignore_errors=True)
    os.makedirs(h)
    subprocess.run([binary, "-q", "--home", h, "rootfs", "import", "target/fixtures/busybox-rootfs.tar",
                    "--name", "bb"], check=True)


def cycle(home):
    t = time.perf_counter()
    r = subprocess.run([binary, "-q", "--home", home, "exec", "--rootfs", "bb", "--", "true"],
                       stderr=subprocess.DEVNULL)
    assert r.returncode == 0, r
    return time.perf_counter() - t


for h in homes.values():
    for _ in range(3):
        cycle(h)
times = {k: [] for k in homes}
ratios = []
for i in range(rounds):
    order = list(homes) if i % 2 == 0 else list(reversed(list(homes)))
    got = {k: cycle(homes[k]) for k in order}
    for k, v in got.items():
        times[k].append(v)
    ratios.append(got["prjquota"] / got["plain"])
for k, v in times.items():
    print(f"{k}: median {statistics.median(v) * 1e3:.1f} ms, min {min(v) * 1e3:.1f}, max {max(v) * 1e3:.1f}"
          f" ({len(v)} cycles)")
print(f"prjquota/plain, per round: median {statistics.median(ratios):.3f}, min {min(ratios):.3f},"
      f" max {max(ratios):.3f}")
