"""Prefill CUDA graphs (one request's prefill chunk padded to a token bucket) and the scheduling that feeds them
(a prefill chunk as a step of its own). On CPU the padded path runs the same code eagerly (``padded_decode``): the
tokens must equal the ragged path's for every prompt length (inside a bucket, exactly a bucket, past the largest
bucket, chunked by max_num_batched_tokens, after a prefix-cache hit) and with speculative decoding on top."""

from __future__ import annotations

import pytest
from drafters import make_dflash

from specserve import LLM, SamplingParams
from specserve.engine.block_manager import BlockManager
from specserve.engine.request import Request
from specserve.engine.scheduler import PREFILL_ALONE_MAX_WAITING, Scheduler
from specserve.runner import model_runner
from specserve.sampling_params import SamplingParams as SP

VOCAB = 49152


def _prompts() -> list[list[int]]:
    # 3 (bucket 4), 8 (exactly a bucket), 13 (bucket 16), then 40 and 30 (past the largest bucket, chunked by
    # max_num_batched_tokens=24)
    return [[(7 * i + 3 * n) % 5000 + 100 for i in range(n)] for n in (3, 8, 13, 40, 30)]


def _run(model: str, padded: bool, spec=None, **kw) -> tuple[LLM, list[list[int]], list]:
    llm = LLM(
        model,
        dtype="float32",
        device="cpu",
        max_num_seqs=4,
        padded_decode=padded,
        speculative_config=spec,
        max_num_batched_tokens=24,
        **kw,
    )
    steps: list = []
    execute = llm.engine.runner.execute

    def wrapped(sched):  # (new tokens per scheduled request, drafts) per step
        steps.append([(s.num_new_tokens, len(s.spec_token_ids)) for s in sched.scheduled])
        return execute(sched)

    llm.engine.runner.execute = wrapped
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = []
    for group in (_prompts()[:3], _prompts()[3:]):  # three prompts waiting, then two
        outs += [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in group], sp)]
    return llm, outs, steps


@pytest.fixture()
def small_buckets(monkeypatch):
    monkeypatch.setattr(model_runner, "PREFILL_GRAPH_TOKENS", (4, 8, 16))


@pytest.mark.parametrize("spec", [None, "dflash"])
def test_prefill_graph_path_equals_ragged(tiny_qwen3_dir, small_buckets, spec, tmp_path):
    cfg = None
    if spec == "dflash":
        d = make_dflash(tmp_path / "dflash", 64, 4, VOCAB, layer_ids=[0, 2])
        cfg = {"method": "dflash", "model": d, "num_speculative_tokens": 3}
    ragged, ref, _ = _run(tiny_qwen3_dir, False, cfg)
    assert ragged.engine.runner.prefill_graphs is None and ragged.engine.scheduler.prefill_alone == 0
    llm, outs, steps = _run(tiny_qwen3_dir, True, cfg)
    runner = llm.engine.runner
    assert runner.prefill_graphs is not None and runner.prefill_graphs.buckets == [4, 8, 16]
    assert llm.engine.scheduler.prefill_alone == 16
    assert outs == ref
    # the 3-, 8- and 13-token prompts went through the graphs, one step each, before any decode step; the 40- and
    # 30-token prompts (past the largest bucket) start on the varlen path in chunks of max_num_batched_tokens (the
    # 30-token one beside the other's decode, which takes 1 token of the budget, + 3 drafts with DFlash) and their
    # tails (16 tokens; 7, or 10 with DFlash) run alone through the graphs
    prefills = [[n for n, _ in st] for st in steps if any(n > 1 for n, _ in st)]
    tail = 30 - (24 - 1 - (3 if cfg else 0))
    assert prefills == [[3], [8], [13], [24], [16], [1, 30 - tail], [tail]]
    assert runner.num_prefill_graph_steps == 5
    # no step mixes a prefill chunk that fits the graphs with decode steps
    for st in steps:
        chunks = [n for n, _ in st if n > 1]
        if chunks and min(chunks) <= 16:
            assert len(st) == 1, st
    m = llm.get_metrics()
    assert m["num_free_blocks"] == m["num_gpu_blocks"]


