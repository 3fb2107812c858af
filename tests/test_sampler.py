"""Tests for specserve.layers.sampler."""

from __future__ import annotations

import math

import pytest
import torch
from stats import chi2_pvalue

from specserve.layers.sampler import (
    SamplingTensors,
    apply_sampling_constraints,
    compute_logprobs,
    gather_logprobs,
    sample,
)
from specserve.layers.seeded_noise import seed_key
from specserve.sampling_params import SamplingParams


def _st(params: list[SamplingParams], positions: list[int] | None = None) -> SamplingTensors:
    """Sampling tensors; every row samples position 0 unless ``positions`` says otherwise."""
    return SamplingTensors.from_params(
        params, positions if positions is not None else [0] * len(params), "cpu"
    )


def _kept(logits: torch.Tensor, params: SamplingParams) -> set[int]:
    out = apply_sampling_constraints(logits.unsqueeze(0), _st([params]))[0]
    return set(torch.nonzero(torch.isfinite(out)).flatten().tolist())


def test_chi2_helper_sanity() -> None:
    p = torch.tensor([0.5, 0.3, 0.2])
    assert chi2_pvalue(torch.tensor([5000, 3000, 2000]), p) > 0.99
    assert chi2_pvalue(torch.tensor([5500, 2700, 1800]), p) < 1e-6
    assert chi2_pvalue(torch.tensor([5000, 3000, 2000]), torch.tensor([0.5, 0.5, 0.0])) == 0.0


def test_from_params_and_flags() -> None:
    st = _st(
        [
            SamplingParams(temperature=0.0, top_k=5, top_p=0.5, seed=4),
            SamplingParams(temperature=0.8, top_k=1),
            SamplingParams(temperature=0.7, top_p=0.9, min_p=0.1, seed=3),
        ],
        [5, 6, 7],
    )
    assert st.greedy.tolist() == [True, True, False]
    assert st.temperature.tolist()[:2] == [0.0, 0.0]
    assert st.temperature[2].item() == pytest.approx(0.7)
    # greedy rows carry neutral filters, so the flags describe the sampling rows only
    assert st.top_k.tolist() == [0, 0, 0]
    assert st.no_top_k and not st.no_top_p and not st.no_min_p
    assert not st.all_greedy and not st.all_random
    assert st.seed_keys == [0, 0, seed_key(3)]  # a greedy row's seed draws nothing
    assert st.positions == [5, 6, 7]
    assert _st([SamplingParams(temperature=0.0)]).all_greedy
    assert _st([SamplingParams(temperature=1.0)]).all_random
    with pytest.raises(ValueError, match="positions"):
        SamplingTensors.from_params([SamplingParams()], [1, 2], "cpu")
    with pytest.raises(ValueError, match="positions"):  # a seeded random row needs its position
        SamplingTensors.from_params([SamplingParams(temperature=1.0, seed=1)], None, "cpu")
    assert SamplingTensors.from_params([SamplingParams(temperature=1.0)], None, "cpu").positions is None


def test_seed_keys() -> None:
    keys = [seed_key(s) for s in range(-50, 2000)]
    assert all(1 <= k < 2**31 for k in keys)  # non-zero (0 = unseeded) and int32
    assert len(set(keys)) == len(keys)
    assert seed_key(2**64 + 5) == seed_key(5)  # a 64-bit seed


def test_repeat_interleave() -> None:
    st = _st([SamplingParams(temperature=0.5, top_k=3, seed=9), SamplingParams(temperature=0.0)], [10, 4])
    ex = st.repeat_interleave([3, 1])
    assert ex.temperature.tolist() == [0.5, 0.5, 0.5, 0.0]
    assert ex.top_k.tolist() == [3, 3, 3, 0]
    assert ex.greedy.tolist() == [False, False, False, True]
    assert ex.seed_keys == [seed_key(9)] * 3 + [0]
    assert ex.positions == [10, 11, 12, 4]  # a request's rows sample consecutive positions
    assert not ex.no_top_k


def test_top_k_one_equals_greedy() -> None:
    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 3
    argmax = logits.argmax(-1)
    # through SamplingParams: top_k=1 is classified greedy
    st = _st([SamplingParams(temperature=1.3, top_k=1)] * 64)
    assert bool(st.all_greedy)
    assert torch.equal(sample(logits, st), argmax)
    # and the random path with top_k = 1 also only ever picks the argmax
    st_rand = _st([SamplingParams(temperature=1.3, top_k=2)] * 64)
    st_rand.top_k.fill_(1)
    for _ in range(5):
        assert torch.equal(sample(logits, st_rand), argmax)
    # temperature 0 is argmax of the raw logits
    assert torch.equal(sample(logits, _st([SamplingParams(temperature=0.0)] * 64)), argmax)


