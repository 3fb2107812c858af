"""Bucketed CUDA graphs over static buffers, shared by the target and the drafters.

``fn(b)`` must read only static buffers (sliced to the bucket size ``b``) and return tensors; each bucket is
captured once (largest first, one shared memory pool) and replayed after the caller has copied the real
inputs into the buffers. Without CUDA (or with capture off) the same padded path simply runs eagerly, which
is how CPU tests check that the graph path computes what the eager path does. ``max_cudagraph_capture_size``
(vLLM's) limits capture to the buckets of at most that many tokens (``captured_buckets``); the others run the
same padded step eagerly.

``PaddedBatch`` holds the static inputs of a padded batch (tokens, positions, slots, seq lens, optional
per-request ints, block tables) and refreshes them with numpy writes into one (pinned) staging buffer plus a
single host-to-device copy.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

logger = logging.getLogger("specserve")


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8, always including max_batch."""
    out = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch, 8)) + [max_batch]
    return sorted(set(out))


def captured_buckets(buckets: Collection[int], tokens_per_bucket: int, max_tokens: int | None) -> list[int]:
    """The buckets a CUDA graph captures under vLLM's ``max_cudagraph_capture_size`` (``max_tokens``): those whose
    step has at most ``max_tokens`` tokens, bucket b of a step of ``tokens_per_bucket`` tokens per request having
    ``b * tokens_per_bucket`` (a prefill token bucket t: ``tokens_per_bucket`` 1). None: every bucket."""
    if max_tokens is None:
        return sorted(buckets)
    return [b for b in sorted(buckets) if b * tokens_per_bucket <= max_tokens]


# (max_tokens, tokens_per_bucket) for the BucketedGraphs built inside ``capture_limit``; None: capture every bucket
_CAPTURE_LIMIT: contextvars.ContextVar[tuple[int | None, int] | None] = contextvars.ContextVar(
    "specserve_capture_limit", default=None
)


@contextlib.contextmanager
def capture_limit(max_tokens: int | None, tokens_per_bucket: int) -> Iterator[None]:
    """Within it, a BucketedGraphs built without ``capture_only`` captures ``captured_buckets(its buckets,
    tokens_per_bucket, max_tokens)``. The runner wraps each step's graphs in it with the step's target q (the
    target's, its sampling graphs', the drafter's), so a step is either captured whole or runs eagerly whole, and
    the graphs that read another graph's static outputs (``.outputs[b]``) are captured exactly where it is."""
    token = _CAPTURE_LIMIT.set((max_tokens, tokens_per_bucket))
    try:
        yield
    finally:
        _CAPTURE_LIMIT.reset(token)


