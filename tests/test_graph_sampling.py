"""Random sampling inside the uniform (graph) step: sample_verify, and the engine taking it for temperature > 0.

sample_verify is rejection_sample for a padded batch (static shapes, torch's default generator).  The unit tests
check its distributions with chi-square tests (the global torch seed is fixed so the tests are reproducible),
each with a power check: a deliberately wrong variant must fail the same test.  On CPU the "graphs" run
eagerly on the same static buffers, so the engine tests check that temperature > 0 steps take the in-graph path
(plain decode, n-gram, DFlash with the fused step), that greedy requests keep their exact tokens, and that
logprobs requests keep the host path, and that seeded requests sample in the graphs with the host sampler's
tokens (the counter-based noise of specserve.layers.seeded_noise).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from drafters import make_dflash
from stats import chi2_pvalue

import specserve.spec.rejection as rejection_mod
from specserve import LLM, SamplingParams
from specserve.layers.sampler import SamplingTensors, apply_sampling_constraints, param_row
from specserve.layers.seeded_noise import seed_key
from specserve.spec.rejection import greedy_verify, sample_verify

VOCAB = 49152
PROMPTS = [
    "Hello there, how are you doing today? I wanted to ask you about the weather in",
    "1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7",
    "a",
]


# ---------------------------------------------------------------------------------------------- helpers
def _params(sps: list[SamplingParams]) -> tuple[torch.Tensor, ...]:
    rows = [param_row(p) for p in sps]
    return (
        torch.tensor([r[0] for r in rows], dtype=torch.float32),
        torch.tensor([r[1] for r in rows], dtype=torch.int32),
        torch.tensor([r[2] for r in rows], dtype=torch.float32),
        torch.tensor([r[3] for r in rows], dtype=torch.float32),
    )


def _target_probs(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """The host sampler's distribution for one row of logits."""
    st = SamplingTensors.from_params([sp])
    return apply_sampling_constraints(logits.view(1, -1), st).softmax(-1)[0]


def _run(
    logits: torch.Tensor, drafts: list[int], num_draft: int, sp: SamplingParams, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """n copies of one request (q = len(drafts) + 1 rows of logits): (tokens [n, q], accepted [n])."""
    q = logits.shape[0]
    ids = torch.tensor([7] + drafts, dtype=torch.int64).repeat(n)
    temp, top_k, top_p, min_p = _params([sp] * n)
    nd = torch.full((n,), num_draft, dtype=torch.int32)
    packed = sample_verify(logits.repeat(n, 1), ids, temp, top_k, top_p, min_p, nd, n, q)
    assert packed.shape == (n, q + 1) and packed.dtype == torch.int64
    return packed[:, :q], packed[:, q]


def _counts(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab)


# ---------------------------------------------------------------------------------------------- plain sampling
@pytest.mark.parametrize(
    "sp",
    [
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=1.3, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.7),
        SamplingParams(temperature=0.9, min_p=0.15),
        SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05),
    ],
)
def test_plain_sampling_matches_the_host_distribution(sp):
    torch.manual_seed(0)
    vocab, n = 8, 20000
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(1)) * 1.5
    tokens, accepted = _run(logits, [], 0, sp, n)
    assert (accepted == 0).all()
    want = _target_probs(logits[0], sp)
    assert chi2_pvalue(_counts(tokens[:, 0], vocab), want) > 1e-3
    # power: the distribution without this request's constraints (temperature 1, no filters) is rejected
    assert chi2_pvalue(_counts(tokens[:, 0], vocab), logits[0].softmax(-1)) < 1e-6