def test_top_k_keeps_exactly_k() -> None:
    logits = torch.tensor([0.1, 2.0, -1.0, 3.0, 0.5, 1.5])
    assert _kept(logits, SamplingParams(temperature=1.0, top_k=2)) == {3, 1}
    assert _kept(logits, SamplingParams(temperature=1.0, top_k=3)) == {3, 1, 5}
    assert _kept(logits, SamplingParams(temperature=1.0, top_k=100)) == set(range(6))
    assert _kept(logits, SamplingParams(temperature=1.0, top_k=0)) == set(range(6))


def test_top_p_keeps_smallest_nucleus() -> None:
    probs = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
    logits = probs.log()
    # sorted: 0.4 (1), 0.3 (3), 0.15 (4), 0.1 (2), 0.05 (0)
    assert _kept(logits, SamplingParams(temperature=1.0, top_p=0.35)) == {1}
    assert _kept(logits, SamplingParams(temperature=1.0, top_p=0.45)) == {1, 3}
    assert _kept(logits, SamplingParams(temperature=1.0, top_p=0.7)) == {1, 3}
    assert _kept(logits, SamplingParams(temperature=1.0, top_p=0.71)) == {1, 3, 4}
    assert _kept(logits, SamplingParams(temperature=1.0, top_p=0.9)) == {1, 3, 4, 2}
    assert _kept(logits, SamplingParams(temperature=1.0, top_p=1.0)) == set(range(5))
    # the top token always stays, even for tiny top_p
    assert _kept(logits, SamplingParams(temperature=1.0, top_p=1e-6)) == {1}
    # top_p applies to the top-k renormalized distribution: within {1, 3} mass is 4/7, 3/7
    assert _kept(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.5)) == {1}
    assert _kept(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.6)) == {1, 3}


def test_top_p_after_temperature() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0])
    # T=1: probs .665 .245 .090 -> top_p .8 keeps 2 tokens; T=0.25 sharpens: first alone has .98
    assert _kept(logits, SamplingParams(temperature=1.0, top_p=0.8)) == {0, 1}
    assert _kept(logits, SamplingParams(temperature=0.25, top_p=0.8)) == {0}


def test_min_p() -> None:
    probs = torch.tensor([0.5, 0.2, 0.06, 0.04, 0.2])
    logits = probs.log()
    # threshold 0.1 * 0.5 = 0.05
    assert _kept(logits, SamplingParams(temperature=1.0, min_p=0.1)) == {0, 1, 2, 4}
    # threshold 0.5 * 0.5 = 0.25
    assert _kept(logits, SamplingParams(temperature=1.0, min_p=0.5)) == {0}
    assert _kept(logits, SamplingParams(temperature=1.0, min_p=0.0)) == set(range(5))
    # combined with top_k (the 2nd largest, 0.2, is tied: both stay)
    assert _kept(logits, SamplingParams(temperature=1.0, min_p=0.1, top_k=2)) == {0, 1, 4}


def test_constraints_are_per_row_and_do_not_modify_input() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]] * 3)
    before = logits.clone()
    st = _st(
        [
            SamplingParams(temperature=1.0, top_k=2),
            SamplingParams(temperature=2.0),
            SamplingParams(temperature=0.0, top_k=1),
        ]
    )
    out = apply_sampling_constraints(logits, st)
    assert torch.equal(logits, before)
    assert out.dtype == torch.float32
    assert torch.isinf(out[0, 2:]).all() and torch.equal(out[0, :2], logits[0, :2])
    assert torch.allclose(out[1], logits[1] / 2)
    assert torch.equal(out[2], logits[2])  # greedy rows: divided by 1, filters neutral


def test_seeded_rows_reproducible_seed_and_position_dependent() -> None:
    logits = torch.zeros(1, 1000)  # uniform over 1000 tokens

    def run(seed: int, start: int = 0) -> list[int]:
        sp = SamplingParams(temperature=1.0, seed=seed)
        return [int(sample(logits, _st([sp], [start + i]))[0]) for i in range(20)]

    assert run(7) == run(7)
    assert run(7) != run(8)
    assert len(set(run(7))) > 15  # a new draw at every position
    assert run(7, 5)[:15] == run(7)[5:]  # a function of (seed, position): nothing else
    # torch's generator is not involved
    torch.manual_seed(0)
    a = run(3)
    torch.manual_seed(1)
    assert run(3) == a


