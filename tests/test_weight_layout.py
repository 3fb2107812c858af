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


@pytest.mark.parametrize("splits", [1, 2, 4])
@pytest.mark.parametrize("lead", [(1,), (3,), (2, 3)])
def test_split_partials_sum_to_the_product(splits, lead):
    """TransposedLinear.partials: S fp32 partial products over equal input slices; their sum is the product."""
    torch.manual_seed(0)
    t = TransposedLinear(nn.Linear(24, 40, bias=False))
    x = torch.randn(*lead, 24)
    p = t.partials(x, splits)
    assert p.shape == (splits, *lead, 40) and p.dtype == torch.float32
    torch.testing.assert_close(p.sum(0), t(x), rtol=1e-5, atol=1e-5)
    for s in range(splits):  # partial s is exactly the slice's product
        k = 24 // splits
        sl = x[..., s * k : (s + 1) * k] @ t.weight_t[s * k : (s + 1) * k]
        torch.testing.assert_close(p[s], sl, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="divisible"):
        t.partials(x, 5)
    with pytest.raises(ValueError, match="no bias"):
        TransposedLinear(nn.Linear(24, 40)).partials(x, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [1, 2, 4])  # 1: a single partial is rounded too
def test_add_rms_norm_sums_split_partials(dtype, splits):
    """The add + RMSNorm kernel (interpreted) over a split GEMM's fp32 partials == the same kernel on their sum
    rounded to the model dtype (what one GEMM would return), bit for bit."""
    from specserve.layers.triton_fused import fused_add_rms_norm, fused_add_rms_norm_partials

    torch.manual_seed(1)
    parts = torch.randn(splits, 3, 64) * 3
    residual = torch.randn(3, 64).to(dtype)
    w = (torch.rand(64) + 0.5).to(dtype)
    x = parts[0].clone()
    for s in range(1, splits):  # the kernel's order
        x += parts[s]
    ref_out, ref_res = fused_add_rms_norm(x.to(dtype), residual, w, 1e-6)
    out, res = fused_add_rms_norm_partials(parts, residual, w, 1e-6)
    assert torch.equal(res, ref_res) and torch.equal(out, ref_out)
    with pytest.raises(ValueError, match="partials must be"):
        fused_add_rms_norm_partials(parts[:, :2], residual, w, 1e-6)


def test_split_gemm_config(monkeypatch):
    from specserve.layers import linear
    from specserve.layers.linear import gpu_name, split_gemm_config

    assert gpu_name("cpu") == ""

    monkeypatch.delenv("SPECSERVE_SPLIT_GEMM", raising=False)
    assert split_gemm_config("cuda", "kn") == {"qkv": 4, "o": 4, "down": 4}  # the measured default
    assert split_gemm_config("cpu", "kn") == {}  # not measured there
    assert split_gemm_config("cuda", "nk") == {}
    monkeypatch.setenv("SPECSERVE_SPLIT_GEMM", "0")
    assert split_gemm_config("cuda", "kn") == {}
    monkeypatch.setenv("SPECSERVE_SPLIT_GEMM", "o=4,down=1")
    assert split_gemm_config("cuda", "kn") == {"o": 4}  # 1: not split
    assert split_gemm_config("cuda", "nk") == {}  # nn.Linear's layout: only on the Triton kernels
    assert split_gemm_config("cuda", "nk", triton_gemm=True) == {"o": 4, "down": 1}  # 1: Triton, one partial
    monkeypatch.delenv("SPECSERVE_SPLIT_GEMM")
    assert split_gemm_config("cuda", "kn", triton_gemm=True) == {"qkv": 8, "o": 8, "down": 8}
    assert split_gemm_config("cuda", "nk", triton_gemm=True) == {"qkv": 3, "o": 3, "down": 4}
    assert split_gemm_config("cpu", "nk", triton_gemm=True) == {}
    # a GPU's own Triton splits (an H100 by name: session 46), for the transposed layout only
    monkeypatch.setattr(linear, "gpu_name", lambda device: "NVIDIA H100 80GB HBM3")
    assert split_gemm_config("cuda", "kn", triton_gemm=True) == {"qkv": 4, "o": 8, "down": 8}
    assert split_gemm_config("cuda", "nk", triton_gemm=True) == {"qkv": 3, "o": 3, "down": 4}
    assert split_gemm_config("cuda", "kn") == {"qkv": 4, "o": 4, "down": 4}  # cuBLAS path: unchanged
    monkeypatch.setattr(linear, "gpu_name", lambda device: "NVIDIA H200")
    assert split_gemm_config("cuda", "kn", triton_gemm=True) == {"qkv": 8, "o": 8, "down": 8}
    monkeypatch.setattr(linear, "gpu_name", lambda device: "NVIDIA H100 80GB HBM3")
    monkeypatch.setenv("SPECSERVE_SPLIT_GEMM", "qkv=2,gate_up=2")
    assert split_gemm_config("cuda", "kn") == {"qkv": 2}  # gate_up splits only on the Triton kernel
    assert split_gemm_config("cuda", "kn", triton_gemm=True) == {"qkv": 2, "gate_up": 2}
    for bad in ("up=2", "o=x", "o=0"):
        monkeypatch.setenv("SPECSERVE_SPLIT_GEMM", bad)
        with pytest.raises(ValueError, match="SPECSERVE_SPLIT_GEMM"):
            split_gemm_config("cuda", "kn")


