#!/usr/bin/env python3
"""A small, real RL loop on CPU with TensorHub moving the weights.

One trainer (this process) and N rollout workers (spawned processes):

    trainer                                   rollout worker i
    -------                                   ----------------
    publish_module(policy, version=s)  ---->  fetch_module(latest)   (peer to peer)
    put one task per worker                   generate G answers per prompt
                                       <----  rewards + tokens (multiprocessing.Queue)
    unpublish(s)  (drains reads in flight)
    GRPO step: advantage = (r - mean_group) / std_group

The task: given K digits, answer them reversed; the reward is the fraction of
positions right (checkable, no learned reward model). The policy is a tiny
causal transformer (2 layers, d=64) with its output projection tied to the
token embedding (tensorhub.torch publishes the tied matrix once).

The mutability contract: the optimizer updates the parameters in place, so
the trainer unpublishes the version (which waits until no read is in flight
from its memory) before optimizer.step(). Rollout workers fetch into their
own module with serve=True, so they also serve the version to each other;
their next fetch into the same module withdraws the old version first.

Run:  python3 examples/rl_loop.py [--steps 50] [--rollouts 2] [--seed 0]
Prints one line per step: mean reward, weight-sync times, and waits.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

import tensorhub
from tensorhub.torch import fetch_module, publish_module

MODEL = "policy"


@dataclass(frozen=True)
class Task:
    digits: int = 10  # alphabet size
    length: int = 4  # K

    @property
    def bos(self) -> int:
        return self.digits

    @property
    def sep(self) -> int:
        return self.digits + 1

    @property
    def vocab(self) -> int:
        return self.digits + 2

    @property
    def seq_len(self) -> int:  # BOS x1..xK SEP y1..yK
        return 2 * self.length + 2

    def prompts(self, n: int, gen: torch.Generator) -> torch.Tensor:
        x = torch.randint(0, self.digits, (n, self.length), generator=gen)
        bos = torch.full((n, 1), self.bos)
        sep = torch.full((n, 1), self.sep)
        return torch.cat([bos, x, sep], dim=1)

    def reward(self, prompts: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
        target = prompts[:, 1 : 1 + self.length].flip(1)
        return (answers == target).float().mean(dim=1)


class Policy(torch.nn.Module):
    """A causal transformer over the task's tokens; head tied to the embedding."""

    def __init__(self, vocab: int, max_len: int, d: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(max_len, d)
        block = torch.nn.TransformerEncoderLayer(
            d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        # Small embeddings (GPT-2 style): with the head tied to them, N(0, 1)
        # would make the initial policy nearly deterministic, and a group of
        # identical answers has no advantage signal.
        torch.nn.init.normal_(self.tok.weight, std=0.02)
        torch.nn.init.normal_(self.pos.weight, std=0.02)
        mask = torch.triu(torch.full((max_len, max_len), float("-inf")), diagonal=1)
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(n))
        h = self.blocks(h, mask=self.causal[:n, :n])
        return self.head(self.norm(h))


def make_policy(task: Task) -> Policy:
    return Policy(task.vocab, task.seq_len)


# --------------------------------------------------------------------------
# rollout worker


@torch.no_grad()
def generate(policy: Policy, prompts: torch.Tensor, task: Task, gen: torch.Generator) -> torch.Tensor:
    """Samples K answer tokens (digits only) after each prompt."""
    seq = prompts
    for _ in range(task.length):
        logits = policy(seq)[:, -1, : task.digits]
        tok = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=gen)
        seq = torch.cat([seq, tok], dim=1)
    return seq[:, prompts.shape[1] :]


def rollout_main(idx: int, hub_address: str, args: argparse.Namespace, tasks, results) -> None:
    torch.set_num_threads(1)
    tensorhub.set_log_level("warn")
    task = Task(args.digits, args.length)
    policy = make_policy(task).eval()
    with tensorhub.connect(hub_address, worker_id=f"rollout{idx}") as client:
        while True:
            t_wait = time.perf_counter()
            job = tasks.get()
            waited = time.perf_counter() - t_wait
            if job is None:
                break
            step, n_prompts = job
            t0 = time.perf_counter()
            version = fetch_module(client, MODEL, policy, "latest", timeout=60)
            fetch_s = time.perf_counter() - t0
            gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 101 + idx)
            prompts = task.prompts(n_prompts, gen).repeat_interleave(args.group, dim=0)
            t1 = time.perf_counter()
            answers = generate(policy, prompts, task, gen)
            gen_s = time.perf_counter() - t1
            rewards = task.reward(prompts, answers)
            results.put({
                "worker": idx, "step": step, "version": version,
                "prompts": prompts.numpy(), "answers": answers.numpy(),
                "rewards": rewards.numpy(), "fetch_s": fetch_s,
                "wait_s": waited, "gen_s": gen_s,
            })


# --------------------------------------------------------------------------
# trainer


