"""Draft-model proposer (vLLM's ``draft_model``): a smaller causal LM with the target's vocabulary drafts K tokens
greedily, one forward per token, over its own paged KV cache (the target's block tables, its own pool).

Each step the draft model first runs over the positions the target committed in that step (prefill chunks, or the
verified token plus the accepted drafts), so its cache follows the committed sequence, also on steps that draft
nothing (a non-sampling prefill chunk, the draft budget at 0, ``disable_by_batch_size``). A request that drafts runs
its new bonus token in that same pass; the logits of that row give the first draft, then K-1 one-token steps give
the rest. Draft tokens' K/V land past the committed length, where the next step's pass overwrites what it keeps.
On a greedy or random uniform decode step the same work runs on the device right after the target's verify graph
(``setup_fused_step``), so only prefill chunks and host-path batches come through ``propose``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from specserve.config import ModelConfig, SpeculativeConfig
from specserve.layers.sampler import argmax_last
from specserve.models.llama import DecoderLM
from specserve.spec.drafter_utils import (
    OneTokenSteps,
    PagedBatch,
    build_model,
    drafter_graph_mode,
    drafter_split_gemm,
    paged_slots,
    scatter_drafts,
)
from specserve.spec.proposer import DraftInput, Proposer

if TYPE_CHECKING:
    from specserve.runner.model_runner import ModelRunner


class DraftModelProposer(Proposer):
    method = "draft_model"

    def __init__(self, spec: SpeculativeConfig, runner: ModelRunner) -> None:
        super().__init__(spec.num_speculative_tokens)
        assert spec.model is not None
        from specserve.layers.linear import transpose_decoder_linears
        from specserve.loading import config_only_checkpoint, resolve_checkpoint

        cfg = runner.config
        dummy = cfg.load_format == "dummy"
        trc = cfg.trust_remote_code
        ckpt = (
            config_only_checkpoint(spec.model, trust_remote_code=trc)
            if dummy
            else resolve_checkpoint(
                spec.model, trust_remote_code=trc, revision=spec.revision, download_dir=cfg.download_dir
            )
        )
        archs = list(getattr(ckpt.hf_config, "architectures", None) or [])
        for kind, method in (("DFlash", "dflash"), ("Eagle3", "eagle3"), ("Eagle", "eagle")):
            if any(kind.lower() in a.lower() for a in archs):
                raise ValueError(
                    f"speculative_config: {spec.model!r} is a {kind} drafter ({', '.join(archs)}), not a draft "
                    f'model: set "method": "{method}".'
                )
        try:
            mc = ModelConfig.from_hf(ckpt.hf_config)
        except ValueError as e:
            raise ValueError(f"speculative_config: draft model {spec.model!r}: {e}") from None
        tc = runner.model_config
        if mc.vocab_size != tc.vocab_size:
            raise ValueError(
                f"speculative_config: the draft model {spec.model!r} has a vocabulary of {mc.vocab_size} tokens, "
                f"the target {tc.vocab_size}: a draft model must share the target's tokenizer."
            )
        # no drafts past the draft model's own context (as vLLM: the draft max_model_len is the smaller one)
        runner.draft_max_model_len = min(runner.draft_max_model_len, mc.max_position_embeddings)
        max_pos = runner.max_model_len + 2 * self.num_speculative_tokens + 8
        self.model: DecoderLM = build_model(runner, lambda: DecoderLM(mc, max_position=max_pos))
        if dummy:
            from specserve.runner.model_runner import init_dummy_weights

            init_dummy_weights(self.model, cfg.seed + 1)
        else:
            self.model.load_weights(ckpt.iter_weights(runner.dtype))
        self.model.eval().requires_grad_(False)
        if runner.weight_layout == "kn":  # the target's decode GEMM layout (layers/linear.py)
            transpose_decoder_linears(self.model.layers)
        self.model.rope.to(runner.device)
        self.model.backend = runner.backend
        self.model.split_gemm, self.model.triton_gemm = drafter_split_gemm(runner, self.model.layers)
        self.runner = runner
        self.graphs: Any = None

    @property
    def uses_kv_cache(self) -> bool:
        return True

    def kv_cache_spec(self) -> tuple[int, int, int]:
        c = self.model.config
        return c.num_hidden_layers, c.num_key_value_heads, c.head_dim

    def bind_kv_caches(self, caches: list[tuple[torch.Tensor, torch.Tensor]], block_size: int) -> None:
        """Bind the draft model's paged cache; with the padded drafter batch (the default with CUDA graphs), its
        K-1 one-token steps become one bucketed graph over static inputs (token, base position, slots, block
        tables; padding rows: seq_len 0 and slot -1, no K/V write)."""
        self.model.kv_caches = caches
        self.graphs = None
        runner, K = self.runner, self.num_speculative_tokens
        padded, capture = drafter_graph_mode(runner)
        if not padded or K < 2:
            return
        from specserve.runner.cuda_graphs import BucketedGraphs, batch_buckets

        self.steps = st = OneTokenSteps(runner, K)

        def fn(b: int) -> torch.Tensor:
            tok, outs = st.tok[:b], []
            for step in range(1, K):
                pos, meta = st.meta(b, step)
                hidden, _ = self.model(tok, pos, meta)
                tok = argmax_last(self.model.compute_logits(hidden))
                outs.append(tok)
            return torch.stack(outs, 1)

        self.graphs = BucketedGraphs(
            "draft model steps", fn, batch_buckets(runner.config.max_num_seqs), runner.device, capture
        )

    # ------------------------------------------------------------------ fused step (greedy uniform path)
    def setup_fused_step(self, target: Any, buf: Any) -> bool:
        """The drafter half of a device-resident greedy speculative step (the contract of
        ``DFlashProposer.setup_fused_step``), as its own bucketed graph replayed right after the target's q = K+1
        verify graph on its packed output [b, q+1]; returns packed + drafts [b, q+1+K] (drafts -1 where no draft
        is made). On the device it does what ``propose`` does for such a step: one causal pass over K+2 rows per
        request from the verify's first position, rows 0..n_acc the committed tokens (the input token, the
        accepted drafts) and row n_acc+1 the bonus token, whose logits give the first draft; then K-1 one-token
        steps from the bonus position. Rows past the bonus run too (static shapes) but write no K/V, and causal
        attention keeps them out of the earlier rows' results; the bonus row writes its K/V only when the request
        drafts (as ``propose``). Off without the padded drafter graphs (K = 1 has none) or with the spec config's
        enforce_eager; the target's features are not used (a draft model reads only tokens).
        """
        from specserve.layers.attention import AttnMetadata

        runner, K = self.runner, self.num_speculative_tokens
        capture = self._fused_step_mode(buf, "draft model")
        if capture is None:
            return False
        q, r, bs, dev = K + 1, K + 2, runner.block_size, runner.device
        cols = torch.arange(r, device=dev)
        steps = torch.arange(1, K, device=dev)
        qsl = torch.arange(runner.config.max_num_seqs + 1, dtype=torch.int32, device=dev) * r
        max_seq = runner.max_model_len + 2 * r

        def fn(b: int) -> torch.Tensor:
            assert self._fused_in is not None
            _, packed = self._fused_in
            v = buf.views(b)
            num_draft = v.aux[:, 0].long().clamp(0, K)
            budget = v.aux[:, 1].long()  # max_drafts = max(0, budget - n_acc)
            n_acc = torch.minimum(packed[:, q].clamp(0, K), num_draft)
            bonus = packed.gather(1, n_acc[:, None])
            first = v.pos.view(b, q)[:, 0]
            real = v.seq > 0
            # positions first .. first+K+1; the bonus at first+n_acc+1, the K-1 steps after it
            pos = first[:, None] + cols[None, :]
            pslots, ok = paged_slots(v.bt, pos, bs)
            spos = (first + n_acc + 1)[:, None] + steps[None, :]  # [b, K-1]
            sslots, sok = paged_slots(v.bt, spos, bs)
            covered = sok.all(1) & ok.gather(1, (n_acc + 1)[:, None])[:, 0]
            active = real & covered & (budget > n_acc)
            # 1) the committed rows + the bonus row
            ids = torch.cat([v.ids.view(b, q), bonus], 1)
            toks = torch.where(cols[None, :] <= n_acc[:, None], ids, bonus).reshape(-1)
            write = (cols[None, :] <= n_acc[:, None]) | (
                (cols[None, :] == (n_acc + 1)[:, None]) & active[:, None]
            )
            slots = torch.where(write & ok & real[:, None], pslots, -1).view(-1)
            seq = torch.where(real, first + r, 0).to(torch.int32)
            meta = AttnMetadata(qsl[: b + 1], seq, v.bt, slots, max_query_len=r, max_seq_len=max_seq)
            hidden, _ = self.model(toks, torch.where(real[:, None], pos, 0).view(-1), meta)
            sel = torch.arange(b, device=dev) * r + n_acc + 1
            tok = argmax_last(self.model.compute_logits(hidden[sel]))
            # 2) steps 1..K-1 at bonus + 1 .. bonus + K - 1 for the requests that draft
            sslots = torch.where(active[:, None], sslots, -1)
            outs = [tok]
            for j in range(K - 1):
                p = torch.where(active, spos[:, j], 0)
                m = AttnMetadata(
                    qsl[: b + 1] // r,
                    ((p + 1) * active).to(torch.int32),
                    v.bt,
                    sslots[:, j],
                    max_query_len=1,
                    max_seq_len=max_seq,
                )
                hidden, _ = self.model(tok, p, m)
                tok = argmax_last(self.model.compute_logits(hidden))
                outs.append(tok)
            drafts = torch.stack(outs, 1)
            return torch.cat([packed, torch.where(active[:, None], drafts, -1)], 1)

        return self._capture_fused_step("draft model fused step", fn, target, buf, bs, capture)

    def _eager_attention(self) -> tuple[int, int, int] | None:
        c = self.model.config
        return c.num_attention_heads, c.num_key_value_heads, c.head_dim

    def _eager_pass(self, q: int, positions: torch.Tensor, meta: Any) -> None:
        hidden, _ = self.model(torch.zeros(q, dtype=torch.long, device=self.runner.device), positions, meta)
        argmax_last(self.model.compute_logits(hidden[-1:]))

    def propose(self, inputs: list[DraftInput], features: torch.Tensor | None) -> list[list[int]]:
        runner, dev = self.runner, self.runner.device
        # 1) one causal pass over each request's committed rows of this step (+ its bonus token when it drafts)
        ids: list[int] = []
        batch = PagedBatch(runner)
        last_row: dict[int, int] = {}
        for i, inp in enumerate(inputs):
            if inp.num_valid <= 0:
                continue
            drafting = inp.draft and inp.max_drafts > 0
            n = inp.num_valid + int(drafting)
            ids.extend(inp.token_ids[inp.start : inp.start + n])
            batch.add(inp.block_table, inp.start, n)
            if drafting:
                last_row[i] = len(ids) - 1
        out: list[list[int]] = [[] for _ in inputs]
        if not ids:
            return out
        positions, meta = batch.build()
        hidden, _ = self.model(torch.tensor(ids, dtype=torch.long, device=dev), positions, meta)
        if not last_row:
            return out
        drafting_idx = list(last_row)
        rows = torch.tensor([last_row[i] for i in drafting_idx], device=dev)
        tok = argmax_last(self.model.compute_logits(hidden[rows]))
        drafts = [tok]
        # 2) K-1 one-token steps from each bonus token's position
        bonus_pos = [len(inputs[i].token_ids) - 1 for i in drafting_idx]
        if self.graphs is not None and len(drafting_idx) <= self.graphs.max_batch:
            # steps 2..K as one replay of the bucket's graph
            b = self.graphs.bucket(len(drafting_idx))
            self.steps.fill(inputs, drafting_idx, bonus_pos, b, tok)
            rest = self.graphs.run(b)[: len(drafting_idx)]
            return scatter_drafts(inputs, drafting_idx, torch.cat([tok[:, None], rest], 1).tolist())
        for step in range(1, self.num_speculative_tokens):
            b = PagedBatch(runner)
            for i, p in zip(drafting_idx, bonus_pos):
                b.add(inputs[i].block_table, p + step, 1)
            positions, meta = b.build()
            hidden, _ = self.model(tok, positions, meta)
            tok = argmax_last(self.model.compute_logits(hidden))
            drafts.append(tok)
        return scatter_drafts(inputs, drafting_idx, torch.stack(drafts, dim=1).tolist())