@pytest.mark.parametrize("fixture", ["tiny2_qwen3_dir", "tiny2_qwen2_dir"])  # qwen2: qkv biases, not split
def test_engine_tokens_unchanged_with_split_gemm(fixture, request, tmp_path, monkeypatch):
    """Fused path (triton backend, interpreted) on transposed weights with qkv / o_proj / down_proj as split-K
    partials: the greedy tokens of plain decoding and of DFlash K=4 equal the unsplit engine's (float32)."""
    from drafters import make_dflash

    from specserve import LLM, SamplingParams

    path = request.getfixturevalue(fixture)

    monkeypatch.setenv("SPECSERVE_WEIGHT_LAYOUT", "kn")
    monkeypatch.delenv("SPECSERVE_FUSED_KERNELS", raising=False)
    prompts = ["The capital of France is", "def f(x):"]
    sp = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    kw = dict(dtype="float32", device="cpu", num_gpu_blocks=32, attention_backend="triton")
    calls = []
    real = TransposedLinear.partials
    monkeypatch.setattr(TransposedLinear, "partials", lambda self, x, s: calls.append(s) or real(self, x, s))
    outs = {}
    for cfg in ("0", "qkv=2,o=2,down=4"):
        monkeypatch.setenv("SPECSERVE_SPLIT_GEMM", cfg)
        llm = LLM(path, **kw)
        assert llm.engine.runner.model.split_gemm == ({} if cfg == "0" else {"qkv": 2, "o": 2, "down": 4})
        outs[cfg] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
        assert (len(calls) > 0) == (cfg != "0") and set(calls) <= {2, 4}
    assert outs["qkv=2,o=2,down=4"] == outs["0"]
    mc = llm.engine.runner.model.config
    dflash = make_dflash(
        tmp_path / "d", mc.hidden_size, mc.num_hidden_layers, mc.vocab_size, layer_ids=[0, 1]
    )
    spec = {"method": "dflash", "model": dflash, "num_speculative_tokens": 4}
    llm = LLM(path, speculative_config=spec, **kw)
    assert llm.engine.runner.model.split_gemm == {"qkv": 2, "o": 2, "down": 4}
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, sp)] == outs["0"]
    assert llm.get_metrics()["spec_decode_num_drafts"] > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("s", [1, 4])  # 1: a single partial is rounded too