def test_mixed_batch_greedy_rows_are_greedy_verify():
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(2)
    b, q, vocab = 12, 4, 5
    logits = torch.randn(b * q, vocab, generator=g)
    ids = torch.randint(0, vocab, (b * q,), generator=g)
    sps = [SamplingParams(temperature=0.0 if j % 2 else 0.9, top_k=1 if j % 3 == 0 else 0) for j in range(b)]
    temp, top_k, top_p, min_p = _params(sps)
    nd = torch.randint(0, q, (b,), generator=g)
    packed = sample_verify(logits, ids, temp, top_k, top_p, min_p, nd, b, q)
    ref = greedy_verify(logits, ids, b, q)
    greedy = torch.tensor([p.greedy for p in sps])
    assert torch.equal(packed[greedy], ref[greedy])
    # random rows: count capped at num_draft, the emitted drafts are the real drafts
    for j in (~greedy).nonzero().flatten().tolist():
        a = int(packed[j, q])
        assert 0 <= a <= int(nd[j])
        assert packed[j, :a].tolist() == ids[j * q + 1 : j * q + 1 + a].tolist()


def test_profile_sampling_call_samples_every_row():
    """The memory profile's sample_verify call (GPU only in the engine): every row is a random row of its own."""
    from specserve.runner.model_runner import ModelRunner

    torch.manual_seed(2)
    logits = torch.zeros(3000, 4)
    logits[:, 1] = 1.0
    packed = ModelRunner._profile_sampling(logits, torch.zeros(3000, dtype=torch.int64))
    assert packed.shape == (3000, 2) and (packed[:, 1] == 0).all()
    assert chi2_pvalue(_counts(packed[:, 0], 4), logits[0].softmax(-1)) > 1e-3


# ---------------------------------------------------------------------------------------------- verification
VOCAB_S = 6
SP = SamplingParams(temperature=0.9, top_k=5)


def _verify_logits(seed: int) -> torch.Tensor:
    return torch.randn(3, VOCAB_S, generator=torch.Generator().manual_seed(seed)) * 1.5


@pytest.mark.parametrize("which", ["likely", "unlikely", "filtered"])
def test_first_token_is_lossless_and_acceptance_rate_is_p(which):
    torch.manual_seed(3)
    n = 40000
    logits = _verify_logits(4)
    p0, p1 = _target_probs(logits[0], SP), _target_probs(logits[1], SP)
    order = p0.argsort(descending=True).tolist()
    d0 = {"likely": order[0], "unlikely": order[3], "filtered": order[-1]}[which]  # filtered: p0(d0) == 0
    d1 = order[1]
    tokens, accepted = _run(logits, [d0, d1], 2, SP, n)
    assert chi2_pvalue(_counts(tokens[:, 0], VOCAB_S), p0) > 1e-3
    rate, want = float((accepted >= 1).double().mean()), float(p0[d0])
    if want == 0:
        assert rate == 0
    else:
        assert abs(rate - want) < 4 * (want * (1 - want) / n) ** 0.5
    # the token after an accepted draft is distributed as p_1, whatever the second draft
    after = tokens[accepted >= 1, 1]
    if after.numel() > 1000:
        assert chi2_pvalue(_counts(after, VOCAB_S), p1) > 1e-3
    assert (accepted <= 2).all()
    assert (tokens[accepted >= 1, 0] == d0).all() and (tokens[accepted == 2, 1] == d1).all()


def test_power_residual_from_p_instead_of_p_without_the_draft(monkeypatch):
    """Recovering from p (instead of p with the rejected draft removed) over-emits the draft: caught."""
    torch.manual_seed(5)
    n = 40000
    logits = _verify_logits(4)
    p0 = _target_probs(logits[0], SP)
    d0 = int(p0.argmax())
    monkeypatch.setattr(rejection_mod, "_residual", lambda p, d, q: p)
    tokens, _ = _run(logits, [d0, 0], 2, SP, n)
    assert chi2_pvalue(_counts(tokens[:, 0], VOCAB_S), p0) < 1e-6


def test_power_wrong_bonus_row(monkeypatch):
    """Drawing the token after an accepted draft from p_0 again (a wrong row) fails the p_1 test."""
    torch.manual_seed(6)
    n = 40000
    logits = _verify_logits(7)
    p0, p1 = _target_probs(logits[0], SP), _target_probs(logits[1], SP)
    d0 = int(p0.argmax())
    wrong = logits.clone()
    wrong[1] = wrong[0]  # what an off-by-one row index would read
    tokens, accepted = _run(wrong[:2], [d0], 1, SP, n)
    assert chi2_pvalue(_counts(tokens[accepted == 1, 1], VOCAB_S), p1) < 1e-6


