"""Shared plumbing for model-based proposers: checkpoint loading and paged-batch building."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import torch

from specserve.layers.attention import AttnMetadata

if TYPE_CHECKING:
    from specserve.loading import Checkpoint
    from specserve.runner.model_runner import ModelRunner


def load_drafter_checkpoint(
    model: str, dummy: bool = False, revision: str | None = None, download_dir: str | None = None
) -> tuple[dict[str, Any], Checkpoint]:
    from specserve.loading import config_only_checkpoint, resolve_checkpoint

    if dummy:
        ckpt = config_only_checkpoint(model)
    else:
        ckpt = resolve_checkpoint(model, revision=revision, download_dir=download_dir)
    with open(os.path.join(ckpt.path, "config.json")) as f:
        raw = json.load(f)
    if "speculators_model_type" in raw:  # vLLM's speculators format: the layer config nested
        from specserve.loading import speculators

        raw = speculators.flatten(raw)
    return raw, ckpt


def drafter_graph_mode(runner: ModelRunner) -> tuple[bool, bool]:
    """(use the padded static-shape drafter batch, capture it in CUDA graphs).

    Padded by default with CUDA graphs (as vLLM); ``disable_padded_drafter_batch`` takes the compacted host-side
    path; the spec config's ``enforce_eager`` (or the engine's) keeps the drafter out of graphs.
    """
    cfg, spec = runner.config, runner.config.speculative_config
    on_cuda = runner.device.type == "cuda"
    padded = cfg.padded_decode if cfg.padded_decode is not None else on_cuda
    if spec is not None and spec.disable_padded_drafter_batch:
        padded = False
    eager = cfg.enforce_eager or bool(spec is not None and spec.enforce_eager)
    return padded, padded and on_cuda and not eager


def build_model(runner: ModelRunner, factory: Any) -> Any:
    """Instantiate a drafter module on the runner's device and dtype."""
    with torch.device(runner.device):
        prev = torch.get_default_dtype()
        torch.set_default_dtype(runner.dtype)
        try:
            model = factory()
        finally:
            torch.set_default_dtype(prev)
    return model


def drafter_split_gemm(runner: ModelRunner, layers: Any) -> tuple[dict[str, int], bool]:
    """(split_gemm, triton_gemm) for a drafter's decoder layers: the target's split-K decode GEMMs (Triton where the
    drafter's shapes fit the tiles, else cuBLAS's splits on transposed weights, else none); see
    ``models/llama.py`` ``run_layers_fused``."""
    from specserve.layers.linear import split_gemm_config
    from specserve.models.llama import triton_gemm_fits

    target = runner.model
    if target.triton_gemm and triton_gemm_fits(layers, target.split_gemm):
        return dict(target.split_gemm), True
    return split_gemm_config(runner.device, runner.weight_layout, False), False


