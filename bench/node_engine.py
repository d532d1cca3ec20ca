"""One process of bench/node_copy.py: the publisher, or an engine that loads
the way vLLM's tensorhub backend does (python/tensorhub/vllm_engine.py).

An engine holds its model's weights in memory allocated when it starts (on
a GPU node, device memory: not the host memory measured), and per update:
  own   fetches the version into fresh host buffers (VersionInfo.empty), loads
        them into its weights, and keeps the buffers, serving them to other
        readers, until the next version replaces them; a staged update
        fetches the next one while it still holds the current one. This is
        what the backend does without a node agent.
  node  asks the host's agent (tensorhub.node.acquire), loads straight from
        the host copy's views into its weights, and lets the copy go; a
        staged update asks the agent to start fetching (tensorhub.node.stage).
        If no agent answers it fetches itself, as in `own`, and says so.

Line protocol on stdin/stdout (one line each):
  publisher: prints "published V DIGEST" per version, then waits for EOF.
  engine:    prints "ready"; then for "stage V": "staged V"; for "load V":
             "loaded V SECONDS DIGEST PATH DONE" (PATH: node, own, or
             fallback: node asked, own used; DONE: time.monotonic() when
             the weights were in, before the digest); "quit" ends it.
DIGEST: BLAKE2b of every tensor's bytes in name order.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import threading
import time

import numpy as np

import tensorhub
from tensorhub import node

# A Qwen2-like shape, float16, about 256 MiB at scale 1: the embedding is a
# quarter of it (one tensor no bucket of a quarter-model could hold).
VOCAB, HIDDEN, FFN, LAYERS = 32768, 1024, 2816, 8


def shapes(scale: float):
    hidden = max(64, int(HIDDEN * scale) // 64 * 64)
    ffn = max(64, int(FFN * scale) // 64 * 64)
    out = {"model.embed_tokens.weight": (VOCAB, hidden), "model.norm.weight": (hidden,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + f"self_attn.{name}.weight"] = (hidden, hidden)
        out[p + "mlp.gate_proj.weight"] = (ffn, hidden)
        out[p + "mlp.up_proj.weight"] = (ffn, hidden)
        out[p + "mlp.down_proj.weight"] = (hidden, ffn)
        out[p + "input_layernorm.weight"] = (hidden,)
        out[p + "post_attention_layernorm.weight"] = (hidden,)
    return out


def digest(tensors) -> str:
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        h.update(np.ascontiguousarray(tensors[name]).view(np.uint8).data)
    return h.hexdigest()


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def publisher(a) -> None:
    client = tensorhub.connect(a.hub, worker_id="trainer", labels={"host": a.host_label},
                               data_listen=a.data_listen, insecure=True)
    held = []
    for v in range(1, a.versions + 1):
        rng = np.random.default_rng(v)
        w = {}
        for name, shape in shapes(a.scale).items():
            w[name] = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16).view(np.float16)
        for model in a.model.split(","):  # the same bytes under each name (a copy each)
            copy = {k: x.copy() for k, x in w.items()}
            client.publish(model, v, copy)
            held.append(copy)
        say(f"published {v} {digest(w)} {sum(x.nbytes for x in w.values())}")
    sys.stdin.read()  # hold until the driver closes our stdin
    client.close()


class Engine:
    def __init__(self, a) -> None:
        self.a = a
        # The model's weights, allocated and touched at start (device memory
        # on a GPU node; here a baseline the measurement subtracts).
        self.weights = {n: np.empty(s, np.float16) for n, s in shapes(a.scale).items()}
        for w in self.weights.values():
            w.fill(0)  # resident now, as device memory would be (np.zeros is not)
        self.client = None
        if a.mode == "own":
            self.client = self.connect()
        self.held = None       # (version, buffers) served after a load (own)
        self.staged = None     # (version, thread, result) (own)
        self.withdraw = None

    def connect(self):
        return tensorhub.connect(self.a.hub, worker_id=self.a.name, labels={"host": self.a.host_label},
                                 data_listen=self.a.data_listen, insecure=True)

    def fetch(self, v: int):
        info = self.client.describe(self.a.model, v)
        out = info.empty("numpy")
        self.client.fetch(self.a.model, v, into=out, timeout=300)
        return out

    def stage(self, v: int) -> None:
        if self.a.mode == "node":
            try:
                node.stage(self.a.model, v, socket=self.a.socket, timeout=300)
                say(f"staged {v}")
                return
            except node.NodeUnavailable as e:
                say(f"# stage {v}: no node agent ({e}); staging myself")
                if self.client is None:
                    self.client = self.connect()
        result = {}

        def run():
            result["out"] = self.fetch(v)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.staged = (v, t, result)
        say(f"staged {v}")

    def load(self, v: int) -> None:
        t0 = time.monotonic()
        path = "own"
        if self.a.mode == "node" and self.staged is None:
            try:
                copy = node.acquire(self.a.model, v, socket=self.a.socket, timeout=300)
                try:
                    for name, view in copy.items("numpy"):
                        np.copyto(self.weights[name], view.view(np.float16))
                    view = None  # the last view: close() can unmap the copy
                finally:
                    copy.close()
                self.finish(v, t0, "node")
                return
            except node.NodeUnavailable as e:
                say(f"# load {v}: no node agent ({e}); fetching myself")
                path = "fallback"
                if self.client is None:
                    self.client = self.connect()
        if self.staged is not None and self.staged[0] == v:
            _, t, result = self.staged
            t.join()
            out = result["out"]
            self.staged = None
        else:
            out = self.fetch(v)
        for name, buf in out.items():
            np.copyto(self.weights[name], buf)
        old, self.held = self.held, (v, out)
        if old is not None:
            # As the backend: withdraw the replaced version in the background.
            if self.withdraw is not None:
                self.withdraw.join()
            self.withdraw = threading.Thread(target=self.client.unpublish, args=(self.a.model, old[0]),
                                             daemon=True)
            self.withdraw.start()
        self.finish(v, t0, path)

    def finish(self, v: int, t0: float, path: str) -> None:
        # CLOCK_MONOTONIC is the machine's, shared by every namespace: the
        # driver compares it with its own.
        done = time.monotonic()
        say(f"loaded {v} {done - t0:.3f} {digest(self.weights)} {path} {done:.6f}")


def engine(a) -> None:
    e = Engine(a)
    say("ready")
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        if words[0] == "stage":
            e.stage(int(words[1]))
        elif words[0] == "load":
            e.load(int(words[1]))
    if e.withdraw is not None:
        e.withdraw.join()
    if e.client is not None:
        e.client.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", choices=["publisher", "engine"])
    p.add_argument("--hub", required=True)
    p.add_argument("--model", default="policy", help="publisher: a comma list publishes each version under each")
    p.add_argument("--name", default="engine")
    p.add_argument("--host-label", default="")
    p.add_argument("--data-listen", default="127.0.0.1:0")
    p.add_argument("--mode", choices=["own", "node"], default="own")
    p.add_argument("--socket", default=None)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--versions", type=int, default=2)
    a = p.parse_args()
    if a.role == "publisher":
        publisher(a)
    else:
        engine(a)


if __name__ == "__main__":
    main()
