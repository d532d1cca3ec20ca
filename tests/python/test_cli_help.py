"""The command lines' help and their answers to bad input.

`COMMAND --help` of every command of `tensorhub` ($TENSORHUB_BIN, default
build/tools/tensorhub) and `tensorhub-lab` ($TENSORHUB_LAB_BIN, default
build/bench/lab/tensorhub-lab) exits 0 and lists the command's flags, each with
a description; a bad command line exits 2 with a message that names the flag
(or command) and points at --help. No hub is needed.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TENSORHUB_BIN", REPO / "build" / "tools" / "tensorhub"))
LAB = Path(os.environ.get("TENSORHUB_LAB_BIN", REPO / "build" / "bench" / "lab" / "tensorhub-lab"))


def built(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


needs_cli = pytest.mark.skipif(not built(BIN), reason=f"CLI binary {BIN} not built")
needs_lab = pytest.mark.skipif(not built(LAB), reason=f"lab binary {LAB} not built")

HUB = ["--hub", "--secret-file"]
WORKER = HUB + ["--name", "--datacenter", "--rack", "--host-label", "--spot", "--data-listen", "--advertise-host",
                "--metrics-listen", "--no-deltas", "--wide-area-mbit", "--datacenter-mbit", "--delta-memory"]

# Each command and the flags its help must list.
CLI_COMMANDS = {
    ("serve",): ["--listen", "--lease-ms", "--oversubscribed-racks", "--keep-latest", "--rebuild-ms",
                 "--secret-file", "--metrics-listen"],
    ("ls",): HUB + ["--timeout-ms", "--json"],
    ("show",): HUB + ["--timeout-ms", "--json"],
    ("top",): HUB + ["--interval", "--once", "--timeout-ms", "--width", "--transfers", "--versions"],
    ("publish",): WORKER + ["--model", "--version", "--rank", "--group-size", "--chunk-bytes", "--timeout-ms"],
    ("fetch",): WORKER + ["--output", "--hold", "--stats-json", "--connections", "--group", "--step",
                          "--timeout-ms"],
    ("retain",): HUB + ["--timeout-ms"],
    ("unretain",): HUB + ["--timeout-ms"],
    ("keeper",): WORKER + ["--memory-limit", "--leave-timeout-ms"],
    ("node",): WORKER + ["--socket", "--max-sessions", "--replace-wait-ms", "--memory-limit", "--connections",
                         "--leave-timeout-ms"],
    ("demo",): ["--rollouts", "--rounds", "--scale"],
    ("bench", "pair"): ["--bytes", "--chunk-bytes", "--repeat", "--connections"],
    ("bench", "local"): ["--bytes", "--chunk-bytes", "--repeat", "--connections"],
    ("bench", "ucx"): ["--bytes", "--chunk-bytes", "--repeat", "--connections"],
}
LAB_COMMANDS = {
    ("chaos",): ["--seed", "--rounds", "--readers", "--bytes", "--verbose"],
    ("sim",): ["--scenario", "--csv", "--systems", "--measured", "--trainer-gpus", "--rollout-gpus",
               "--model-bytes", "--tp", "--nic-gbit", "--rack-oversub", "--wan-gbit", "--seed"],
    ("bench", "hub"): ["--workers", "--tensors", "--chunks", "--threads", "--no-rpc"],
    ("bench", "fanout"): ["--testbed", "--readers", "--bytes", "--chunk-bytes", "--mode", "--repeat",
                          "--connections", "--port", "--metrics-port"],
    ("bench", "workload"): ["--testbed", "--bytes", "--chunk-bytes", "--rounds", "--step-ms", "--batch-ms",
                            "--copies", "--connections", "--port", "--seed", "--spot", "--stay-max",
                            "--timeout-s", "--systems", "--mpi-script", "--mpi-algorithms"],
    ("bench", "reshard"): ["--trainers", "--tp", "--scale"],
    ("serve",): ["--listen", "--lease-ms", "--keep-latest", "--rebuild-ms", "--secret-file",
                 "--metrics-listen", "--insecure"],
}


def run(binary: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, TENSORHUB_LOG="warn", **(env or {})))


# The column where CLI11 (as the binaries set it up) starts descriptions.
DESC_COLUMN = 34


def flag_lines(help_text: str) -> dict[str, str]:
    """Each flag in a help text -> its description: from DESC_COLUMN on the
    flag's line, or alone on the next line when the flag's part is wider."""
    lines = help_text.splitlines()
    out = {}
    for i, line in enumerate(lines):
        if not re.match(r"^  -", line):
            continue
        if len(line) > DESC_COLUMN and line[DESC_COLUMN - 1] == " ":
            spec, desc = line[:DESC_COLUMN], line[DESC_COLUMN:].strip()
        else:
            spec, desc = line, ""
            if i + 1 < len(lines) and re.match(rf"^ {{{DESC_COLUMN}}}\S", lines[i + 1]):
                desc = lines[i + 1].strip()
        for name in re.findall(r"--[a-z][a-z0-9-]*", spec.split(" ")[2]):
            out[name] = desc
    return out


def check_help(binary: Path, name: str, path: tuple[str, ...], flags: list[str]) -> None:
    r = run(binary, *path, "--help")
    assert r.returncode == 0, r.stderr
    assert f"Usage: {name} {' '.join(path)} " in r.stdout, r.stdout
    listed = flag_lines(r.stdout)
    for f in flags + ["--help"]:
        assert f in listed, f"{name} {' '.join(path)} --help does not list {f}:\n{r.stdout}"
    for f, desc in listed.items():
        assert desc, f"{name} {' '.join(path)}: {f} has no description:\n{r.stdout}"


@needs_cli
@pytest.mark.parametrize("path", list(CLI_COMMANDS), ids=" ".join)
def test_every_command_lists_its_flags(path):
    check_help(BIN, "tensorhub", path, CLI_COMMANDS[path])


@needs_lab
@pytest.mark.parametrize("path", list(LAB_COMMANDS), ids=" ".join)
def test_every_lab_command_lists_its_flags(path):
    check_help(LAB, "tensorhub-lab", path, LAB_COMMANDS[path])


@needs_cli
def test_top_level_help_lists_every_command():
    for args in (["--help"], ["-h"], ["help"]):
        r = run(BIN, *args)
        assert r.returncode == 0, r.stderr
        for c in ["serve", "ls", "show", "top", "publish", "fetch", "retain", "unretain", "keeper", "node", "demo", "bench"]:
            assert re.search(rf"^  {c}\s", r.stdout, re.M), (c, r.stdout)
        assert "bench pair" in r.stdout and "bench local" in r.stdout, r.stdout
    r = run(BIN, "bench", "--help")
    assert r.returncode == 0 and re.search(r"^  pair\s", r.stdout, re.M) and re.search(r"^  local\s", r.stdout, re.M)
    # `help COMMAND` is `COMMAND --help`; no command at all is a usage error.
    assert run(BIN, "help", "fetch").stdout == run(BIN, "fetch", "--help").stdout
    r = run(BIN)
    assert r.returncode == 2 and "Commands:" in r.stderr and r.stdout == ""


@needs_lab
def test_lab_top_level_help():
    r = run(LAB, "--help")
    assert r.returncode == 0, r.stderr
    for c in ["chaos", "sim", "bench", "serve"]:
        assert re.search(rf"^  {c}\s", r.stdout, re.M), (c, r.stdout)


@needs_cli
@pytest.mark.parametrize("args, names", [
    (["fetch", "m@1", "-o", "x", "--bogus"], ["--bogus"]),
    (["fetch", "m@1", "-o", "x", "--help-me"], ["--help-me"]),
    (["fetch", "m@1", "-o", "x", "--connections", "0"], ["--connections"]),
    (["fetch", "m@1", "-o", "x", "--connections", "many"], ["--connections"]),
    (["fetch", "m@1", "-o", "x", "--step", "3"], ["--step", "--group"]),
    (["fetch", "m@1"], ["--output"]),
    (["fetch", "m@1", "-o", "x", "--wide-area-mbit", "0"], ["--wide-area-mbit"]),
    (["fetch", "m@1", "-o", "x", "--delta-memory", "lots"], ["--delta-memory"]),
    (["publish", "f.safetensors", "--model", "m"], ["--version"]),
    (["publish", "f.safetensors", "--model", "m", "--version", "0"], ["--version"]),
    (["publish", "f.safetensors", "--model", "m", "--version", "1", "--chunk-bytes", "4QB"], ["--chunk-bytes"]),
    (["serve", "--lease-ms", "10"], ["--lease-ms"]),
    (["serve", "--lease-ms"], ["--lease-ms"]),
    (["keeper", "--spot"], ["--spot"]),
    (["ls", "extra"], ["extra"]),
    (["bench", "pair", "--bytes", "1"], ["--bytes"]),
])
def test_bad_command_line_names_the_flag(args, names):
    r = run(BIN, *args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == ""
    for n in names:
        assert n in r.stderr, (n, r.stderr)
    command = " ".join(args[:2] if args[0] == "bench" else args[:1])
    assert f"`tensorhub {command} --help`" in r.stderr, r.stderr


@needs_cli
def test_unknown_and_moved_commands():
    r = run(BIN, "nope")
    assert r.returncode == 2 and "unknown command 'nope'" in r.stderr, r.stderr
    r = run(BIN, "bench", "nope")
    assert r.returncode == 2 and "tensorhub bench: unknown command 'nope'" in r.stderr, r.stderr
    r = run(BIN, "bench")
    assert r.returncode == 2 and "name a command" in r.stderr and "pair" in r.stderr, r.stderr
    for args in (["sim", "--scenario", "x"], ["bench", "hub", "--workers", "5"], ["chaos", "--help"]):
        r = run(BIN, *args)
        assert r.returncode == 2 and "tensorhub-lab" in r.stderr, (args, r.stderr)


@needs_cli
def test_hub_address_from_the_environment():
    # Nothing listens on port 1: the error names the address the command used.
    r = run(BIN, "ls", "--timeout-ms", "300", env={"TENSORHUB_HUB": "127.0.0.1:1"})
    assert r.returncode == 1 and "127.0.0.1:1" in r.stderr, r.stderr
    r = run(BIN, "ls", "--timeout-ms", "300", "--hub", "127.0.0.1:2", env={"TENSORHUB_HUB": "127.0.0.1:1"})
    assert r.returncode == 1 and "127.0.0.1:2" in r.stderr, r.stderr
    r = run(BIN, "ls", "--timeout-ms", "300", env={"TENSORHUB_HUB": "127.0.0.1:1",
                                                      "TENSORHUB_SECRET_FILE": "/nonexistent/secret"})
    assert r.returncode == 1 and "/nonexistent/secret" in r.stderr, r.stderr
