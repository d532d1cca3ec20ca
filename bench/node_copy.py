"""One host copy per node, measured: 2 hosts x 4 engines on the test bed.

    flock /tmp/th-testbed.lock .venv/bin/python bench/node_copy.py [--scale 1.0]

Brings up a test bed (bench/testbed.sh: one trainer host with the hub, and
--hosts engine hosts, every NIC shaped to --host-mbit), publishes
--versions versions of a Qwen2-like float16 model (bench/node_engine.py;
about 256 MiB at scale 1, a quarter of it the embedding), and then, in one
run, for each mode:

  own    every engine fetches each version itself and keeps serving it until
         the next replaces it (the vLLM backend without an agent);
  node   one `tensorhub node` agent per host fetches each version once onto
         the host, and its engines load from that copy.

Version 1 is loaded by all engines at once; each later version is first
staged (own: every engine fetches it beside the one it holds; node: the
agents fetch it) and then loaded by all at once.

Per host it prints the peak host memory of the host's TensorHub processes
(the agent and the engines, in one memory cgroup of their own) above what
they used before the first update: the engines' weights, allocated at start,
stand for device memory and are in that baseline, as are the processes
themselves ("processes": the baseline less the weights). The peak is the kernel's (memory.max_usage_in_bytes
of the cgroup), not a sample. Beside it: the model's size and the ratio, and
the time from "load" to the last engine of the run reporting its weights
loaded, with every engine's weights checked against the publisher's digest.
The bound beside those times is the model's size over one host link's rate
as iperf3 measures it in the same run (`testbed.sh check`): every version
must cross the trainer's link at least once.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CGROUP = Path("/sys/fs/cgroup/memory")


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


class Proc:
    """A process in a test-bed host (and a memory cgroup), line I/O."""

    def __init__(self, host_ns: str, argv, cgroup: Path | None, env: dict, name: str) -> None:
        self.name = name
        # `ip netns exec` execs the command in its own process (no fork), so
        # the pid is the process's from start to end. It mounts a sysfs of
        # its own, without the cgroup tree: the process is moved into its
        # cgroup from here, before it has loaded anything.
        self.proc = subprocess.Popen(["ip", "netns", "exec", host_ns, *argv], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     start_new_session=True)
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(self.proc.pid))
        self.lines: list[str] = []
        self.cv = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._errors, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            with self.cv:
                self.lines.append(line.rstrip("\n"))
                self.cv.notify_all()
        with self.cv:
            self.lines.append("<eof>")
            self.cv.notify_all()

    def _errors(self) -> None:
        for line in self.proc.stderr:
            if " W" in line[:2] or line.startswith(("E", "W", "Traceback")) or "Error" in line:
                sys.stderr.write(f"[{self.name}] {line}")

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, prefix: str, timeout: float = 600.0) -> tuple[str, float]:
        """The next line starting with `prefix` (lines starting '#' are
        printed), and the time it arrived."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                while self.lines:
                    line = self.lines.pop(0)
                    if line == "<eof>":
                        raise RuntimeError(f"{self.name} exited ({self.proc.poll()}) waiting for {prefix!r}")
                    if line.startswith("#"):
                        print(f"  [{self.name}] {line[1:].strip()}", flush=True)
                        continue
                    if line.startswith(prefix):
                        return line, time.monotonic()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{self.name}: no {prefix!r} within {timeout:.0f} s")
                self.cv.wait(left)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(30)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def make_cgroup(name: str) -> Path:
    path = CGROUP / name
    if path.exists():
        path.rmdir()
    path.mkdir()
    return path


def read_int(path: Path) -> int:
    return int(path.read_text().strip())


def status_mib(pid: int, field: str = "VmRSS") -> float:
    """A /proc/PID/status size (VmRSS, VmHWM, RssAnon, RssShmem) in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def reset_peak(pid: int) -> None:
    """VmHWM := VmRSS (proc(5), clear_refs 5)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        pass


