"""Processes of the vLLM end-to-end test: engines and a trainer.

Every process is started with the spawn method. They talk over
multiprocessing pipes: a request is (method, args), a reply ("ok", value) or
("err", text). Every receive has a deadline; nothing waits by sleeping.
"""

from __future__ import annotations

import os
import time
import traceback
from typing import Any, Dict, List, Optional

# A tiny Qwen2: head size 64 (the CPU attention backend accepts 32, 64, ...).
MODEL_CONFIG = dict(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=256,
    tie_word_embeddings=True,  # published once, the alias in the metadata
    initializer_range=0.2,
    torch_dtype="float32",
)
PROMPTS = [[3, 17, 101, 7, 250], [42, 42, 9], [500, 1, 2, 3, 4, 5, 6, 7]]
MAX_TOKENS = 12


def make_model_dir(path: str) -> None:
    """A model directory with config.json only (vLLM loads dummy weights)."""
    from transformers import Qwen2Config

    cfg = Qwen2Config(**MODEL_CONFIG)
    cfg.save_pretrained(path)


def recv(conn: Any, deadline: float, what: str) -> Any:
    left = deadline - time.monotonic()
    if left <= 0 or not conn.poll(left):
        raise TimeoutError(f"no reply to {what} within the deadline")
    return conn.recv()


class PipeEngine:
    """One engine process, called over a pipe."""

    def __init__(self, conn: Any, name: str, timeout_s: float = 180.0,
                 init_extra: Optional[Dict[str, Any]] = None) -> None:
        self.conn, self.name, self.timeout_s = conn, name, timeout_s
        self.init_extra = dict(init_extra or {})

    def call(self, method: str, *args: Any, timeout_s: Optional[float] = None) -> Any:
        self.conn.send((method, args))
        status, value = recv(
            self.conn, time.monotonic() + (timeout_s or self.timeout_s), f"{self.name}.{method}"
        )
        if status != "ok":
            raise RuntimeError(f"{self.name}.{method} failed: {value}")
        return value


class PipeClient:
    """A VLLMWeightSyncClient over engine processes, called in list order."""

    def __init__(self, engines: List[PipeEngine]) -> None:
        self.engines = engines

    def init_weight_transfer_engine(self, init_info: Dict[str, Any]) -> None:
        for e in self.engines:
            e.call("init_weight_transfer_engine",
                   {"init_info": dict(init_info, worker_name=e.name, **e.init_extra)})

    def start_weight_update(self) -> None:
        for e in self.engines:
            e.call("start_weight_update")

    def update_weights(self, update_info: Dict[str, Any]) -> None:
        for e in self.engines:
            e.call("update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: Optional[str] = None) -> None:
        for e in self.engines:
            e.call("finish_weight_update", weight_version)


def hub_main(conn: Any, netns: str, listen_ip: str, secret_file: str) -> None:
    """A hub on test-bed host ``netns`` (its address ``listen_ip``), with the
    secret in ``secret_file``; serves until "stop"."""
    try:
        from testbed_util import enter_host

        enter_host(netns)
        import tensorhub

        with open(secret_file) as f:
            secret = f.read().strip()
        hub = tensorhub.serve_hub(listen=f"{listen_ip}:0", secret=secret)
    except BaseException:
        conn.send(("err", traceback.format_exc()))
        return
    conn.send(("ok", hub.address))
    conn.poll(1200)
    hub.close()
    conn.send(("ok", None))


def engine_main(conn: Any, model_dir: str, netns: str = "") -> None:
    """Hosts one vLLM engine (in-process mode) on test-bed host ``netns``
    (none: this one) and serves calls until "stop"."""
    try:
        from testbed_util import enter_host

        enter_host(netns)
        from vllm import LLM, SamplingParams

        import tensorhub.vllm

        llm = LLM(
            model=model_dir,
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype="float32",
            max_model_len=128,
            max_num_seqs=8,
            kv_cache_memory_bytes=64 << 20,
            enforce_eager=True,
            distributed_executor_backend="uni",
            weight_transfer_config={"backend": "tensorhub"},
        )
        greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    except BaseException:
        conn.send(("err", traceback.format_exc()))
        return
    conn.send(("ok", "ready"))

    def generate() -> List[List[int]]:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def generate_timed() -> Dict[str, Any]:
        t0 = time.monotonic()
        tokens = generate()
        return {"tokens": tokens, "seconds": time.monotonic() - t0}

    calls = {
        "init_weight_transfer_engine": llm.init_weight_transfer_engine,
        "start_weight_update": llm.start_weight_update,
        "update_weights": llm.update_weights,
        "finish_weight_update": llm.finish_weight_update,
        "generate": generate,
        "generate_timed": generate_timed,
        "stats": lambda: [s for per in llm.collective_rpc(tensorhub.vllm.worker_stats) for s in per],
        "weight_version": llm.get_weight_version,
    }
    while True:
        if not conn.poll(600):
            return  # the test is gone
        method, args = conn.recv()
        if method == "stop":
            conn.send(("ok", None))
            return
        try:
            t0 = time.monotonic()
            value = calls[method](*args)
            if method == "update_weights":
                value = {"seconds": time.monotonic() - t0}
            conn.send(("ok", value))
        except BaseException as e:  # reported to the caller
            conn.send(("err", f"{type(e).__name__}: {e}"))


def _reference(model: Any) -> List[List[int]]:
    import torch

    out = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = torch.tensor([p])
            g = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False,
                max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                eos_token_id=None, pad_token_id=0,
            )
            out.append(g[0, len(p):].tolist())
    return out