@pytest.mark.parametrize("num_draft", [0, 1])
def test_padding_drafts_are_never_accepted(num_draft):
    """Drafts past num_draft are padding (token 0 in the graphs); make token 0 (nearly) certain under the target
    at every row: the padding is still never accepted, and the bonus comes from p at row num_draft (mostly token
    0 here; a residual would never give 0)."""
    torch.manual_seed(8)
    n = 20000
    logits = _verify_logits(9)
    logits[:, 0] += 6.0
    drafts = [0, 0]
    pb = _target_probs(logits[num_draft], SP)
    tokens, accepted = _run(logits, drafts, num_draft, SP, n)
    assert (accepted <= num_draft).all()
    assert chi2_pvalue(_counts(tokens[accepted == num_draft, num_draft], VOCAB_S), pb) > 1e-3
    # power: the same drafts, all real, get accepted past num_draft
    _, acc_all = _run(logits, drafts, 2, SP, 2000)
    assert (acc_all > num_draft).float().mean() > 0.5


# ---------------------------------------------------------------------------------------------- seeded rows
def _seeded_verify(logits, drafts, num_draft, sps, first_pos):  # type: ignore[no-untyped-def]
    """sample_verify over requests with per-request seeds: logits [b*q, V], drafts [b][q-1], the position of each
    request's first sampled token."""
    b, q = len(sps), len(drafts[0]) + 1
    ids = torch.tensor([[7] + d for d in drafts], dtype=torch.int64).flatten()
    pos = (torch.tensor(first_pos).unsqueeze(1) - 1 + torch.arange(q)).flatten()  # input rows' positions
    keys = torch.tensor([seed_key(p.seed) if p.seed is not None else 0 for p in sps])
    temp, top_k, top_p, min_p = _params(sps)
    nd = torch.tensor(num_draft, dtype=torch.int32)
    return sample_verify(logits, ids, temp, top_k, top_p, min_p, nd, b, q, seed_key=keys.int(), pos=pos)


def test_seeded_rows_equal_the_host_rejection_sampler():
    """A seeded request in the graphs' sampler emits what rejection_sample gives it on the host (the same draws:
    seed and positions), whatever its batch, its number of real drafts or its position; other rows vary."""
    q, b = 4, 6
    g = torch.Generator().manual_seed(11)
    sps = [
        SamplingParams(temperature=0.9, seed=1),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.2, top_k=50, seed=2),
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=1.0, top_p=0.8, seed=3),
        SamplingParams(temperature=0.7, min_p=0.05, seed=1),
    ]
    emitted_lens = set()
    for trial in range(12):
        logits = torch.randn(b * q, VOCAB_S, generator=g) * 2
        drafts = [torch.randint(0, VOCAB_S, (q - 1,), generator=g).tolist() for _ in range(b)]
        for j in range(b):  # a likely first draft, so that some drafts are accepted
            drafts[j][0] = int(logits[j * q].argmax())
        num_draft = [(trial + j) % q for j in range(b)]
        first = [10 * trial + 3 * j for j in range(b)]
        packed = _seeded_verify(logits, drafts, num_draft, sps, first)
        for j, sp in enumerate(sps):
            if sp.seed is None:
                continue
            n = num_draft[j]
            rows = logits[j * q : j * q + n + 1]
            d = torch.tensor([drafts[j][:n]], dtype=torch.int64).view(1, n)
            st = SamplingTensors.from_params([sp], [first[j]])
            out, num = rejection_mod.rejection_sample(rows, d, torch.tensor([n]), st)
            host = out[0, : int(num[0])].tolist()
            acc = min(int(packed[j, q]), n)
            assert packed[j, : acc + 1].tolist() == host, (trial, j)
            emitted_lens.add(len(host))
    assert {1, 2} <= emitted_lens  # rejections and acceptances both happened


