"""Greedy fast path of the uniform (graph) step: argmax and acceptance inside the graph, one device-to-host copy.

On CPU the "graphs" run eagerly, so these tests check that the fast path answers exactly what the host-side
rejection sampler does (token for token, same draft/accept counts and metrics), that it steps aside for anything
it does not handle (sampling, logprobs, min_tokens masking), and that PaddedBatch.fill keeps its contract.
"""

from __future__ import annotations

import random

import pytest
import torch
from drafters import make_dflash, make_eagle3

from specserve import LLM, SamplingParams
from specserve.layers.sampler import SamplingTensors
from specserve.runner.cuda_graphs import PaddedBatch
from specserve.runner.model_runner import greedy_verify
from specserve.spec.proposer import DraftInput, Proposer
from specserve.spec.rejection import rejection_sample

VOCAB = 49152
N = 20
PROMPTS = [
    "Hello there, how are you doing today? I wanted to ask you about the weather in",
    "1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7",
    "a",
]


# ---------------------------------------------------------------------------------------------- PaddedBatch.fill
def _reference_fill(b: int, q: int, max_blocks: int, rows, block_size: int):
    """The contract, spelled out per request: (ids, pos, slots, seq, [per real row: its table])."""
    ids, pos, slots, seq = [0] * (b * q), [0] * (b * q), [-1] * (b * q), [0] * b
    for j, (toks, first, table) in enumerate(rows):
        for i in range(q):
            p = first + i
            pos[j * q + i] = p
            if i < len(toks):
                ids[j * q + i] = toks[i]
                slots[j * q + i] = table[p // block_size] * block_size + p % block_size
        seq[j] = first + q
    return ids, pos, slots, seq


def _check(buf: PaddedBatch, b: int, rows, block_size: int) -> None:
    v = buf.views(b)
    ids, pos, slots, seq = _reference_fill(b, buf.q, buf.max_blocks, rows, block_size)
    assert v.ids.tolist() == ids
    assert v.pos.tolist() == pos
    assert v.slots.tolist() == slots
    assert v.seq.tolist() == seq
    for j, (_, _, table) in enumerate(rows):
        # the table, then -1 over the whole rest of the row (no stale block id survives)
        assert v.bt[j].tolist() == table + [-1] * (buf.max_blocks - len(table))
    assert v.ids.dtype == v.pos.dtype == v.slots.dtype == torch.int64
    assert v.seq.dtype == v.bt.dtype == torch.int32
    assert tuple(v.bt.shape) == (b, buf.max_blocks)
    meta = buf.meta(b, 100)
    assert meta.seq_lens is v.seq and meta.block_tables is v.bt and meta.slot_mapping is v.slots
    assert meta.query_start_loc.tolist() == list(range(0, (b + 1) * buf.q, buf.q))


def test_fill_hand_built_case():
    buf = PaddedBatch(max_batch=4, q=3, max_blocks=5, device=torch.device("cpu"))
    bs = 4
    rows = [
        ([7, 8, 9], 5, [3, 1]),  # full q tokens at positions 5..7 (block 1 of its table = block 1)
        ([4], 2, [2]),  # a committed token, no drafts: rows 1, 2 are padding (token 0, slot -1)
        ([5, 6], 7, [0, 4, 2]),  # a draft shorter than q, crossing a block boundary (7 -> 8: blocks 4, 2)
    ]
    buf.fill(4, rows, bs)  # bucket 4: the 4th request is padding
    v = buf.views(4)
    assert v.ids.tolist() == [7, 8, 9, 4, 0, 0, 5, 6, 0, 0, 0, 0]
    assert v.pos.tolist() == [5, 6, 7, 2, 3, 4, 7, 8, 9, 0, 0, 0]
    assert v.slots.tolist() == [5, 6, 7, 10, -1, -1, 19, 8, -1, -1, -1, -1]
    assert v.seq.tolist() == [8, 5, 10, 0]
    assert v.bt[0, :2].tolist() == [3, 1]
    assert v.bt[1, :2].tolist() == [2, -1]  # position 4 (a padding row) is in block 1: not this request's
    assert v.bt[2, :3].tolist() == [0, 4, 2]
    _check(buf, 4, rows, bs)

    # the same buffer, now a smaller bucket (its layout overlaps the previous one) and then bucket 4 again with
    # fewer real requests: every padded request must be reset (seq 0, slot -1), nothing stale may leak
    buf.fill(2, [([11], 0, [4])], bs)
    _check(buf, 2, [([11], 0, [4])], bs)
    assert buf.views(2).slots.tolist() == [16, -1, -1, -1, -1, -1]
    assert buf.views(2).seq.tolist() == [3, 0]
    buf.fill(4, rows[:1], bs)
    _check(buf, 4, rows[:1], bs)
    assert buf.views(4).seq.tolist() == [8, 0, 0, 0]
    buf.fill(1, [], bs)  # an empty batch (what graph capture warms up on): writes no KV anywhere
    assert buf.views(1).slots.tolist() == [-1, -1, -1] and buf.views(1).seq.tolist() == [0]
    with pytest.raises(ValueError, match="do not fit"):
        buf.fill(1, rows[:2], bs)
    with pytest.raises(ValueError, match="does not cover"):
        buf.fill(1, [([1, 2], 3, [5])], bs)  # position 4 needs a second block


def test_fill_random_cases_match_the_contract():
    rng = random.Random(0)
    for q in (1, 2, 5):
        buf = PaddedBatch(max_batch=8, q=q, max_blocks=12, device=torch.device("cpu"))
        for _ in range(60):
            b = rng.choice([1, 2, 4, 8])
            bs = rng.choice([1, 4, 16])
            rows = []
            for _ in range(rng.randint(0, b)):
                first = rng.randint(0, 10 * bs - q)
                toks = [rng.randint(1, VOCAB - 1) for _ in range(rng.randint(1, q))]
                # the table covers the real tokens, maybe not the padding rows
                need = -(-(first + len(toks)) // bs)
                table = rng.sample(range(200), min(12, need + rng.randint(0, 2)))
                rows.append((toks, first, table))
            buf.fill(b, rows, bs)
            _check(buf, b, rows, bs)


# ---------------------------------------------------------------------------------------------- greedy_verify
@pytest.mark.parametrize("q", [1, 2, 5])
def test_greedy_verify_equals_rejection_sample(q):
    """Emitting argmax[:min(n_match, num_draft) + 1] is rejection_sample's greedy answer, including when the
    padding token 0 past num_draft happens to equal the argmax (a tiny vocabulary makes that frequent)."""
    g = torch.Generator().manual_seed(q)
    vocab, k = 3, q - 1
    greedy = SamplingParams(temperature=0)
    for _ in range(200):
        b = int(torch.randint(1, 6, (1,), generator=g))
        logits = torch.randn(b * q, vocab, generator=g)
        ids = torch.zeros(b * q, dtype=torch.long)
        num_draft = [int(torch.randint(0, k + 1, (1,), generator=g)) for _ in range(b)]
        drafts = torch.full((b, k), -1, dtype=torch.long)
        for j, nd in enumerate(num_draft):
            ids[j * q] = int(torch.randint(0, vocab, (1,), generator=g))
            d = torch.randint(0, vocab, (nd,), generator=g)
            ids[j * q + 1 : j * q + 1 + nd] = d
            drafts[j, :nd] = d
        packed = greedy_verify(logits, ids, b, q)
        assert packed.shape == (b, q + 1) and packed.dtype == torch.int64
        fast = [r[: min(r[q], nd) + 1] for r, nd in zip(packed.tolist(), num_draft)]
        # the slow path: the rows of each request's real tokens only, verified on the host side
        rows = [j * q + i for j, nd in enumerate(num_draft) for i in range(nd + 1)]
        st = SamplingTensors.from_params([greedy] * b)
        out, ne = rejection_sample(logits[rows], drafts, torch.tensor(num_draft), st)
        assert fast == [o[:n] for o, n in zip(out.tolist(), ne.tolist())]


# ---------------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def dflash_dir(tmp_path_factory) -> str:
    return make_dflash(tmp_path_factory.mktemp("fp_dflash"), 64, 4, VOCAB, layer_ids=[0, 2])


@pytest.fixture(scope="module")
def eagle_dir(tmp_path_factory) -> str:
    return make_eagle3(tmp_path_factory.mktemp("fp_eagle"), 64, 4, VOCAB)


def _llm(model: str, spec, padded: bool, slow: bool = False, **kw) -> LLM:
    llm = LLM(
        model,
        dtype="float32",
        device="cpu",
        max_num_seqs=4,
        speculative_config=spec,
        padded_decode=padded,
        **kw,
    )
    if slow:  # the same uniform path, verified on the host side (what every step did before the fast path)
        llm.engine.runner._graph_sampling_ok = lambda items: False
    return llm


def _record(llm: LLM) -> list:
    """Per step: (scheduled ids, {id: (new tokens, num_draft, num_accepted)}, drafts, fast steps taken, whether
    the step was uniform: every request runs its one committed token (+ drafts) and samples)."""
    runner = llm.engine.runner
    log: list = []
    execute = runner.execute

    def wrapped(sched):
        before = runner.num_fast_steps
        uniform = all(s.num_new_tokens == 1 and s.samples for s in sched.scheduled)
        out = execute(sched)
        res = {rid: (o.new_token_ids, o.num_draft, o.num_accepted) for rid, o in out.outputs.items()}
        ids = [s.req.request_id for s in sched.scheduled]
        log.append((ids, res, dict(out.drafts), runner.num_fast_steps - before, uniform))
        return out

    runner.execute = wrapped
    return log


def _generate(llm: LLM, prompts, sp) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]


def _spec_metrics(llm: LLM) -> dict:
    return {k: v for k, v in llm.get_metrics().items() if k.startswith("spec_decode")}


def _spec(method: str, dflash_dir: str, eagle_dir: str):
    return {
        "plain": None,
        "ngram": {
            "method": "ngram",
            "num_speculative_tokens": 4,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 3,
        },
        "dflash": {"method": "dflash", "model": dflash_dir, "num_speculative_tokens": 4},
        "eagle3": {"method": "eagle3", "model": eagle_dir, "num_speculative_tokens": 3},
    }[method]


@pytest.mark.parametrize("method", ["plain", "ngram", "dflash", "eagle3"])
def test_fast_path_equals_slow_path_and_ragged(method, tiny_qwen3_dir, dflash_dir, eagle_dir):
    spec = _spec(method, dflash_dir, eagle_dir)
    sp = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    runs = {}
    for name, padded, slow in (("fast", True, False), ("slow", True, True), ("ragged", False, False)):
        llm = _llm(tiny_qwen3_dir, spec, padded, slow)
        log = _record(llm)
        outs = [_generate(llm, PROMPTS[:1], sp), _generate(llm, PROMPTS, sp)]  # batch 1, then batch 3
        runs[name] = (llm, log, outs)
    fast, slow, ragged = runs["fast"], runs["slow"], runs["ragged"]
    assert fast[2] == ragged[2] == slow[2]
    assert fast[0].engine.runner.num_fast_steps > 0
    assert slow[0].engine.runner.num_fast_steps == 0 and ragged[0].engine.runner.num_fast_steps == 0
    # step for step the fast path reports exactly what the host-side verification reported
    assert [e[:3] for e in fast[1]] == [e[:3] for e in slow[1]]
    assert _spec_metrics(fast[0]) == _spec_metrics(slow[0])
    # all greedy: every uniform step (and only those) took the fast path
    assert [e[3] for e in fast[1]] == [int(e[4]) for e in fast[1]]
    if spec is not None:
        assert _spec_metrics(fast[0])["spec_decode_num_drafts"] > 0
        assert any(e[3] and any(r[1] for r in e[1].values()) for e in fast[1])  # verify steps among them
    m = fast[0].get_metrics()
    assert m["num_free_blocks"] == m["num_gpu_blocks"]


class PartialProposer(Proposer):
    """Drafts a known continuation whose first ``m`` tokens are right and the rest wrong, with m cycling
    0..k per call; near max_tokens the engine's max_drafts shortens the drafts (num_draft < K)."""

    method = "scripted"

    def __init__(self, k: int, refs: dict[tuple[int, ...], list[int]]) -> None:
        super().__init__(k)
        self.refs, self.calls = refs, 0

    def propose(self, inputs: list[DraftInput], features: torch.Tensor | None) -> list[list[int]]:
        out = []
        for inp in inputs:
            k = min(self.num_speculative_tokens, inp.max_drafts)
            if not inp.draft or k <= 0:
                out.append([])
                continue
            self.calls += 1
            m = self.calls % (self.num_speculative_tokens + 1)
            for prompt, cont in self.refs.items():
                if tuple(inp.token_ids[: len(prompt)]) == prompt:
                    done = len(inp.token_ids) - len(prompt)
                    nxt = cont[done : done + k]
                    out.append([t if i < m else (t + 1) % VOCAB for i, t in enumerate(nxt)])
                    break
            else:
                out.append([])
        return out


def _padding_always_matches(logits, ids, b, q):
    """greedy_verify as if the target's argmax were token 0 wherever a draft is padding (token 0): n_match then
    runs past num_draft, and only the cap at num_draft keeps the emitted tokens right."""
    packed = greedy_verify(logits, ids, b, q)
    if q > 1:
        d = ids.view(b, q)[:, 1:]
        match = (d == packed[:, : q - 1]) | (d == 0)
        packed[:, q] = match.to(torch.int64).cumprod(dim=1).sum(dim=1)
    return packed


def test_partially_correct_drafts_and_short_drafts(tiny_qwen3_dir, smol_tokenizer, monkeypatch):
    k = 4
    ragged = _llm(tiny_qwen3_dir, None, padded=False)
    full = _generate(ragged, PROMPTS, SamplingParams(temperature=0, max_tokens=N + k + 1, ignore_eos=True))
    refs = {tuple(smol_tokenizer(p).input_ids): f for p, f in zip(PROMPTS, full)}
    # different max_tokens per request: drafts get shortened near each one's end at different steps
    sps = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (N, N - 3, N - 7)]
    runs = {}
    for name, slow in (("fast", False), ("slow", True), ("pad_match", False)):
        if name == "pad_match":
            monkeypatch.setattr("specserve.runner.model_runner.greedy_verify", _padding_always_matches)
        llm = _llm(tiny_qwen3_dir, {"method": "ngram", "num_speculative_tokens": k}, padded=True, slow=slow)
        llm.engine.runner.proposer = PartialProposer(k, refs)
        log = _record(llm)
        runs[name] = (llm, log, _generate(llm, PROMPTS, sps))
    fast, slow, pad = runs["fast"], runs["slow"], runs["pad_match"]
    assert fast[2] == slow[2] == pad[2] == [f[: sp.max_tokens] for f, sp in zip(full, sps)]
    assert [e[:3] for e in fast[1]] == [e[:3] for e in slow[1]] == [e[:3] for e in pad[1]]
    assert _spec_metrics(fast[0]) == _spec_metrics(slow[0]) == _spec_metrics(pad[0])
    assert [e[3] for e in fast[1]] == [int(e[4]) for e in fast[1]]
    results = [r for e in fast[1] if e[3] for r in e[1].values()]
    assert {r[2] for r in results if r[1] == k} >= {0, 1, 2, 3, 4}  # n_match varied over every value
    assert any(0 < r[1] < k for r in results)  # shortened drafts went through the fast path too


