"""EAGLE-3 proposer: a first pass over the committed positions (token shifted by one + fused target taps),
then K-1 autoregressive steps feeding back the head's pre-norm hidden state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from specserve.config import SpeculativeConfig
from specserve.layers.sampler import argmax_last
from specserve.models.eagle3 import Eagle3DraftModel
from specserve.spec.drafter_utils import (
    OneTokenSteps,
    PagedBatch,
    build_model,
    drafter_graph_mode,
    load_drafter_checkpoint,
    paged_slots,
    scatter_drafts,
)
from specserve.spec.proposer import DraftInput, Proposer

if TYPE_CHECKING:
    from specserve.runner.model_runner import ModelRunner


class Eagle3Proposer(Proposer):
    method = "eagle3"

    def __init__(self, spec: SpeculativeConfig, runner: ModelRunner) -> None:
        super().__init__(spec.num_speculative_tokens)
        assert spec.model is not None
        dummy = runner.config.load_format == "dummy"
        raw, ckpt = load_drafter_checkpoint(spec.model, dummy, spec.revision, runner.config.download_dir)
        tc = runner.model_config
        L = tc.num_hidden_layers
        ids = raw.get("eagle_aux_hidden_state_layer_ids") or (raw.get("eagle_config") or {}).get(
            "eagle_aux_hidden_state_layer_ids"
        )
        # vLLM convention: id i = the residual stream entering layer i = HF hidden_states[i]
        self._taps = [int(i) for i in ids] if ids else [2, L // 2, L - 3]
        if max(self._taps) > L:
            raise ValueError(f"EAGLE-3 aux layer ids {self._taps} do not fit the target's {L} layers.")
        th = int(raw.get("target_hidden_size") or tc.hidden_size)
        if th != tc.hidden_size:
            raise ValueError(
                f"EAGLE-3 head expects target hidden size {th}, the target has {tc.hidden_size}."
            )
        raw = dict(raw, eagle_aux_hidden_state_layer_ids=self._taps)
        max_pos = runner.max_model_len + 2 * self.num_speculative_tokens + 8
        self.model: Eagle3DraftModel = build_model(
            runner, lambda: Eagle3DraftModel(raw, tc.hidden_size, tc.vocab_size, max_pos)
        )
        if dummy:
            from specserve.runner.model_runner import init_dummy_weights

            init_dummy_weights(self.model, runner.config.seed + 1)
        else:
            self.model.load_weights(ckpt.iter_weights(runner.dtype))
        if runner.weight_layout == "kn":  # the target's decode GEMM layout (layers/linear.py)
            self.model.transpose_weights()
        self.model.eval().requires_grad_(False)
        if self.model.lm_head is None and self.model.draft_vocab_size != tc.vocab_size:
            raise ValueError(
                f"EAGLE-3 head has no lm_head and draft_vocab_size {self.model.draft_vocab_size} != target "
                f"vocab {tc.vocab_size}."
            )
        if self.model.cfg.hidden_size != tc.hidden_size and (self.model.embed_tokens is None):
            raise ValueError("EAGLE-3 head with a different hidden size needs its own embed_tokens.")
        self.runner = runner
        self.cache: tuple[torch.Tensor, torch.Tensor] | None = None
        self.graphs: Any = None

    @property
    def tap_indices(self) -> list[int]:
        return self._taps

    @property
    def uses_kv_cache(self) -> bool:
        return True

    @property
    def drop_last_cached_block(self) -> bool:
        return True

    def kv_cache_spec(self) -> tuple[int, int, int]:
        c = self.model.cfg
        return 1, c.num_key_value_heads, c.head_dim

    def bind_kv_caches(self, caches: list[tuple[torch.Tensor, torch.Tensor]], block_size: int) -> None:
        self.cache = caches[0]
        self.graphs = self.fused = None
        runner, K = self.runner, self.num_speculative_tokens
        cfg = runner.config
        padded, capture = drafter_graph_mode(runner)
        if not padded or K < 2:
            return
        from specserve.runner.cuda_graphs import BucketedGraphs, batch_buckets

        dev, max_b = runner.device, cfg.max_num_seqs
        self.steps = st = OneTokenSteps(runner, K)
        self.e_hidden = torch.zeros((max_b, self.model.cfg.hidden_size), dtype=runner.dtype, device=dev)

        def fn(b: int) -> torch.Tensor:
            tok, hidden, outs = st.tok[:b], self.e_hidden[:b], []
            for step in range(1, K):
                pos, meta = st.meta(b, step)
                hidden, normed = self.model(self._embed(tok), hidden, pos, meta, self.cache, runner.backend)
                tok = self._draft_tokens(normed)
                outs.append(tok)
            return torch.stack(outs, 1)

        self.graphs = BucketedGraphs("eagle3 draft steps", fn, batch_buckets(max_b), dev, capture)

    # ------------------------------------------------------------------ fused step (greedy uniform path)
    def setup_fused_step(self, target: Any, buf: Any) -> bool:
        """The drafter half of a device-resident greedy speculative step (the contract of
        ``DFlashProposer.setup_fused_step``), as its own bucketed graph replayed right after the target's q = K+1
        verify graph on its outputs (features [b*q, F], greedy_verify's packed [b, q+1]); returns packed + drafts
        [b, q+1+K] (drafts -1 where no draft is made). On the device it does what ``propose`` does for such a
        step: the first pass over the committed rows 0..n_acc (row j reads the token at the next position: the
        accepted draft j+1, or the bonus token for row n_acc), then K-1 autoregressive steps from row n_acc.
        Rows past n_acc run too (static shapes) but write no K/V, and causal attention keeps them out of the
        committed rows' results. Off without the padded drafter graphs or with the spec config's enforce_eager.
        """
        from specserve.layers.attention import AttnMetadata

        runner, K = self.runner, self.num_speculative_tokens
        capture = self._fused_step_mode(buf, "EAGLE-3")
        if capture is None:
            return False
        q, bs, dev = K + 1, runner.block_size, runner.device
        cols = torch.arange(q, device=dev)
        steps = torch.arange(1, K, device=dev)
        backend = runner.backend
        max_seq = runner.max_model_len + 2 * q

        def fn(b: int) -> torch.Tensor:
            assert self._fused_in is not None
            feats, packed = self._fused_in
            v = buf.views(b)
            num_draft = v.aux[:, 0].long().clamp(0, K)
            budget = v.aux[:, 1].long()  # max_drafts = max(0, budget - n_acc)
            n_acc = torch.minimum(packed[:, q].clamp(0, K), num_draft)
            bonus = packed.gather(1, n_acc[:, None])
            # 1) first pass over rows 0..K at the verify's positions and slots; only rows 0..n_acc write K/V
            ids = v.ids.view(b, q)
            nxt = torch.cat([ids[:, 1:], bonus], 1)
            toks = torch.where(cols[None, :] < n_acc[:, None], nxt, bonus).reshape(-1)
            slots = torch.where(cols[None, :] <= n_acc[:, None], v.slots.view(b, q), -1).view(-1)
            meta = AttnMetadata(buf.qsl[: b + 1], v.seq, v.bt, slots, max_query_len=q, max_seq_len=max_seq)
            hidden_in = self.model.fc(feats)
            prenorm, normed = self.model(self._embed(toks), hidden_in, v.pos, meta, self.cache, backend)
            sel = torch.arange(b, device=dev) * q + n_acc
            hidden, tok = prenorm[sel], self._draft_tokens(normed[sel])
            # 2) steps 1..K-1 at last + 1 .. last + K - 1 (last: the last committed position) for the requests that
            #    draft (budget left) and whose block table covers those positions
            last = v.pos.view(b, q)[:, 0] + n_acc
            spos = last[:, None] + steps[None, :]  # [b, K-1]
            sslots, covered = paged_slots(v.bt, spos, bs)
            active = (v.seq > 0) & covered.all(1) & (budget > n_acc)
            sslots = torch.where(active[:, None], sslots, -1)
            outs = [tok]
            for j in range(K - 1):
                pos = torch.where(active, spos[:, j], 0)
                seq = ((pos + 1) * active).to(torch.int32)
                m = AttnMetadata(
                    buf.qsl[: b + 1] // q, seq, v.bt, sslots[:, j], max_query_len=1, max_seq_len=max_seq
                )
                hidden, normed = self.model(self._embed(tok), hidden, pos, m, self.cache, backend)
                tok = self._draft_tokens(normed)
                outs.append(tok)
            drafts = torch.stack(outs, 1)
            return torch.cat([packed, torch.where(active[:, None], drafts, -1)], 1)

        return self._capture_fused_step("eagle3 fused step", fn, target, buf, bs, capture)

    def _steps_uniform(
        self,
        inputs: list[DraftInput],
        drafting: list[int],
        tok: torch.Tensor,
        hidden: torch.Tensor,
        last_pos: list[int],
    ) -> list[list[int]]:
        """Steps 2..K as one graph replay: static token/hidden/positions/slots for the bucket."""
        n = len(drafting)
        b = self.graphs.bucket(n)
        self.steps.fill(inputs, drafting, last_pos, b, tok)
        self.e_hidden[:n].copy_(hidden)
        rest = self.graphs.run(b)[:n]
        return scatter_drafts(inputs, drafting, torch.cat([tok[:, None], rest], 1).tolist())

    def _eager_attention(self) -> tuple[int, int, int] | None:
        c = self.model.cfg
        return None if self.cache is None else (c.num_attention_heads, c.num_key_value_heads, c.head_dim)

    def _eager_pass(self, q: int, positions: torch.Tensor, meta: Any) -> None:
        assert self.cache is not None
        runner = self.runner
        width = len(self._taps) * runner.model_config.hidden_size
        hidden_in = self.model.fc(torch.zeros((q, width), dtype=runner.dtype, device=runner.device))
        embeds = self._embed(torch.zeros(q, dtype=torch.long, device=runner.device))
        _, normed = self.model(embeds, hidden_in, positions, meta, self.cache, runner.backend)
        self._draft_tokens(normed[-1:])

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        emb = self.model.embed_tokens or self.runner.model.embed_tokens
        return emb(ids)

    def _draft_tokens(self, normed: torch.Tensor) -> torch.Tensor:
        head = self.model.lm_head or self.runner.model.lm_head
        return self.model.to_target_ids(argmax_last(head(normed)))

    @torch.inference_mode()
    def propose(self, inputs: list[DraftInput], features: torch.Tensor | None) -> list[list[int]]:
        assert features is not None and self.cache is not None
        runner, dev, backend = self.runner, self.runner.device, self.runner.backend
        rows: list[int] = []
        toks: list[int] = []
        batch = PagedBatch(runner)
        last_row: dict[int, int] = {}
        for i, inp in enumerate(inputs):
            if inp.num_valid <= 0:
                continue
            rows.extend(range(inp.row_offset, inp.row_offset + inp.num_valid))
            # position p reads the token at p+1 with the target feature at p
            toks.extend(inp.token_ids[inp.start + 1 : inp.start + inp.num_valid + 1])
            batch.add(inp.block_table, inp.start, inp.num_valid)
            last_row[i] = len(rows) - 1
        out: list[list[int]] = [[] for _ in inputs]
        if not rows:
            return out
        positions, meta = batch.build()
        hidden_in = self.model.fc(features[torch.tensor(rows, device=dev)])
        embeds = self._embed(torch.tensor(toks, dtype=torch.long, device=dev))
        prenorm, normed = self.model(embeds, hidden_in, positions, meta, self.cache, backend)
        drafting = [i for i, inp in enumerate(inputs) if inp.draft and inp.max_drafts > 0 and i in last_row]
        if not drafting:
            return out
        sel = torch.tensor([last_row[i] for i in drafting], device=dev)
        hidden = prenorm[sel]
        tok = self._draft_tokens(normed[sel])
        drafts = [tok]
        # positions of the last committed row per drafting request
        last_pos = [inputs[i].start + inputs[i].num_valid - 1 for i in drafting]
        if self.graphs is not None and len(drafting) <= self.graphs.max_batch:
            return self._steps_uniform(inputs, drafting, tok, hidden, last_pos)
        for step in range(1, self.num_speculative_tokens):
            b = PagedBatch(runner)
            for i, p in zip(drafting, last_pos):
                b.add(inputs[i].block_table, p + step, 1)
            positions, meta = b.build()
            hidden, normed = self.model(self._embed(tok), hidden, positions, meta, self.cache, backend)
            tok = self._draft_tokens(normed)
            drafts.append(tok)
        return scatter_drafts(inputs, drafting, torch.stack(drafts, 1).tolist())