def test_rope_store_sums_split_qkv_partials(dtype, s):
    """rope_store (interpreted) over the qkv GEMM's fp32 split-K partials == rope_store of their sum rounded to the
    model dtype: the same q and the same K/V cache contents, bit for bit; slot -1 writes nothing."""
    from specserve.layers.triton_fused import rope_store

    torch.manual_seed(2)
    hq, hk, d, t = 4, 2, 16, 3
    parts = torch.randn(s, t, (hq + 2 * hk) * d)
    x = parts[0].clone()
    for i in range(1, s):
        x += parts[i]
    pos = torch.tensor([0, 5, 9])
    ang = torch.arange(32)[:, None] * torch.rand(d // 2)[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    qw, kw = (torch.rand(d) + 0.5).to(dtype), (torch.rand(d) + 0.5).to(dtype)
    slots = torch.tensor([1, -1, 6])
    outs = []
    for use_parts in (False, True):
        kc, vc = torch.zeros(2, 4, hk, d, dtype=dtype), torch.zeros(2, 4, hk, d, dtype=dtype)
        qkv = torch.empty(1, dtype=dtype).expand(t, x.shape[1]) if use_parts else x.to(dtype)
        q = rope_store(
            qkv, pos, cos, sin, qw, kw, 1e-6, kc, vc, slots, hq, hk, d, parts if use_parts else None
        )
        outs.append((q, kc, vc))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    assert outs[0][1].abs().sum() > 0 and outs[0][1].view(8, hk, d)[[0, 2, 3, 4, 5, 7]].abs().sum() == 0
    with pytest.raises(ValueError, match="partials must be"):
        rope_store(x.to(dtype), pos, cos, sin, qw, kw, 1e-6, kc, vc, slots, hq, hk, d, parts[:, :2])


def test_rope_store_rejects_a_flat_qkv_clearly():
    from specserve.layers.triton_fused import rope_store

    kc = torch.zeros(2, 4, 2, 16)
    with pytest.raises(ValueError, match="qkv must be"):
        rope_store(torch.zeros(128), torch.zeros(1, dtype=torch.long), torch.zeros(8, 16), torch.zeros(8, 16),
                   None, None, 0.0, kc, kc.clone(), torch.zeros(1, dtype=torch.long), 4, 2, 16)  # fmt: skip


TINY_TILES = ",".join(
    f"{n}@{r}{lay}=16:16:2:4" for n in ("qkv", "o", "gate_up", "down") for r in (1, 16) for lay in ("", "nk")
)
# the engine tests' tiles: 32 columns (half the interpreted programs; every projection still has two or more N blocks
# and K loops of 2-4 steps of 16)
ENGINE_TILES = TINY_TILES.replace("=16:", "=32:")


# qwen2: qkv biases (that projection stays on cuBLAS, unsplit)
@pytest.mark.parametrize("fixture", ["tiny2_qwen3_dir", "tiny2_qwen2_dir"])
def test_engine_tokens_unchanged_with_triton_gemm(fixture, request, tmp_path, monkeypatch):
    """The split GEMMs as the Triton kernels of triton_splitk (interpreted; gate_up + SiLU-mul in one kernel):
    greedy tokens of plain decoding (1 and 2 rows) and of DFlash K=4 (verify steps of 5 rows a request: the
    tensor-core tile) equal the cuBLAS split engine's (float32)."""
    from drafters import make_dflash

    import specserve.layers.triton_splitk as ts
    from specserve import LLM, SamplingParams

    path = request.getfixturevalue(fixture)
    monkeypatch.setenv("SPECSERVE_WEIGHT_LAYOUT", "kn")
    # gate_up in 2 K slices: its SiLU-mul after the last slice of each column block
    monkeypatch.setenv("SPECSERVE_SPLIT_GEMM", "qkv=2,o=2,down=4,gate_up=2")
    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", ENGINE_TILES)
    prompts = ["The capital of France is", "def f(x):"]
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    kw = dict(dtype="float32", device="cpu", num_gpu_blocks=32, attention_backend="triton")
    calls: list[tuple[str, int]] = []
    for fn in ("splitk_partials", "gate_up_silu"):
        real = getattr(ts, fn)
        spy = lambda *a, _r=real, _n=fn, **k: calls.append((_n, a[0].shape[0])) or _r(*a, **k)  # noqa: E731
        monkeypatch.setattr(ts, fn, spy)
    outs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("SPECSERVE_TRITON_GEMM", flag)
        llm = LLM(path, **kw)
        assert llm.engine.runner.model.triton_gemm == (flag == "1")
        outs[flag] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
        one = llm.generate(prompts[:1], sp)  # one row: the CUDA-core tile
        outs[flag + "b1"] = one[0].outputs[0].token_ids
    assert outs["1"] == outs["0"] and outs["1b1"] == outs["0b1"]
    names = {c[0] for c in calls}
    assert "gate_up_silu" in names and ("splitk_partials" in names) and {c[1] for c in calls} >= {1, 2}
    # the speculative run once (qwen2 adds the biased qkv: the plain steps above cover it)
    if fixture != "tiny2_qwen3_dir":
        return
    mc = llm.engine.runner.model.config
    dflash = make_dflash(
        tmp_path / "d", mc.hidden_size, mc.num_hidden_layers, mc.vocab_size, layer_ids=[0, 1]
    )
    calls.clear()
    spec = {"method": "dflash", "model": dflash, "num_speculative_tokens": 4}
    llm = LLM(path, speculative_config=spec, **kw)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, sp)] == outs["0"]
    assert llm.get_metrics()["spec_decode_num_drafts"] > 0
    assert any(c[1] > 2 for c in calls)  # verify steps of 5 rows per request