def paged_slots(bt: torch.Tensor, pos: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """On the device: the cache slots of positions ``pos`` [b, n] through block tables ``bt`` [b, max_blocks], and
    whether each table covers its position (a block there, inside the table)."""
    mb = bt.shape[1]
    blk = pos // block_size
    bid = bt.gather(1, blk.clamp(0, mb - 1)).long()
    return bid * block_size + pos % block_size, (bid >= 0) & (blk < mb)


class PagedBatch:
    """Host-side builder for one drafter forward over a varlen batch (positions, slots, block tables)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.positions: list[int] = []
        self.slots: list[int] = []
        self.q_lens: list[int] = []
        self.seq_lens: list[int] = []
        self.tables: list[list[int]] = []

    def add(self, block_table: list[int], first_pos: int, n: int, seq_len: int | None = None) -> None:
        pos = range(first_pos, first_pos + n)
        self.positions.extend(pos)
        self.slots.extend(self.runner.slot(block_table, p) for p in pos)
        self.q_lens.append(n)
        self.seq_lens.append(first_pos + n if seq_len is None else seq_len)
        self.tables.append(block_table)

    def build(self, causal: bool = True) -> tuple[torch.Tensor, AttnMetadata]:
        meta = self.runner.build_metadata(self.q_lens, self.seq_lens, self.tables, self.slots, causal=causal)
        return torch.tensor(self.positions, dtype=torch.long, device=self.runner.device), meta


def eager_warm_shapes(
    runner: ModelRunner, num_heads: int, num_kv_heads: int, head_dim: int
) -> list[tuple[int, int]]:
    """(rows, context) of the eager drafter passes to run at start so that every kernel form ``propose``'s eager
    pass can take is compiled before the first request: a new prompt's rows (their count is the prompt's, or a
    chunk's, after a cached prefix too) and a catch-up pass's (a step's committed rows the drafter has not seen,
    e.g. after a request's last step, which drafts nothing).

    Triton compiles a form per constexpr set and per integer argument's class (1, a multiple of 16, other). With
    the rows q, the attention's query tile changes (``select_attention_config``: q x GQA group, capped at 128),
    whether q fits one tile (then q, RoPE and the K/V store run inside the attention where its q prologue is small
    enough: a threshold in q), whether the projections take the split-K GEMMs (``SPLIT_MAX_ROWS``) and the class
    of q; with the context, the KV split count (``_pick_num_splits``: up to ``SPLIT_MAX_QUERY_LEN`` rows, a power
    of two that changes at doublings of the context; more requests per pass pick fewer, a count warmed here too).
    Per class of q and split count: its first and last q (the thresholds are monotone in q), each at the first
    context with that split count."""
    from specserve.layers import triton_attention as ta
    from specserve.layers.linear import SPLIT_MAX_ROWS

    first: dict[tuple, tuple[int, int]] = {}
    last: dict[tuple, tuple[int, int]] = {}
    top = ta.SPLIT_MAX_QUERY_LEN  # no split past it
    q = 0
    while q <= top:
        q += 1
        cfg = ta.select_attention_config(num_heads, num_kv_heads, head_dim, q)
        top = max(top, cfg.queries_per_tile)
        key = (cfg.block_m, q > cfg.queries_per_tile, q <= SPLIT_MAX_ROWS, q == 1, q % 16 == 0)
        programs = num_kv_heads * -(-q // cfg.queries_per_tile)
        ctx, seen = q, set()
        while ctx <= runner.max_model_len:
            s = ta._pick_num_splits(runner.device, programs, cfg.block_n, ctx, q)
            if s not in seen:
                seen.add(s)
                first.setdefault((key, s), (q, ctx))
                last[(key, s)] = (q, ctx)
            ctx *= 2  # one context in every [c, 2c)
    return sorted(set(first.values()) | set(last.values()))


def warm_meta(runner: ModelRunner, q: int, context: int) -> tuple[torch.Tensor, AttnMetadata]:
    """(positions, metadata) of one request's last ``q`` rows at ``context`` tokens, writing no KV (slots -1), for
    warm-ups (the cache's block 0 stands for every block: its values do not matter)."""
    table = [0] * -(-context // runner.block_size)
    meta = runner.build_metadata([q], [context], [table], [-1] * q)
    return torch.arange(context - q, context, dtype=torch.long, device=runner.device), meta


def scatter_drafts(inputs: list[Any], drafting: list[int], rows: list[list[int]]) -> list[list[int]]:
    """Per input its drafts: row j of ``rows`` for input ``drafting[j]``, cut to its ``max_drafts``; none for the
    others."""
    out: list[list[int]] = [[] for _ in inputs]
    for j, i in enumerate(drafting):
        out[i] = rows[j][: inputs[i].max_drafts]
    return out


class OneTokenSteps:
    """Static inputs of a drafter's K-1 one-token draft steps over the padded batch, which EAGLE-3's and the draft
    model's graphs read: per row the token, the base position (step s runs at base + s), validity, the steps' slots
    and the block table. Padding rows have seq_len 0 and slot -1 (no K/V write)."""

    def __init__(self, runner: ModelRunner, K: int) -> None:
        dev, max_b = runner.device, runner.config.max_num_seqs
        self.runner, self.K = runner, K
        self.tok = torch.zeros(max_b, dtype=torch.long, device=dev)
        self.base = torch.zeros(max_b, dtype=torch.long, device=dev)
        self.valid = torch.zeros(max_b, dtype=torch.int32, device=dev)
        self.slots = torch.full((K - 1, max_b), -1, dtype=torch.long, device=dev)
        self.bt = torch.zeros((max_b, runner.max_blocks_per_seq), dtype=torch.int32, device=dev)
        self.qsl = torch.arange(max_b + 1, dtype=torch.int32, device=dev)
        self.max_seq = runner.max_model_len + K + 1

    def meta(self, b: int, step: int) -> tuple[torch.Tensor, AttnMetadata]:
        """(positions, attention metadata) of step ``step`` (1..K-1) for bucket ``b``."""
        pos = self.base[:b] + step
        seq = (pos + 1).to(torch.int32) * self.valid[:b]
        meta = AttnMetadata(
            self.qsl[: b + 1],
            seq,
            self.bt[:b],
            self.slots[step - 1, :b],
            max_query_len=1,
            max_seq_len=self.max_seq,
        )
        return pos, meta

    def fill(
        self, inputs: list[Any], drafting: list[int], base_pos: list[int], b: int, tok: torch.Tensor
    ) -> None:
        """Rows 0..n-1: input ``drafting[j]`` drafting from position ``base_pos[j]`` with first token ``tok[j]``; rows
        n..b-1 padding."""
        K, runner = self.K, self.runner
        slots = torch.full((K - 1, b), -1, dtype=torch.long)
        bt = torch.zeros((b, self.bt.shape[1]), dtype=torch.int32)
        valid = torch.zeros(b, dtype=torch.int32)
        base = torch.zeros(b, dtype=torch.long)
        for j, (i, p) in enumerate(zip(drafting, base_pos)):
            table = inputs[i].block_table
            slots[:, j] = torch.tensor([runner.slot(table, p + s) for s in range(1, K)])
            bt[j, : len(table)] = torch.tensor(table, dtype=torch.int32)
            valid[j], base[j] = 1, p
        self.tok[: len(drafting)].copy_(tok)
        self.slots[:, :b].copy_(slots, non_blocking=True)
        self.bt[:b].copy_(bt, non_blocking=True)
        self.valid[:b].copy_(valid, non_blocking=True)
        self.base[:b].copy_(base, non_blocking=True)
