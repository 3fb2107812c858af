"""Tests for specserve.spec.rejection: greedy verification, losslessness (chi-square), seeding."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

import pytest
import torch
from stats import chi2_pvalue

import specserve.spec.rejection as rejection_mod
from specserve.layers.sampler import SamplingTensors, sample
from specserve.sampling_params import SamplingParams
from specserve.spec.rejection import PLACEHOLDER, rejection_sample


def _st(params: list[SamplingParams], positions: list[int] | None = None) -> SamplingTensors:
    """Sampling tensors; every request's first sampled position is 0 unless ``positions`` says otherwise."""
    return SamplingTensors.from_params(
        params, positions if positions is not None else [0] * len(params), "cpu"
    )


def _pack(per_req_logits: list[torch.Tensor], drafts: list[list[int]]) -> tuple[torch.Tensor, ...]:
    """Flatten per-request [n_b + 1, V] logits; pad drafts to [B, K] with -1."""
    k = max((len(d) for d in drafts), default=0)
    draft_t = torch.full((len(drafts), k), -1, dtype=torch.int64)
    for b, d in enumerate(drafts):
        draft_t[b, : len(d)] = torch.tensor(d, dtype=torch.int64)
    num = torch.tensor([len(d) for d in drafts], dtype=torch.int64)
    return torch.cat(per_req_logits), draft_t, num


def _emitted(out: torch.Tensor, num: torch.Tensor) -> list[list[int]]:
    res = []
    for row, n in zip(out.tolist(), num.tolist()):
        assert all(t == PLACEHOLDER for t in row[n:])
        assert all(t != PLACEHOLDER for t in row[:n])
        res.append(row[:n])
    return res


def _greedy_reference(logits: torch.Tensor, draft: list[int]) -> list[int]:
    out = []
    am = logits.argmax(-1).tolist()
    for i, d in enumerate(draft):
        out.append(am[i])
        if d != am[i]:
            return out
    out.append(am[len(draft)])
    return out


# ----------------------------------------------------------------------------------------- greedy


def test_greedy_all_accepted_plus_bonus() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 10)
    chain = logits.argmax(-1).tolist()
    tl, d, n = _pack([logits], [chain[:3]])
    out, num = rejection_sample(tl, d, n, _st([SamplingParams(temperature=0.0)]))
    assert num.tolist() == [4]
    assert out.tolist() == [chain]


@pytest.mark.parametrize("mismatch", [0, 1, 2])
def test_greedy_first_mismatch(mismatch: int) -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, 10)
    chain = logits.argmax(-1).tolist()
    draft = chain[:3]
    draft[mismatch] = (draft[mismatch] + 1) % 10
    if mismatch + 1 < 3:
        draft[mismatch + 1] = (draft[mismatch + 1] + 3) % 10  # later drafts are irrelevant
    tl, d, n = _pack([logits], [draft])
    out, num = rejection_sample(tl, d, n, _st([SamplingParams(temperature=0.0)]))
    assert num.tolist() == [mismatch + 1]
    assert out[0, : mismatch + 1].tolist() == chain[: mismatch + 1]
    assert (out[0, mismatch + 1 :] == PLACEHOLDER).all()


def test_greedy_zero_drafts_is_plain_decode() -> None:
    torch.manual_seed(2)
    logits = torch.randn(3, 10)  # three requests, one row each
    out, num = rejection_sample(
        logits,
        torch.full((3, 2), -1),
        torch.zeros(3, dtype=torch.int64),
        _st([SamplingParams(temperature=0)] * 3),
    )
    assert num.tolist() == [1, 1, 1]
    assert out[:, 0].tolist() == logits.argmax(-1).tolist()
    assert (out[:, 1:] == PLACEHOLDER).all()
    # K = 0 drafts tensor works too
    out0, num0 = rejection_sample(
        logits,
        torch.empty(3, 0, dtype=torch.int64),
        torch.zeros(3, dtype=torch.int64),
        _st([SamplingParams(temperature=0)] * 3),
    )
    assert out0.shape == (3, 1) and out0[:, 0].tolist() == logits.argmax(-1).tolist()
    assert num0.tolist() == [1, 1, 1]


