"""DFlash proposer: one non-causal drafter pass over [last token, MASK x K] per request per step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from specserve.config import SpeculativeConfig
from specserve.layers.sampler import argmax_graph, argmax_last
from specserve.models.dflash import DFlashDraftModel
from specserve.spec.drafter_utils import (
    PagedBatch,
    build_model,
    drafter_graph_mode,
    drafter_split_gemm,
    load_drafter_checkpoint,
    scatter_drafts,
)
from specserve.spec.proposer import DraftInput, Proposer

if TYPE_CHECKING:
    from specserve.runner.model_runner import ModelRunner


class DFlashProposer(Proposer):
    method = "dflash"

    def __init__(self, spec: SpeculativeConfig, runner: ModelRunner) -> None:
        super().__init__(spec.num_speculative_tokens)
        assert spec.model is not None
        dummy = runner.config.load_format == "dummy"
        raw, ckpt = load_drafter_checkpoint(spec.model, dummy, spec.revision, runner.config.download_dir)
        archs = raw.get("architectures") or []
        if not any("DFlash" in a for a in archs) and "dflash_config" not in raw:
            raise ValueError(f"{spec.model} is not a DFlash checkpoint (architectures={archs}).")
        tc = runner.model_config
        k = spec.num_speculative_tokens
        block = int(raw.get("block_size", 16))
        if not 1 <= k <= block - 1:
            raise ValueError(
                f"speculative_config: 'num_speculative_tokens' must be between 1 and block_size-1={block - 1} "
                f"for this DFlash drafter, got {k}."
            )
        ids = (raw.get("dflash_config") or {}).get("target_layer_ids") or raw.get("target_layer_ids")
        if not ids:
            raise ValueError(f"DFlash checkpoint {spec.model} has no dflash_config.target_layer_ids.")
        if max(ids) >= tc.num_hidden_layers:
            raise ValueError(
                f"DFlash target_layer_ids {ids} do not fit the target's {tc.num_hidden_layers} layers."
            )
        if int(raw["hidden_size"]) != tc.hidden_size:
            raise ValueError(
                f"DFlash drafter hidden_size {raw['hidden_size']} != target hidden_size {tc.hidden_size} "
                "(the drafter reads the target's embeddings)."
            )
        mask = int((raw.get("dflash_config") or {}).get("mask_token_id", raw.get("mask_token_id", -1)))
        if not 0 <= mask < tc.vocab_size:
            raise ValueError(
                f"DFlash mask_token_id {mask} is outside the target vocabulary (size {tc.vocab_size})."
            )
        max_pos = runner.max_model_len + 2 * k + 8
        self.model: DFlashDraftModel = build_model(
            runner, lambda: DFlashDraftModel(raw, tc.hidden_size, max_pos)
        )
        if dummy:
            from specserve.runner.model_runner import init_dummy_weights

            init_dummy_weights(self.model, runner.config.seed + 1)
            self.model.stack_context_weights()
        sd = {} if dummy else dict(ckpt.iter_weights(runner.dtype))
        fc = sd.get("fc.weight", sd.get("model.fc.weight"))
        if fc is not None and fc.shape[1] != len(ids) * tc.hidden_size:
            raise ValueError(
                f"DFlash fc expects a target feature of width {fc.shape[1]} but the target gives "
                f"{len(ids)} taps x hidden {tc.hidden_size} = {len(ids) * tc.hidden_size}: draft/target mismatch."
            )
        if not dummy:
            self.model.load_weights(sd.items())
        if runner.weight_layout == "kn":
            self.model.transpose_weights()
        self.model.split_gemm, self.model.triton_gemm = drafter_split_gemm(runner, self.model.layers)
        self.model.eval().requires_grad_(False)
        self.runner = runner
        self.caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.graphs: Any = None

    @property
    def tap_indices(self) -> list[int]:
        return [i + 1 for i in self.model.target_layer_ids]

    @property
    def uses_kv_cache(self) -> bool:
        return True

    def kv_cache_spec(self) -> tuple[int, int, int]:
        c = self.model.cfg
        return len(self.model.layers), c.num_key_value_heads, c.head_dim

    def bind_kv_caches(self, caches: list[tuple[torch.Tensor, torch.Tensor]], block_size: int) -> None:
        self.caches = caches
        self.graphs = self.fused = self.context = None
        runner = self.runner
        padded, capture = drafter_graph_mode(runner)
        if not padded:
            return
        from specserve.runner.cuda_graphs import BucketedGraphs, PaddedBatch, batch_buckets

        K, dev = self.num_speculative_tokens, runner.device
        max_b = runner.config.max_num_seqs
        self.query = buf = PaddedBatch(max_b, K + 1, runner.max_blocks_per_seq, dev)

        def fn(b: int) -> torch.Tensor:
            v = buf.views(b)
            meta = buf.meta(b, runner.max_model_len + K + 1, causal=False)
            embeds = runner.model.embed_tokens(v.ids)
            hidden = self.model(embeds, v.pos, meta, self.caches, runner.backend)
            return argmax_graph(runner.model.compute_logits(hidden.view(b, K + 1, -1)[:, 1:]))

        def prepare(b: int) -> None:
            buf.fill(b, [], runner.block_size)

        pool = next(iter(runner.graphs.values())).pool if getattr(runner, "graphs", None) else None
        self.graphs = BucketedGraphs(
            "dflash query pass", fn, batch_buckets(max_b), dev, capture, pool, prepare=prepare
        )

    # ------------------------------------------------------------------ fused step (greedy uniform path)
    def setup_fused_step(self, target: Any, buf: Any) -> bool:
        """The drafter half of a device-resident greedy speculative step, as its own bucketed graph.

        ``target`` are the runner's q = K+1 verify graphs, ``buf`` their static inputs (a PaddedBatch whose
        ``aux`` carries, per request, its number of real drafts and its draft budget: ``max_drafts`` before
        this step's ``n_acc`` is known, see ModelRunner.execute).  Replayed right after the target's graph on
        the target's outputs (features [b*q, F], greedy_verify's packed [b, q+1]), it does on the device what
        ``propose`` does on the host for such a step: context K/V of the committed rows, then the query pass
        over [bonus, MASK x K], and returns packed + drafts [b, q+1+K] (drafts -1 where no draft is made).
        Off with a non-padded drafter batch or the spec config's enforce_eager (today's path then).
        """
        from specserve.layers.attention import AttnMetadata

        runner, K = self.runner, self.num_speculative_tokens
        capture = self._fused_step_mode(buf, "DFlash")
        if capture is None:
            return False
        from specserve.spec.step_inputs import step_input_fns

        q, bs, backend = K + 1, runner.block_size, runner.backend
        # the per-request bookkeeping: one Triton kernel on the fused path, its torch specification elsewhere
        query_inputs = step_input_fns(backend.fused)[0]
        mask_id = self.model.mask_token_id

        def fn(b: int) -> torch.Tensor:
            assert self._fused_in is not None
            feats, packed = self._fused_in
            assert feats is not None
            v = buf.views(b)
            # ctx_slots: the verify slots of rows 0..n_acc (the input token, the accepted drafts); the query block
            # [bonus, MASK x K] at first .. first+K (first: the bonus token's position), only for real requests
            # that draft (budget left) and whose block table covers the block
            ctx_slots, ids, qpos, qslots, qseq, active = query_inputs(
                packed, v.aux, v.pos, v.slots, v.bt, v.seq, K, mask_id, bs
            )
            # 1) context K/V of the committed rows at the target's verify slots
            self.model.store_context_kv(feats, v.pos, ctx_slots, self.caches, backend)
            # 2) the query pass
            meta = AttnMetadata(
                buf.qsl[: b + 1],
                qseq,
                v.bt,
                qslots,
                max_query_len=q,
                max_seq_len=runner.max_model_len + q,
                causal=False,
            )
            hidden = self.model(runner.model.embed_tokens(ids), qpos, meta, self.caches, backend)
            drafts = argmax_graph(runner.model.compute_logits(hidden.view(b, q, -1)[:, 1:]))
            return torch.cat([packed, torch.where(active[:, None], drafts, -1)], 1)

        return self._capture_fused_step("dflash fused step", fn, target, buf, bs, capture)

    def setup_context_step(self, target: Any, buf: Any) -> bool:
        """The context K/V of a plain decode step's input tokens (one per request, at the target's q=1 slots;
        padding rows have slot -1 and write nothing), as a bucketed graph after the target's (Proposer)."""
        from specserve.runner.cuda_graphs import BucketedGraphs

        capture = self._graph_step_mode()
        if capture is None or buf.q != 1:
            return False
        runner = self.runner

        def fn(b: int) -> torch.Tensor:
            assert self._context_in is not None
            v = buf.views(b)
            self.model.store_context_kv(self._context_in, v.pos, v.slots, self.caches, runner.backend)
            return v.seq  # the graph's output is not read

        def prepare(b: int) -> None:
            buf.fill(b, [], runner.block_size)
            self._context_in = target.run(b)[1]

        self.context = BucketedGraphs(
            "dflash context step", fn, target.buckets, buf.device, capture, target.pool, prepare=prepare
        )
        self._context_in = None
        self._context_target = target
        return True

    def _query_uniform(self, inputs: list[DraftInput], drafting: list[int]) -> list[list[int]]:
        """The query pass as one graph replay over [last token, MASK x K] per drafting request."""
        assert self.graphs is not None
        K = self.num_speculative_tokens
        b = self.graphs.bucket(len(drafting))
        rows = [
            (
                [inputs[i].token_ids[-1]] + [self.model.mask_token_id] * K,
                len(inputs[i].token_ids) - 1,
                inputs[i].block_table,
            )
            for i in drafting
        ]
        self.query.fill(b, rows, self.runner.block_size)
        return scatter_drafts(inputs, drafting, self.graphs.run(b)[: len(drafting)].tolist())

    @torch.inference_mode()
    def propose(self, inputs: list[DraftInput], features: torch.Tensor | None) -> list[list[int]]:
        assert features is not None
        runner, dev = self.runner, self.runner.device
        backend = runner.backend
        # 1) context K/V for every committed position the target ran this step (all layers in one GEMM)
        rows: list[int] = []
        ctx = PagedBatch(runner)
        for inp in inputs:
            if inp.num_valid > 0:
                rows.extend(range(inp.row_offset, inp.row_offset + inp.num_valid))
                ctx.add(inp.block_table, inp.start, inp.num_valid)
        if rows:
            pos = torch.tensor(ctx.positions, dtype=torch.long, device=dev)
            slots = torch.tensor(ctx.slots, dtype=torch.long, device=dev)
            self.model.store_context_kv(
                features[torch.tensor(rows, device=dev)], pos, slots, self.caches, backend
            )
        # 2) one non-causal pass over [last token, MASK x K] for the requests that draft
        K = self.num_speculative_tokens
        drafting = [i for i, inp in enumerate(inputs) if inp.draft and inp.max_drafts > 0]
        out: list[list[int]] = [[] for _ in inputs]
        if not drafting:
            return out
        if self.graphs is not None and len(drafting) <= self.graphs.max_batch:
            return self._query_uniform(inputs, drafting)
        q = PagedBatch(runner)
        ids: list[int] = []
        for i in drafting:
            inp = inputs[i]
            n = len(inp.token_ids)
            ids.extend([inp.token_ids[-1]] + [self.model.mask_token_id] * K)
            q.add(inp.block_table, n - 1, K + 1)
        positions, meta = q.build(causal=False)
        tgt = runner.model
        embeds = tgt.embed_tokens(torch.tensor(ids, dtype=torch.long, device=dev))
        hidden = self.model(embeds, positions, meta, self.caches, backend)
        hidden = hidden.view(len(drafting), K + 1, -1)[:, 1:]
        return scatter_drafts(inputs, drafting, argmax_last(tgt.compute_logits(hidden)).tolist())