def trainer_main(conns: List[Any], hub: str, model_dir: str, updates: int, result: Any,
                 netns: str = "", secret_file: Optional[str] = None) -> None:
    """The trainer (on test-bed host ``netns``): K updates, each checked
    against transformers, then failures."""
    try:
        from testbed_util import enter_host

        enter_host(netns)
        result.send(("ok", _trainer(conns, hub, model_dir, updates, secret_file)))
    except BaseException:
        result.send(("err", traceback.format_exc()))


def _trainer(conns: List[Any], hub: str, model_dir: str, updates: int,
             secret_file: Optional[str]) -> Dict[str, Any]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    import tensorhub.vllm
    from tensorhub.vllm_engine import TensorHubTrainerInitInfo

    tensorhub.vllm.register()
    torch.manual_seed(1234)
    model = Qwen2ForCausalLM(Qwen2Config.from_pretrained(model_dir)).float().eval()
    # engine1 fetches through the TP slice path (rank 0 of 1: whole boxes),
    # which TP > 1 engines take; engine0 the plain full fetch.
    engines = [
        PipeEngine(c, f"engine{i}", init_extra={"slices": True} if i == 1 else None)
        for i, c in enumerate(conns)
    ]
    client = PipeClient(engines)
    trainer = WeightTransferTrainerFactory.trainer_init(
        TensorHubTrainerInitInfo(hub=hub, model="policy", timeout_s=60.0, rank=0,
                                 secret_file=secret_file), client=client
    )
    out: Dict[str, Any] = {"versions": [], "trainer_worker": trainer.hub_client.worker_id,
                           "trainer_address": trainer.hub_client.data_address}
    before = [e.call("generate") for e in engines]  # dummy weights
    for step in range(1, updates + 1):
        trainer.release()  # drains reads before the weights change in place
        with torch.no_grad():
            g = torch.Generator().manual_seed(step)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
        reference = _reference(model)
        rec: Dict[str, Any] = {"reference": reference}
        t0 = time.monotonic()
        v = trainer.publish(dict(model.state_dict()))
        rec["publish_seconds"] = time.monotonic() - t0
        if step < updates:
            trainer.load(v)
            rec["mode"] = "load"
        else:
            # Prefetch: stage on every engine, generate while it runs, then apply.
            t0 = time.monotonic()
            trainer.load(v, stage=True)
            rec["stage_call_seconds"] = time.monotonic() - t0
            rec["generate_while_staging"] = [e.call("generate_timed") for e in engines]
            t0 = time.monotonic()
            trainer.load(v)
            rec["apply_call_seconds"] = time.monotonic() - t0
            rec["mode"] = "prefetch"
        rec["version"] = v
        rec["weight_version"] = [e.call("weight_version") for e in engines]
        rec["tokens"] = [e.call("generate") for e in engines]
        rec["stats"] = [e.call("stats") for e in engines]
        out["versions"].append(rec)
    out["before"] = before

    # A version that does not exist: a clear error within its deadline, and
    # the engine keeps the weights it had.
    e0 = engines[0]
    e0.call("start_weight_update")
    t0 = time.monotonic()
    try:
        e0.call("update_weights", {"update_info": {"model": "policy", "version": 999, "timeout_s": 5}})
        out["missing_error"] = None
    except RuntimeError as e:
        out["missing_error"] = str(e)
    out["missing_seconds"] = time.monotonic() - t0
    out["after_missing"] = e0.call("generate")
    trainer.release()
    trainer.hub_client.close()
    return out


def hub_down_check(conn: Any) -> Dict[str, Any]:
    """After the hub is gone: update_weights fails within its deadline."""
    e = PipeEngine(conn, "engine0")
    e.call("start_weight_update")
    t0 = time.monotonic()
    try:
        e.call("update_weights", {"update_info": {"model": "policy", "version": "latest", "timeout_s": 5}})
        err = None
    except RuntimeError as ex:
        err = str(ex)
    return {"error": err, "seconds": time.monotonic() - t0, "tokens": e.call("generate")}
