"""Run by tests/install/wheel_test.sh inside the minimal root, in the fresh
venv the wheel was installed into."""

import os
import re
import subprocess
import sys
import time

import tensorhub
import tensorhub.vllm  # the vLLM plugin entry point's module

assert "tensorhub._core" not in sys.modules, "importing tensorhub loaded the native library"
assert "_core" not in open("/proc/self/maps").read(), "the native library is mapped after a plain import"

import numpy as np  # noqa: E402

print(f"wheel_check: tensorhub {tensorhub.__version__} ({tensorhub.build_info()['line']})")
with tensorhub.serve_hub("127.0.0.1:0") as hub:
    with tensorhub.connect(hub.address, worker_id="trainer") as trainer, \
         tensorhub.connect(hub.address, worker_id="rollout") as rollout:
        w = {"w": np.arange(1 << 20, dtype=np.float32), "b": np.ones(7, np.float16)}
        trainer.publish("m", 1, w)
        out = rollout.describe("m", "latest").empty("numpy")
        assert rollout.fetch("m", "latest", into=out) == 1
        assert all(out[k].tobytes() == w[k].tobytes() for k in w), "fetched bytes differ"
        trainer.unpublish("m", 1)

# UCX from the wheel: its built-in wires (here tcp) work without the
# modules UCX would load from its own directory (docs/design.md).
if tensorhub.build_info()["ucx"]:
    os.environ.update(UCX_TLS="tcp", TENSORHUB_UCX_SAME_HOST="1", TENSORHUB_TRANSPORTS="ucx,tcp",
                      TENSORHUB_UCX_EMULATED_GETS="allow")
    with tensorhub.serve_hub("127.0.0.1:0") as hub:
        with tensorhub.connect(hub.address, worker_id="trainer") as trainer, \
             tensorhub.connect(hub.address, worker_id="rollout") as rollout:
            w = {"w": np.arange(1 << 20, dtype=np.float32)}
            trainer.publish("m", 1, w)
            out = rollout.describe("m", 1).empty("numpy")
            stats = rollout.fetch("m", 1, into=out, return_stats=True)
            assert out["w"].tobytes() == w["w"].tobytes()
            used = {s["transport"] for s in stats.sources}
            assert used == {"ucx"}, used
            trainer.unpublish("m", 1)
    print("wheel_check: fetched over UCX (tcp) with the wheel's UCX")

# Every shared library this process mapped: the root's (the interpreter's
# and the C/C++ runtime's, under /usr/lib) or the venv's (the wheel's own,
# numpy's).
venv = sys.prefix
mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if ".so" in line.split()[-1]})
own = [m for m in mapped if m.startswith(venv)]
other = [m for m in mapped if not m.startswith(venv) and not m.startswith("/usr/lib/")]
assert not other, f"libraries from outside the root's runtime and the venv: {other}"
bundled = sorted({re.sub(r"-[0-9a-f]{8}\.so.*$", "", os.path.basename(m)) for m in own if "tensorhub.libs" in m})
print(f"wheel_check: published and fetched 4 MiB; every library but the root's runtime came from the wheel "
      f"({len(bundled)}: {', '.join(b for b in bundled if not b.startswith('libabsl_'))}, libabsl_*)")

# The CLI the wheel installs.
bin_dir = os.path.join(venv, "bin")
version = subprocess.run([os.path.join(bin_dir, "tensorhub"), "--version"], check=True, capture_output=True,
                         text=True).stdout.strip()
assert version.startswith("tensorhub ") and tensorhub.build_info()["version"] in version, version
hub = subprocess.Popen([os.path.join(bin_dir, "tensorhub"), "serve", "--listen", "127.0.0.1:7391"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
try:
    deadline = time.monotonic() + 60
    while True:
        r = subprocess.run([os.path.join(bin_dir, "tensorhub"), "ls", "--json", "--hub", "127.0.0.1:7391",
                            "--timeout-ms", "2000"], capture_output=True, text=True)
        if r.returncode == 0:
            break
        assert time.monotonic() < deadline, r.stderr
    assert '"models": []' in r.stdout, r.stdout
finally:
    hub.terminate()
    hub.wait(30)
print(f"wheel_check: CLI ok: {version}")