def run_mode(mode: str, a, prefix: str, ips: list, hub: str, digests: dict, model_bytes: int, env: dict) -> dict:
    hosts = list(range(1, a.hosts + 1))
    groups = {h: make_cgroup(f"{prefix}-{mode}-h{h}") for h in hosts}
    procs: list[Proc] = []
    agents: dict[int, Proc] = {}
    engines: list[Proc] = []
    try:
        for h in hosts:
            ns = f"{prefix}-h{h}"
            socket = "@tensorhub-node"
            if mode == "node":
                agent = Proc(ns, [a.bin, "node", "--socket", socket, "--hub", hub, "--name", f"agent-h{h}",
                                  "--host-label", f"h{h}", "--data-listen", f"{ips[h]}:0", "--insecure"],
                             groups[h], env, f"agent-h{h}")
                agent.expect("node agent ", 60)
                agents[h] = agent
                procs.append(agent)
            for e in range(a.engines):
                eng = Proc(ns, [a.python, str(REPO / "bench" / "node_engine.py"), "engine", "--hub", hub,
                                "--model", f"{a.model}-{mode}", "--name", f"h{h}-e{e}", "--host-label", f"h{h}",
                                "--data-listen", f"{ips[h]}:0", "--mode", mode, "--socket", socket,
                                "--scale", str(a.scale)],
                           groups[h], env, f"h{h}-e{e}")
                engines.append(eng)
                procs.append(eng)
        for eng in engines:
            eng.expect("ready", 300)
        base = {}
        for h in hosts:
            (groups[h] / "memory.max_usage_in_bytes").write_text("0")
            base[h] = read_int(groups[h] / "memory.usage_in_bytes")
        # The processes themselves: the cgroup at baseline less the engines'
        # weights (which stand for device memory).
        procs_mib = {h: (read_int(groups[h] / "memory.usage_in_bytes") - a.engines * model_bytes) / 2**20
                     for h in hosts}
        agent_rss = {h: status_mib(agents[h].proc.pid) for h in agents}
        engine_base = {eng.name: status_mib(eng.proc.pid) for eng in engines}
        for p in procs:
            reset_peak(p.proc.pid)
        rounds = []
        for v in range(1, a.versions + 1):
            # From the round's first command (later versions: stage, then
            # load at once, so the load waits for the staged fetch) to the
            # last engine's weights in (its own clock: the digest after it
            # is not counted).
            t0 = time.monotonic()
            if v > 1:
                for eng in engines:
                    eng.send(f"stage {v}")
                for eng in engines:
                    eng.expect("staged", 300)
            for eng in engines:
                eng.send(f"load {v}")
            last = 0.0
            paths = set()
            for eng in engines:
                line, _ = eng.expect("loaded", 600)
                _, ver, secs, dig, path, done = line.split()
                if dig != digests[v]:
                    raise RuntimeError(f"{eng.name}: version {v} loaded with digest {dig}, published {digests[v]}")
                paths.add(path)
                last = max(last, float(done) - t0)
            rounds.append((v, last, sorted(paths)))
        peak = {h: read_int(groups[h] / "memory.max_usage_in_bytes") - base[h] for h in hosts}
        # Where it went, per process: the agent's peak RSS (its copy is
        # shared memory it faulted in), and each engine's peak RSS above its
        # start (pages of the host copy it mapped count here too).
        agent_peak = {h: status_mib(agents[h].proc.pid, "VmHWM") for h in agents}
        engine_peak = {h: max(status_mib(e.proc.pid, "VmHWM") - engine_base[e.name]
                              for e in engines if e.name.startswith(f"h{h}-")) for h in hosts}
        for eng in engines:
            eng.send("quit")
        for eng in engines:  # they leave the hub; the next mode starts clean
            eng.proc.wait(60)
        return {"mode": mode, "peak": peak, "procs_mib": procs_mib, "agent_rss": agent_rss, "rounds": rounds,
                "agent_peak": agent_peak, "engine_peak": engine_peak}
    finally:
        for p in procs:
            p.stop()
        for g in groups.values():
            for _ in range(100):
                try:
                    g.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=2, help="engine hosts")
    p.add_argument("--engines", type=int, default=4, help="engines per host")
    p.add_argument("--scale", type=float, default=1.0, help="model size: about 256 MiB x scale")
    p.add_argument("--versions", type=int, default=2, help="versions loaded (the 2nd on is staged first)")
    p.add_argument("--host-mbit", type=int, default=1000, help="every host NIC, both ways")
    p.add_argument("--modes", default="own,node")
    p.add_argument("--prefix", default="thnc")
    p.add_argument("--net", default="10.93")
    p.add_argument("--model", default="policy")
    p.add_argument("--bin", default=os.environ.get("TENSORHUB_BIN", str(REPO / "build" / "tools" / "tensorhub")))
    p.add_argument("--python", default=os.environ.get("PYTHON", sys.executable))
    a = p.parse_args()
    if os.geteuid() != 0:
        print("node_copy.py: needs root (network namespaces, tc, memory cgroups)", file=sys.stderr)
        return 2
    if not (CGROUP / "memory.max_usage_in_bytes").exists():
        print(f"node_copy.py: needs the cgroup v1 memory controller at {CGROUP}", file=sys.stderr)
        return 2
    prefix = a.prefix
    sh(str(REPO / "bench" / "testbed.sh"), "up", "--prefix", prefix, "--net", a.net, "--hosts", str(a.hosts + 1),
       "--host-mbit", str(a.host_mbit), "--force")
    env_file = Path(f"/run/tensorhub-testbed-{prefix}.env").read_text()
    ips = [line for line in env_file.splitlines() if line.startswith("TB_HOST_IPS=")][0]
    ips = ips.split("=", 1)[1].strip().strip('"').split()
    hub = f"{ips[0]}:7400"
    # The link as measured in this run (iperf3 between two hosts): the bound.
    check = sh(str(REPO / "bench" / "testbed.sh"), "check", "--prefix", prefix, "--seconds", "3")
    link_mbit = float([w.split("=")[1] for w in check.split() if w.startswith("measured_mbit=")][0])
    env = dict(os.environ, TENSORHUB_LOG="warn", TENSORHUB_INSECURE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH", "")])))
    procs = []
    try:
        hubp = Proc(f"{prefix}-h0", [a.bin, "serve", "--listen", hub, "--insecure", "--lease-ms", "10000"], None,
                    env, "hub")
        procs.append(hubp)
        pub = Proc(f"{prefix}-h0", [a.python, str(REPO / "bench" / "node_engine.py"), "publisher", "--hub", hub,
                                    "--model", ",".join(f"{a.model}-{m}" for m in a.modes.split(",")),
                                    "--host-label", "h0", "--data-listen", f"{ips[0]}:0",
                                    "--scale", str(a.scale), "--versions", str(a.versions)], None, env, "trainer")
        procs.append(pub)
        digests = {}
        model_bytes = 0
        for v in range(1, a.versions + 1):
            line, _ = pub.expect("published", 300)
            _, ver, dig, nbytes = line.split()
            digests[int(ver)] = dig
            model_bytes = int(nbytes)
        bound_s = model_bytes * 8 / (link_mbit * 1e6)
        print(f"node_copy: {a.hosts} hosts x {a.engines} engines, model {model_bytes / 2**20:.1f} MiB "
              f"(float16, {len(digests)} versions), host links {a.host_mbit} Mbit/s (iperf3 measured "
              f"{link_mbit:.0f}); one copy over one link takes {bound_s:.2f} s: the bound", flush=True)
        results = [run_mode(m, a, prefix, ips, hub, digests, model_bytes, env) for m in a.modes.split(",")]
    finally:
        for pr in procs:
            pr.stop()
        subprocess.run([str(REPO / "bench" / "testbed.sh"), "down", "--prefix", prefix], capture_output=True)
    mib = model_bytes / 2**20
    print()
    print(f"{'mode':<6} {'host':<5} {'peak above baseline':>20} {'x model':>8} {'processes':>18} "
          f"{'agent RSS':>10}   time to last engine loaded, per version (x bound)")
    for r in results:
        for h, peak in r["peak"].items():
            times = ", ".join(f"v{v} {t:.2f} s ({t / bound_s:.2f}x) [{'/'.join(paths)}]"
                              for v, t, paths in r["rounds"])
            agent = f"{r['agent_rss'][h]:.0f} MiB" if h in r["agent_rss"] else "-"
            print(f"{r['mode']:<6} h{h:<4} {peak / 2**20:>15.1f} MiB {peak / model_bytes:>8.2f} "
                  f"{r['procs_mib'][h]:>14.0f} MiB {agent:>10}   {times}")
    print("\nper process (VmHWM, MiB): " + "; ".join(
        f"{r['mode']} h{h}: agent {r['agent_peak'][h]:.0f} peak RSS" if h in r["agent_peak"] else
        f"{r['mode']} h{h}: no agent" for r in results for h in r["peak"]) + "; " + "; ".join(
        f"{r['mode']} h{h}: engine +{r['engine_peak'][h]:.0f} at most" for r in results for h in r["peak"]))
    print(f"model {mib:.1f} MiB; every engine's weights matched the publisher's digest for every version")
    worst = {r["mode"]: max(r["peak"].values()) / model_bytes for r in results}
    if "node" in worst:
        print(f"node: at most {worst['node']:.2f} copies per host (limit 1.25)")
        return 0 if worst["node"] <= 1.25 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