def grpo_loss(policy: Policy, prompts, answers, rewards, group: int) -> torch.Tensor:
    """Policy gradient with group-relative advantages (on-policy, so no ratio)."""
    r = rewards.view(-1, group)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    seq = torch.cat([prompts, answers], dim=1)
    logits = policy(seq[:, :-1])[:, prompts.shape[1] - 1 :, :]
    logp = torch.log_softmax(logits.float(), dim=-1)
    tok_logp = logp.gather(-1, answers.unsqueeze(-1)).squeeze(-1)  # [B, K]
    return -(adv.unsqueeze(1) * tok_logp).mean()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rollouts", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=16, help="prompts per rollout worker per step")
    ap.add_argument("--group", type=int, default=8, help="answers per prompt (GRPO group)")
    ap.add_argument("--digits", type=int, default=10)
    ap.add_argument("--length", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hub", default=None, help="use a running hub (default: embedded)")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.set_num_threads(1)
    tensorhub.set_log_level("warn")
    task = Task(args.digits, args.length)
    policy = make_policy(task)
    opt = torch.optim.Adam(policy.parameters(), lr=args.lr)
    n_params = sum(p.numel() for p in policy.parameters())

    hub = None if args.hub else tensorhub.serve_hub("127.0.0.1:0")
    hub_address = args.hub or hub.address
    ctx = mp.get_context("spawn")  # never fork a process that runs gRPC threads
    tasks = [ctx.Queue() for _ in range(args.rollouts)]
    results = ctx.Queue()
    workers = [
        ctx.Process(target=rollout_main, args=(i, hub_address, args, tasks[i], results), daemon=True)
        for i in range(args.rollouts)
    ]
    for w in workers:
        w.start()

    print(f"hub {hub_address}; policy {n_params} parameters; {args.rollouts} rollout workers; "
          f"task: reverse {args.length} digits of {args.digits}; "
          f"{args.rollouts * args.prompts} prompts x {args.group} answers per step", flush=True)
    print(f"{'step':>4} {'reward':>6} {'publish_ms':>10} {'fetch_ms':>13} {'unpub_ms':>8} "
          f"{'trainer_wait_ms':>15} {'rollout_wait_ms':>15} {'gen_ms':>6} {'train_ms':>8}", flush=True)
    first = last = None
    t_start = time.perf_counter()
    client = tensorhub.connect(hub_address, worker_id="trainer")
    try:
        for step in range(1, args.steps + 1):
            t0 = time.perf_counter()
            publish_module(client, MODEL, step, policy)
            publish_ms = (time.perf_counter() - t0) * 1e3
            for q in tasks:
                q.put((step, args.prompts))
            t1 = time.perf_counter()
            batch = []
            for _ in workers:
                try:
                    batch.append(results.get(timeout=120))
                except queue.Empty:
                    raise SystemExit("a rollout worker did not answer in 120 s") from None
            wait_ms = (time.perf_counter() - t1) * 1e3
            stale = [b["version"] for b in batch if b["version"] != step]
            if stale:
                raise SystemExit(f"step {step}: rollouts used versions {stale}")
            t2 = time.perf_counter()
            client.unpublish(MODEL, step, timeout=30)  # drain before in-place update
            unpub_ms = (time.perf_counter() - t2) * 1e3

            batch.sort(key=lambda b: b["worker"])
            prompts = torch.from_numpy(np.concatenate([b["prompts"] for b in batch]))
            answers = torch.from_numpy(np.concatenate([b["answers"] for b in batch]))
            rewards = torch.from_numpy(np.concatenate([b["rewards"] for b in batch]))
            t3 = time.perf_counter()
            loss = grpo_loss(policy, prompts, answers, rewards, args.group)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            opt.step()
            train_ms = (time.perf_counter() - t3) * 1e3

            reward = rewards.mean().item()
            first = reward if first is None else first
            last = reward
            fetch = [b["fetch_s"] * 1e3 for b in batch]
            print(f"{step:>4} {reward:>6.3f} {publish_ms:>10.1f} "
                  f"{np.mean(fetch):>6.1f}/{max(fetch):>6.1f} {unpub_ms:>8.1f} {wait_ms:>15.1f} "
                  f"{np.mean([b['wait_s'] * 1e3 for b in batch]):>15.1f} "
                  f"{np.mean([b['gen_s'] * 1e3 for b in batch]):>6.1f} {train_ms:>8.1f}", flush=True)
    finally:
        for q in tasks:
            q.put(None)
        for w in workers:
            w.join(30)
            if w.is_alive():
                w.kill()
        client.close()
        if hub is not None:
            hub.close()
    elapsed = time.perf_counter() - t_start
    print(f"done: {args.steps} steps in {elapsed:.1f} s; mean reward {first:.3f} -> {last:.3f} "
          f"(random policy: {1 / args.digits:.3f}); fetch_ms is mean/max over rollout workers",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