def test_logprobs_and_min_tokens_take_the_slow_path_seeded_sampling_does_not(tiny_qwen3_dir, dflash_dir):
    """Logprobs and min_tokens (while it masks) keep a request's steps on the host side; a seeded random request
    samples in the graphs and emits the tokens the host-side rejection sampler gives it (its draws are keyed by
    seed and position, see specserve.layers.seeded_noise), also against the ragged path's logits."""
    spec = {"method": "dflash", "model": dflash_dir, "num_speculative_tokens": 4}
    greedy = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    base = _generate(_llm(tiny_qwen3_dir, spec, padded=False), PROMPTS, greedy)
    # forbid (via stop_token_ids + min_tokens) a token the greedy continuation of prompt 2 produces early
    stop_tok = base[2][1]
    special = [
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.8, seed=5, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=N, min_tokens=5, ignore_eos=True, stop_token_ids=[stop_tok]),
    ]
    for idx, sp_special in enumerate(special):
        sps = [greedy, greedy, greedy]
        sps[idx] = sp_special
        runs = {}
        for name, padded, slow in (("fast", True, False), ("slow", True, True), ("ragged", False, False)):
            llm = _llm(tiny_qwen3_dir, spec, padded, slow)
            log = _record(llm)
            runs[name] = (llm, log, llm.generate(PROMPTS, sps))
        fast_llm, log, outs = runs["fast"]
        rid = outs[idx].request_id
        # a uniform step takes the fast path unless the special request is in it and still needs the host side
        # (min_tokens: only while its output is shorter than min_tokens; seeded sampling: never)
        n_out = 0
        for ids, res, _, took_fast, uniform in log:
            special_active = rid in ids and (idx == 0 or (idx == 2 and n_out < 5))
            assert took_fast == int(uniform and not special_active)
            if rid in res:
                n_out += len(res[rid][0])
        assert fast_llm.engine.runner.num_fast_steps > 0  # the others went on fast once it was done
        toks = {name: [o.outputs[0].token_ids for o in r[2]] for name, r in runs.items()}
        assert toks["fast"] == toks["slow"]
        assert [e[:3] for e in log] == [e[:3] for e in runs["slow"][1]]
        assert toks["fast"] == toks["ragged"]
        for j in range(3):
            if j != idx:
                assert toks["fast"][j] == base[j]
        if idx == 0:
            lp = outs[0].outputs[0].logprobs
            assert lp is not None and len(lp) == 8
        if idx == 2:
            assert stop_tok not in toks["fast"][2][:5]
