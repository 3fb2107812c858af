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
