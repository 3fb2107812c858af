"""The fused DFlash step: on a greedy uniform verify step the drafter's half (context K/V, the query pass over
[bonus, MASK x K], its argmax) runs on the device right after the target's verify graph, and the step comes
back in one device-to-host copy.

On CPU the "graphs" run eagerly on the same static buffers, so these tests check that the fused step answers
exactly what the host-side proposer does: the same tokens as the ragged path, step for step the same emitted
tokens, drafts and spec metrics as the padded path with the fused step off, the same drafter KV cache, and that
it runs on exactly the uniform greedy verify steps. Acceptance varies with targets edited to make the random
drafter right some of the time (two dominant tokens) or always (one dominant token).
"""

from __future__ import annotations

import pytest
import torch
from drafters import edit_target, make_dflash

from specserve import LLM, SamplingParams
from specserve.engine.request import Request
from specserve.engine.scheduler import ScheduledRequest, SchedulerOutput
from specserve.layers.attention_ref import paged_attention_ref
from specserve.runner.cuda_graphs import PaddedBatch
from specserve.runner.model_runner import greedy_verify

VOCAB = 49152
PROMPTS = [
    "Hello there, how are you doing today? I wanted to ask you about the weather in",
    "1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7",
    "a",
]
MAX_TOKENS = [23, 14, 9]  # different ends: drafts get shortened (max_drafts) at different steps


# ---------------------------------------------------------------------------------------------- checkpoints
@pytest.fixture(scope="module")
def dflash_dir(tmp_path_factory) -> str:
    return make_dflash(tmp_path_factory.mktemp("fs_dflash"), 64, 4, VOCAB, layer_ids=[0, 2])


@pytest.fixture(scope="module")
def eagle3_dir(tmp_path_factory) -> str:
    from drafters import make_eagle3

    return make_eagle3(tmp_path_factory.mktemp("fs_eagle3"), 64, 4, VOCAB)


@pytest.fixture(scope="module")
def eagle3_head_dir(tmp_path_factory) -> str:
    """An EAGLE-3 head with its own reduced-vocabulary LM head (d2t mapping)."""
    from drafters import make_eagle3

    return make_eagle3(tmp_path_factory.mktemp("fs_eagle3_head"), 64, 4, VOCAB, draft_vocab=8192)


@pytest.fixture(scope="module")
def always_dir(tiny_qwen3_dir, tmp_path_factory) -> str:
    """Every embedding has a large component 0 and one LM-head row reads only it: target and drafter (which
    shares the embeddings and the LM head) always pick token 101, so every draft is accepted."""

    def edit(w):  # type: ignore[no-untyped-def]
        w["model.embed_tokens.weight"][:, 0] += 30
        w["lm_head.weight"][101, 0] += 100

    return edit_target(tiny_qwen3_dir, tmp_path_factory.mktemp("fs_always"), edit)


# ---------------------------------------------------------------------------------------------- helpers
def _llm(model: str, spec, padded: bool = True, fused: bool = True, **kw) -> LLM:  # type: ignore[no-untyped-def]
    llm = LLM(
        model,
        dtype="float32",
        device="cpu",
        max_num_seqs=4,
        speculative_config=spec,
        padded_decode=padded,
        **kw,
    )
    if not fused:  # the same padded path, drafter on the host side (what every step did before)
        llm.engine.runner.use_fused_step = False
    return llm


def _dflash(dflash_dir: str, k: int, **extra) -> dict:  # type: ignore[no-untyped-def]
    return {"method": "dflash", "model": dflash_dir, "num_speculative_tokens": k, **extra}


def _record(llm: LLM) -> list:
    """Per step: (scheduled ids, {id: (new tokens, num_draft, num_accepted)}, drafts, fused steps taken, whether
    the step is a uniform greedy verify step: every request runs one committed token (+ drafts) and samples,
    some request has drafts and the greedy fast path applies)."""
    runner = llm.engine.runner
    log: list = []
    execute = runner.execute

    def wrapped(sched):  # type: ignore[no-untyped-def]
        before = runner.num_fused_steps
        items = sched.scheduled
        verify = (
            all(s.num_new_tokens == 1 and s.samples for s in items)
            and any(s.spec_token_ids for s in items)
            and runner._graph_sampling_ok(items)
        )
        out = execute(sched)
        res = {rid: (o.new_token_ids, o.num_draft, o.num_accepted) for rid, o in out.outputs.items()}
        ids = [s.req.request_id for s in items]
        log.append((ids, res, dict(out.drafts), runner.num_fused_steps - before, verify))
        return out

    runner.execute = wrapped
    return log