def test_greedy_mixed_num_draft_batch_matches_reference() -> None:
    gen = torch.Generator().manual_seed(3)
    vocab = 7
    for _ in range(30):
        b = int(torch.randint(1, 6, (1,), generator=gen))
        per_logits, drafts = [], []
        for _ in range(b):
            nd = int(torch.randint(0, 5, (1,), generator=gen))
            lg = torch.randn(nd + 1, vocab, generator=gen)
            am = lg.argmax(-1)
            # drafts mostly correct so that long acceptances happen
            wrong = torch.rand(nd, generator=gen) < 0.25
            d = torch.where(wrong[:nd], (am[:nd] + 1) % vocab, am[:nd]).tolist()
            per_logits.append(lg)
            drafts.append(d)
        tl, d_t, n_t = _pack(per_logits, drafts)
        out, num = rejection_sample(tl, d_t, n_t, _st([SamplingParams(temperature=0.0)] * b))
        assert out.shape == (b, d_t.shape[1] + 1)
        got = _emitted(out, num)
        for bi in range(b):
            assert got[bi] == _greedy_reference(per_logits[bi], drafts[bi])


def test_mixed_greedy_and_random_rows() -> None:
    torch.manual_seed(4)
    vocab = 12
    lg = [torch.randn(3, vocab) for _ in range(4)]
    chains = [x.argmax(-1).tolist() for x in lg]
    drafts = [chains[0][:2], [chains[1][0], (chains[1][1] + 1) % vocab], chains[2][:2], chains[3][:2]]
    # rows 2 and 3 sample; row 3's target is sharply peaked on its argmax chain
    lg[3] = lg[3] * 0 + torch.nn.functional.one_hot(torch.tensor(chains[3]), vocab) * 50.0
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=1),  # greedy
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.0, top_p=0.9),
    ]
    tl, d, n = _pack(lg, drafts)
    out, num = rejection_sample(tl, d, n, _st(params), fallback=torch.Generator().manual_seed(0))
    got = _emitted(out, num)
    assert got[0] == chains[0]
    assert got[1] == chains[1][:2]
    assert 1 <= len(got[2]) <= 3
    assert got[3] == chains[3]  # p(draft) = 1 -> always accepted, bonus is the peak


# ----------------------------------------------------------------------------------------- random


def test_draft_outside_top_k_is_never_accepted() -> None:
    n = 2000
    logits = torch.tensor([3.0, 2.5, 2.0, 0.0, -1.0, 1.0])
    st = _st([SamplingParams(temperature=1.0, top_k=2)] * n)
    tl = logits.repeat(2 * n, 1)  # one draft position + bonus per request
    draft = torch.full((n, 1), 2)  # third most likely: outside top-2
    out, num = rejection_sample(
        tl, draft, torch.ones(n, dtype=torch.int64), st, fallback=torch.Generator().manual_seed(1)
    )
    assert (num == 1).all()
    assert set(out[:, 0].tolist()) == {0, 1}


def test_draft_with_zero_draft_prob_is_rejected() -> None:
    n = 500
    vocab = 5
    tl = torch.zeros(2 * n, vocab)  # uniform target
    q = torch.zeros(n, 1, vocab)
    q[..., 4] = 1.0  # the drafter claims it would never propose token 0
    draft = torch.zeros(n, 1, dtype=torch.int64)
    out, num = rejection_sample(
        tl,
        draft,
        torch.ones(n, dtype=torch.int64),
        _st([SamplingParams(temperature=1.0)] * n),
        q,
        torch.Generator().manual_seed(0),
    )
    assert (num == 1).all()
    # recovered from max(0, p - q): token 4 has p - q < 0, everything else is uniform
    assert set(out[:, 0].tolist()) == {0, 1, 2, 3}


