"""The float32 CPU projections as ``W @ x.T`` (specserve/layers/linear.py ``linear_rows``, on by default for float32
on CPU): same values as nn.Linear, every plain nn.Linear of target and drafter switched (tied weights kept), the
switch controlled by SPECSERVE_CPU_GEMM, and the engine's greedy tokens unchanged, plain and speculative."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specserve.layers.linear import CPU_MM_MAX_ROWS, CpuRowsLinear, cpu_mm_enabled, linear_rows, use_cpu_mm


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "shape", [(1, 24), (2, 24), (5, 24), (3, 4, 24), (1, 1, 24), (CPU_MM_MAX_ROWS + 1, 24)]
)
def test_linear_rows_matches_f_linear(bias, shape):
    torch.manual_seed(0)
    w = torch.randn(40, 24)
    b = torch.randn(40) if bias else None
    x = torch.randn(*shape)
    y = linear_rows(x, w, b)
    assert y.shape == (*shape[:-1], 40) and y.is_contiguous()
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
    # a non-contiguous input (a column slice) and an empty one
    xs = torch.randn(*shape[:-1], 48)[..., ::2]
    torch.testing.assert_close(
        linear_rows(xs, w, b), torch.nn.functional.linear(xs, w, b), rtol=1e-5, atol=1e-5
    )
    assert linear_rows(torch.randn(0, 24), w, b).shape == (0, 40)


def test_linear_rows_keeps_autograd_on_nn_linear_path():
    w = torch.randn(8, 4, requires_grad=True)
    linear_rows(torch.randn(3, 4), w).sum().backward()  # falls back to F.linear: gradients flow
    assert w.grad is not None and w.grad.shape == (8, 4)


def test_use_cpu_mm_switches_plain_linears_only_and_keeps_tied_weights():
    emb = nn.Embedding(50, 16)
    model = nn.ModuleDict(
        {"a": nn.Linear(16, 16), "b": nn.Sequential(nn.Linear(16, 8), nn.ReLU()), "head": nn.Linear(16, 50)}
    )
    model["head"].weight = emb.weight
    x = torch.randn(3, 16)
    ref = model["head"](model["a"](x))
    assert use_cpu_mm(model) == 3
    assert use_cpu_mm(model) == 0  # already switched
    assert all(type(m) is CpuRowsLinear for m in model.modules() if isinstance(m, nn.Linear))
    assert model["head"].weight is emb.weight  # the same parameter, not a copy
    torch.testing.assert_close(model["head"](model["a"](x)), ref, rtol=1e-5, atol=1e-5)


def test_cpu_mm_setting(monkeypatch):
    monkeypatch.delenv("SPECSERVE_CPU_GEMM", raising=False)
    assert cpu_mm_enabled("cpu", torch.float32)
    assert not cpu_mm_enabled("cpu", torch.bfloat16)  # measured for float32 only
    assert not cpu_mm_enabled("cuda", torch.float32)
    monkeypatch.setenv("SPECSERVE_CPU_GEMM", "linear")
    assert not cpu_mm_enabled("cpu", torch.float32)
    monkeypatch.setenv("SPECSERVE_CPU_GEMM", "MM")
    assert cpu_mm_enabled("cpu", torch.bfloat16)
    assert not cpu_mm_enabled("cuda", torch.float32)
    monkeypatch.setenv("SPECSERVE_CPU_GEMM", "fast")
    with pytest.raises(ValueError, match="SPECSERVE_CPU_GEMM must be 'mm' or 'linear'"):
        cpu_mm_enabled("cpu", torch.float32)


def test_engine_tokens_unchanged_with_cpu_mm(tiny_qwen3_dir, tmp_path, monkeypatch):
    from drafters import make_dflash, make_eagle3

    from specserve import LLM, SamplingParams

    prompts = ["The capital of France is", "1 2 3 4 5 6", "def f(x):"]
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    kw = dict(dtype="float32", device="cpu", num_gpu_blocks=48)
    outs = {}
    for mode in ("linear", "mm"):
        monkeypatch.setenv("SPECSERVE_CPU_GEMM", mode)
        llm = LLM(tiny_qwen3_dir, **kw)
        runner = llm.engine.runner
        n_mm = sum(type(m) is CpuRowsLinear for m in runner.model.modules())
        assert runner.cpu_mm == (mode == "mm")
        assert n_mm == ((4 * len(runner.model.layers) + 1) if mode == "mm" else 0)  # + the LM head
        outs[mode] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    assert outs["mm"] == outs["linear"]
    cfg = runner.model.config
    drafters = {
        "dflash": make_dflash(
            tmp_path / "d", cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, layer_ids=[0, 1]
        ),
        "eagle3": make_eagle3(tmp_path / "e", cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size),
    }
    for method, path in drafters.items():
        spec = {"method": method, "model": path, "num_speculative_tokens": 4}
        llm = LLM(tiny_qwen3_dir, speculative_config=spec, **kw)
        draft = llm.engine.runner.proposer.model  # type: ignore[union-attr]
        assert any(type(m) is CpuRowsLinear for m in draft.modules())
        assert not any(type(m) is nn.Linear for m in draft.modules())
        if method == "dflash":
            assert draft.cpu_mm
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, sp)] == outs["linear"]  # lossless
        assert llm.get_metrics()["spec_decode_num_drafts"] > 0
