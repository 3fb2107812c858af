"""Bucketed CUDA graphs over static buffers, shared by the target and the drafters.

``fn(b)`` must read only static buffers (sliced to the bucket size ``b``) and return tensors; each bucket is
captured once (largest first, one shared memory pool) and replayed after the caller has copied the real
inputs into the buffers. Without CUDA (or with capture off) the same padded path simply runs eagerly, which
is how CPU tests check that the graph path computes what the eager path does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger("specserve")


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8, always including max_batch."""
    out = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch, 8)) + [max_batch]
    return sorted(set(out))


class BucketedGraphs:
    def __init__(
        self,
        name: str,
        fn: Callable[[int], Any],
        buckets: list[int],
        device: torch.device,
        capture: bool,
        pool: Any = None,
    ) -> None:
        self.name, self.fn, self.buckets = name, fn, sorted(buckets)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, Any] = {}
        self.pool = pool
        if capture and device.type == "cuda":
            t0 = time.perf_counter()
            for b in reversed(self.buckets):
                s = torch.cuda.Stream(device)
                s.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(s):
                    for _ in range(2):
                        fn(b)
                torch.cuda.current_stream(device).wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool):
                    out = fn(b)
                if self.pool is None:
                    self.pool = g.pool()
                self.graphs[b], self.outputs[b] = g, out
            torch.cuda.synchronize(device)
            logger.info(
                "captured %d CUDA graphs for %s (buckets %s) in %.2fs",
                len(self.graphs),
                name,
                self.buckets,
                time.perf_counter() - t0,
            )

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    def bucket(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"batch {n} exceeds the largest bucket {self.max_batch}")

    def run(self, b: int) -> Any:
        g = self.graphs.get(b)
        if g is None:
            return self.fn(b)
        g.replay()
        return self.outputs[b]


class PaddedBatch:
    """Static device buffers for a batch of up to ``max_batch`` requests of exactly ``q`` query tokens each.

    ``fill`` pads to a bucket: request j gets its tokens (the rest of its q rows are token 0 and write no KV),
    positions ``first_pos .. first_pos + q - 1`` and seq_len ``first_pos + q``; requests past the real batch get
    seq_len 0 (the attention kernel outputs zeros for them) and slot -1 everywhere.
    """

    def __init__(self, max_batch: int, q: int, max_blocks: int, device: torch.device) -> None:
        self.q = q
        t = max_batch * q
        self.ids = torch.zeros(t, dtype=torch.long, device=device)
        self.pos = torch.zeros(t, dtype=torch.long, device=device)
        self.slots = torch.full((t,), -1, dtype=torch.long, device=device)
        self.qsl = torch.arange(0, (max_batch + 1) * q, q, dtype=torch.int32, device=device)
        self.seq = torch.zeros(max_batch, dtype=torch.int32, device=device)
        self.bt = torch.zeros((max_batch, max_blocks), dtype=torch.int32, device=device)

    def meta(self, b: int, max_seq_len: int, causal: bool = True) -> Any:
        from specserve.layers.attention import AttnMetadata

        return AttnMetadata(
            self.qsl[: b + 1],
            self.seq[:b],
            self.bt[:b],
            self.slots[: b * self.q],
            max_query_len=self.q,
            max_seq_len=max_seq_len,
            causal=causal,
        )

    def fill(self, b: int, rows: list[tuple[list[int], int, list[int]]], block_size: int) -> None:
        """rows: (tokens (at most q), first position, block table) per real request; b >= len(rows)."""
        q = self.q
        ids = torch.zeros(b * q, dtype=torch.long)
        pos = torch.zeros(b * q, dtype=torch.long)
        slots = torch.full((b * q,), -1, dtype=torch.long)
        seq = torch.zeros(b, dtype=torch.int32)
        bt = torch.zeros((b, self.bt.shape[1]), dtype=torch.int32)
        for j, (toks, first, table) in enumerate(rows):
            n = len(toks)
            p = torch.arange(first, first + q)
            ids[j * q : j * q + n] = torch.tensor(toks)
            pos[j * q : (j + 1) * q] = p
            tab = torch.tensor(table, dtype=torch.long)
            slots[j * q : j * q + n] = tab[p[:n] // block_size] * block_size + p[:n] % block_size
            seq[j] = first + q
            bt[j, : len(table)] = tab.to(torch.int32)
        self.ids[: b * q].copy_(ids, non_blocking=True)
        self.pos[: b * q].copy_(pos, non_blocking=True)
        self.slots[: b * q].copy_(slots, non_blocking=True)
        self.seq[:b].copy_(seq, non_blocking=True)
        self.bt[:b].copy_(bt, non_blocking=True)