def _ref_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Independent reference for the constrained target distribution (plain Python over the vocab)."""
    x = logits.double() / p.temperature
    probs = torch.softmax(x, -1)
    keep = [True] * len(x)
    if p.min_p > 0:
        keep = [bool(probs[i] >= p.min_p * probs.max()) for i in range(len(x))]
    order = sorted((i for i in range(len(x)) if keep[i]), key=lambda i: -float(x[i]))
    if p.top_k > 0:
        order = order[: p.top_k]
    w = torch.zeros_like(probs)
    w[order] = probs[order]
    w = w / w.sum()
    if p.top_p < 1:
        kept, mass = [], 0.0
        for i in order:
            if kept and mass >= p.top_p:
                break
            kept.append(i)
            mass += float(w[i])
        order = kept
    out = torch.zeros_like(probs)
    out[order] = w[order]
    return out / out.sum()


VOCAB = 8
_G = torch.Generator().manual_seed(1234)
LOGITS1 = torch.randn(VOCAB, generator=_G) * 1.2
LOGITS2 = torch.randn(VOCAB, VOCAB, generator=_G) * 1.2  # row x: position-2 logits after x
LOGITS_BONUS = torch.randn(VOCAB, generator=_G)


def _two_step_trials(
    params: SamplingParams,
    drafter: str,
    n: int,
    seed: int,
    rs: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    seeded: bool = False,
) -> torch.Tensor:
    """Sample n two-token continuations through speculative steps; return [n, 2] (x1, x2).

    Step 1 drafts (d1, d2) and verifies them against [LOGITS1, LOGITS2[d1], bonus].  Rows that emit a
    single token run a second step from context x1 with one draft (or none, on odd rows).  ``seeded``: row i is
    a request with seed ``seed * n + i`` (its draws the counter-based noise of positions 40 and 41).
    """
    gen = torch.Generator().manual_seed(seed)
    row_params = [params] * n
    if seeded:
        row_params = [dataclasses.replace(params, seed=seed * n + i) for i in range(n)]
    st = _st(row_params, [40] * n)
    p1 = _ref_probs(LOGITS1, params)
    # biased drafters: the deterministic one proposes low-probability tokens; the random one is
    # anti-correlated with the target
    det1 = int(torch.nonzero(p1 > 0).flatten()[p1[p1 > 0].argmin()])
    q1 = torch.softmax(-LOGITS1, -1)
    q2 = torch.softmax(-LOGITS2, -1)

    def propose(ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if drafter == "det":
            return (ctx * 3 + 1) % VOCAB, None
        q = q2[ctx]
        return torch.multinomial(q, 1, generator=gen).squeeze(1), q

    if drafter == "det":
        d1 = torch.full((n,), det1)
        qd1 = None
    else:
        d1 = torch.multinomial(q1.expand(n, -1), 1, replacement=True, generator=gen).squeeze(1)
        qd1 = q1.expand(n, -1)
    d2, qd2 = propose(d1)
    logits = torch.stack([LOGITS1.expand(n, -1), LOGITS2[d1], LOGITS_BONUS.expand(n, -1)], 1).reshape(
        3 * n, VOCAB
    )
    drafts = torch.stack([d1, d2], 1)
    dp = None if qd1 is None else torch.stack([qd1, qd2], 1)
    out, num = rs(logits, drafts, torch.full((n,), 2), st, dp, gen)
    x1 = out[:, 0]
    x2 = out[:, 1].clone()

    # second step for rows that only emitted x1
    redo = torch.nonzero(num == 1).flatten()
    m = redo.numel()
    ctx = x1[redo]
    d, q = propose(ctx)
    nd = torch.arange(m) % 2  # alternate 0 / 1 drafts
    d = torch.where(nd == 1, d, torch.full_like(d, -1))
    # per request rows: [LOGITS2[ctx]] (+ bonus row when it has a draft)
    rows = []
    for j in range(2):
        rows.append(LOGITS2[ctx] if j == 0 else LOGITS_BONUS.expand(m, -1))
    stacked = torch.stack(rows, 1)  # [m, 2, V]
    keep = torch.ones(m, 2, dtype=torch.bool)
    keep[:, 1] = nd == 1
    logits2 = stacked[keep]
    dp2 = None if q is None else q.unsqueeze(1)
    st2 = _st([row_params[i] for i in redo.tolist()], [41] * m)
    out2, num2 = rs(logits2, d.unsqueeze(1), nd, st2, dp2, gen)
    x2[redo] = out2[:, 0]
    return torch.stack([x1, x2], 1)


CONFIGS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.8, top_k=5),
    SamplingParams(temperature=1.0, top_p=0.8),
    SamplingParams(temperature=1.3, top_k=6, top_p=0.9, min_p=0.05),
]


def _joint_target(params: SamplingParams) -> torch.Tensor:
    p1 = _ref_probs(LOGITS1, params)
    p2 = torch.stack([_ref_probs(LOGITS2[x], params) for x in range(VOCAB)])
    return p1.unsqueeze(1) * p2


def _check(samples: torch.Tensor, params: SamplingParams) -> tuple[float, float]:
    joint = _joint_target(params)
    counts1 = torch.bincount(samples[:, 0], minlength=VOCAB)
    counts12 = torch.bincount(samples[:, 0] * VOCAB + samples[:, 1], minlength=VOCAB * VOCAB)
    return chi2_pvalue(counts1, joint.sum(1)), chi2_pvalue(counts12, joint.flatten())


@pytest.mark.parametrize("drafter", ["det", "rand"])
@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
def test_lossless_chi_square(drafter: str, cfg: int) -> None:
    params = CONFIGS[cfg]
    samples = _two_step_trials(params, drafter, 20000, seed=100 + cfg, rs=rejection_sample)
    p_first, p_joint = _check(samples, params)
    assert p_first > 0.001, p_first
    assert p_joint > 0.001, p_joint


@pytest.mark.parametrize("drafter", ["det", "rand"])
@pytest.mark.parametrize("cfg", [0, 3])
def test_lossless_chi_square_seeded(drafter: str, cfg: int) -> None:
    """Seeded requests (one seed per trial: the counter-based noise) are lossless too: x1 and (x1, x2) follow
    the target although step 2 runs from where step 1 stopped (its draws those of the next position)."""
    params = CONFIGS[cfg]
    samples = _two_step_trials(params, drafter, 20000, seed=3 + cfg, rs=rejection_sample, seeded=True)
    p_first, p_joint = _check(samples, params)
    assert p_first > 0.001, p_first
    assert p_joint > 0.001, p_joint


def test_drafter_is_actually_biased_and_often_accepted() -> None:
    # guard against a vacuous lossless test: drafts must be accepted sometimes and rejected often
    params = CONFIGS[0]
    n = 5000
    gen = torch.Generator().manual_seed(9)
    p1 = _ref_probs(LOGITS1, params)
    det1 = int(p1.argmin())
    assert float(p1[det1]) < 0.1
    logits = torch.stack(
        [LOGITS1.expand(n, -1), LOGITS2[torch.full((n,), det1)], LOGITS_BONUS.expand(n, -1)], 1
    )
    drafts = torch.tensor([[det1, 0]]).expand(n, -1)
    _, num = rejection_sample(
        logits.reshape(3 * n, VOCAB), drafts, torch.full((n,), 2), _st([params] * n), None, gen
    )
    rate = float((num >= 2).double().mean())
    assert abs(rate - float(p1[det1])) < 0.02


def test_seeded_chi_square_has_power(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reusing position 40's draws in step 2 (a wrong position key) correlates x2 with x1: the joint test sees it."""
    real = _st

    def reused(params: list[SamplingParams], positions: list[int] | None = None) -> SamplingTensors:
        return real(params, [40] * len(params) if positions and positions[0] == 41 else positions)

    monkeypatch.setattr(sys.modules[__name__], "_st", reused)
    params = CONFIGS[0]
    samples = _two_step_trials(params, "det", 20000, seed=3, rs=rejection_sample, seeded=True)
    assert _check(samples, params)[1] < 0.001