def test_engine_tokens_unchanged_with_triton_gemm_on_nn_linear_weights(
    tiny2_qwen3_dir, tmp_path, monkeypatch
):
    """Small targets keep nn.Linear's [N, K] weights: with the Triton GEMMs on, their 2-16-row steps (DFlash K=4
    verify, the drafter's block) run the split-K kernels on ``weight.t()`` views, and the drafter's layers take the
    target's splits; greedy tokens equal those of the engine without them (cuBLAS, no split; float32)."""
    from drafters import make_dflash

    import specserve.layers.triton_splitk as ts
    import specserve.models.llama as llama
    from specserve import LLM, SamplingParams

    monkeypatch.setenv("SPECSERVE_WEIGHT_LAYOUT", "nk")
    monkeypatch.setenv("SPECSERVE_SPLIT_GEMM", "qkv=2,o=1,down=2")
    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", ENGINE_TILES)
    prompts = ["The capital of France is", "def f(x):"]
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    kw = dict(dtype="float32", device="cpu", num_gpu_blocks=64, attention_backend="triton")
    layouts: list[str] = []
    real = ts._launch
    monkeypatch.setattr(
        ts, "_launch", lambda x, w, *a, **k: layouts.append(ts.layout_of(w)) or real(x, w, *a, **k)
    )
    split_layers: set[int] = set()  # the decoder layers that ran the split path
    real_split = llama._layer_fused_split
    monkeypatch.setattr(
        llama,
        "_layer_fused_split",
        lambda lyr, *a, **k: split_layers.add(id(lyr)) or real_split(lyr, *a, **k),
    )
    mc = LLM(tiny2_qwen3_dir, **kw).engine.runner.model.config
    dflash = make_dflash(
        tmp_path / "d", mc.hidden_size, mc.num_hidden_layers, mc.vocab_size, layer_ids=[0, 1]
    )
    spec = {"method": "dflash", "model": dflash, "num_speculative_tokens": 4}
    outs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("SPECSERVE_TRITON_GEMM", flag)
        llm = LLM(tiny2_qwen3_dir, speculative_config=spec, **kw)
        runner = llm.engine.runner
        drafter = runner.proposer.model
        assert runner.weight_layout == "nk" and runner.model.triton_gemm == (flag == "1")
        want = {"qkv": 2, "o": 1, "down": 2} if flag == "1" else {}
        assert runner.model.split_gemm == want and drafter.split_gemm == want
        assert drafter.triton_gemm == (flag == "1")
        split_layers.clear()
        outs[flag] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
        assert llm.get_metrics()["spec_decode_num_drafts"] > 0
        ran = (
            {id(m) for m in drafter.layers} & split_layers,
            {id(m) for m in runner.model.layers} & split_layers,
        )
        assert all(ran) == (flag == "1")  # drafter and target layers both took the split path
    assert outs["1"] == outs["0"]
    assert layouts and set(layouts) == {"nk"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# 1 row: the CUDA-core tile; 5, 16: the tensor-core tile (rows padded to 16)
@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize("layout", ["kn", "nk"])  # nk: an nn.Linear weight [N, K] passed as weight.t()
# pre: each program's first 16 / all 16 K rows of the slice (gate_up: 16 of 64) read before the PDL wait
@pytest.mark.parametrize("pre", [0, 16])
def test_triton_splitk_kernels_match_torch(dtype, rows, layout, pre, monkeypatch):
    """triton_splitk (interpreted): the fp32 partials sum to x @ W (fp32 math on the same inputs), partial s is
    the product of the s-th K slice, and gate_up_silu equals silu_mul of the rounded product; with and without
    the weight rows read before the wait (``GemmTile.pre``)."""
    import specserve.layers.triton_splitk as ts
    from specserve.layers.triton_fused import silu_mul

    def weight(k: int, n: int) -> torch.Tensor:
        w = torch.randn(k, n) / 8
        return (w if layout == "kn" else w.t().contiguous().t()).to(dtype)

    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", TINY_TILES.replace(":2:4", f":2:4:{pre}"))
    assert ts.tile_for("o", rows, layout).pre == pre and ts.tile_for("gate_up", rows, layout).pre == pre
    torch.manual_seed(rows)
    k, n, s = 64, 48, 4
    x, w = torch.randn(rows, k).to(dtype), weight(k, n)
    assert ts.layout_of(w) == layout
    parts = ts.splitk_partials(x, w, s, "o")
    assert parts.shape == (s, rows, n) and parts.dtype == torch.float32
    xf, wf = x.float(), w.float()
    torch.testing.assert_close(parts.sum(0), xf @ wf, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(parts[2], xf[:, 32:48] @ wf[32:48], rtol=1e-5, atol=1e-5)
    wg = weight(k, 2 * n)
    ref = silu_mul((xf @ wg.float()).to(dtype), n)
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: one rounding of the GEMM output may differ (order)
    for splits in (
        1,
        4,
    ):  # 4: the last of each column block's 4 programs sums the partials, then the SiLU-mul
        got = ts.gate_up_silu(x, wg, n, splits=splits)
        assert got.dtype == dtype and got.shape == (rows, n)
        torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)
    assert torch.equal(ts.gate_up_silu(x, wg, n, splits=4), got)  # deterministic: the partials in split order
    assert not ts._arrival_counters(x.device, 3).any()  # every arrival counter back at 0


@pytest.mark.parametrize("rows", [1, 3])
def test_triton_splitk_pre_of_one_block_is_bit_equal(rows, monkeypatch):
    """``pre`` == BLOCK_K (the H100's one-row qkv tile: its first chunk read before the PDL wait) multiplies the
    same chunks in the same order as ``pre`` 0: partials bit-equal, so the setting changes no token."""
    import specserve.layers.triton_splitk as ts

    torch.manual_seed(rows)
    x, w = torch.randn(rows, 64).to(torch.bfloat16), (torch.randn(64, 48) / 8).to(torch.bfloat16)
    got = {}
    for pre in (0, 16):
        monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", TINY_TILES.replace(":2:4", f":2:4:{pre}"))
        assert ts.tile_for("qkv", rows).pre == pre and ts.tile_for("qkv", rows).block_k == 16
        got[pre] = ts.splitk_partials(x, w, 2, "qkv")
    assert torch.equal(got[0], got[16])


def test_triton_splitk_rejects_bad_shapes_and_settings(monkeypatch):
    import specserve.layers.triton_splitk as ts
    from specserve.layers.linear import triton_gemm_enabled

    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", TINY_TILES)
    x, w = torch.randn(2, 64), torch.randn(64, 48)
    with pytest.raises(ValueError, match="split 3 ways"):
        ts.splitk_partials(x, w, 3, "o")
    with pytest.raises(ValueError, match="1-16 rows"):
        ts.splitk_partials(torch.randn(17, 64), w, 4, "o")
    with pytest.raises(ValueError, match="share a dtype"):
        ts.splitk_partials(x.bfloat16(), w, 4, "o")
    with pytest.raises(ValueError, match="gate_up weight"):
        ts.gate_up_silu(x, w, 32)
    with pytest.raises(ValueError, match="contiguous in"):
        ts.splitk_partials(x, torch.randn(64, 96)[:, ::2], 4, "o")  # no unit stride
    assert ts.fits("o", 64, 48, 4) and not ts.fits("o", 64, 40, 4) and not ts.fits("o", 64, 48, 8)
    for bad in ("o@2=16:16:2:4", "o@1=16:16:2:4:24", "o@1=16:16:2:4:16:1"):  # row class; pre no power of 2
        monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", bad)
        with pytest.raises(ValueError, match="SPECSERVE_TRITON_GEMM_TILES"):
            ts.tile_for("o", 1)
    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", "o@1=16:16:2:4:32,o@16=16:16:2:4")
    assert ts.tile_for("o", 1) == ts.GemmTile(16, 16, 2, 4, 32) and ts.tile_for("o", 2).pre == 0
    # a 16-row slice cannot hold 32 rows read before the wait
    with pytest.raises(ValueError, match="of at least 32 rows"):
        ts.splitk_partials(torch.randn(1, 64), w, 4, "o")
    assert ts.splitk_partials(torch.randn(1, 64), w, 2, "o").shape == (2, 1, 48)
    assert not ts.fits("o", 64, 48, 4) and ts.fits("o", 64, 48, 2)
    monkeypatch.setenv("SPECSERVE_TRITON_GATE_UP_MIN_ROWS", "1")
    assert ts.gate_up_min_rows() == 1
    monkeypatch.setenv("SPECSERVE_TRITON_GATE_UP_MIN_ROWS", "0")
    with pytest.raises(ValueError, match="SPECSERVE_TRITON_GATE_UP_MIN_ROWS"):
        ts.gate_up_min_rows()
    monkeypatch.delenv("SPECSERVE_TRITON_GATE_UP_MIN_ROWS")
    assert ts.gate_up_min_rows() == ts.GATE_UP_MIN_ROWS == 2
    monkeypatch.delenv("SPECSERVE_TRITON_GEMM_TILES")
    assert ts.tile_for("qkv", 1) == ts.GemmTile(256, 32, 4, 4)
    assert ts.tile_for("qkv", 7) == ts.tile_for("qkv", 16)
    assert ts.tile_for("qkv", 16, "nk") == ts.GemmTile(64, 64, 3, 4)
    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", "qkv@16nk=32:32:2:4")
    assert ts.tile_for("qkv", 16, "nk") == ts.GemmTile(32, 32, 2, 4) and ts.tile_for("qkv", 16).block_n == 128
    with pytest.raises(ValueError, match="layout must be"):
        ts.tile_for("qkv", 16, "tn")
    monkeypatch.delenv("SPECSERVE_TRITON_GEMM_TILES")
    # a GPU's own tiles (an H100 here by name), for the transposed layout and where they fit the shape
    monkeypatch.setattr(ts, "_device_family", lambda index: "H100")
    cuda = torch.device("cuda", 0)
    h100 = ts._DEVICE_TILES["H100"][("qkv", 1)]
    assert h100 != ts.tile_for("qkv", 1) == ts.tile_for("qkv", 1, "kn", torch.device("cpu"))
    assert ts.tile_for("qkv", 1, "kn", cuda) == ts.tile_for("qkv", 1, "kn", cuda, (4096, 6144, 8)) == h100
    assert ts.tile_for("qkv", 1, "kn", cuda, (4096, 6144, 4)) == h100  # the H100's own split (linear.py)
    assert ts.tile_for("qkv", 1, "kn", cuda, (4096, 6144 - 64, 8)) == ts.tile_for("qkv", 1)  # N % 128 != 0
    assert ts.tile_for("qkv", 1, "nk", cuda) == ts.tile_for("qkv", 1, "nk")
    assert ts.tile_for("o", 1, "kn", cuda) == ts.tile_for("o", 1)  # no entry of its own
    assert ts.tile_for("gate_up", 16, "kn", cuda) == ts._DEVICE_TILES["H100"][("gate_up", 16)]
    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", "qkv@1=64:32:2:4")  # the setting still comes first
    assert ts.tile_for("qkv", 1, "kn", cuda) == ts.GemmTile(64, 32, 2, 4)
    monkeypatch.delenv("SPECSERVE_TRITON_GEMM_TILES")
    monkeypatch.setenv("SPECSERVE_TRITON_GEMM", "yes")
    with pytest.raises(ValueError, match="SPECSERVE_TRITON_GEMM must be"):
        triton_gemm_enabled("cuda")
    monkeypatch.delenv("SPECSERVE_TRITON_GEMM")
    assert triton_gemm_enabled("cuda") and not triton_gemm_enabled("cpu")


def test_pdl_setting(monkeypatch):
    """SPECSERVE_PDL: 1 / 0 on CUDA devices (the launch keyword follows), never on CPU, anything else an error."""
    from specserve.layers.triton_fused import pdl_enabled, pdl_launch

    cuda = torch.device("cuda")
    monkeypatch.setenv("SPECSERVE_PDL", "1")
    assert pdl_enabled(cuda) and pdl_launch(cuda) == (True, {"launch_pdl": True})
    assert not pdl_enabled(torch.device("cpu")) and pdl_launch(torch.device("cpu")) == (False, {})
    monkeypatch.setenv("SPECSERVE_PDL", "0")
    assert pdl_launch(cuda) == (False, {})
    monkeypatch.setenv("SPECSERVE_PDL", "2")
    with pytest.raises(ValueError, match="SPECSERVE_PDL must be 0 or 1"):
        pdl_enabled(cuda)
    # SPECSERVE_PDL_EARLY: the tagged kernels release their successor before their own wait (PDL constexpr 2)
    monkeypatch.setenv("SPECSERVE_PDL", "1")
    monkeypatch.setenv("SPECSERVE_PDL_EARLY", "norm, merge")
    assert pdl_launch(cuda, "norm")[0] == 2 and pdl_launch(cuda, "merge")[0] == 2
    assert pdl_launch(cuda, "silu")[0] == 1 and pdl_launch(cuda)[0] == 1
    assert pdl_launch(torch.device("cpu"), "norm") == (0, {})
    monkeypatch.setenv("SPECSERVE_PDL", "0")
    assert pdl_launch(cuda, "norm") == (0, {})
    monkeypatch.setenv("SPECSERVE_PDL", "1")
    monkeypatch.setenv("SPECSERVE_PDL_EARLY", "norm,gemm")
    with pytest.raises(ValueError, match="unknown kernel tag"):
        pdl_launch(cuda, "norm")


_HOPPER_SPLITK_SCRIPT = r"""
import specserve.layers.triton_splitk as ts
from specserve.layers.triton_fused import _BF16
from sm90 import compile_sm90

ptrs = dict(x_ptr="bf16", w_ptr="bf16", out_ptr="fp32")
# the default tiles of the Qwen3-8B projections (kn) and SmolLM2-135M's (nk): (layout, name, rows class, N, K, splits);
# the unit weight stride is a constant, as the JIT specialises an int argument equal to 1
for lay, name, cls, n, k, s in [
    ("kn", "qkv", 1, 6144, 4096, 8), ("kn", "o", 1, 4096, 4096, 8), ("kn", "down", 1, 4096, 12288, 8),
    ("kn", "gate_up", 16, 12288, 4096, 1), ("kn", "qkv", 16, 6144, 4096, 8), ("kn", "down", 16, 4096, 12288, 8),
    ("nk", "qkv", 16, 960, 576, 3), ("nk", "o", 16, 576, 576, 3), ("nk", "gate_up", 16, 1536, 576, 1),
    ("nk", "down", 16, 576, 1536, 4), ("nk", "qkv", 1, 960, 576, 3), ("H100", "qkv", 1, 6144, 4096, 4),
]:
    t = ts._DEVICE_TILES[lay][(name, cls)] if lay == "H100" else ts.tile_for(name, cls, lay)
    lay = "kn" if lay == "H100" else lay
    gate_up = name == "gate_up"
    const = dict(N=n, K_SPLIT=k // s, BLOCK_M=1 if cls == 1 else 16, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
                 PRE_K=t.pre, NUM_STAGES=t.stages, USE_DOT=cls > 1, PRECISION="tf32", UPCAST=False, GATE_UP=gate_up, MODE=_BF16,
                 PDL=True, **({"stride_wn": 1} if lay == "kn" else {"stride_wk": 1}))
    p = dict(ptrs, out_ptr="bf16") if gate_up else ptrs
    kernel, reg, stack = compile_sm90(ts._splitk_gemm_kernel, p, const, t.warps, t.stages)
    print(lay, name, cls, f"REG:{reg} STACK:{stack}")
    assert stack == 0, (lay, name, cls)
    ptx = kernel.asm["ptx"]
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
    assert ("mma" in ptx) == (cls > 1), (name, cls)  # 2-16 rows on the tensor cores, one row on the CUDA cores
    if t.pre:  # the tile's first weight rows are loaded before the wait
        assert "ld.global" in ptx[: ptx.index("griddepcontrol.wait")], (lay, name, cls)
# weight rows read before the wait (GemmTile.pre): the loads precede griddepcontrol.wait in the PTX; PDL == 2 (a
# small kernel tagged in SPECSERVE_PDL_EARLY) releases the successor before its own wait
for cls, pre in ((1, 128), (16, 64)):
    const = dict(N=4096, K_SPLIT=512, BLOCK_M=1 if cls == 1 else 16, BLOCK_N=128, BLOCK_K=32 if cls == 1 else 64,
                 PRE_K=pre, NUM_STAGES=3, USE_DOT=cls > 1, PRECISION="tf32", UPCAST=False, GATE_UP=False,
                 MODE=_BF16, PDL=2, stride_wn=1)
    kernel, reg, stack = compile_sm90(ts._splitk_gemm_kernel, ptrs, const, 4, 3)
    print("pre", cls, pre, f"REG:{reg} STACK:{stack}")
    assert stack == 0
    ptx = kernel.asm["ptx"]
    wait, launch = ptx.index("griddepcontrol.wait"), ptx.index("griddepcontrol.launch_dependents")
    assert launch < wait and "ld.global" in ptx[:wait], cls
print("OK")
"""


def test_splitk_tiles_compile_for_hopper_without_spills() -> None:
    """The split-K kernel's default tiles compile for sm_90 (no GPU needed) without spills, with the PDL wait and
    release in the PTX and tensor-core MMAs only in the multi-row form."""
    from sm90 import run_script

    run_script(_HOPPER_SPLITK_SCRIPT)


def test_triton_gemm_falls_back_where_the_tiles_do_not_fit(tiny_qwen3_dir, monkeypatch):
    """SPECSERVE_TRITON_GEMM=1 with the default (Qwen3-8B) tiles on a tiny model: the runner keeps the cuBLAS split
    path (the projections' 64-128 columns are no multiple of those tiles); with tiles that fit it takes Triton's."""
    from specserve import LLM

    monkeypatch.setenv("SPECSERVE_WEIGHT_LAYOUT", "kn")
    monkeypatch.setenv("SPECSERVE_SPLIT_GEMM", "qkv=2,o=2,down=4")
    monkeypatch.setenv("SPECSERVE_TRITON_GEMM", "1")
    kw = dict(dtype="float32", device="cpu", num_gpu_blocks=8, attention_backend="triton")
    monkeypatch.delenv("SPECSERVE_TRITON_GEMM_TILES", raising=False)
    assert LLM(tiny_qwen3_dir, **kw).engine.runner.model.triton_gemm is False
    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", TINY_TILES)
    assert LLM(tiny_qwen3_dir, **kw).engine.runner.model.triton_gemm is True


def test_triton_gemm_falls_back_on_nn_linear_weights_and_for_the_drafter(
    tiny_qwen3_dir, tmp_path, monkeypatch
):
    """nn.Linear's layout: where the tiles do not fit, no split at all (cuBLAS has no split path there); a DFlash
    drafter whose down_proj (96 inputs, 4 splits) does not fit keeps its layers off the Triton GEMMs while the
    target (128 inputs) takes them."""
    from drafters import make_dflash

    from specserve import LLM

    monkeypatch.setenv("SPECSERVE_WEIGHT_LAYOUT", "nk")
    monkeypatch.setenv("SPECSERVE_SPLIT_GEMM", "qkv=2,o=1,down=4")
    monkeypatch.setenv("SPECSERVE_TRITON_GEMM", "1")
    kw = dict(dtype="float32", device="cpu", num_gpu_blocks=8, attention_backend="triton")
    monkeypatch.delenv(
        "SPECSERVE_TRITON_GEMM_TILES", raising=False
    )  # the nk defaults: 64 columns, K slices of 64
    model = LLM(tiny_qwen3_dir, **kw).engine.runner.model
    assert model.triton_gemm is False and model.split_gemm == {}
    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", TINY_TILES)
    mc = model.config
    dflash = make_dflash(
        tmp_path / "d", mc.hidden_size, mc.num_hidden_layers, mc.vocab_size, layer_ids=[0, 1]
    )
    spec = {"method": "dflash", "model": dflash, "num_speculative_tokens": 4}
    runner = LLM(tiny_qwen3_dir, speculative_config=spec, **kw).engine.runner
    assert runner.model.triton_gemm is True and runner.model.split_gemm == {"qkv": 2, "o": 1, "down": 4}
    assert runner.proposer.model.triton_gemm is False and runner.proposer.model.split_gemm == {}
