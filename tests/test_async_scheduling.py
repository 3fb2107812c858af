"""Async scheduling: step N+1 of a plain decode is scheduled and launched before step N's tokens reach the host.

On CPU the padded "graphs" run eagerly, so the pipeline is exercised for its bookkeeping (input tokens gathered
from the previous step's device output, tokens discarded for requests that finished meanwhile, KV slots
reserved ahead, aborts while a step is in flight): every output must be exactly what the synchronous engine
produces, step by step, with the same metrics and no leaked KV block.
"""

from __future__ import annotations

import pytest
import torch

from specserve import LLM, SamplingParams

PROMPTS = [
    "Hello there, how are you doing today? I wanted to ask you about the weather in",
    "1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7",
    "a",
    "The quick brown fox",
]


def _llm(model: str, async_on: bool, **kw) -> LLM:
    return LLM(
        model,
        dtype="float32",
        device="cpu",
        max_num_seqs=4,
        padded_decode=True,
        async_scheduling=async_on,
        **kw,
    )


def _steps(llm: LLM, prompts, params) -> list:
    """Add everything up front, then step to the end: per step, what each output said."""
    eng = llm.engine
    for i, (p, sp) in enumerate(zip(prompts, params)):
        eng.add_request(str(i), p, sp)
    trace = []
    while eng.has_unfinished_requests():
        outs = eng.step()
        trace.append(
            sorted(
                (
                    o.request_id,
                    o.finished,
                    [(c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in o.outputs],
                )
                for o in outs
            )
        )
    return trace


def _metrics(llm: LLM) -> dict:
    m = llm.get_metrics()
    assert m["num_free_blocks"] == m["num_gpu_blocks"]  # no KV block leaked
    keys = (
        "prompt_tokens_total",
        "generation_tokens_total",
        "request_success_total",
        "num_preemptions_total",
    )
    return {k: m[k] for k in keys}


@pytest.fixture(scope="module")
def pair(tiny_llama_dir):
    return _llm(tiny_llama_dir, False), _llm(tiny_llama_dir, True)


def _mixed_params(sync: LLM) -> list[SamplingParams]:
    """Different lengths, a stop string and a stop token hit mid-stream (picked from a free run), ignore_eos, n=2."""
    free = sync.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    toks0, text1 = free[0].outputs[0].token_ids, free[1].outputs[0].text
    stop_str = text1[len(text1) // 2 : len(text1) // 2 + 3].strip() or text1[-3:]
    return [
        SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[toks0[6]]),
        SamplingParams(temperature=0, max_tokens=24, stop=[stop_str]),
        SamplingParams(temperature=0, max_tokens=3),
        SamplingParams(temperature=0, max_tokens=17, ignore_eos=True, n=2),
    ]


def test_greedy_mixed_batch_identical_step_by_step(pair):
    sync, asy = pair
    params = _mixed_params(sync)
    m0 = _metrics(asy)
    n0 = asy.engine.runner.num_async_steps
    want = _steps(sync, PROMPTS, params)
    got = _steps(asy, PROMPTS, params)
    assert got == want
    assert asy.engine.runner.num_async_steps - n0 > 10  # the pipeline really ran
    assert sync.engine.runner.num_async_steps == 0
    finals = [o for step in want for o in step if o[1]]
    assert {c[2] for o in finals for c in o[2]} >= {"stop", "length"}
    assert any(c[3] is not None for o in finals for c in o[2])  # a stop string / stop token id hit
    m1 = _metrics(asy)
    assert m1["generation_tokens_total"] - m0["generation_tokens_total"] == sum(
        len(c[1]) for o in finals for c in o[2]
    )


def test_generate_and_metrics_match(tiny_llama_dir):
    sync, asy = _llm(tiny_llama_dir, False), _llm(tiny_llama_dir, True)
    params = _mixed_params(sync)
    base = _metrics(sync)  # _mixed_params ran one generate on sync only: run it on asy too
    asy.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert _metrics(asy) == base
    want = sync.generate(PROMPTS, params)
    got = asy.generate(PROMPTS, params)
    for a, b in zip(got, want):
        assert [(c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in a.outputs] == [
            (c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in b.outputs
        ]
    assert _metrics(asy) == _metrics(sync)


def test_launch_before_collect(pair):
    """Step N+1 is launched before step N's tokens are read on the host."""
    _, asy = pair
    runner, events = asy.engine.runner, []
    launch, collect = runner.launch_decode, runner.collect_decode

    def spy_launch(items, prev=None):
        step = launch(items, prev)
        events.append(("launch", id(step)))
        return step

    def spy_collect(step):
        events.append(("collect", id(step)))
        return collect(step)

    runner.launch_decode, runner.collect_decode = spy_launch, spy_collect
    try:
        asy.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    finally:
        del runner.launch_decode, runner.collect_decode
    launches = [e for e in events if e[0] == "launch"]
    assert len(launches) >= 6
    # launch(N), launch(N+1), collect(N), launch(N+2), collect(N+1), ...
    assert events[:3] == [launches[0], launches[1], ("collect", launches[0][1])]
    assert sum(1 for e in events if e[0] == "collect") == len(launches)


def test_request_added_mid_decode(pair):
    sync, asy = pair
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    def run(llm: LLM) -> dict:
        eng, done = llm.engine, {}
        eng.add_request("A", PROMPTS[0], sp)
        for i in range(40):
            if i == 4:
                assert eng._inflight is not None or llm is sync
                eng.add_request("B", PROMPTS[1], sp)  # admitted once the pipeline has drained
            if not eng.has_unfinished_requests():
                break
            done.update({o.request_id: o.outputs[0].token_ids for o in eng.step() if o.finished})
        return done

    want, got = run(sync), run(asy)
    assert got == want and set(got) == {"A", "B"}
    assert len(got["B"]) == 12
    assert asy.get_metrics()["num_free_blocks"] == asy.get_metrics()["num_gpu_blocks"]


def test_abort_while_in_flight(pair):
    sync, asy = pair
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    want = sync.generate(PROMPTS[1], sp)[0].outputs[0].token_ids
    eng = asy.engine
    eng.add_request("A", PROMPTS[0], sp)
    eng.add_request("B", PROMPTS[1], sp)
    seen_a = 0
    for _ in range(4):
        seen_a += sum(o.request_id == "A" for o in eng.step())
    assert eng._inflight is not None  # a decode step is on the "device"
    eng.abort_request("A")
    got = None
    while eng.has_unfinished_requests():
        outs = eng.step()
        assert all(o.request_id == "B" for o in outs)  # A's in-flight token is discarded
        got = next((o.outputs[0].token_ids for o in outs if o.finished), got)
    assert got == want
    m = eng.get_metrics()
    assert m["num_free_blocks"] == m["num_gpu_blocks"]
    assert m["request_success_total"].get("abort", 0) >= 1
    # every request aborted while a step is in flight: that step is still collected (and yields nothing)
    eng.add_request("C", PROMPTS[2], sp)
    for _ in range(3):
        eng.step()
    assert eng._inflight is not None
    eng.abort_request("C")
    assert eng.has_unfinished_requests()
    assert eng.step() == []
    assert not eng.has_unfinished_requests()
    assert eng.get_metrics()["num_free_blocks"] == m["num_gpu_blocks"]


def test_prefix_cache_after_async_decode(pair):
    """Blocks registered during async decode hold only confirmed tokens: a second request hitting them (its
    prompt = the first one's prompt + output) continues exactly as without the cache."""
    sync, asy = pair
    sp = SamplingParams(temperature=0, max_tokens=44, ignore_eos=True)
    first = asy.generate(PROMPTS[3], sp)[0]
    prompt2 = first.prompt_token_ids + first.outputs[0].token_ids[:36]
    sp2 = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    got = asy.generate({"prompt_token_ids": prompt2}, sp2)[0]
    assert got.num_cached_tokens >= 32
    assert got.outputs[0].token_ids == first.outputs[0].token_ids[36:42]
    want = sync.generate({"prompt_token_ids": prompt2}, sp2)[0]
    assert got.outputs[0].token_ids == want.outputs[0].token_ids


def test_random_sampling_same_global_seed(pair):
    """Unseeded random requests sample in the graph with the global generator: same seed, same tokens."""
    sync, asy = pair
    sp = SamplingParams(temperature=0.8, top_k=50, max_tokens=10, ignore_eos=True)
    outs = []
    for llm in (sync, asy):
        n0 = llm.engine.runner.num_sampling_steps
        torch.manual_seed(1234)
        llm.engine.runner.generator.manual_seed(1234)
        outs.append([o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)])
        assert llm.engine.runner.num_sampling_steps > n0
    assert outs[0] == outs[1]


def test_not_eligible_stays_synchronous(pair):
    """Logprobs and min_tokens-masking requests keep the host path (no async step); seeded sampled requests
    pipeline, with the synchronous engine's tokens (their draws keyed by seed and position)."""
    sync, asy = pair
    for sp in (
        SamplingParams(temperature=0.8, seed=3, max_tokens=6),
        SamplingParams(temperature=0, logprobs=2, max_tokens=6),
        SamplingParams(temperature=0, min_tokens=5, max_tokens=6),
    ):
        n0 = asy.engine.runner.num_async_steps
        got = asy.generate(PROMPTS[:2], sp)
        want = sync.generate(PROMPTS[:2], sp)
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
        if sp.seed is not None:
            assert asy.engine.runner.num_async_steps > n0
        elif sp.min_tokens == 0:
            assert asy.engine.runner.num_async_steps == n0


def test_auto_is_off_without_graphs(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, dtype="float32", device="cpu", max_num_seqs=2, padded_decode=True)
    assert llm.engine.runner.async_scheduling is False  # auto: only with captured CUDA graphs


def test_cli_flag():
    from specserve.server.cli_args import engine_config_from_args, parse_serve_args

    for argv, want in ((["--async-scheduling"], True), (["--no-async-scheduling"], False), ([], None)):
        args = parse_serve_args(["some/model", *argv])
        assert args.async_scheduling is want
        assert engine_config_from_args(args).async_scheduling is want
