"""PyTorch helpers: publish a module's weights, fetch them into another module.

    from tensorhub.torch import publish_module, fetch_module

    # trainer                                   # rollout worker
    publish_module(client, "policy", 7, model)  fetch_module(client, "policy", model)
    ...                                         # model now holds version 7
    client.unpublish("policy", 7)  # before optimizer.step() modifies weights

What is moved: the module's ``state_dict()`` (parameters and persistent
buffers), by name, in place, with no copy on the publishing side. The rules:

* Every tensor must be a contiguous CPU tensor; otherwise
  InvalidArgumentError names it (no silent copies: a copy would not be the
  memory the optimizer updates).
* dtypes must match exactly between the two modules (bfloat16 included);
  nothing is converted. Cast the receiving module first if needed.
* Tied weights (two names sharing the same memory, e.g. an embedding tied
  to the output projection) are published once, under the first name in
  ``state_dict()`` order; the alias is recorded in the version's metadata
  (key ``tensorhub.torch.aliases``). On fetch, a receiving module with the
  same ties gets the tensor once; one whose copies are separate gets the
  data copied into each. Names that share memory only partly (views into
  one buffer at different offsets) are rejected.
* The mutability contract applies to module weights: the publisher must
  ``client.unpublish(model, version)`` (which waits for reads in flight)
  before the optimizer changes the parameters in place. A module fetched
  with ``serve=True`` is served to other readers until its next fetch or an
  unpublish: do not train it meanwhile.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from ._tensors import torch_dtype_for
from .client import Client, VersionArg
from .errors import FailedPreconditionError, InvalidArgumentError

#: Metadata key under which tied-weight aliases travel: JSON {alias: name}.
ALIASES_KEY = "tensorhub.torch.aliases"


def _weights(module: torch.nn.Module, what: str) -> Dict[str, torch.Tensor]:
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{what}: expected a torch.nn.Module, got {type(module).__name__}")
    sd = module.state_dict(keep_vars=False)
    for name, t in sd.items():
        if t.device.type not in ("cpu", "cuda"):
            raise InvalidArgumentError(
                f"{what}: '{name}' is on {t.device}; TensorHub moves host and CUDA memory"
            )
        if not t.is_contiguous():
            raise InvalidArgumentError(
                f"{what}: '{name}' is not contiguous (stride {tuple(t.stride())}); "
                f"make the parameter contiguous in the module itself "
                f"(p.data = p.data.contiguous()) so the served memory is the trained memory"
            )
    return dict(sd)


def _span(t: torch.Tensor) -> Tuple[int, int]:
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def _group_ties(sd: Dict[str, torch.Tensor], what: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """Splits ``sd`` into canonical tensors and aliases {alias: canonical}.

    Two names are tied when they cover the same bytes with the same dtype and
    shape. Partial overlaps are rejected.
    """
    canonical: Dict[str, torch.Tensor] = {}
    aliases: Dict[str, str] = {}
    by_key: Dict[Tuple[Any, ...], str] = {}
    spans: List[Tuple[int, int, str]] = []
    for name, t in sd.items():
        s, e = _span(t)
        key = (s, e, t.dtype, tuple(t.shape))
        if e > s and key in by_key:
            aliases[name] = by_key[key]
            continue
        by_key[key] = name
        canonical[name] = t
        if e > s:
            spans.append((s, e, name))
    spans.sort()
    for (s0, e0, n0), (s1, e1, n1) in zip(spans, spans[1:]):
        if s1 < e0:
            raise InvalidArgumentError(
                f"{what}: '{n0}' and '{n1}' share part of their memory (views of one "
                f"buffer); TensorHub cannot publish or fill overlapping tensors"
            )
    return canonical, aliases


def publish_module(
    client: Client,
    model: str,
    version: int,
    module: torch.nn.Module,
    rank: int = 0,
    group_size: int = 1,
    chunk_bytes: Optional[int] = None,
    timeout: Optional[float] = None,
    *,
    metadata: Optional[Mapping[str, str]] = None,
    tied: str = "dedupe",
) -> Dict[str, torch.Tensor]:
    """Publishes ``module.state_dict()`` as rank ``rank`` of ``model@version``.

    No copy: readers read the module's parameter memory. Unpublish with
    ``client.unpublish(model, version)`` before modifying the weights (the
    call waits for reads in flight).

    Args:
        tied: "dedupe" (default) publishes tied weights once and records the
            alias; "error" raises InvalidArgumentError on tied weights.
        Other arguments as in :meth:`tensorhub.Client.publish`.

    Returns:
        The tensors published, by name (tied aliases left out).
    """
    if tied not in ("dedupe", "error"):
        raise InvalidArgumentError(f"tied must be 'dedupe' or 'error', not {tied!r}")
    what = f"publish_module({model}@{version})"
    canonical, aliases = _group_ties(_weights(module, what), what)
    if aliases and tied == "error":
        pairs = ", ".join(f"'{a}' = '{c}'" for a, c in aliases.items())
        raise InvalidArgumentError(f"{what}: tied weights {pairs} (pass tied='dedupe')")
    md = dict(metadata or {})
    if ALIASES_KEY in md:
        raise InvalidArgumentError(f"metadata key {ALIASES_KEY!r} is reserved")
    if aliases:
        md[ALIASES_KEY] = json.dumps(aliases, sort_keys=True)
    client.publish(
        model, version, canonical, rank=rank, group_size=group_size,
        chunk_bytes=chunk_bytes, timeout=timeout, metadata=md,
    )
    return canonical


def fetch_module(
    client: Client,
    model: str,
    module: torch.nn.Module,
    version: VersionArg = "latest",
    timeout: Optional[float] = None,
    connections: int = 4,
    serve: bool = True,
) -> int:
    """Fetches ``model@version`` into ``module``'s parameters and buffers in place.

    Names must match the published module's ``state_dict()`` names exactly,
    and so must dtypes and shapes (nothing is converted). Returns the version
    fetched.

    Raises:
        InvalidArgumentError: missing / unexpected names, dtype or shape
            mismatches (all listed in one message), non-CPU or
            non-contiguous tensors, or ties the version does not have.
        NotFoundError, FailedPreconditionError, UnavailableError,
        DeadlineExceededError: as :meth:`tensorhub.Client.fetch`.
    """
    what = f"fetch_module({model}@{version})"
    sd = _weights(module, what)
    info = client.describe(model, version)
    if not info.committed:
        raise FailedPreconditionError(
            f"{model}@{info.version} is {info.state}, not fetchable"
        )
    raw = info.metadata.get(ALIASES_KEY, "{}")
    try:
        src_aliases: Dict[str, str] = json.loads(raw) if isinstance(raw, str) else {}
    except ValueError:
        raise InvalidArgumentError(f"{model}@{info.version}: malformed {ALIASES_KEY} metadata") from None
    manifest = {t.name: t for t in info.tensors}
    dst_canonical, dst_aliases = _group_ties(sd, what)

    problems: List[str] = []
    missing = [n for n in list(manifest) + list(src_aliases) if n not in sd]
    unexpected = [n for n in sd if n not in manifest and n not in src_aliases]
    if missing:
        problems.append(f"module lacks {missing}")
    if unexpected:
        problems.append(f"module has {unexpected}, which {model}@{info.version} does not")
    for alias, name in dst_aliases.items():
        if alias in manifest and name in manifest:
            problems.append(
                f"module ties '{alias}' to '{name}', but {model}@{info.version} has "
                f"them as separate tensors"
            )
    for name, t in manifest.items():
        d = sd.get(name)
        if d is None:
            continue
        want_dtype = _torch_dtype_or_name(t.dtype)
        if d.dtype != want_dtype or tuple(d.shape) != t.shape:
            problems.append(
                f"'{name}' is {d.dtype}{list(d.shape)} in the module but "
                f"{t.dtype}{list(t.shape)} in {model}@{info.version}"
            )
    if problems:
        raise InvalidArgumentError(
            f"{what}: the module does not match: " + "; ".join(problems)
            + " (fetch_module converts nothing: cast or rebuild the module)"
        )

    # Fill each distinct piece of memory once: a module tie receives the
    # published tensor once, through the name the version has.
    into: Dict[str, torch.Tensor] = {}
    for name in manifest:
        into[name] = sd[name]
    got = client.fetch(
        model, info.version, into=into, timeout=timeout,
        connections=connections, serve=serve,
    )
    # Names the publisher had tied but this module keeps separate.
    with torch.no_grad():
        for alias, name in src_aliases.items():
            if alias in sd and _span(sd[alias]) != _span(sd[name]):
                sd[alias].copy_(sd[name])
    return got


def _torch_dtype_or_name(name: str) -> Any:
    try:
        return torch_dtype_for(name)
    except InvalidArgumentError:
        return name  # compares unequal to every torch dtype


__all__ = ["publish_module", "fetch_module", "ALIASES_KEY"]