@pytest.mark.parametrize("broken", ["always_accept", "recover_from_p"])
@pytest.mark.parametrize("drafter", ["det", "rand"])
def test_chi_square_has_power(broken: str, drafter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if broken == "always_accept":
        real = rejection_mod._draw_uniform
        monkeypatch.setattr(rejection_mod, "_draw_uniform", lambda *a, **kw: real(*a, **kw) * 0.0)
    else:
        monkeypatch.setattr(rejection_mod, "_residual", lambda p, draft, q: p)
    params = CONFIGS[0]
    samples = _two_step_trials(params, drafter, 20000, seed=7, rs=rejection_mod.rejection_sample)
    p_first, p_joint = _check(samples, params)
    assert min(p_first, p_joint) < 0.001


# ----------------------------------------------------------------------------------------- seeding


def _seeded_run(seed: int, alone: bool) -> list[list[int]]:
    """25 speculative steps of a seeded request (3 drafts each) whose position advances by what it emits, alone
    or batched with others (different drafts, positions, seeds; a greedy one)."""
    vocab = 40
    data = torch.Generator().manual_seed(77)
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=seed)
    res, pos = [], 50
    for step in range(25):
        lg = torch.randn(4, vocab, generator=data)
        drafts = torch.randint(0, vocab, (3,), generator=data).tolist()
        drafts[0] = int(lg[0].argmax())  # likely accepted: the run sees acceptances and rejections
        if alone:
            tl, d, n = _pack([lg], [drafts])
            out, num = rejection_sample(
                tl, d, n, _st([params], [pos]), fallback=torch.Generator().manual_seed(1)
            )
            toks = _emitted(out, num)[0]
        else:
            other = torch.randn(6, vocab)
            tl, d, n = _pack([other[:2], lg, other[2:3], other[3:6]], [[1], drafts, [], [2, 3]])
            ps = [
                SamplingParams(temperature=0.5),
                params,
                SamplingParams(temperature=0.0),
                SamplingParams(temperature=1.0, seed=9),
            ]
            st = _st(ps, [step, pos, 3, pos])
            out, num = rejection_sample(tl, d, n, st, fallback=torch.Generator().manual_seed(2 + step))
            toks = _emitted(out, num)[1]
        res.append(toks)
        pos += len(toks)
    return res