def _caches(llm: LLM) -> list[torch.Tensor]:
    p = llm.engine.runner.proposer
    if p.method == "draft_model":
        return [t for kv in p.model.kv_caches for t in kv]
    return [t for kv in (p.caches if hasattr(p, "caches") else [p.cache]) for t in kv]


def _assert_same_caches(a: LLM, b: LLM) -> None:
    """Same slots written (caches start at zero; a written K/V row is never all zeros), same values up to the
    rounding of a GEMM over a different number of rows."""
    for x, y in zip(_caches(a), _caches(b)):
        assert torch.equal((x != 0).any(-1).any(-1), (y != 0).any(-1).any(-1))
        torch.testing.assert_close(x, y, atol=2e-5, rtol=1e-4)


def _spec_metrics(llm: LLM) -> dict:
    return {k: v for k, v in llm.get_metrics().items() if k.startswith("spec_decode")}


def _lockstep(model: str, spec, prompts, sps, **kw) -> tuple[LLM, list, list[list[int]]]:  # type: ignore[no-untyped-def]
    """Fused vs fused-off padded engines stepped side by side: after every step the same step results, drafts
    and drafter KV caches; at the end the same spec metrics and tokens, and every uniform greedy verify step
    (only those) fused. Returns the fused engine, its step log and its tokens per request."""
    llms = _llm(model, spec, fused=True, **kw), _llm(model, spec, fused=False, **kw)
    fused, slow = llms
    assert fused.engine.runner.use_fused_step
    logs = [_record(llm) for llm in llms]
    done: list[dict[str, list[int]]] = [{}, {}]
    for llm in llms:
        for i, (p, sp) in enumerate(zip(prompts, sps)):
            llm.engine.add_request(str(i), p, sp)
    while fused.engine.has_unfinished_requests():
        for llm, d in zip(llms, done):
            for out in llm.engine.step():
                if out.finished:
                    d[out.request_id] = list(out.outputs[0].token_ids)
        assert logs[0][-1][:3] == logs[1][-1][:3]
        _assert_same_caches(fused, slow)
    assert not slow.engine.has_unfinished_requests()
    assert done[0] == done[1] and len(done[0]) == len(prompts)
    assert _spec_metrics(fused) == _spec_metrics(slow)
    assert slow.engine.runner.num_fused_steps == 0
    assert [e[3] for e in logs[0]] == [int(e[4]) for e in logs[0]]
    assert 0 < fused.engine.runner.num_fused_steps <= fused.engine.runner.num_fast_steps
    for llm in llms:
        m = llm.get_metrics()
        assert m["num_free_blocks"] == m["num_gpu_blocks"]
    return fused, logs[0], [done[0][str(i)] for i in range(len(prompts))]


def _generate(llm: LLM, prompts, sps) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [o.outputs[0].token_ids for o in llm.generate(prompts, sps)]


# ---------------------------------------------------------------------------------------------- end to end
def _accepted(log: list, k: int) -> tuple[set[int], int, int]:
    """Over the fused steps: the acceptance lengths of full-length drafts, the number of shortened drafts
    (0 < num_draft < k) and of requests that verified no draft while others did."""
    res = [r for e in log if e[3] for r in e[1].values()]
    return {r[2] for r in res if r[1] == k}, sum(0 < r[1] < k for r in res), sum(r[1] == 0 for r in res)