def test_seeded_rows_first_token_is_lossless():
    """Across seeds, a seeded request's first emitted token follows p_0 (the draws of position n are
    uniform over seeds) and a draft is accepted with probability p_0(draft)."""
    n, q = 20000, 3
    logits = _verify_logits(4)
    p0 = _target_probs(logits[0], SP)
    d0 = int(p0.argsort(descending=True)[2])
    sps = [dataclasses.replace(SP, seed=s) for s in range(n)]
    packed = _seeded_verify(logits.repeat(n, 1), [[d0, 1]] * n, [2] * n, sps, [50] * n)
    assert chi2_pvalue(_counts(packed[:, 0], VOCAB_S), p0) > 1e-3
    rate, want = float((packed[:, q] >= 1).double().mean()), float(p0[d0])
    assert abs(rate - want) < 4 * (want * (1 - want) / n) ** 0.5
    # power: the tokens do not follow a wrong distribution (p_1)
    assert chi2_pvalue(_counts(packed[:, 0], VOCAB_S), _target_probs(logits[1], SP)) < 1e-6


# ---------------------------------------------------------------------------------------------- engine
@pytest.fixture(scope="module")
def dflash_dir(tmp_path_factory) -> str:
    return make_dflash(tmp_path_factory.mktemp("gs_dflash"), 64, 4, VOCAB, layer_ids=[0, 2])


def _spec(method: str, dflash_dir: str, draft_model: str = ""):  # type: ignore[no-untyped-def]
    return {
        "plain": None,
        "ngram": {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 3,
        },
        "dflash": {"method": "dflash", "model": dflash_dir, "num_speculative_tokens": 3},
        "draft_model": {"method": "draft_model", "model": draft_model, "num_speculative_tokens": 3},
    }[method]


def _llm(model: str, spec, padded: bool = True) -> LLM:  # type: ignore[no-untyped-def]
    return LLM(
        model, dtype="float32", device="cpu", max_num_seqs=4, speculative_config=spec, padded_decode=padded
    )


def _record(llm: LLM) -> list:
    """Per step: (any random request, any logprobs request, in-graph sampling steps taken, uniform step)."""
    runner = llm.engine.runner
    log: list = []
    execute = runner.execute

    def wrapped(sched):  # type: ignore[no-untyped-def]
        before = runner.num_sampling_steps
        uniform = all(s.num_new_tokens == 1 and s.samples for s in sched.scheduled)
        out = execute(sched)
        ps = [s.req.params for s in sched.scheduled]
        rand = any(not p.greedy for p in ps)
        host = any(p.logprobs is not None for p in ps)
        log.append((rand, host, runner.num_sampling_steps - before, uniform))
        return out

    runner.execute = wrapped
    return log


def _check_spec_metrics(llm: LLM) -> None:
    m = llm.get_metrics()
    if "spec_decode_num_drafts" in m:
        assert 0 <= m["spec_decode_num_accepted_tokens"] <= m["spec_decode_num_draft_tokens"]
    assert m["num_free_blocks"] == m["num_gpu_blocks"]


@pytest.mark.parametrize("method", ["plain", "ngram", "dflash", "draft_model"])
def test_engine_samples_in_the_graphs(method, often_qwen3_dir, dflash_dir):
    spec = _spec(method, dflash_dir, often_qwen3_dir)  # draft_model: the target drafting for itself
    max_tokens = [14, 9, 12]
    greedy = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    mixed = [SamplingParams(temperature=0.8, max_tokens=m, ignore_eos=True) for m in max_tokens[:2]] + greedy[
        2:
    ]
    mixed[1].top_k, mixed[1].top_p = 20, 0.9
    base = [o.outputs[0].token_ids for o in _llm(often_qwen3_dir, spec).generate(PROMPTS, greedy)]
    torch.manual_seed(0)
    llm = _llm(often_qwen3_dir, spec)
    log = _record(llm)
    outs = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, mixed)]
    runner = llm.engine.runner
    assert [len(t) for t in outs] == max_tokens
    assert all(0 <= t < VOCAB for toks in outs for t in toks)
    assert outs[2] == base[2]  # the greedy request of the mixed batch: token for token its greedy output
    # every uniform step with a random request in it sampled in the graphs
    for rand, _, took, uniform in log:
        assert took == int(uniform and rand)
    assert runner.num_sampling_steps > 0
    assert runner.num_sampling_steps <= runner.num_fast_steps
    _check_spec_metrics(llm)
    if spec is not None:
        m = llm.get_metrics()
        assert m["spec_decode_num_drafts"] > 0 and m["spec_decode_num_accepted_tokens"] > 0
    if method in ("dflash", "draft_model"):
        assert runner.use_fused_step and runner.num_fused_steps > 0
        assert runner.num_fused_steps <= runner.num_fast_steps