def test_seeded_rows_reproducible_and_batch_independent() -> None:
    a = _seeded_run(5, alone=True)
    assert a == _seeded_run(5, alone=True)
    assert a == _seeded_run(5, alone=False)  # the batch around it changes nothing
    assert a != _seeded_run(6, alone=True)
    lens = [len(t) for t in a]
    assert min(lens) == 1 and max(lens) >= 2  # both rejections and acceptances happened


def test_seeded_zero_draft_row_matches_plain_sampler() -> None:
    """A seeded request without drafts draws the token at its position exactly as sample() does there."""
    vocab = 30
    data = torch.Generator().manual_seed(3)
    params = SamplingParams(temperature=0.9, seed=11)
    via_sample, via_rs = [], []
    for i in range(30):
        lg = torch.randn(1, vocab, generator=data)
        via_sample.append(int(sample(lg, _st([params], [i]))[0]))
        other = torch.randn(3, vocab)
        tl, d, n = _pack([lg, other], [[], [4, 5]])
        st = _st([params, SamplingParams(temperature=1.0)], [i, 2 * i])
        out, num = rejection_sample(tl, d, n, st)
        assert int(num[0]) == 1
        via_rs.append(int(out[0, 0]))
    assert via_sample == via_rs
    assert len(set(via_sample)) > 10


def test_seeded_rejection_emits_the_plain_sampler_token_at_the_rejected_position() -> None:
    """Drafting never changes which noise decides a position: with point-mass drafts rejected at once, the
    recovered token at position n is drawn from p with the draft removed by the race of position n."""
    vocab = 30
    data = torch.Generator().manual_seed(4)
    params = SamplingParams(temperature=1.0, seed=21)
    for i in range(20):
        lg = torch.randn(2, vocab, generator=data)
        p = torch.softmax(lg[0], -1)
        bad = int(p.argmin())  # almost surely rejected
        tl, d, n = _pack([lg], [[bad]])
        out, num = rejection_sample(tl, d, n, _st([params], [100 + i]))
        if int(num[0]) != 1:
            continue
        masked = lg[:1].clone()
        masked[0, bad] = float("-inf")
        assert int(out[0, 0]) == int(sample(masked, _st([params], [100 + i]))[0])
