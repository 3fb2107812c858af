"""The drafters' eager passes compile nothing inside requests (issue #6: graphs captured at start; session 28's
GPU check found EAGLE-3's first request compiling two attention forms, ~1.3 s).

Triton compiles a kernel once per form: its constexprs plus, per integer argument, whether it is 1 or a multiple of
16 and, per pointer, whether it is 16-byte aligned. The graphs' forms are compiled by their warm-up runs at capture;
``propose``'s first pass over a new prompt's rows runs eagerly (its row count is the prompt's), so the runner runs
it at start (``Proposer.warm_eager_passes``) at one prompt length per attention form, and every eager step's block
table has the graphs' width. Here (CPU, the Triton interpreter: no compiles, but the same launches) every
attention launch outside the graphs during requests must have a form the warm-up launched."""

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


@pytest.mark.parametrize("method", ["eagle3", "draft_model"])
def test_eager_drafter_passes_are_warmed(method, tiny2_qwen3_dir, tmp_path, forms):  # type: ignore[no-untyped-def]
    if method == "eagle3":
        drafter = make_eagle3(tmp_path / "eagle", 64, 2, VOCAB)
        cfg = json.loads((Path(drafter) / "config.json").read_text())
        cfg["eagle_aux_hidden_state_layer_ids"] = [0, 1, 2]
        (Path(drafter) / "config.json").write_text(json.dumps(cfg))
    else:
        drafter = tiny2_qwen3_dir
    llm = LLM(tiny2_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=2, padded_decode=True,
              attention_backend="triton", speculative_config={"method": method, "model": drafter,
                                                              "num_speculative_tokens": 3})  # fmt: skip
    runner = llm.engine.runner
    assert not forms  # CPU: nothing captured, nothing warmed at start
    assert runner.proposer.warm_eager_passes() >= 3
    warmed = {f for _, f in forms}
    assert len(warmed) >= 3  # one form per query tile
    del forms[:]
    g = torch.Generator().manual_seed(0)
    # prompts of one block, of 2-3 blocks and (EAGLE-3) of 16 blocks: the old per-step table width, a multiple of
    # 16. One token each: the first pass over the prompt runs in the prefill step.
    for n in (3, 20, 40, 250) if method == "eagle3" else (3, 40):
        ids = torch.randint(100, 4000, (n,), generator=g).tolist()
        llm.generate(
            [{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        )
    eager = {f for in_graph, f in forms if not in_graph}
    assert len(eager) >= 2  # the passes of prompts in different query tiles
    assert eager <= warmed, [dict(f[0]).get("BLOCK_M") for f in eager - warmed]