class BucketedGraphs:
    def __init__(
        self,
        name: str,
        fn: Callable[[int], Any],
        buckets: list[int],
        device: torch.device,
        capture: bool,
        pool: Any = None,
        prepare: Callable[[int], None] | None = None,
        capture_only: Collection[int] | None = None,
    ) -> None:
        """``prepare(b)``, when given, puts the static buffers in a harmless state for bucket b (e.g. an empty
        padded batch: no KV writes) before its warm-up runs and capture. ``capture_only``: the buckets to capture
        (default: the enclosing ``capture_limit``'s, else all); ``run`` answers the others with ``fn(b)``."""
        self.name, self.fn, self.buckets = name, fn, sorted(buckets)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, Any] = {}
        self.pool = pool
        if capture_only is None:
            limit = _CAPTURE_LIMIT.get()
            capture_only = (
                self.buckets if limit is None else captured_buckets(self.buckets, limit[1], limit[0])
            )
        wanted = set(capture_only)
        # buckets that run eagerly although graphs are captured (over max_cudagraph_capture_size)
        self.eager_buckets = [b for b in self.buckets if b not in wanted]
        if capture and device.type == "cuda":
            t0 = time.perf_counter()
            for b in reversed(self.eager_buckets):  # once, so their first real step compiles no kernels
                if prepare is not None:
                    prepare(b)
                fn(b)
            for b in reversed(self.buckets):
                if b not in wanted:
                    continue
                if prepare is not None:
                    prepare(b)
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
            eager = self.eager_buckets
            logger.info(
                "captured %d CUDA graphs for %s (buckets %s%s) in %.2fs",
                len(self.graphs),
                name,
                sorted(self.graphs),
                f"; {len(eager)} more run eagerly: {eager}" if eager else "",
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


class BucketViews(NamedTuple):
    """One bucket's views of a PaddedBatch's buffers (device or host staging)."""

    ids: torch.Tensor  # int64 [b*q]
    pos: torch.Tensor  # int64 [b*q]
    slots: torch.Tensor  # int64 [b*q]
    seq: torch.Tensor  # int32 [b]
    bt: torch.Tensor  # int32 [b, max_blocks]
    aux: torch.Tensor  # int32 [b, num_aux]: per-request ints (zeros past the real batch)
    faux: torch.Tensor  # float32 [b, num_faux]: per-request floats (zeros past the real batch)


class PaddedBatch:
    """Static device buffers for a batch of up to ``max_batch`` requests of exactly ``q`` query tokens each.

    ``fill`` pads to a bucket: request j gets its tokens (the rest of its q rows are token 0 and write no KV),
    positions ``first_pos .. first_pos + q - 1`` and seq_len ``first_pos + q``; requests past the real batch get
    seq_len 0 (the attention kernel outputs zeros for them) and slot -1 everywhere.  Request j's block-table row
    is its table, then -1 over the whole rest of the row (a negative block id means "not this request's": a
    graph that derives slots from the table must not write there; the attention kernels read a negative id as
    block 0, which only padding rows can see).  The rows of requests past the real batch are unspecified.
    ``num_aux`` optional int32 columns per request (``aux``) carry small per-request values to the device in
    the same copy; requests past the real batch get zeros.  ``num_faux`` float32 columns (``faux``) likewise.

    Layout: everything lives in ONE byte buffer whose layout depends on the bucket ``b`` (each bucket's graph
    is captured on its own views, see ``views``): int64 ``ids[b*q] | pos[b*q] | slots[b*q]``, then int32
    ``seq[b] | aux[b, num_aux]``, float32 ``faux[b, num_faux]``, int32 ``bt[b, max_blocks]``.  ``fill`` writes the values with numpy into a host staging
    buffer of the same layout (pinned on CUDA) and moves them with a single host-to-device copy; on CPU the
    staging buffer *is* the device buffer, so there is no copy at all.
    """

    def __init__(
        self,
        max_batch: int,
        q: int,
        max_blocks: int,
        device: torch.device,
        num_aux: int = 0,
        num_faux: int = 0,
    ) -> None:
        self.q, self.max_batch, self.max_blocks, self.num_aux = q, max_batch, max_blocks, num_aux
        self.num_faux = num_faux
        self.device = device
        nbytes = self._nbytes(max_batch, max_batch)
        self._dev = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        if device.type == "cpu":
            self._host = self._dev
        else:
            self._host = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
        self._host_np = self._host.numpy()
        self._copied: Any = None  # CUDA event recorded after the last host-to-device copy
        self.qsl = torch.arange(0, (max_batch + 1) * q, q, dtype=torch.int32, device=device)
        self._dev_views: dict[int, BucketViews] = {}
        self._host_views: dict[int, tuple[np.ndarray, ...]] = {}
        self._zeros = [0] * q
        self._neg = [-1] * q

    def _nbytes(self, b: int, rows: int) -> int:
        """Bytes of bucket b's layout up to the end of the first ``rows`` block-table rows."""
        return 24 * b * self.q + 4 * b * (1 + self.num_aux + self.num_faux) + 4 * rows * self.max_blocks

    def views(self, b: int) -> BucketViews:
        """Device views for bucket b (the same tensors every call: graphs read them)."""
        v = self._dev_views.get(b)
        if v is None:
            t, raw, na, nf = b * self.q, self._dev, self.num_aux, self.num_faux
            i64 = raw[: 24 * t].view(torch.int64)
            i32 = raw[24 * t : self._nbytes(b, b)].view(torch.int32)
            f32 = raw[24 * t : self._nbytes(b, b)].view(torch.float32)
            v = BucketViews(
                i64[:t],
                i64[t : 2 * t],
                i64[2 * t :],
                i32[:b],
                i32[b * (1 + na + nf) :].view(b, self.max_blocks),
                i32[b : b * (1 + na)].view(b, na),
                f32[b * (1 + na) : b * (1 + na + nf)].view(b, nf),
            )
            self._dev_views[b] = v
        return v

    def _staging(self, b: int) -> tuple[np.ndarray, ...]:
        """Host numpy views for bucket b: ids/pos/slots as [b, q] int64, seq [b], bt [b, max_blocks] and
        aux [b, num_aux] int32, faux [b, num_faux] float32."""
        v = self._host_views.get(b)
        if v is None:
            t, raw, na, nf = b * self.q, self._host_np, self.num_aux, self.num_faux
            i64 = raw[: 24 * t].view(np.int64).reshape(3, b, self.q)
            i32 = raw[24 * t : self._nbytes(b, b)].view(np.int32)
            f32 = raw[24 * t : self._nbytes(b, b)].view(np.float32)
            v = (
                i64[0],
                i64[1],
                i64[2],
                i32[:b],
                i32[b * (1 + na + nf) :].reshape(b, self.max_blocks),
                i32[b : b * (1 + na)].reshape(b, na),
                f32[b * (1 + na) : b * (1 + na + nf)].reshape(b, nf),
            )
            self._host_views[b] = v
        return v

    def meta(self, b: int, max_seq_len: int, causal: bool = True) -> Any:
        from specserve.layers.attention import AttnMetadata

        v = self.views(b)
        return AttnMetadata(
            self.qsl[: b + 1],
            v.seq,
            v.bt,
            v.slots,
            max_query_len=self.q,
            max_seq_len=max_seq_len,
            causal=causal,
        )

    def fill(
        self,
        b: int,
        rows: list[tuple[list[int], int, list[int]]],
        block_size: int,
        aux: list[list[int]] | None = None,
        faux: list[list[float]] | None = None,
    ) -> None:
        """rows: (tokens (at most q), first position, block table) per real request; b >= len(rows).
        aux: ``num_aux`` ints per real request (None: zeros); faux: ``num_faux`` floats likewise."""
        q, n = self.q, len(rows)
        if n > b:
            raise ValueError(f"{n} requests do not fit bucket {b}")
        if aux is not None and (len(aux) != n or any(len(a) != self.num_aux for a in aux)):
            raise ValueError(f"aux must hold {self.num_aux} ints for each of the {n} requests")
        if faux is not None and (len(faux) != n or any(len(a) != self.num_faux for a in faux)):
            raise ValueError(f"faux must hold {self.num_faux} floats for each of the {n} requests")
        if self._copied is not None:
            self._copied.synchronize()  # the previous copy has read the staging buffer
        ids, pos, slots, seq, bt, aux_np, faux_np = self._staging(b)
        # the whole row is -1 past each table: no stale block id of an earlier batch survives
        bt[:n] = -1
        if self.num_aux:
            aux_np[:] = 0
            if aux is not None and n:
                aux_np[:n] = aux
        if self.num_faux:
            faux_np[:] = 0
            if faux is not None and n:
                faux_np[:n] = faux
        # plain Python over the (few) real requests, then one numpy write per buffer: at decode batch sizes this
        # is several times cheaper than vectorized numpy (whose per-call overhead dominates small arrays)
        ids_l: list[int] = []
        pos_l: list[int] = []
        slots_l: list[int] = []
        seq_l: list[int] = []
        zeros, neg = self._zeros, self._neg
        for j, (toks, first, table) in enumerate(rows):
            nt = len(toks)
            if (first + nt - 1) // block_size >= len(table):
                raise ValueError("a block table does not cover its request's tokens")
            ids_l += toks
            ids_l += zeros[nt:]
            pos_l += range(first, first + q)
            for p in range(first, first + nt):
                slots_l.append(table[p // block_size] * block_size + p % block_size)
            slots_l += neg[nt:]
            seq_l.append(first + q)
            if table:
                bt[j, : len(table)] = table
        pad = (b - n) * q
        if pad:
            ids_l += [0] * pad
            pos_l += [0] * pad
            slots_l += [-1] * pad
            seq_l += [0] * (b - n)
        ids.reshape(-1)[:] = ids_l
        pos.reshape(-1)[:] = pos_l
        slots.reshape(-1)[:] = slots_l
        seq[:] = seq_l
        self._upload(b, n)

    def _upload(self, b: int, n: int) -> None:
        """One host-to-device copy of bucket b's layout up to the end of the real requests' block tables."""
        if self._host is self._dev:
            return
        nbytes = self._nbytes(b, n)
        self._dev[:nbytes].copy_(self._host[:nbytes], non_blocking=True)
        if self.device.type == "cuda":
            if self._copied is None:
                self._copied = torch.cuda.Event()
            self._copied.record(torch.cuda.current_stream(self.device))