@pytest.mark.parametrize("k", [4, 15])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("target", ["random", "often", "always"])
def test_fused_step_equals_host_drafter_and_ragged(
    target, batch, k, tiny_qwen3_dir, often_qwen3_dir, always_dir, dflash_dir
):
    model = {"random": tiny_qwen3_dir, "often": often_qwen3_dir, "always": always_dir}[target]
    spec = _dflash(dflash_dir, k)
    sps = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS[:batch]]
    _, log, toks = _lockstep(model, spec, PROMPTS[:batch], sps)
    assert toks == _generate(_llm(model, spec, padded=False), PROMPTS[:batch], sps)
    accepted, shortened, _ = _accepted(log, k)
    if target == "always":
        assert all(r[2] == r[1] for e in log if e[3] for r in e[1].values())
        assert shortened > 0  # the budget (max_tokens) cut the drafts near the end
    if target == "often":
        assert 0 in accepted and len(accepted) >= 2


@pytest.mark.parametrize("k", [2, 5])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("target", ["random", "often"])
@pytest.mark.parametrize("head", [False, True])
def test_fused_eagle3_step_equals_host_drafter_and_ragged(
    target, batch, k, head, tiny_qwen3_dir, often_qwen3_dir, eagle3_dir, eagle3_head_dir
):
    """EAGLE-3's fused step (first pass over the committed rows + K-1 autoregressive steps on the device, after
    the verify graph): step for step what the host-side proposer does, and the ragged path's tokens."""
    model = {"random": tiny_qwen3_dir, "often": often_qwen3_dir}[target]
    spec = {"method": "eagle3", "model": eagle3_head_dir if head else eagle3_dir, "num_speculative_tokens": k}
    sps = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS[:batch]]
    _, log, toks = _lockstep(model, spec, PROMPTS[:batch], sps)
    assert toks == _generate(_llm(model, spec, padded=False), PROMPTS[:batch], sps)
    accepted, shortened, _ = _accepted(log, k)
    if target == "often" and not head:
        assert 0 in accepted and len(accepted) >= 2, accepted


@pytest.mark.parametrize(
    "pair,batch,k", [("random", 3, 5), ("self", 1, 2), ("self", 3, 5), ("often", 3, 2), ("often", 1, 5)]
)
def test_fused_draft_model_step_equals_host_drafter_and_ragged(
    pair, batch, k, tiny_qwen3_dir, tiny2_qwen3_dir, often_qwen3_dir
):
    """vLLM's draft_model on the fused step (one causal pass over the committed rows + the bonus token, then K-1
    one-token steps, all on the device after the verify graph): step for step what the host-side proposer
    does, the same draft-model KV cache, and the ragged path's tokens; a model drafting for itself accepts
    every draft."""
    target, drafter = {
        "random": (tiny_qwen3_dir, tiny2_qwen3_dir),
        "self": (often_qwen3_dir, often_qwen3_dir),
        "often": (often_qwen3_dir, tiny_qwen3_dir),
    }[pair]
    spec = {"method": "draft_model", "model": drafter, "num_speculative_tokens": k}
    sps = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS[:batch]]
    _, log, toks = _lockstep(target, spec, PROMPTS[:batch], sps)
    assert toks == _generate(_llm(target, spec, padded=False), PROMPTS[:batch], sps)
    if pair == "self":
        res = [r for e in log if e[3] for r in e[1].values()]
        assert res and all(r[2] == r[1] for r in res)
        assert any(r[1] == k for r in res)


@pytest.mark.parametrize("method", ["eagle3", "draft_model"])
def test_fused_steps_near_the_ends(
    method, often_qwen3_dir, tiny_qwen3_dir, eagle3_dir, smol_tokenizer, monkeypatch
):
    """EAGLE-3's and the draft model's fused steps next to max_model_len, the drafter's context cap and the step's
    token budget, with padding drafts that "match" (n_match past num_draft must be capped for the first pass and
    the bonus)."""
    sps = [
        SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=11, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
    ]
    drafter = eagle3_dir if method == "eagle3" else often_qwen3_dir  # the draft model: the target itself
    spec = {"method": method, "model": drafter, "num_speculative_tokens": 4, "max_model_len": 36}
    _, log, toks = _lockstep(often_qwen3_dir, spec, PROMPTS, sps, max_model_len=48)
    assert toks == _generate(_llm(often_qwen3_dir, spec, padded=False, max_model_len=48), PROMPTS, sps)
    assert len(toks[0]) == 48 - len(smol_tokenizer(PROMPTS[0]).input_ids)
    _, shortened, no_draft = _accepted(log, 4)
    assert shortened > 0 and no_draft > 0
    monkeypatch.setattr("specserve.runner.model_runner.greedy_verify", _padding_always_matches)
    if method == "draft_model":  # a draft model other than the target, no cap: drafts rejected at times
        spec = {"method": "draft_model", "model": tiny_qwen3_dir, "num_speculative_tokens": 4}
    kw = {"max_model_len": 48, "max_num_batched_tokens": 12}
    sps = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (28, 9, 17)]
    _lockstep(often_qwen3_dir, spec, PROMPTS, sps, **kw)


