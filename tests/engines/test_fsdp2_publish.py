"""Every rank of an FSDP2 trainer publishes its own shard.

Three CPU processes form a torch.distributed gloo group, wrap a tiny Llama
(tied embeddings) in FSDP2's ``fully_shard``, and each publishes its
``state_dict()`` through the vLLM backend's trainer engine as one version
(``group_size`` 3): every DTensor's local shard as a piece of the logical
tensor, in place (the published memory is the shard's), nothing gathered,
nothing copied. A reader then fetches the version from all three ranks at
once: its tensors equal the unsharded model's state_dict. It serves them
onward, so once the ranks shut down a late reader still reads the version,
every byte from the first reader.

Run with tests/engines/run.sh (.venv-vllm has a torch with FSDP2).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
import traceback
from typing import Any, Dict

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm", reason="needs the vLLM venv: bash tests/engines/run.sh")
pytest.importorskip("torch.distributed.fsdp", reason="needs a torch with FSDP2")

import tensorhub  # noqa: E402

WORLD = 3
CONFIG = dict(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
              tie_word_embeddings=True)


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(11)
    return LlamaForCausalLM(LlamaConfig(**CONFIG)).float()


class _NoEngines:
    """Rank 0's client: no engine is driven here (the test reads the version)."""

    def init_weight_transfer_engine(self, init_info: Dict[str, Any]) -> None:
        self.init_info = init_info


def _rank_main(rank: int, port: int, hub: str, conn: Any) -> None:
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        import tensorhub.vllm
        from tensorhub.vllm_engine import TensorHubTrainerInitInfo

        dist.init_process_group("gloo", rank=rank, world_size=WORLD)
        tensorhub.vllm.register()
        model = _model()
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        trainer = WeightTransferTrainerFactory.trainer_init(
            TensorHubTrainerInitInfo(hub=hub, model="fsdp", rank=rank, world_size=WORLD),
            client=_NoEngines())
        sd = model.state_dict()
        v = trainer.publish(dict(sd))
        share = trainer.last_share
        locals_ = {n: t.to_local().data_ptr() for n, t in sd.items() if hasattr(t, "to_local")}
        conn.send(("ok", {
            "version": v, "worker": trainer.hub_client.worker_id,
            "bytes": share.bytes, "gathered": share.gathered, "copied": share.copied,
            "pieces": len(share.pieces), "aliases": share.aliases,
            "in_place": all(t.data_ptr() == locals_[n] for n, t in share.tensors.items()
                            if n in locals_),
            "dtensors": sum(1 for t in sd.values() if hasattr(t, "to_local")),
        }))
        conn.poll(300)  # until the reader is done
        trainer.shutdown()
        dist.destroy_process_group()
        conn.send(("ok", None))
    except BaseException:
        conn.send(("err", traceback.format_exc()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fsdp2_ranks_publish_their_shards():
    ctx = mp.get_context("spawn")
    procs, conns = [], []
    with tensorhub.serve_hub() as hub:
        port = _free_port()
        try:
            for r in range(WORLD):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_rank_main, args=(r, port, hub.address, child), daemon=True)
                p.start()
                procs.append(p)
                conns.append(parent)
            shares = []
            for r, c in enumerate(conns):
                assert c.poll(300), f"rank {r} did not publish in time"
                status, value = c.recv()
                assert status == "ok", f"rank {r}:\n{value}"
                shares.append(value)
            assert len({s["version"] for s in shares}) == 1
            for r, s in enumerate(shares):
                print(f"rank {r}: published {s['bytes']} bytes, {s['pieces']} pieces")
                assert s["gathered"] == [] and s["copied"] == [], s  # no all-gather, no copy
                assert s["in_place"], s
                assert s["pieces"] > 0 and s["bytes"] > 0
                assert s["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"}, s
            reference = _model().state_dict()
            total = sum(t.numel() * t.element_size() for n, t in reference.items()
                        if n != "lm_head.weight")
            assert sum(s["bytes"] for s in shares) == total  # the ranks' pieces tile it once
            def equal_reference(out):
                for name, t in reference.items():
                    got = out.get(name, out.get("model.embed_tokens.weight")
                                  if name == "lm_head.weight" else None)
                    assert got is not None and torch.equal(got, t), name

            with tensorhub.connect(hub.address) as reader, tensorhub.connect(hub.address) as late:
                info = reader.describe("fsdp", shares[0]["version"])
                assert info.committed and info.group_size == WORLD
                out = info.empty("torch")
                stats = reader.fetch("fsdp", info.version, into=out, return_stats=True)
                equal_reference(out)
                senders = {src["worker"] for src in stats.sources if src["bytes"] > 0}
                assert senders == {s["worker"] for s in shares}, stats.sources  # from every rank
                # The reader serves what it fetched (serve=True, the default)
                # as a holder of slices: once every rank shut down, the version
                # stays COMMITTED and a late reader reads it all from the reader.
                for c in conns:
                    c.send("done")
                for r, c in enumerate(conns):
                    assert c.poll(120), f"rank {r} did not shut down in time"
                    status, value = c.recv()
                    assert status == "ok", f"rank {r}:\n{value}"
                assert [v.state for v in late.versions("fsdp")] == ["COMMITTED"]
                mine = info.empty("torch")
                stats = late.fetch("fsdp", info.version, into=mine, serve=False,
                                   return_stats=True)
                equal_reference(mine)
                senders = {src["worker"] for src in stats.sources if src["bytes"] > 0}
                assert senders == {reader.worker_id}, stats.sources
                reader.unpublish("fsdp", info.version)
                assert [v.state for v in late.versions("fsdp")] == ["UNAVAILABLE"]
        finally:
            for c in conns:
                try:
                    c.send("done")
                except (BrokenPipeError, OSError):
                    pass
            for p in procs:
                p.join(60)
                if p.is_alive():
                    p.kill()
                    p.join(10)
