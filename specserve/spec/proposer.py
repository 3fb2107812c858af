"""The narrow interface every drafter implements, so DFlash, EAGLE-3 and n-gram swap freely."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class DraftInput:
    """What a proposer learns about one request after a target step."""

    token_ids: list[int]  # committed tokens after this step (incl. the new bonus token when one was sampled)
    start: int  # first position the target ran this step
    num_valid: int  # rows of this step's target output that are committed (1+accepted, or the prefill chunk)
    row_offset: int  # index of the first such row in the step's flattened target output
    block_table: list[int]
    draft: bool  # propose drafts for the next step (a token was sampled and the request goes on)
    max_drafts: int  # cap from max_model_len / max_tokens


class Proposer:
    """Proposes up to ``num_speculative_tokens`` drafts per request from the step that just ran."""

    method = "base"
    runner: Any = None  # the target's ModelRunner (drafters with a model)
    graphs: Any = None  # the drafter's own bucketed graphs, if any
    fused: Any = None  # the fused step's bucketed graphs (_capture_fused_step), if any
    _fused_target: Any = None
    _fused_in: tuple[torch.Tensor | None, torch.Tensor] | None = (
        None  # the verify graph's (features, packed), during a run
    )
    context: Any = None  # the context step's bucketed graphs (setup_context_step), if any
    _context_target: Any = None
    _context_in: torch.Tensor | None = None  # the q=1 target graph's features, during a run

    def __init__(self, num_speculative_tokens: int) -> None:
        self.num_speculative_tokens = num_speculative_tokens

    @property
    def tap_indices(self) -> list[int]:
        """Target hidden-state indices to capture (HF convention: i+1 = output of layer i)."""
        return []

    @property
    def uses_kv_cache(self) -> bool:
        return False

    @property
    def drop_last_cached_block(self) -> bool:
        """True when the drafter's KV at a block's last slot depends on the next token (EAGLE)."""
        return False

    def kv_cache_spec(self) -> tuple[int, int, int] | None:
        """(num_layers, num_kv_heads, head_dim) of the drafter's paged cache, or None."""
        return None

    def bind_kv_caches(self, caches: list[tuple[torch.Tensor, torch.Tensor]], block_size: int) -> None:
        pass

    def propose(self, inputs: list[DraftInput], features: torch.Tensor | None) -> list[list[int]]:
        raise NotImplementedError

    @torch.inference_mode()
    def warm_eager_passes(self) -> int:
        """Run, once at start, the eager pass ``propose`` makes outside the graphs (over a new prompt's rows, or a
        few rows to catch up at a long context) at every (rows, context) form Triton compiles for it
        (``drafter_utils.eager_warm_shapes``), so that nothing compiles inside the first requests. No KV is written.
        Returns the passes run (0: nothing eager to warm)."""
        from specserve.spec.drafter_utils import eager_warm_shapes, warm_meta

        heads = self._eager_attention()
        if heads is None:
            return 0
        shapes = eager_warm_shapes(self.runner, *heads)
        for q, context in shapes:
            self._eager_pass(q, *warm_meta(self.runner, q, context))
        return len(shapes)

    def _eager_attention(self) -> tuple[int, int, int] | None:
        """(heads, KV heads, head dim) of the attention of ``propose``'s eager pass, None when it has none."""
        return None

    def _eager_pass(self, q: int, positions: torch.Tensor, meta: Any) -> None:
        """``propose``'s eager pass over ``q`` rows at ``positions`` (dummy tokens and features, as warm-up)."""
        raise NotImplementedError

    def setup_fused_step(self, target: Any, buf: Any) -> bool:
        """Build the drafter half of the device-resident greedy step (see ``DFlashProposer``, ``Eagle3Proposer``) on the target's
        q=K+1 graphs ``target`` and their static inputs ``buf``; False when this proposer has none (then every
        step calls ``propose``)."""
        return False

    def run_fused_step(self, features: torch.Tensor | None, packed: torch.Tensor) -> torch.Tensor:
        """The drafter half of a fused step, right after the target's verify graph (no host sync between)."""
        fused = self.fused
        if fused is None:
            raise NotImplementedError
        b = packed.shape[0]
        if b in fused.graphs:  # a captured graph reads the target graph's static outputs
            assert packed is self._fused_target.outputs[b][2]
        self._fused_in = (features, packed)
        try:
            return fused.run(b)
        finally:
            self._fused_in = None

    def setup_context_step(self, target: Any, buf: Any) -> bool:
        """Build a graph that feeds the drafter one plain decode step's target features (its context: what
        ``propose`` does for a step that drafts nothing), replayed right after the target's q=1 graphs
        ``target`` (static inputs ``buf``). With it, plain steps taken while drafting is off
        (disable_when_slower, disable_by_batch_size) pipeline like plain decoding without a drafter. False when
        this proposer has none (such steps then run synchronously through ``propose``)."""
        return False

    def run_context_step(self, features: torch.Tensor | None, b: int) -> None:
        """The drafter's context update of a plain q=1 step of bucket b, right after the target's graph."""
        ctx = self.context
        if ctx is None:
            raise NotImplementedError
        if b in ctx.graphs:  # a captured graph reads the target graph's static outputs
            assert features is self._context_target.outputs[b][1]
        self._context_in = features
        try:
            ctx.run(b)
        finally:
            self._context_in = None

    def _graph_step_mode(self) -> bool | None:
        """The device-side steps' shared gate (fused step, context step): None when none is built (no padded
        drafter graphs, or the spec config's enforce_eager), else whether to capture it."""
        from specserve.spec.drafter_utils import drafter_graph_mode

        spec = self.runner.config.speculative_config
        padded, capture = drafter_graph_mode(self.runner)
        if self.graphs is None or not padded or (spec is not None and spec.enforce_eager):
            return None
        return bool(capture)

    def _fused_step_mode(self, buf: Any, what: str) -> bool | None:
        """``_graph_step_mode`` for a fused step: the target batch must be q=K+1 with 2 aux ints."""
        capture = self._graph_step_mode()
        if capture is None:
            return None
        if buf.q != self.num_speculative_tokens + 1 or buf.num_aux < 2:
            raise ValueError(f"the fused {what} step needs the q=K+1 batch with 2 aux ints per request")
        return capture

    def _capture_fused_step(
        self, name: str, fn: Any, target: Any, buf: Any, block_size: int, capture: bool
    ) -> bool:
        """Shared by the fused steps: ``fn(b)`` reads ``self._fused_in`` = (features, packed) of the target's verify
        graph; bucketed like ``target`` and captured in its memory pool. Warm-up and capture run on an empty batch
        (no KV writes anywhere) with the target graph's own outputs as inputs."""
        from specserve.runner.cuda_graphs import BucketedGraphs

        def prepare(b: int) -> None:
            buf.fill(b, [], block_size)
            _, feats, packed = target.run(b)
            self._fused_in = (feats, packed)

        self.fused = BucketedGraphs(
            name, fn, target.buckets, buf.device, capture, target.pool, prepare=prepare
        )
        self._fused_in = None
        self._fused_target = target
        return True


class NgramProposer(Proposer):
    method = "ngram"

    def __init__(self, num_speculative_tokens: int, min_n: int, max_n: int) -> None:
        super().__init__(num_speculative_tokens)
        self.min_n, self.max_n = min_n, max_n

    def setup_context_step(self, target: Any, buf: Any) -> bool:
        """Prompt lookup keeps no context of its own: a step that drafts nothing needs nothing from it, so such
        steps (disable_by_batch_size, disable_when_slower) pipeline as plain decoding."""
        return True

    def run_context_step(self, features: torch.Tensor | None, b: int) -> None:
        return None

    def propose(self, inputs: list[DraftInput], features: torch.Tensor | None) -> list[list[int]]:
        from specserve.spec.ngram import ngram_propose

        out: list[list[int]] = []
        for inp in inputs:
            k = min(self.num_speculative_tokens, inp.max_drafts)
            out.append(
                ngram_propose(inp.token_ids, self.min_n, self.max_n, k)[:k] if inp.draft and k > 0 else []
            )
        return out