def test_prefill_graph_after_prefix_hit_and_env_off(tiny_qwen3_dir, small_buckets, monkeypatch):
    """A prompt whose first blocks are cached prefills only its tail (start > 0) through the graphs; the same
    tokens as without prefix caching. SPECSERVE_PREFILL_GRAPHS=0 turns the graphs off."""
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompt = {"prompt_token_ids": [(11 * i) % 3000 + 50 for i in range(37)]}
    kw = dict(dtype="float32", device="cpu", max_num_seqs=2, padded_decode=True, block_size=16)
    plain = LLM(tiny_qwen3_dir, enable_prefix_caching=False, **kw)
    ref = plain.generate([prompt], sp)[0].outputs[0].token_ids
    llm = LLM(tiny_qwen3_dir, enable_prefix_caching=True, **kw)
    first = llm.generate([prompt], sp)[0].outputs[0].token_ids  # 37 tokens: past the buckets (ragged)
    before = llm.engine.runner.num_prefill_graph_steps
    again = llm.generate([prompt], sp)[0].outputs[0].token_ids  # 32 cached: a 5-token tail (bucket 8)
    assert first == again == ref
    assert llm.engine.runner.num_prefill_graph_steps == before + 1
    # buckets stop at the first that holds max_model_len tokens
    short = LLM(tiny_qwen3_dir, enable_prefix_caching=False, max_model_len=12, **kw)
    assert short.engine.runner.prefill_graphs is not None
    assert (
        short.engine.runner.prefill_graphs.buckets == [4, 8, 16]
        and short.engine.scheduler.prefill_alone == 16
    )
    short = LLM(tiny_qwen3_dir, enable_prefix_caching=False, max_model_len=7, **kw)
    assert short.engine.runner.prefill_graphs.buckets == [4, 8]  # type: ignore[union-attr]
    monkeypatch.setenv("SPECSERVE_PREFILL_GRAPHS", "0")
    off = LLM(tiny_qwen3_dir, enable_prefix_caching=False, **kw)
    assert off.engine.runner.prefill_graphs is None and off.engine.scheduler.prefill_alone == 0
    assert off.generate([prompt], sp)[0].outputs[0].token_ids == ref


def _req(i: int, n: int) -> Request:
    return Request(
        request_id=str(i), prompt_token_ids=list(range(1, n + 1)), params=SP(max_tokens=4), max_tokens=4
    )


def test_scheduler_runs_fitting_prefills_alone():
    bm = BlockManager(64, 16, False)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256)
    sch.prefill_alone = 16
    a, b, c = _req(0, 10), _req(1, 12), _req(2, 40)
    sch.add(a)
    out = sch.schedule()  # a alone
    assert [(s.req, s.num_new_tokens) for s in out.scheduled] == [(a, 10)]
    a.num_computed_tokens = 10
    a.token_ids.append(5)
    sch.add(b)
    out = sch.schedule()  # b's prefill fits the graphs: alone, a's decode waits one step
    assert [(s.req, s.num_new_tokens) for s in out.scheduled] == [(b, 12)]
    b.num_computed_tokens = 12
    b.token_ids.append(5)
    out = sch.schedule()  # decodes only
    assert [(s.req, s.num_new_tokens) for s in out.scheduled] == [(a, 1), (b, 1)]
    sch.add(c)  # 40 tokens: past the graphs, joins the decode batch as before
    out = sch.schedule()
    assert [(s.req, s.num_new_tokens) for s in out.scheduled] == [(a, 1), (b, 1), (c, 40)]
    # a burst of waiting requests is admitted together
    bm2 = BlockManager(64, 16, False)
    sch2 = Scheduler(bm2, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256)
    sch2.prefill_alone = 16
    for i in range(PREFILL_ALONE_MAX_WAITING + 1):
        sch2.add(_req(10 + i, 5))
    assert len(sch2.schedule().scheduled) == PREFILL_ALONE_MAX_WAITING + 1