@pytest.mark.parametrize("method", ["ngram", "dflash"])
def test_logprobs_requests_keep_the_host_path_seeded_ones_do_not(method, often_qwen3_dir, dflash_dir):
    """A logprobs request keeps its steps on the host side; a seeded one samples in the graphs, and its tokens
    depend on nothing but its seed: not on torch's global seed (the unseeded in-graph draws), not on the path
    (the ragged engine samples on the host), not on its batch (alone)."""
    spec = _spec(method, dflash_dir)
    sps = [
        SamplingParams(temperature=0.8, seed=11, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=0.8, logprobs=2, max_tokens=4, ignore_eos=True),
        SamplingParams(temperature=0.8, max_tokens=30, ignore_eos=True),
    ]
    results = []
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)  # the in-graph draws; the seeded request must not depend on them
        llm = _llm(often_qwen3_dir, spec)
        log = _record(llm)
        outs = llm.generate(PROMPTS, sps)
        for _, host, took, uniform in log:
            assert took == int(uniform and not host)
        assert llm.engine.runner.num_sampling_steps > 0  # the unseeded request alone, at the end
        lp = outs[1].outputs[0].logprobs
        assert lp is not None and len(lp) == 4
        assert [len(o.outputs[0].token_ids) for o in outs] == [6, 4, 30]
        _check_spec_metrics(llm)
        results.append(outs[0].outputs[0].token_ids)
    assert results[0] == results[1]
    ragged = _llm(often_qwen3_dir, spec, padded=False).generate(PROMPTS, sps)
    assert ragged[0].outputs[0].token_ids == results[0]
    alone = _llm(often_qwen3_dir, spec).generate(PROMPTS[:1], sps[:1])
    assert alone[0].outputs[0].token_ids == results[0]
    other_seed = _llm(often_qwen3_dir, spec).generate(PROMPTS[:1], [dataclasses.replace(sps[0], seed=12)])
    assert other_seed[0].outputs[0].token_ids != results[0]


@pytest.mark.parametrize("method", ["plain", "dflash"])
def test_engine_triton_sampler_equals_torch_sampler(method, often_qwen3_dir, dflash_dir, monkeypatch):
    """The engine's in-graph sampling steps with the sort-free Triton sampler (interpreted here; the default on
    CUDA) emit the torch sampler's tokens: seeded, unseeded (the same draws of torch's generator) and greedy."""
    from specserve.layers.sampler import SAMPLER_ENV

    # 8192-entry programs: 6 a row instead of 48 (the interpreter runs every program of every launch; the rows split
    # over many programs are test_triton_sampling's)
    monkeypatch.setenv("SPECSERVE_SAMPLER_BLOCK", "8192")
    spec = _spec(method, dflash_dir)
    sps = [
        SamplingParams(temperature=0.8, min_p=0.01, seed=5, max_tokens=7, ignore_eos=True),
        SamplingParams(temperature=1.1, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),
    ]
    outs = {}
    for mode in ("torch", "triton"):
        monkeypatch.setenv(SAMPLER_ENV, mode)
        torch.manual_seed(0)
        llm = _llm(often_qwen3_dir, spec)
        outs[mode] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sps)]
        assert llm.engine.runner.num_sampling_steps > 0
        _check_spec_metrics(llm)
    assert outs["triton"] == outs["torch"]


