"""The transposed decode GEMM layout (specserve/layers/linear.py; the default for large CUDA targets,
SPECSERVE_WEIGHT_LAYOUT=kn elsewhere): the transposed projections compute what nn.Linear computes, and the
engine's greedy tokens do not change (plain and DFlash)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specserve.layers.linear import TransposedLinear, transpose_decoder_linears, weight_layout


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(5, 24), (2, 3, 24)])
def test_transposed_linear_matches_nn_linear(bias, shape):
    torch.manual_seed(0)
    lin = nn.Linear(24, 40, bias=bias)
    t = TransposedLinear(lin)
    assert t.weight_t.shape == (24, 40) and t.weight_t.is_contiguous()
    assert torch.equal(t.weight_t.t(), lin.weight)
    x = torch.randn(*shape)
    torch.testing.assert_close(t(x), lin(x), rtol=1e-5, atol=1e-6)


def test_default_layout_transposes_large_cuda_targets_only(monkeypatch):
    monkeypatch.delenv("SPECSERVE_WEIGHT_LAYOUT", raising=False)
    assert weight_layout() == "nk"
    assert weight_layout("cpu", 4096) == "nk"  # measured on the H200 only
    assert weight_layout("cuda", 576) == "nk"  # SmolLM2: launch-bound, no gain
    assert weight_layout(torch.device("cuda", 0), 4096) == "kn"  # Qwen3-8B shape: -4.7% per decode step
    monkeypatch.setenv("SPECSERVE_WEIGHT_LAYOUT", "nk")
    assert weight_layout("cuda", 4096) == "nk"
    monkeypatch.setenv("SPECSERVE_WEIGHT_LAYOUT", "KN")
    assert weight_layout("cpu", 64) == "kn"


def test_bad_layout_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("SPECSERVE_WEIGHT_LAYOUT", "tn")
    with pytest.raises(ValueError, match="SPECSERVE_WEIGHT_LAYOUT must be 'nk' or 'kn'"):
        weight_layout()


@pytest.mark.parametrize("fixture", ["tiny_qwen3_dir", "tiny_qwen2_dir"])  # qwen2: q/k/v biases (addmm)
def test_engine_tokens_unchanged_with_transposed_weights(fixture, request, tmp_path, monkeypatch):
    from drafters import make_dflash

    from specserve import LLM, SamplingParams

    path = request.getfixturevalue(fixture)
    prompts = ["The capital of France is", "1 2 3 4 5 6", "def f(x):"]
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    kw = dict(dtype="float32", device="cpu", num_gpu_blocks=32)
    outs = {}
    for layout in ("nk", "kn"):
        monkeypatch.setenv("SPECSERVE_WEIGHT_LAYOUT", layout)
        llm = LLM(path, **kw)
        model = llm.engine.runner.model
        n_t = sum(isinstance(m, TransposedLinear) for m in model.modules())
        assert n_t == (4 * len(model.layers) if layout == "kn" else 0)
        outs[layout] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    assert outs["kn"] == outs["nk"]
    # lossless speculation on the transposed target: DFlash K=4 emits the plain tokens
    cfg = llm.engine.runner.model.config
    dflash = make_dflash(
        tmp_path / "d", cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, layer_ids=[0, 1]
    )
    spec = {"method": "dflash", "model": dflash, "num_speculative_tokens": 4}
    llm = LLM(path, speculative_config=spec, **kw)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, sp)] == outs["nk"]
    assert llm.get_metrics()["spec_decode_num_drafts"] > 0


def test_transpose_decoder_linears_counts_and_is_idempotent(tiny_qwen3_dir):
    from specserve import LLM

    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", num_gpu_blocks=8)
    layers = llm.engine.runner.model.layers
    assert transpose_decoder_linears(layers) == 4 * len(layers)
    assert transpose_decoder_linears(layers) == 0  # already transposed: nothing to do


def test_drafters_follow_the_transposed_layout(often_qwen3_dir, tmp_path, monkeypatch):
    """DFlash K=4 and EAGLE-3 K=3 on a transposed target are transposed with it (projections + fc), stay lossless,
    and draft what the nn.Linear layout drafts (the same accepted counts per position; the target here makes
    half the drafts right, so a wrong transposed drafter would show)."""
    from drafters import make_dflash, make_eagle3

    from specserve import LLM, SamplingParams

    prompts = ["The capital of France is", "1 2 3 4 5 6", "def f(x):"]
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    kw = dict(dtype="float32", device="cpu", num_gpu_blocks=32)
    monkeypatch.setenv("SPECSERVE_WEIGHT_LAYOUT", "nk")
    llm = LLM(often_qwen3_dir, **kw)
    plain = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    cfg = llm.engine.runner.model.config
    dflash = make_dflash(
        tmp_path / "d", cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, layer_ids=[0, 1]
    )
    eagle = make_eagle3(tmp_path / "e", cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size)
    for spec in (
        {"method": "dflash", "model": dflash, "num_speculative_tokens": 4},
        {"method": "eagle3", "model": eagle, "num_speculative_tokens": 3},
    ):
        accepted = {}
        for layout in ("nk", "kn"):
            monkeypatch.setenv("SPECSERVE_WEIGHT_LAYOUT", layout)
            llm = LLM(often_qwen3_dir, speculative_config=spec, **kw)
            drafter = llm.engine.runner.proposer.model
            n_t = sum(isinstance(m, TransposedLinear) for m in drafter.modules())
            n_layers = len(drafter.layers) if spec["method"] == "dflash" else 1
            assert n_t == (4 * n_layers + 1 if layout == "kn" else 0)  # + fc
            assert [o.outputs[0].token_ids for o in llm.generate(prompts, sp)] == plain
            m = llm.get_metrics()
            accepted[layout] = m["spec_decode_num_accepted_tokens_per_pos"]
        assert sum(accepted["nk"]) > 0, spec["method"]
        assert accepted["kn"] == accepted["nk"], spec["method"]
