"""A sharded trainer's local share of a version: what each rank publishes.

Every rank of a trainer group (FSDP2, tensor parallel, or plain data
parallel) publishes the bytes it already holds, as *pieces* of the logical
tensors (``Client.publish(..., pieces={name: (global_shape, offset)})``),
with no all-gather and no copy:

* a ``DTensor`` sharded with ``Shard(d)`` (FSDP2's ``fully_shard``, torch's
  tensor parallelism) publishes ``to_local()``, in place, at the offset its
  mesh coordinate gives (``torch.chunk``'s split, as DTensor lays it out);
  along a ``Replicate`` mesh axis only coordinate 0 publishes, so the pieces
  tile every tensor exactly once;
* a plain tensor (replicated: every rank has it whole, e.g. what verl's
  ``get_per_tensor_param`` gathered) is cut into near-equal row ranges, and
  each rank publishes its range (a view: no copy), so the ranks share the
  sending evenly; a tensor with fewer rows than ranks is published whole by
  one rank, chosen by a hash of its name;
* a ``DTensor`` with another placement (``Partial``, strided shards) is
  gathered with ``full_tensor()`` (every rank runs the collective, in the
  same order) and then treated as replicated;
* explicit ``pieces`` (a Megatron-style TP shard that is a plain tensor)
  are taken as given.

Tied names (two names of one tensor, e.g. tied embeddings) are published
once, under the first name; the alias map is the same on every rank.

CUDA tensors stay in device memory (TensorHub publishes device memory in
place); CPU tensors stay where they are. One publish takes one kind of
memory: when a rank's tensors are on several devices, the ones outside the
most common device are copied to it (said in the log).
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch

from .errors import InvalidArgumentError

log = logging.getLogger("tensorhub.pieces")

Piece = Tuple[List[int], List[int]]  # (global_shape, offset)


@dataclass
class LocalShare:
    """What one rank publishes: tensors (local, in place), the pieces among
    them, and tied aliases {alias: canonical} (equal on every rank)."""

    tensors: Dict[str, torch.Tensor] = field(default_factory=dict)
    pieces: Dict[str, Piece] = field(default_factory=dict)
    aliases: Dict[str, str] = field(default_factory=dict)
    gathered: List[str] = field(default_factory=list)  #: names gathered with full_tensor()
    copied: List[str] = field(default_factory=list)  #: names copied (device or layout)

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def is_dtensor(t: Any) -> bool:
    return hasattr(t, "device_mesh") and hasattr(t, "placements") and hasattr(t, "to_local")


def replicated_owner(name: str, world: int) -> int:
    """The rank that publishes a replicated tensor: a hash of its name, so
    every rank agrees without talking and the ranks share the work."""
    return zlib.crc32(name.encode()) % world


def _chunk_extent(n: int, parts: int, index: int) -> Tuple[int, int]:
    """(offset, length) of torch.chunk(n, parts)[index] (empty past the end)."""
    size = -(-n // parts) if n else 0
    start = min(size * index, n)
    return start, max(0, min(size, n - start))


def shard_box(shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[Any],
              coord: Sequence[int]) -> Tuple[List[int], List[int]]:
    """(offset, extent) of the piece at mesh coordinate ``coord`` of a tensor
    laid out with ``placements`` (objects with ``.dim`` shard that dim,
    others replicate), ``torch.chunk`` per mesh axis, outer axis first."""
    off = [0] * len(shape)
    ext = [int(s) for s in shape]
    for axis, p in enumerate(placements):
        d = getattr(p, "dim", None)
        if d is None or not isinstance(d, int):
            continue
        o, e = _chunk_extent(ext[d], int(mesh_shape[axis]), int(coord[axis]))
        off[d] += o
        ext[d] = e
    return off, ext


def _replicated_piece(name: str, t: torch.Tensor, rank: int,
                      world: int) -> Optional[Tuple[torch.Tensor, Optional[Piece]]]:
    """This rank's part of a tensor every rank holds whole: its row range
    (a view), or the whole tensor on one rank when it has too few rows."""
    if world == 1:
        return t, None
    if t.dim() == 0 or t.shape[0] < world or not t.is_contiguous():
        return (t, None) if replicated_owner(name, world) == rank else None
    o, e = _chunk_extent(int(t.shape[0]), world, rank)
    if e == 0:
        return None
    return t[o:o + e], ([int(x) for x in t.shape], [o] + [0] * (t.dim() - 1))


def _plain_placements(placements: Sequence[Any]) -> bool:
    from torch.distributed.tensor import Replicate, Shard

    return all(type(p) in (Replicate, Shard) for p in placements)


def _dtensor_piece(t: Any) -> Optional[Tuple[torch.Tensor, Piece]]:
    """(local tensor, (global_shape, offset)) this rank publishes of a
    DTensor with plain placements, or None if another rank publishes it."""
    from torch.distributed.tensor import Replicate

    mesh = t.device_mesh
    coord = mesh.get_coordinate()
    if coord is None:
        return None  # not in this tensor's mesh
    if any(isinstance(p, Replicate) and c != 0 for p, c in zip(t.placements, coord)):
        return None  # a replica: coordinate 0 of that axis publishes
    off, ext = shard_box(list(t.shape), list(mesh.mesh.shape), list(t.placements), coord)
    local = t.to_local()
    if list(local.shape) != ext:
        raise InvalidArgumentError(
            f"a DTensor's local shard is {list(local.shape)}, not the {ext} its placements "
            f"{t.placements} give at mesh coordinate {coord}")
    if local.numel() == 0:
        return None
    return local, ([int(s) for s in t.shape], off)


def _tie_key(t: Any) -> Optional[Tuple[Any, ...]]:
    local = t.to_local() if is_dtensor(t) else t
    if local.numel() == 0:
        return None
    return (local.device, local.data_ptr(), local.dtype, tuple(t.shape))


def local_share(items: Iterable[Tuple[str, Any]], rank: int, world: int, *,
                pieces: Optional[Mapping[str, Tuple[Sequence[int], Sequence[int]]]] = None,
                what: str = "publish") -> LocalShare:
    """This rank's share of ``items`` (``(name, tensor)`` pairs, every rank
    iterating the same names in the same order). See the module doc."""
    if not isinstance(world, int) or world < 1 or not 0 <= rank < world:
        raise InvalidArgumentError(f"{what}: rank {rank} is not in a group of {world}")
    explicit = dict(pieces or {})
    share = LocalShare()
    ties: Dict[Tuple[Any, ...], str] = {}
    chosen: Dict[str, Tuple[torch.Tensor, Optional[Piece]]] = {}
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"{what}: {name!r} is a {type(t).__name__}, not a tensor")
        key = _tie_key(t)
        if key is not None and key in ties:
            share.aliases[name] = ties[key]
            continue
        if key is not None:
            ties[key] = name
        t = t.detach()
        if name in explicit:
            g, o = explicit[name]
            chosen[name] = (t, ([int(x) for x in g], [int(x) for x in o]))
            continue
        if is_dtensor(t):
            if _plain_placements(t.placements):
                got = _dtensor_piece(t)
                if got is not None:
                    chosen[name] = got
                continue
            t = t.full_tensor()  # a collective: every rank gets here in the same order
            share.gathered.append(name)
        got = _replicated_piece(name, t, rank, world)
        if got is not None:
            chosen[name] = got
    unknown = set(explicit) - set(chosen) - set(share.aliases)
    if unknown:
        raise InvalidArgumentError(f"{what}: pieces name tensors not given: {sorted(unknown)[:5]}")

    devices: Dict[torch.device, int] = {}
    for t, _ in chosen.values():
        devices[t.device] = devices.get(t.device, 0) + 1
    home = max(devices, key=lambda d: (d.type == "cuda", devices[d])) if devices else None
    for name, (t, piece) in chosen.items():
        if home is not None and t.device != home:
            t = t.to(home)
            share.copied.append(name)
        elif not t.is_contiguous():
            t = t.contiguous()
            share.copied.append(name)
        share.tensors[name] = t
        if piece is not None and list(t.shape) != piece[0]:
            share.pieces[name] = piece
    if share.copied:
        log.info("%s: copied %d tensors (another device or not contiguous): %s", what,
                 len(share.copied), share.copied[:5])
    return _nonempty(share, rank, world, what)


def meta_share(source: Any, rank: int, world: int, *, what: str = "publish") -> LocalShare:
    """This rank's share of a vLLM >= 0.33 ``WeightSource`` that yields local
    pieces (``iter_local``), laid out as its ``metadata`` declares
    (``ParamMeta.owners``, ``mesh_shape``, ``placements``)."""
    metas = {m.name: m for m in source.metadata}
    share = LocalShare()
    for name, t in source.iter_local():
        m = metas.get(name)
        if m is None:
            raise InvalidArgumentError(f"{what}: the source yielded {name!r}, which its metadata lacks")
        t = t.detach()
        if m.owners is None:
            got = _replicated_piece(name, t, rank, world)
            if got is not None:
                share.tensors[name] = got[0]
                if got[1] is not None:
                    share.pieces[name] = got[1]
            continue
        coord_index = list(m.owners).index(rank)
        coord = []
        for size in reversed(m.mesh_shape):
            coord.append(coord_index % size)
            coord_index //= size
        coord.reverse()
        placements = m.placements or ()
        if any(getattr(p, "dim", None) is None and c != 0 for p, c in zip(placements, coord)):
            continue  # a replica along that axis
        if not placements and coord != [0] * len(coord):
            continue  # replicated over its owners: the first publishes
        off, ext = shard_box(list(m.shape), list(m.mesh_shape), list(placements), coord)
        if list(t.shape) != ext:
            raise InvalidArgumentError(
                f"{what}: {name!r}'s local piece is {list(t.shape)}, not the {ext} its "
                f"metadata gives at mesh coordinate {coord}")
        if t.numel() == 0:
            continue
        share.tensors[name] = t
        if ext != list(m.shape):
            share.pieces[name] = ([int(s) for s in m.shape], off)
    devices = {t.device for t in share.tensors.values()}
    if len(devices) > 1:
        home = next((d for d in devices if d.type == "cuda"), next(iter(devices)))
        for name, t in share.tensors.items():
            if t.device != home:
                share.tensors[name] = t.to(home)
                share.copied.append(name)
    for name, t in share.tensors.items():
        if not t.is_contiguous():
            share.tensors[name] = t.contiguous()
            share.copied.append(name)
    return _nonempty(share, rank, world, what)


def _nonempty(share: LocalShare, rank: int, world: int, what: str) -> LocalShare:
    if not share.tensors:
        raise InvalidArgumentError(
            f"{what}: rank {rank} of {world} holds no part of any tensor (every tensor has fewer "
            f"rows than the group has ranks), and a version needs a part from every rank: "
            f"publish from fewer ranks (world_size)")
    return share


__all__ = ["LocalShare", "local_share", "meta_share", "shard_box", "replicated_owner", "is_dtensor"]