def test_near_max_model_len_and_drafter_context_cap(always_dir, often_qwen3_dir, dflash_dir, smol_tokenizer):
    """Requests that run into max_model_len (max_tokens unset) and into the drafter's own context cap
    (speculative_config.max_model_len), next to requests that end on max_tokens."""
    sps = [
        SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),  # until max_model_len
        SamplingParams(temperature=0, max_tokens=11, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
    ]
    for model, extra in ((always_dir, {}), (often_qwen3_dir, {"max_model_len": 36})):
        spec = _dflash(dflash_dir, 4, **extra)
        _, log, toks = _lockstep(model, spec, PROMPTS, sps, max_model_len=48)
        assert toks == _generate(_llm(model, spec, padded=False, max_model_len=48), PROMPTS, sps)
        assert len(toks[0]) == 48 - len(smol_tokenizer(PROMPTS[0]).input_ids)
        _, shortened, no_draft = _accepted(log, 4)
        assert shortened > 0  # drafts cut by max_model_len / max_tokens / the drafter's cap in fused steps
        if extra:  # past the drafter's cap a request goes on without drafts, next to requests that draft
            assert no_draft > 0


def _padding_always_matches(logits, ids, b, q):  # type: ignore[no-untyped-def]
    """greedy_verify as if the target's argmax were token 0 wherever a draft is padding (token 0): n_match then
    runs past num_draft, and only the cap at num_draft keeps the accepted rows right."""
    packed = greedy_verify(logits, ids, b, q)
    d = ids.view(b, q)[:, 1:]
    match = (d == packed[:, : q - 1]) | (d == 0)
    packed[:, q] = match.to(torch.int64).cumprod(dim=1).sum(dim=1)
    return packed


def test_n_match_past_the_real_drafts_is_capped(often_qwen3_dir, dflash_dir, monkeypatch):
    """Drafts cut by the step's token budget (max_num_batched_tokens: a request verifies fewer drafts than its
    own budget allows), by max_tokens and the drafter's cap, next to full ones, with padding that "matches":
    the fused step caps n_match at each request's num_draft for the context K/V and the bonus token too."""
    monkeypatch.setattr("specserve.runner.model_runner.greedy_verify", _padding_always_matches)
    spec = _dflash(dflash_dir, 4, max_model_len=36)
    sps = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (28, 9, 17)]
    kw = {"max_model_len": 48, "max_num_batched_tokens": 12}
    _, log, toks = _lockstep(often_qwen3_dir, spec, PROMPTS, sps, **kw)
    monkeypatch.undo()
    assert toks == _generate(_llm(often_qwen3_dir, spec, padded=False, **kw), PROMPTS, sps)
    _, shortened, no_draft = _accepted(log, 4)
    assert shortened > 0 and no_draft > 0


@pytest.mark.parametrize("method", ["dflash", "draft_model"])
def test_mixed_batches_logprobs_keep_the_host_path_seeded_sampling_fuses(
    method, often_qwen3_dir, tiny_qwen3_dir, dflash_dir
):
    """A request asking for logprobs keeps the host path while it runs (the greedy ones fuse again once it is
    done); a seeded sampled request fuses with the greedy ones (its draws keyed by seed and position); outputs
    and drafter caches stay those of the fused-off engine either way."""
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    spec = (
        _dflash(dflash_dir, 4)
        if method == "dflash"
        else {"method": "draft_model", "model": tiny_qwen3_dir, "num_speculative_tokens": 4}
    )
    for special, fuses in (
        (SamplingParams(temperature=0.8, seed=3, max_tokens=6, ignore_eos=True), True),
        (SamplingParams(temperature=0, max_tokens=5, logprobs=1, ignore_eos=True), False),
    ):
        fused, log, _ = _lockstep(often_qwen3_dir, spec, PROMPTS, [greedy, special, greedy])
        assert any(e[3] and "1" in e[0] for e in log) == fuses  # request 1 in a fused step
        assert any(e[3] and "1" not in e[0] for e in log)  # the greedy ones fuse without it