def test_fallback_generator_reproducible() -> None:
    logits = torch.randn(32, 100)
    st = _st([SamplingParams(temperature=0.9)] * 32)
    a = sample(logits, st, torch.Generator().manual_seed(5))
    b = sample(logits, st, torch.Generator().manual_seed(5))
    c = sample(logits, st, torch.Generator().manual_seed(6))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_seeded_row_independent_of_batch() -> None:
    vocab = 50
    torch.manual_seed(0)
    base = torch.randn(vocab)
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=42)

    alone = [int(sample(base.unsqueeze(0), _st([params], [100 + i]))[0]) for i in range(40)]

    batch_params = [
        SamplingParams(temperature=0.5, top_k=5),
        params,
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.2, seed=1),
    ]
    fallback = torch.Generator().manual_seed(123)
    in_batch = []
    for i in range(40):
        st = _st(batch_params, [7 * i, 100 + i, 3, 100 + i])
        logits = torch.randn(4, vocab)
        logits[1] = base
        in_batch.append(int(sample(logits, st, fallback)[1]))
    assert alone == in_batch
    assert len(set(alone)) > 5  # it really is random


def test_mixed_batch_greedy_rows_take_argmax() -> None:
    torch.manual_seed(1)
    logits = torch.randn(6, 30)
    params = [SamplingParams(temperature=t) for t in (0.0, 1.0, 0.0, 1.5, 0.0, 0.8)]
    st = _st(params)
    out = sample(logits, st, torch.Generator().manual_seed(0))
    assert out.shape == (6,) and out.dtype == torch.int64
    assert out[[0, 2, 4]].tolist() == logits[[0, 2, 4]].argmax(-1).tolist()


def _target_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Independent reference: softmax(logits / T), keep the smallest nucleus >= top_p, renormalize."""
    p = torch.softmax(logits.double() / temperature, -1)
    order = sorted(range(len(p)), key=lambda i: -float(p[i]))
    kept, mass = [], 0.0
    for i in order:
        if kept and mass >= top_p:
            break
        kept.append(i)
        mass += float(p[i])
    out = torch.zeros_like(p)
    out[kept] = p[kept]
    return out / out.sum()


def test_sample_distribution_chi_square() -> None:
    logits = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -2.0, 1.5, -1.0])
    n = 20000
    st = _st([SamplingParams(temperature=0.7, top_p=0.9)] * n)
    tokens = sample(logits.expand(n, -1), st, torch.Generator().manual_seed(2024))
    counts = torch.bincount(tokens, minlength=8)
    target = _target_probs(logits, 0.7, 0.9)
    assert (target == 0).sum() >= 2  # top_p really truncates something here
    assert chi2_pvalue(counts, target) > 0.001
    # power: the same samples must reject nearby wrong distributions
    assert chi2_pvalue(counts, _target_probs(logits, 0.7, 1.0)) < 0.001  # no truncation
    assert chi2_pvalue(counts, _target_probs(logits, 0.8, 0.9)) < 0.001  # wrong temperature
    wrong = target.clone()
    wrong[3] += 0.06  # shifts P(3) by ~0.02, about 6 standard errors at n = 20k
    assert chi2_pvalue(counts, wrong) < 0.001


def test_compute_and_gather_logprobs() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 0.0]], dtype=torch.bfloat16)
    lp = compute_logprobs(logits)
    assert lp.dtype == torch.float32
    assert torch.allclose(lp.exp().sum(-1), torch.ones(2))
    assert torch.allclose(lp, torch.log_softmax(logits.float(), -1))
    chosen, ranks, top_ids, top_lps = gather_logprobs(lp, torch.tensor([2, 1]), 2)
    assert torch.allclose(chosen, torch.stack([lp[0, 2], lp[1, 1]]))
    assert ranks.tolist() == [2, 4]  # ties share the worst rank (vLLM counts >=)
    assert top_ids[0].tolist() == [1, 2]
    assert top_ids[1, 0].item() == 2
    assert torch.allclose(top_lps[0], lp[0, [1, 2]])
    _, ranks1, ids0, lps0 = gather_logprobs(lp, torch.tensor([1, 2]), 0)
    assert ranks1.tolist() == [1, 1]
    assert ids0.shape == (2, 0) and lps0.shape == (2, 0)
    assert math.isclose(float(chosen[1]), float(lp[1, 1]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_argmax_last_equals_argmax_on_cpu(dtype: torch.dtype) -> None:
    """The CPU argmax (``max(-1).indices``, several times faster over a vocabulary) picks torch.argmax's index:
    random rows, exact ties (the first index), NaN (its index), +inf / all -inf rows, 1-3 dims."""
    from specserve.layers.sampler import argmax_last

    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 5000, generator=g).to(dtype)
    x[0, 17] = x[0, 4000] = 50  # tie: first index
    x[1, 9] = float("nan")
    x[1, 10] = float("inf")
    x[2, 11] = x[2, 12] = float("inf")
    x[3] = float("-inf")
    x[4] = 0  # all equal
    for t in (x, x[0], x.view(2, 3, 5000), torch.randn(3, 4, 49152, generator=g).to(dtype)):
        assert torch.equal(argmax_last(t), t.argmax(-1))
    assert argmax_last(x)[:5].tolist() == [17, 9, 11, 0, 0]


@pytest.mark.parametrize("over", ["seeds", "positions"])
def test_seeded_sample_distribution_chi_square(over: str) -> None:
    """Seeded rows draw from the target distribution: across 20k seeds at one position, and across 20k positions
    of one seed (the counter-based noise, not torch's generator)."""
    logits = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -2.0, 1.5, -1.0])
    n = 20000
    if over == "seeds":
        st = _st([SamplingParams(temperature=0.7, top_p=0.9, seed=s) for s in range(n)], [3] * n)
    else:
        st = _st([SamplingParams(temperature=0.7, top_p=0.9, seed=12345)] * n, list(range(n)))
    assert all(st.seed_keys)
    tokens = sample(logits.expand(n, -1), st)
    counts = torch.bincount(tokens, minlength=8)
    target = _target_probs(logits, 0.7, 0.9)
    assert chi2_pvalue(counts, target) > 0.001
    assert chi2_pvalue(counts, _target_probs(logits, 0.8, 0.9)) < 0.001  # power: a wrong temperature


