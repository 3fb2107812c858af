"""The sort-free Triton sampler (specserve.layers.triton_sampling, interpreted on CPU) against the torch form of
sample_verify: the same draws (torch's generator in the same order, seeded rows' counter-based noise) give the same
tokens, acceptances and greedy rows, over temperature / min-p / top-k / top-p, drafts, padding and seeds."""

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


@pytest.mark.parametrize("q", [1, 4])
@pytest.mark.parametrize("vocab", [300, 4500])
def test_triton_sampler_equals_torch_form(monkeypatch, q, vocab):
    gen = torch.Generator().manual_seed(q * 1000 + vocab)
    b = len(PARAMS)
    seen_acc = set()
    for trial in range(4 if vocab < 1000 else 2):
        logits, ids, temp, top_k, top_p, min_p, keys, pos = _inputs(PARAMS, q, vocab, gen)
        nd = torch.tensor([(trial + j) % q for j in range(b)], dtype=torch.int32)
        want, got = _both(monkeypatch, logits, ids, temp, top_k, top_p, min_p, nd, b, q, keys, pos, trial)
        assert torch.equal(got, want), (trial, got, want)
        seen_acc |= set(want[:, q].tolist())
    if q > 1:
        assert len(seen_acc) >= 2  # acceptances varied


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
    """SPECSERVE_SAMPLER takes auto / triton / torch; SPECSERVE_SAMPLER_BLOCK a power of 2; auto captures the
    sort-free graphs on CUDA only, and routes only batches without top-k / top-p there."""
    from specserve.layers.triton_sampling import sample_verify_triton

    monkeypatch.setenv(sampler.SAMPLER_ENV, "fast")
    with pytest.raises(ValueError, match=sampler.SAMPLER_ENV):
        sampler.sampler_mode()
    monkeypatch.setenv(sampler.SAMPLER_ENV, "auto")
    assert sampler.sort_free_graphs_on(torch.device("cuda")) and not sampler.sort_free_graphs_on(
        torch.device("cpu")
    )
    assert not sampler.triton_sampler_on(torch.device("cuda"))
    monkeypatch.setenv(sampler.SAMPLER_ENV, "triton")
    assert sampler.triton_sampler_on(torch.device("cpu")) and not sampler.sort_free_graphs_on(
        torch.device("cuda")
    )
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
