"""vLLM integration: the weight-transfer backend ``"tensorhub"``.

Importing this module does not import vLLM. vLLM finds the backend through
the ``vllm.general_plugins`` entry point of the installed tensorhub package
(``tensorhub = "tensorhub.vllm:register"``), which runs :func:`register` in
every vLLM process, the spawned workers included.

Engine side (the rollout worker)::

    llm = LLM(model=..., weight_transfer_config={"backend": "tensorhub"})
    llm.init_weight_transfer_engine({"init_info": {"hub": "10.0.0.1:7070"}})
    llm.start_weight_update()
    llm.update_weights({"update_info": {"model": "policy", "version": 7}})
    llm.finish_weight_update()

Trainer side: :class:`tensorhub.vllm_engine.TensorHubTrainerWeightTransferEngine`
publishes a state_dict as a version and drives the engines through any
``VLLMWeightSyncClient`` (vLLM's HTTP or Ray clients, or
:class:`tensorhub.vllm_engine.LLMClient` for an in-process ``LLM``).

The init_info and update_info fields are documented on
:class:`tensorhub.vllm_engine.TensorHubInitInfo` and
:class:`tensorhub.vllm_engine.TensorHubUpdateInfo`.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List

#: The backend name, in vLLM's ``weight_transfer_config={"backend": ...}``.
BACKEND = "tensorhub"
#: The vLLM releases the backend is tested with (pyproject's ``vllm`` extra).
SUPPORTED_VLLM = ((0, 32), (0, 34))  # [from, to)

_ENGINE_MODULE = "tensorhub.vllm_engine"
_lock = threading.Lock()


def register() -> None:
    """Registers the ``tensorhub`` backend with vLLM's weight-transfer factories.

    Idempotent: vLLM runs general plugins once per process, yet a process may
    also call this by hand, and vLLM's ``register_engine`` raises on a name
    that is already registered. The registration is lazy (module path and
    class name): vLLM imports :mod:`tensorhub.vllm_engine` only when an engine
    is created.

    Raises:
        ImportError: vLLM is not installed (the entry point only runs inside
            vLLM, so this means a direct call in a process without vLLM).
        ValueError: another package registered a different engine under
            ``"tensorhub"``.
    """
    import vllm
    from vllm.distributed.weight_transfer import factory

    _check_version(getattr(vllm, "__version__", ""))
    with _lock:
        for registry, cls_name in (
            (factory.WeightTransferEngineFactory, "TensorHubWeightTransferEngine"),
            (
                getattr(factory, "WeightTransferTrainerFactory", None),
                "TensorHubTrainerWeightTransferEngine",
            ),
        ):
            if registry is None:  # older vLLM: no trainer-side factory
                continue
            if BACKEND in registry._registry:
                existing = getattr(registry._registry[BACKEND], "_tensorhub_class", None)
                if existing != cls_name:
                    raise ValueError(
                        f"vLLM already has a weight transfer engine named {BACKEND!r} that "
                        f"tensorhub did not register ({registry.__name__}); uninstall the "
                        f"other package or rename its backend"
                    )
                continue
            registry.register_engine(BACKEND, _ENGINE_MODULE, cls_name)
            registry._registry[BACKEND]._tensorhub_class = cls_name


_warned = False


def _check_version(version: str) -> None:
    """Warns (once) when vLLM is outside the tested releases."""
    global _warned
    try:
        got = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        return
    lo, hi = SUPPORTED_VLLM
    if not lo <= got < hi and not _warned:
        _warned = True
        import logging

        logging.getLogger("tensorhub.vllm").warning(
            "tensorhub's vLLM backend is tested with vLLM %d.%d to %d.%d (exclusive); this is "
            "vLLM %s: its weight-transfer interface may differ", *lo, *hi, version)


def worker_stats(worker: Any = None) -> List[Dict[str, Any]]:
    """Timings of the tensorhub engines in this process (one per vLLM worker).

    Meant for ``llm.collective_rpc(tensorhub.vllm.worker_stats)``, which runs
    it in every worker and returns one list per worker. Each entry has the
    engine's ``worker_id`` (its TensorHub worker), the ``version`` it applied
    last, ``fetch`` (that fetch's stats, with bytes per source), and the
    seconds spent: ``stage_seconds`` (fetch while generating, from
    ``stage_started_at`` to ``stage_finished_at`` on this process's
    ``time.monotonic()`` clock), ``wait_seconds`` (waiting for a staged
    fetch), ``fetch_seconds`` (fetching during the pause), ``apply_seconds``
    (layerwise reload) and ``withdraw_seconds`` (the last withdrawal of a
    replaced version, in the background after its update).
    """
    import sys

    mod = sys.modules.get(_ENGINE_MODULE)
    if mod is None:
        return []
    return mod.live_engine_stats()


__all__ = ["BACKEND", "register", "worker_stats"]
