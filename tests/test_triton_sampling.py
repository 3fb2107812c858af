"""The sort-free Triton sampler (specserve.layers.triton_sampling, interpreted on CPU) against the torch form of
sample_verify: the same draws (torch's generator in the same order, seeded rows' counter-based noise) give the same
tokens, acceptances and greedy rows, over temperature / min-p / top-k / top-p, drafts, padding, seeds, rows split
over many programs, and bf16 rows full of ties (both forms keep tied values whole)."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton decorates the kernels

import pytest  # noqa: E402
import torch  # noqa: E402

from specserve.layers import sampler  # noqa: E402
from specserve.layers.sampler import param_row, row_seed_key  # noqa: E402
from specserve.sampling_params import SamplingParams  # noqa: E402
from specserve.spec.rejection import greedy_verify, sample_verify  # noqa: E402


def _inputs(sps: list[SamplingParams], q: int, vocab: int, gen: torch.Generator, likely: float = 0.6):
    """Logits [b*q, V], ids (committed token + drafts, the first drafts often the row argmax), params, seeds."""
    b = len(sps)
    logits = torch.randn(b * q, vocab, generator=gen) * 3
    ids = torch.randint(0, vocab, (b * q,), generator=gen)
    for r in range(b * q - 1):
        if (r + 1) % q and float(torch.rand(1, generator=gen)) < likely:
            ids[r + 1] = int(logits[r].argmax())
    rows = [param_row(p) for p in sps]
    temp = torch.tensor([x[0] for x in rows], dtype=torch.float32)
    top_k = torch.tensor([x[1] for x in rows], dtype=torch.int32)
    top_p = torch.tensor([x[2] for x in rows], dtype=torch.float32)
    min_p = torch.tensor([x[3] for x in rows], dtype=torch.float32)
    keys = torch.tensor([row_seed_key(p) for p in sps], dtype=torch.int32)
    pos = (torch.arange(b).unsqueeze(1) * 37 + 5 + torch.arange(q)).flatten()
    return logits, ids, temp, top_k, top_p, min_p, keys, pos


def _both(monkeypatch, logits, ids, temp, top_k, top_p, min_p, nd, b, q, keys, pos, seed):  # type: ignore[no-untyped-def]
    out = {}
    for mode in ("torch", "triton"):
        monkeypatch.setenv(sampler.SAMPLER_ENV, mode)
        torch.manual_seed(seed)
        packed = greedy_verify(logits, ids, b, q)
        out[mode] = sample_verify(
            logits, ids, temp, top_k, top_p, min_p, nd, b, q, packed, seed_key=keys, pos=pos
        )
    return out["torch"], out["triton"]


PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.3, top_k=7),
    SamplingParams(temperature=0.9, min_p=0.05),
    SamplingParams(temperature=1.1, top_k=40, top_p=0.8, min_p=0.02, seed=3),
    SamplingParams(temperature=0.5, top_p=0.3, seed=11),
    SamplingParams(temperature=2.0, top_k=1),
]


@pytest.mark.parametrize(
    ("q", "vocab", "block", "trials"),
    [(1, 300, None, 3), (4, 300, None, 3), (4, 700, 128, 2), (4, 4500, None, 1)],
)
def test_triton_sampler_equals_torch_form(monkeypatch, q, vocab, block, trials):
    """``block``: SPECSERVE_SAMPLER_BLOCK (128: a row over 6 programs, each round's choice from 6 histograms)."""
    if block:
        monkeypatch.setenv("SPECSERVE_SAMPLER_BLOCK", str(block))
    gen = torch.Generator().manual_seed(q * 1000 + vocab)
    b = len(PARAMS)
    seen_acc = set()
    for trial in range(trials):
        logits, ids, temp, top_k, top_p, min_p, keys, pos = _inputs(PARAMS, q, vocab, gen)
        nd = torch.tensor([(trial + j) % q for j in range(b)], dtype=torch.int32)
        want, got = _both(monkeypatch, logits, ids, temp, top_k, top_p, min_p, nd, b, q, keys, pos, trial)
        assert torch.equal(got, want), (trial, got, want)
        seen_acc |= set(want[:, q].tolist())
    if q > 1:
        assert len(seen_acc) >= 2  # acceptances varied


def test_triton_sampler_keeps_ties_as_the_torch_form_does(monkeypatch):
    """Rows of few distinct values (bf16 rounding does this to real logits): the k-th largest value and the value
    where top-p's mass runs out each sit in a run of ties, which both forms keep whole, so the same tokens come out;
    and the kept sets are the tie-inclusive ones (the kernels' stats against sets computed here)."""
    from specserve.layers.sampler import apply_sampling_constraints, static_sampling_tensors

    monkeypatch.setenv("SPECSERVE_SAMPLER_BLOCK", "128")
    gen = torch.Generator().manual_seed(7)
    sps = [
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=1.0, top_p=0.5),
        SamplingParams(temperature=0.8, top_k=30, top_p=0.9, seed=2),
        SamplingParams(temperature=1.0, top_k=3, min_p=0.2),
    ]
    b, q, vocab = len(sps), 3, 500
    for trial in range(3):
        logits, ids, temp, top_k, top_p, min_p, keys, pos = _inputs(sps, q, vocab, gen)
        logits = (torch.randint(-6, 7, logits.shape, generator=gen) * 0.5).to(torch.bfloat16)
        nd = torch.full((b,), q - 1, dtype=torch.int32)
        want, got = _both(monkeypatch, logits, ids, temp, top_k, top_p, min_p, nd, b, q, keys, pos, trial)
        assert torch.equal(got, want), (trial, got, want)
    # the kept sets: top_k 5 keeps every value at or above the 5th largest
    row = logits[0].float()
    st = static_sampling_tensors(*(torch.tensor([v]) for v in (1.0, 5, 1.0, 0.0)))
    kept = apply_sampling_constraints(row[None], st)[0].isfinite()
    assert torch.equal(kept, row >= row.sort(descending=True).values[4])
    assert int(kept.sum()) > 5  # the run of ties at the 5th value is kept whole


