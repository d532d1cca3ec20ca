#!/usr/bin/env python3
"""Plots for `tensorhub-lab sim`: docs/sim-scale.png, sim-stall.png, sim-validation.png.

Runs the simulator itself (build/bench/lab/tensorhub-lab sim ... --csv):
  1. standalone update time / bandwidth bound versus cluster size
     (half trainer, half rollout GPUs), every system;
  2. total GPU stall per system for the three workloads at 1,024 GPUs;
  3. the test bed's measured fan-out times beside the simulated ones.
Needs matplotlib (Debian's python3-matplotlib):
  apt-get install -y python3-matplotlib && /usr/bin/python3 bench/plot_sim.py
"""
import csv
import io
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/bench/lab/tensorhub-lab"


def run(*args):
    out = subprocess.run([BIN, "sim", "--csv", *args], check=True,
                         capture_output=True, text=True, timeout=1800).stdout
    return list(csv.DictReader(io.StringIO(out)))


sizes = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
series = {}
for n in sizes:
    for row in run("--scenario", "standalone", "--trainer-gpus", str(n // 2),
                   "--rollout-gpus", str(n // 2), "--rounds", "1"):
        series.setdefault(row["system"], []).append(float(row["update_over_bound"]))

fig, ax = plt.subplots(figsize=(7, 4.2))
for system, ys in series.items():
    # TensorHub and the ring may coincide: draw TensorHub last, hollow.
    if system != "tensorhub":
        ax.plot(sizes, ys, marker="o", label=system)
ax.plot(sizes, series["tensorhub"], marker="o", markerfacecolor="none",
        markersize=10, linestyle="--", color="black", label="tensorhub")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("GPUs (half trainer, half rollout; 70B bf16, TP=8)")
ax.set_ylabel("update time / (shard / NIC)")
ax.set_title("tensorhub sim: standalone update time vs the bandwidth bound")
ax.grid(True, which="both", alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig("docs/sim-scale.png", dpi=110)

fig, ax = plt.subplots(figsize=(7, 4.2))
width = 0.2
scen = ["standalone", "crossdc", "elastic"]
systems = ["tensorhub", "p2p", "ring-bcast", "tree-bcast"]
for i, s in enumerate(scen):
    rows = {r["system"]: float(r["total_stall_gpu_s"]) for r in run("--scenario", s)
            if r["scenario"] == s}
    for j, system in enumerate(systems):
        if system in rows:
            ax.bar(i + (j - 1.5) * width, rows[system], width,
                   label=system if i == 0 else None, color=f"C{j}")
ax.set_xticks(range(len(scen)))
ax.set_xticklabels([f"{s}\n1,024 GPUs" for s in scen])
ax.set_yscale("log")
ax.set_ylabel("total GPU stall (GPU-seconds, all rounds)")
ax.set_title("tensorhub sim: stall per system")
ax.legend()
fig.tight_layout()
fig.savefig("docs/sim-stall.png", dpi=110)
rows = run("--scenario", "testbed")
fig, ax = plt.subplots(figsize=(7, 4.2))
labels = []
for k, r in enumerate(rows):
    mode = "TH" if r["mode"] == "tensorhub" else r["mode"]
    run_name = ("xdc " if r["crossdc"] == "1" else "") + mode
    chunk = int(r["chunk_bytes"]) >> 20
    labels.append(f"{run_name}\nN={r['readers']} {chunk}MiB")
    ax.bar(k - 0.2, float(r["measured_s"]), 0.4, color="C0", label="measured" if k == 0 else None)
    ax.bar(k + 0.2, float(r["sim_s"]), 0.4, color="C1", label="simulated" if k == 0 else None)
    ax.annotate(f"{100 * float(r['error']):+.0f}%", (k, max(float(r["measured_s"]), float(r["sim_s"]))),
                ha="center", va="bottom", fontsize=7)
ax.set_xticks(range(len(rows)))
ax.set_xticklabels(labels, fontsize=7)
ax.set_yscale("log")
ax.set_ylabel("seconds until every reader holds 256 MiB")
ax.set_title("tensorhub sim vs the namespace test bed (400 Mbit/s links)")
ax.legend()
fig.tight_layout()
fig.savefig("docs/sim-validation.png", dpi=110)
print("wrote docs/sim-scale.png docs/sim-stall.png docs/sim-validation.png")