def test_top_k_and_top_p_keep_runs_of_ties_whole():
    """A threshold decides each kept set (as the sort-free Triton sampler's do): top-k keeps every value tied with
    the k-th largest, top-p every value tied with the last one its mass needs; the top value always stays."""
    from specserve.layers.sampler import apply_sampling_constraints, static_sampling_tensors

    logits = torch.tensor([[0.2, 0.4, 0.2, 0.1, 0.2]]).log()

    def kept(top_k: int, top_p: float) -> list[int]:
        st = static_sampling_tensors(
            torch.tensor([1.0]), torch.tensor([top_k]), torch.tensor([top_p]), torch.tensor([0.0])
        )
        return apply_sampling_constraints(logits, st)[0].isfinite().nonzero().flatten().tolist()

    assert kept(2, 1.0) == [0, 1, 2, 4]  # the 2nd largest (0.2) is tied three ways
    assert kept(1, 1.0) == [1]
    assert kept(0, 0.5) == [0, 1, 2, 4]  # 0.4 + 0.2 reaches 0.5; the other 0.2s are tied with that one
    assert kept(0, 0.3) == [1]  # 0.4 alone reaches 0.3
    assert kept(0, 0.95) == [0, 1, 2, 3, 4]
    assert kept(0, 0.05) == [1]  # below the top value's own mass: the top value stays


def test_n_ceiling_follows_vllm_max_n_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECSERVE_MAX_N_SEQUENCES", raising=False)
    monkeypatch.delenv("VLLM_MAX_N_SEQUENCES", raising=False)
    SamplingParams(n=16384)  # vLLM's default ceiling
    with pytest.raises(ValueError, match=r"^n must be at most 16384"):
        SamplingParams(n=16385)
    monkeypatch.setenv("VLLM_MAX_N_SEQUENCES", "4")
    SamplingParams(n=4)
    with pytest.raises(ValueError, match=r"^n must be at most 4"):
        SamplingParams(n=5)
    monkeypatch.setenv("SPECSERVE_MAX_N_SEQUENCES", "2")  # ours wins over vLLM's name
    with pytest.raises(ValueError, match=r"^n must be at most 2"):
        SamplingParams(n=3)
    monkeypatch.setenv("SPECSERVE_MAX_N_SEQUENCES", "many")
    with pytest.raises(ValueError, match="SPECSERVE_MAX_N_SEQUENCES must be an integer"):
        SamplingParams(n=1)


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "presence_penalty", "repetition_penalty"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must"):
        SamplingParams(**{field: value})
    with pytest.raises(ValueError, match=r"^logit_bias must"):
        SamplingParams(logit_bias={3: value})