def test_triton_sampler_bf16_logits_and_strided_params(monkeypatch):
    """bf16 logits (the graphs pass the model dtype) and parameter columns of the graphs' [b, n] buffers."""
    gen = torch.Generator().manual_seed(5)
    b, q, vocab = 4, 3, 700
    sps = PARAMS[:4]
    logits, ids, temp, top_k, top_p, min_p, keys, pos = _inputs(sps, q, vocab, gen)
    logits = logits.to(torch.bfloat16)
    aux = torch.stack([torch.full((b,), q - 1, dtype=torch.int32), top_k, top_k, keys], 1)
    faux = torch.stack([temp, top_p, min_p], 1)
    nd, _, tk, key = aux.unbind(1)
    tt, tpp, mpp = faux.unbind(1)
    want, got = _both(monkeypatch, logits, ids, tt, tk, tpp, mpp, nd, b, q, key, pos, 1)
    assert torch.equal(got, want)


def test_sampler_settings_are_checked(monkeypatch):
    """SPECSERVE_SAMPLER takes auto / triton / torch; SPECSERVE_SAMPLER_BLOCK a power of 2; auto is the Triton form
    on CUDA only; with it on CUDA the sort-free graphs (no top-k / top-p rounds) are captured for the batches that
    use neither."""
    from specserve.layers.triton_sampling import sample_verify_triton

    monkeypatch.setenv(sampler.SAMPLER_ENV, "fast")
    with pytest.raises(ValueError, match=sampler.SAMPLER_ENV):
        sampler.sampler_mode()
    monkeypatch.setenv(sampler.SAMPLER_ENV, "auto")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert sampler.triton_sampler_on(cuda) and sampler.sort_free_graphs_on(cuda)
    assert not sampler.triton_sampler_on(cpu) and not sampler.sort_free_graphs_on(cpu)
    monkeypatch.setenv(sampler.SAMPLER_ENV, "triton")
    assert sampler.triton_sampler_on(cpu) and sampler.triton_sampler_on(cuda)
    assert sampler.sort_free_graphs_on(cuda) and not sampler.sort_free_graphs_on(cpu)
    monkeypatch.setenv(sampler.SAMPLER_ENV, "torch")
    assert not sampler.triton_sampler_on(cuda) and not sampler.sort_free_graphs_on(cuda)
    assert sampler.sort_free(
        [SamplingParams(temperature=0.7, min_p=0.1), SamplingParams(temperature=0, top_k=5)]
    )
    assert not sampler.sort_free([SamplingParams(temperature=0.7, top_p=0.9)])
    assert not sampler.sort_free([SamplingParams(temperature=0.7, top_k=20)])
    gen = torch.Generator().manual_seed(0)
    logits, ids, temp, top_k, top_p, min_p, keys, pos = _inputs(PARAMS[:1], 1, 50, gen)
    packed = greedy_verify(logits, ids, 1, 1)
    monkeypatch.setenv("SPECSERVE_SAMPLER_BLOCK", "1000")
    with pytest.raises(ValueError, match="SPECSERVE_SAMPLER_BLOCK"):
        sample_verify_triton(
            logits, ids, temp, top_k, top_p, min_p, torch.zeros(1, dtype=torch.int32), 1, 1, packed
        )
    huge = torch.zeros(1, 1).expand(1, 1 << 24)  # indices past 2^24 are not exact in float32: refused
    with pytest.raises(ValueError, match="vocabulary"):
        sample_verify_triton(
            huge, ids, temp, top_k, top_p, min_p, torch.zeros(1, dtype=torch.int32), 1, 1, packed
        )


