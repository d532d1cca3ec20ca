"""A sharded Hugging Face checkpoint through `tensorhub publish DIR` / `fetch -o DIR`.

A tiny Qwen2 saved by transformers with a small max_shard_size (many shards
and model.safetensors.index.json), plus config, generation config and
tokenizer files (one of them binary). The fetched directory must load with
from_pretrained with identical tensors, shards byte for byte.
Runs the CLI ($TENSORHUB_BIN, default build/tools/tensorhub).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TENSORHUB_BIN", REPO / "build" / "tools" / "tensorhub"))
pytestmark = pytest.mark.skipif(not os.access(BIN, os.X_OK), reason=f"CLI {BIN} not built")
ENV = dict(os.environ, TENSORHUB_LOG="warn")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc, timeout=30.0):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    return proc.wait(timeout)


def _read_until(proc, marker, timeout=30.0):
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()  # the CLI prints the marker, or exits
        if not line:
            break
        lines.append(line)
        if marker in line:
            return lines
    raise AssertionError(f"no {marker!r}: {lines} {proc.stderr.read() if proc.poll() is not None else ''}")


@pytest.fixture
def hub():
    port = _free_port()
    proc = subprocess.Popen([str(BIN), "serve", "--listen", f"127.0.0.1:{port}", "--rebuild-ms", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        deadline = time.monotonic() + 20
        while True:  # the hub accepts connections once it is ready
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "hub did not start"
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        _stop(proc)


def _run(*args, timeout=120):
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=timeout, env=ENV)


def _tiny_checkpoint(path: Path):
    cfg = transformers.Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, tie_word_embeddings=False)
    torch.manual_seed(7)
    model = transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path, max_shard_size="100KB")
    (path / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": {"é": 0}}}')
    (path / "tokenizer.model").write_bytes(bytes(range(256)) * 3)  # not UTF-8
    return model


def test_sharded_checkpoint_round_trips(hub, tmp_path):
    src = tmp_path / "ckpt"
    model = _tiny_checkpoint(src)
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    assert len(shards) >= 3 and (src / "model.safetensors.index.json").exists()

    pub = subprocess.Popen([str(BIN), "publish", str(src), "--model", "qwen", "--version", "3", "--hub", hub],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        lines = _read_until(pub, "serving from")
        assert f"{len(shards)} shard(s)" in "".join(lines)
        out = tmp_path / "fetched"
        r = _run("fetch", "qwen@latest", "-o", str(out), "--hub", hub)
        assert r.returncode == 0, r.stderr
        assert "fetched qwen@3" in r.stdout
    finally:
        assert _stop(pub) == 0

    # Every file of the checkpoint, shards byte for byte.
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in src.iterdir())
    for p in src.iterdir():
        assert (out / p.name).read_bytes() == p.read_bytes(), p.name

    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
    assert loaded.generation_config.to_dict() == model.generation_config.to_dict()


def test_checkpoint_misuse_is_clear(hub, tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "pytorch_model.bin").write_bytes(b"\0" * 16)
    r = _run("publish", str(d), "--model", "m", "--version", "1", "--hub", hub)
    assert r.returncode == 1 and "INVALID_ARGUMENT" in r.stderr and "pytorch_model.bin" in r.stderr, r.stderr

    (d / "pytorch_model.bin").unlink()
    r = _run("publish", str(d), "--model", "m", "--version", "1", "--hub", hub)
    assert r.returncode == 1 and "no *.safetensors" in r.stderr, r.stderr

    big = tmp_path / "big"
    _tiny_checkpoint(big)
    (big / "vocab.txt").write_bytes(b"a" * (11 << 20))
    r = _run("publish", str(big), "--model", "m", "--version", "1", "--hub", hub)
    assert r.returncode == 1 and "vocab.txt" in r.stderr and "MiB" in r.stderr, r.stderr

    stray = tmp_path / "stray"
    _tiny_checkpoint(stray)
    (stray / "model-extra.safetensors").write_bytes((stray / sorted(p.name for p in stray.glob("*.safetensors"))[0]).read_bytes())
    r = _run("publish", str(stray), "--model", "m", "--version", "1", "--hub", hub)
    assert r.returncode == 1 and "model-extra.safetensors" in r.stderr and "index" in r.stderr, r.stderr
