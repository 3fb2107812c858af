"""The drafters' eager passes compile nothing inside requests (issue #6: graphs captured at start; session 28's
GPU check found EAGLE-3's first request compiling two attention forms, ~1.3 s).

Triton compiles a kernel once per form: its constexprs plus, per integer argument, whether it is 1 or a multiple of
16 and, per pointer, whether it is 16-byte aligned. The graphs' forms are compiled by their warm-up runs at capture;
``propose``'s first pass runs eagerly (over a new prompt's rows, or a few rows to catch up at a long context), so
the runner runs it at start (``Proposer.warm_eager_passes``) at every (rows, context) form it can take
(``drafter_utils.eager_warm_shapes``), and every eager step's block table has the graphs' width. Here (CPU, the
Triton interpreter: no compiles, but the same launches; the KV split count picked as on a GPU, at short contexts)
every attention launch outside the graphs during requests must have a form the warm-up launched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from drafters import make_eagle3

import specserve.layers.triton_attention as ta
import specserve.runner.cuda_graphs as cg
from specserve import LLM, SamplingParams

VOCAB = 49152


def _form(args: tuple, kwargs: dict) -> tuple:
    ints = tuple(
        "1" if a == 1 else "16" if a % 16 == 0 else "n"
        for a in args
        if isinstance(a, int) and not isinstance(a, bool)
    )
    aligned = tuple(a.data_ptr() % 16 == 0 for a in args if isinstance(a, torch.Tensor))
    return tuple(sorted(kwargs.items())), ints, aligned


@pytest.fixture
def forms(monkeypatch):  # type: ignore[no-untyped-def]
    """Every attention launch as (inside a graph's run, form)."""
    seen: list[tuple[bool, tuple]] = []
    depth = [0]
    real, run = ta._paged_attn_kernel, cg.BucketedGraphs.run

    class Spy:
        def __getitem__(self, grid):  # type: ignore[no-untyped-def]
            def launch(*a, **k):  # type: ignore[no-untyped-def]
                seen.append((depth[0] > 0, _form(a, k)))
                return real[grid](*a, **k)

            return launch

    def graph_run(self, b):  # type: ignore[no-untyped-def]
        depth[0] += 1
        try:
            return run(self, b)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(ta, "_paged_attn_kernel", Spy())
    monkeypatch.setattr(cg.BucketedGraphs, "run", graph_run)
    return seen


def _gpu_like_splits(device, num_programs, block_n, max_seq_len, max_query_len):  # type: ignore[no-untyped-def]
    """The CUDA heuristic's shape (no split past SPLIT_MAX_QUERY_LEN rows, more splits at doublings of the context)
    at this test's short contexts: 1 KV split below 32 keys, 2 from 32."""
    if max_query_len > ta.SPLIT_MAX_QUERY_LEN or max_seq_len is None:
        return 1
    return 2 if max_seq_len >= 32 else 1


@pytest.mark.parametrize("method", ["eagle3", "draft_model"])
def test_eager_drafter_passes_are_warmed(
    method, tiny2_qwen3_dir, smol_tokenizer, tmp_path, forms, monkeypatch
):  # type: ignore[no-untyped-def]
    if method == "eagle3":
        # (GQA group 8: the query tiles hold 2-16 rows, so the warm-up's passes are few and short here)
        drafter = make_eagle3(tmp_path / "eagle", 64, 2, VOCAB, heads=(8, 1))
        cfg = json.loads((Path(drafter) / "config.json").read_text())
        cfg["eagle_aux_hidden_state_layer_ids"] = [0, 1, 2]
        (Path(drafter) / "config.json").write_text(json.dumps(cfg))
    else:  # a one-layer Qwen3 on the target's vocabulary (head dim 16, GQA group 8 too)
        from conftest import build_tiny

        drafter = build_tiny(
            "qwen3",
            tmp_path / "d1",
            smol_tokenizer,
            seed=5,
            num_hidden_layers=1,
            num_attention_heads=8,
            num_key_value_heads=1,
        )
    llm = LLM(tiny2_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=2, padded_decode=True,
              attention_backend="triton", speculative_config={"method": method, "model": drafter,
                                                              "num_speculative_tokens": 3})  # fmt: skip
    runner = llm.engine.runner
    monkeypatch.setattr(ta, "_pick_num_splits", _gpu_like_splits)  # (the CPU's is 1)
    monkeypatch.setattr(ta, "SPLIT_MAX_QUERY_LEN", 16)  # (64: warm passes of up to 65 rows, slow interpreted)
    assert not forms  # CPU: nothing captured, nothing warmed at start
    assert runner.proposer.warm_eager_passes() >= 3
    warmed = {f for _, f in forms}
    assert len(warmed) >= 3  # one form per query tile
    del forms[:]
    # every eager step's block table has the graphs' width (its stride: one form)
    meta = runner.build_metadata([3], [3], [[5]], [-1] * 3)
    assert meta.block_tables.shape == (1, runner.max_blocks_per_seq) and meta.block_tables[0, 0] == 5
    # a 30-token prompt: the first pass over it in the prefill step, then a catch-up pass of a few rows at a
    # longer context when the request's last step drafts nothing
    ids = torch.randint(100, 4000, (30,), generator=torch.Generator().manual_seed(0)).tolist()
    llm.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    eager = {f for in_graph, f in forms if not in_graph}
    assert len(eager) >= 2  # passes in different query tiles
    assert any(dict(f[0])["NUM_SPLITS"] > 1 for f in eager)  # and one that splits the keys
    assert eager <= warmed, [dict(f[0]).get("BLOCK_M") for f in eager - warmed]
