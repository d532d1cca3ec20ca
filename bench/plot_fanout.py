"""Plots bench/results/fanout.txt (written by bench/fanout.sh) as time to
deliver one version to N readers, per method, beside the bound S/B."""
import re
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def fields(line):
    return dict(re.findall(r"(\w+)=([^\s]+)", line))


def main(src, dst):
    series = defaultdict(dict)
    bound = {}
    for line in open(src):
        if line.startswith("crossdc"):
            continue
        f = fields(line)
        if line.startswith("fanout "):
            n = int(f["readers"])
            name = "TensorHub" if f["mode"] == "tensorhub" else "point-to-point (pull from trainer)"
            if f.get("transport", "tcp") != "tcp":
                name += " over " + f["transport"].upper()
            series[name][n] = float(f["seconds"])
            bound[n] = float(f["bound_seconds"])
        elif line.startswith("mpi_bcast_best"):
            series["MPI_Bcast (best of pipeline / scatter-allgather)"][int(f["receivers"])] = float(f["seconds"])
        elif line.startswith("gloo_bcast"):
            series["torch.distributed gloo broadcast"][int(f["ranks"]) - 1] = float(f["seconds"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in series.items():
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], marker="o", label=name)
    xs = sorted(bound)
    ax.plot(xs, [bound[x] for x in xs], "k--", label="lower bound S/B")
    ax.set_xlabel("readers (one per host)")
    ax.set_ylabel("seconds until every reader holds the version")
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Fan-out of one version on the netns test bed")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
