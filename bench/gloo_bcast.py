"""torch.distributed broadcast over gloo, the PyTorch static-group baseline.

One process per rank; bench/gloo_bcast.sh starts rank 0 on the trainer's
host and one rank on each reader host of the test bed. Rank 0 broadcasts S
bytes; every rank times from a barrier to its own completion; the slowest
time is reported, and every receiver checks the bytes against rank 0's.

  MASTER_ADDR=... MASTER_PORT=... python3 gloo_bcast.py RANK WORLD BYTES IFACE_IP
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    rank, world, nbytes = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=600))
    gen = torch.Generator().manual_seed(1234)
    if rank == 0:
        buf = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, generator=gen)
    else:
        buf = torch.zeros(nbytes, dtype=torch.uint8)
    dist.barrier()
    t0 = time.monotonic()
    dist.broadcast(buf, src=0)
    took = torch.tensor([time.monotonic() - t0], dtype=torch.float64)
    # Verify against the root's checksum, then take the slowest rank's time.
    check = torch.tensor([int(buf[::4096].to(torch.int64).sum())], dtype=torch.int64)
    ref = check.clone()
    dist.broadcast(ref, src=0)
    ok = torch.tensor([1 if int(ref) == int(check) else 0], dtype=torch.int64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if rank == 0:
        print(f"gloo_bcast bytes={nbytes} ranks={world} seconds={float(took):.3f} "
              f"verified={int(ok)}", flush=True)
    dist.destroy_process_group()
    return 0 if int(ok) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