_HOPPER_COMPILE_SCRIPT = """
import specserve.layers.triton_sampling as ts
from sm90 import compile_sm90

state = dict(logits_ptr="bf16", temp_ptr="fp32", topk_ptr="i32", topp_ptr="fp32", minp_ptr="fp32", cm_ptr="fp32",
             pm_ptr="fp32", hist_ptr="fp32", si_ptr="i32", sf_ptr="fp32")
race = dict(logits_ptr="bf16", ids_ptr="i64", temp_ptr="fp32", nd_ptr="i32", stats_ptr="fp32", u_ptr="fp64",
            e_ptr="fp32", key_ptr="i32", pos_ptr="i64", cand_ptr="fp32", acc_ptr="i32")
kernels = [
    (ts._max_kernel, dict(logits_ptr="bf16", temp_ptr="fp32", cm_ptr="fp32"), dict(Q=8, CHUNK=1024), 4),
    (ts._mass_kernel, dict(logits_ptr="bf16", temp_ptr="fp32", minp_ptr="fp32", cm_ptr="fp32", pm_ptr="fp32"),
     dict(Q=8, C_PAD=256, CHUNK=1024), 4),
    (ts._round_kernel, state, dict(Q=8, C_PAD=256, CHUNK=1024, SUB=256), 4),
    (ts._finish_kernel, {**state, "ids_ptr": "i64", "stats_ptr": "fp32"}, dict(Q=8, C_PAD=256), 4),
    (ts._race_kernel, race, dict(Q=8, Q_PAD=16, SEEDED=True, CHUNK=1024), 4),
    (ts._pick_kernel, dict(ids_ptr="i64", temp_ptr="fp32", cand_ptr="fp32", acc_ptr="i32", greedy_ptr="i64",
                           out_ptr="i64"), dict(Q=8, Q_PAD=16, C_PAD=256), 1),
]
for fn, ptrs, const, warps in kernels:
    _, reg, stack = compile_sm90(fn, ptrs, const, warps, 1, not_divisible=("V", "C", "R", "G"))
    print(fn.__name__, f"REG:{reg} STACK:{stack}")
    assert stack == 0, fn.__name__
print("OK")
"""


def test_sampler_kernels_compile_for_hopper() -> None:
    """The interpreter accepts code the compiler rejects (a name rebound to another type inside a branch did): every
    kernel of the sampler compiles for sm_90 (no GPU needed) at Qwen3's vocabulary (149 programs a row), without a
    register spill."""
    from sm90 import run_script

    out = run_script(_HOPPER_COMPILE_SCRIPT)
    assert out.count("STACK:0") == 6