def test_fused_step_only_for_padded_drafters(tiny_qwen3_dir, dflash_dir, eagle3_dir):
    def eagle(k: int, **extra) -> dict:  # type: ignore[no-untyped-def]
        return {"method": "eagle3", "model": eagle3_dir, "num_speculative_tokens": k, **extra}

    for spec in (
        _dflash(dflash_dir, 4),
        eagle(3),
        {"method": "draft_model", "model": tiny_qwen3_dir, "num_speculative_tokens": 3},
    ):
        assert _llm(tiny_qwen3_dir, spec).engine.runner.use_fused_step
    for spec, padded in (
        (_dflash(dflash_dir, 4), False),
        (_dflash(dflash_dir, 4, enforce_eager=True), True),
        (_dflash(dflash_dir, 4, disable_padded_drafter_batch=True), True),
        (eagle(3), False),
        (eagle(3, enforce_eager=True), True),
        (eagle(3, disable_padded_drafter_batch=True), True),
        (eagle(1), True),  # one draft: no autoregressive steps, no drafter graphs
        ({"method": "draft_model", "model": tiny_qwen3_dir, "num_speculative_tokens": 3}, False),
        (
            {
                "method": "draft_model",
                "model": tiny_qwen3_dir,
                "num_speculative_tokens": 3,
                "enforce_eager": True,
            },
            True,
        ),
        ({"method": "ngram", "num_speculative_tokens": 3}, True),
        (None, True),
    ):
        llm = _llm(tiny_qwen3_dir, spec, padded=padded)
        assert not llm.engine.runner.use_fused_step
        _generate(llm, PROMPTS[:2], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        assert llm.engine.runner.num_fused_steps == 0


def test_query_block_outside_the_block_table_writes_nothing(tiny_qwen3_dir, dflash_dir):
    """A request whose block table does not cover its next query block (the scheduler's lookahead slots
    prevent this; the host path raises) gets no drafts and its query pass writes no KV anywhere, while the
    request next to it drafts as usual."""
    k, bs = 4, 16
    spec = _dflash(dflash_dir, k)
    greedy = SamplingParams(temperature=0, max_tokens=100)

    def sched() -> SchedulerOutput:
        # request 0 at position 19 with blocks for 0..31: verify 19..23, query block within 20..28: covered.
        # request 1 at position 11 with one block (0..15): verify 11..15 fits, its query block (from 12 + n_acc
        # to 16 + n_acc) does not.
        r0 = Request("r0", list(range(1000, 1020)), greedy, 100, num_computed_tokens=19, block_table=[3, 4])
        r1 = Request("r1", list(range(2000, 2012)), greedy, 100, num_computed_tokens=11, block_table=[5])
        return SchedulerOutput(
            [ScheduledRequest(r0, 1, [7, 8, 9, 10]), ScheduledRequest(r1, 1, [11, 12])], []
        )

    llm = _llm(tiny_qwen3_dir, spec)
    runner = llm.engine.runner
    before = [t.clone() for t in _caches(llm)]
    out = runner.execute(sched())
    assert runner.num_fused_steps == 1
    acc = {rid: o.num_accepted for rid, o in out.outputs.items()}
    assert list(out.drafts) == ["r0"] and len(out.drafts["r0"]) == k
    expect = torch.zeros(before[0].shape[:2], dtype=torch.bool)
    for blocks, start, query in (([3, 4], 19, True), ([5], 11, False)):
        n_acc = acc["r0" if query else "r1"]
        pos = list(range(start, start + n_acc + 1))  # context K/V of the committed rows
        if query:
            pos += list(range(start + n_acc + 1, start + n_acc + 2 + k))
        for p in pos:
            expect[blocks[p // bs], p % bs] = True
    for old, new in zip(before, _caches(llm)):
        changed = (old != new).any(-1).any(-1)
        assert torch.equal(changed, expect)

    slow = _llm(tiny_qwen3_dir, spec, fused=False)
    with pytest.raises(ValueError, match="does not cover"):
        slow.engine.runner.execute(sched())


# ---------------------------------------------------------------------------------------------- PaddedBatch
def test_padded_batch_block_table_is_minus_one_past_each_table_and_aux():
    buf = PaddedBatch(max_batch=4, q=3, max_blocks=6, device=torch.device("cpu"), num_aux=2)
    bs = 4
    long_rows = [([1, 2, 3], 17, [9, 8, 7, 6, 5]), ([4], 0, [1, 2, 3, 4, 10, 11])]
    buf.fill(2, long_rows, bs, aux=[[2, 30], [0, -5]])
    v = buf.views(2)
    assert v.bt.tolist() == [[9, 8, 7, 6, 5, -1], [1, 2, 3, 4, 10, 11]]
    assert v.aux.tolist() == [[2, 30], [0, -5]] and v.aux.dtype == torch.int32
    assert v.seq.tolist() == [20, 3]
    # shorter tables afterwards (and a bucket whose layout overlaps the previous one): no stale block id
    # survives anywhere in a real request's row, padding requests get aux zeros
    rows = [([5, 6], 2, [3]), ([7], 5, [2, 4])]
    buf.fill(4, rows, bs, aux=[[1, 7], [0, 3]])
    v = buf.views(4)
    assert v.bt[:2].tolist() == [[3, -1, -1, -1, -1, -1], [2, 4, -1, -1, -1, -1]]
    assert v.aux.tolist() == [[1, 7], [0, 3], [0, 0], [0, 0]]
    assert v.slots.tolist() == [14, 15, -1, 17, -1, -1] + [-1] * 6
    assert v.seq.tolist() == [5, 8, 0, 0]
    buf.fill(4, rows, bs)  # no aux: zeros
    assert buf.views(4).aux.tolist() == [[0, 0]] * 4
    with pytest.raises(ValueError, match="aux"):
        buf.fill(4, rows, bs, aux=[[1, 2]])
    plain = PaddedBatch(max_batch=2, q=1, max_blocks=3, device=torch.device("cpu"))
    plain.fill(2, [([5], 4, [1, 2])], bs)
    assert plain.views(2).aux.shape == (2, 0) and plain.views(2).bt[0].tolist() == [1, 2, -1]


def test_attention_reads_a_negative_block_id_as_block_zero():
    """Padding rows past a table can see keys in blocks the table does not have (-1): both backends read
    block 0 there (never memory outside the cache) and the real rows are unaffected."""
    g = torch.Generator().manual_seed(0)
    bs, hk, d = 4, 2, 16
    kc, vc = torch.randn(6, bs, hk, d, generator=g), torch.randn(6, bs, hk, d, generator=g)
    q = torch.randn(6, 4, d, generator=g)  # one request: 1 real row at position 3, then 5 padding rows
    qsl, seq = torch.tensor([0, 6], dtype=torch.int32), torch.tensor([9], dtype=torch.int32)
    outs = {}
    for name, row in (("minus", [2, -1, -1]), ("zero", [2, 0, 0])):
        bt = torch.tensor([row], dtype=torch.int32)
        outs[name, "ref"] = paged_attention_ref(q, kc, vc, qsl, seq, bt, causal=True)
        try:
            from specserve.layers import triton_attention as ta
        except ImportError:
            continue
        if type(ta._paged_attn_kernel).__name__ == "InterpretedFunction":
            outs[name, "triton"] = ta.paged_attention(q, kc, vc, qsl, seq, bt, causal=True, max_query_len=6)
    for key in [k for k in outs if k[0] == "minus"]:
        torch.testing.assert_close(outs[key], outs["zero", key[1]])
    torch.testing.assert_close(
        outs["minus", "ref"][:1], outs.get(("minus", "triton"), outs["minus", "ref"])[:1]
    )