def test_sort_free_batches_take_the_triton_graphs(often_qwen3_dir, dflash_dir, monkeypatch):
    """Batches whose random rows use neither top-k nor top-p replay the sort-free sampling graphs (the Triton form
    without its top-k / top-p rounds), the others the main set (here on CPU with auto: torch's form; on CUDA the
    Triton form with its rounds); the tokens are the torch-only engine's either way."""
    import specserve.runner.model_runner as mr
    from specserve.layers.sampler import SAMPLER_ENV

    free = [
        SamplingParams(temperature=0.8, seed=5, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=1.2, min_p=0.02, max_tokens=5, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
    ]
    topp = [dataclasses.replace(free[0], top_p=0.9), free[1], dataclasses.replace(free[2], top_k=3)]
    runs = {}
    for mode in ("torch", "auto"):
        monkeypatch.setenv(SAMPLER_ENV, mode)
        monkeypatch.setattr(
            mr, "sort_free_graphs_on", lambda dev, mode=mode: mode == "auto"
        )  # CUDA's default
        llm = _llm(often_qwen3_dir, None)
        r = llm.engine.runner
        assert bool(r.sort_free_graphs) == (mode == "auto")
        out = []
        for sps in (free, topp):
            torch.manual_seed(0)
            n0, s0 = r.num_sort_free_steps, r.num_sampling_steps
            out.append([o.outputs[0].token_ids for o in llm.generate(PROMPTS, sps)])
            out.append((r.num_sort_free_steps - n0, r.num_sampling_steps - s0))
        runs[mode] = out
    (free_t, (n_free, s_free), topp_t, (n_topp, _)) = runs["auto"]
    assert free_t == runs["torch"][0] and topp_t == runs["torch"][2]
    assert n_free == s_free > 0  # every sampling step of the sort-free batch
    assert n_topp == 0


def test_bf16_graph_logits_stay_bf16_and_sampling_reads_fp32(often_qwen3_dir, monkeypatch):
    """The target graphs return bf16 logits (no fp32 copy on greedy steps); the sampling graph hands them to
    sample_verify as they are (the Triton form reads bf16), whose torch form and the host path (logits
    processing) convert them: both compute on fp32 logits with the bf16 values."""
    import specserve.runner.model_runner as mr

    seen: dict[str, list] = {"graph": [], "sample": [], "host": [], "constraints": []}
    real_sv, real_pl = mr.sample_verify, mr.ModelRunner._process_logits
    real_c = rejection_mod.apply_sampling_constraints

    def constraints(logits, st):  # type: ignore[no-untyped-def]
        seen["constraints"].append(logits.dtype)
        return real_c(logits, st)

    monkeypatch.setattr(rejection_mod, "apply_sampling_constraints", constraints)

    def sv(logits, *a, **k):  # type: ignore[no-untyped-def]
        seen["sample"].append(logits.dtype)
        return real_sv(logits, *a, **k)

    def pl(self, logits, items):  # type: ignore[no-untyped-def]
        seen["host"].append(logits.dtype)
        return real_pl(self, logits, items)

    monkeypatch.setattr(mr, "sample_verify", sv)
    monkeypatch.setattr(mr.ModelRunner, "_process_logits", pl)
    llm = LLM(often_qwen3_dir, dtype="bfloat16", device="cpu", max_num_seqs=4, padded_decode=True)
    runner = llm.engine.runner
    fwd = runner._forward_uniform

    def forward(*a, **k):  # type: ignore[no-untyped-def]
        out = fwd(*a, **k)
        seen["graph"].append(out[0].dtype)
        return out

    runner._forward_uniform = forward
    sps = [
        SamplingParams(temperature=0.8, max_tokens=5, ignore_eos=True),  # in-graph sampling
        SamplingParams(temperature=0.8, max_tokens=5, ignore_eos=True, logit_bias={7: 1.0}),  # host path
    ]
    llm.generate(PROMPTS[:1], sps[:1])
    llm.generate(PROMPTS[:1], sps[1:])
    assert seen["graph"] and set(seen["graph"]) == {torch.bfloat16}
    assert seen["sample"] and set(seen["sample"]) == {torch.bfloat16}
    assert seen["constraints"] and set(seen["constraints"]) == {torch.float32}
    assert seen["host"] and set(seen["host"]) == {torch.float32}
