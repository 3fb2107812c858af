"""Async scheduling of fused DFlash / EAGLE-3 steps (greedy and unseeded random rows): step N+1 is scheduled (worst-case blocks), its inputs (bonus
token, drafts, positions, slots, seq lens, num_draft, budget) written on the device from step N's packed output,
and launched before N's tokens reach the host.

On CPU the padded "graphs" run eagerly, so the pipeline is exercised for its bookkeeping: every step's outputs,
every verified draft (num_draft, num_accepted, in order) and the spec metrics must be exactly what the
synchronous engine produces, with no KV block leaked, across stop tokens, stop strings, different max_tokens
and aborts while a step is in flight.
"""

from __future__ import annotations

import pytest
from drafters import make_dflash

from specserve import LLM, SamplingParams

VOCAB = 49152
PROMPTS = [
    "Hello there, how are you doing today? I wanted to ask you about the weather in",
    "1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7",
    "a",
]


@pytest.fixture(scope="module")
def dflash_dir(tmp_path_factory) -> str:
    return make_dflash(tmp_path_factory.mktemp("as_dflash"), 64, 4, VOCAB, layer_ids=[0, 2])


def _llm(model: str, dflash: str, k: int, async_on: bool, method: str = "dflash", **kw) -> LLM:  # type: ignore[no-untyped-def]
    llm = LLM(
        model,
        dtype="float32",
        device="cpu",
        max_num_seqs=4,
        padded_decode=True,
        async_spec=async_on,
        speculative_config={"method": method, "model": dflash, "num_speculative_tokens": k},
        **kw,
    )
    assert llm.engine.runner.use_fused_step
    assert llm.engine.runner.async_spec == async_on
    return llm


def _run(llm: LLM, prompts, params, on_step=None, marks=None) -> tuple[list, list]:  # type: ignore[no-untyped-def]
    """Add everything up front, step to the end: per step what each output said, and every (num_draft,
    num_accepted) observed, in order; ``marks`` (a list) gets the number observed before each step and at the
    end."""
    eng = llm.engine
    observed: list[tuple[int, int]] = []
    observe = eng.spec_stats.observe

    def rec(nd: int, na: int) -> None:
        observed.append((nd, na))
        observe(nd, na)

    eng.spec_stats.observe = rec  # type: ignore[method-assign]
    for i, (p, sp) in enumerate(zip(prompts, params)):
        eng.add_request(str(i), p, sp)
    trace = []
    n = 0
    try:
        while eng.has_unfinished_requests():
            if on_step is not None:
                on_step(eng, n)
            if marks is not None:
                marks.append(len(observed))
            outs = eng.step()
            n += 1
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
    finally:
        del eng.spec_stats.observe
    if marks is not None:
        marks.append(len(observed))
    return trace, observed


def _check_metrics(sync: LLM, asy: LLM) -> None:
    ms, ma = sync.get_metrics(), asy.get_metrics()
    for m in (ms, ma):
        assert m["num_free_blocks"] == m["num_gpu_blocks"]  # no KV block leaked
    keys = [k for k in ms if k.startswith("spec_decode")] + [
        "prompt_tokens_total",
        "generation_tokens_total",
        "request_success_total",
    ]
    assert {k: ma[k] for k in keys} == {k: ms[k] for k in keys}


def _same_as_sync(sync: LLM, asy: LLM, prompts, params) -> list:  # type: ignore[no-untyped-def]
    """Run both engines to the end: the pipelined one answers exactly what the synchronous one does (outputs per
    step, verified drafts, metrics) and did pipeline; returns the observed (num_draft, num_accepted)."""
    want, obs_want = _run(sync, prompts, params)
    got, obs_got = _run(asy, prompts, params)
    assert got == want
    assert obs_got == obs_want
    _check_metrics(sync, asy)
    assert asy.engine.runner.num_async_spec_steps > 0
    return obs_want


@pytest.mark.parametrize("k", [4, 15])
@pytest.mark.parametrize("batch", [1, 3])
def test_identical_to_sync(k, batch, often_qwen3_dir, dflash_dir):
    sync = _llm(often_qwen3_dir, dflash_dir, k, False)
    asy = _llm(often_qwen3_dir, dflash_dir, k, True)
    lens = [120, 97, 105] if k == 15 else [90, 57, 66]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens[:batch]]
    obs_want = _same_as_sync(sync, asy, PROMPTS[:batch], params)
    assert sync.engine.runner.num_async_spec_steps == 0
    accepted = {na for nd, na in obs_want if nd == k}
    assert 0 in accepted and len(accepted) >= 4
    if k == 4 and batch == 3:
        assert accepted == set(range(k + 1))  # every acceptance length
    # drafts shortened by the budget near the end are verified too
    assert any(0 < nd < k for nd, _ in obs_want)


def test_identical_to_sync_on_the_fused_kernels(often_qwen3_dir, dflash_dir, monkeypatch):
    """The GPU's path: the fused Triton kernels (interpreted here, hence short), whose async step inputs come from
    one bookkeeping kernel (spec/step_kernels.py) instead of the torch ops; batch 1 takes one-row column views.
    Batches of several requests run that kernel in test_step_kernels.py. The engine's start launches that kernel
    in every form the pipelined steps then use (Triton compiles per form: with ``into``, by pointer alignment and
    unit strides), so no compile lands in a request (session 28: the warm-up compiled a form no step used)."""
    import specserve.spec.step_kernels as sk

    forms: list[tuple] = []
    real = sk.async_step_inputs

    def spy(packed, nd, budget, first, bt, k, bs, into=None):  # type: ignore[no-untyped-def]
        ts = [packed, nd, budget, first, bt, *(into or ())]
        strides = (packed.stride(0), bt.stride(0), into[4].stride(0) if into else 0)
        forms.append(
            (into is not None, tuple(t.data_ptr() % 16 == 0 for t in ts), tuple(s == 1 for s in strides))
        )
        return real(packed, nd, budget, first, bt, k, bs, into=into)

    monkeypatch.setattr(sk, "async_step_inputs", spy)
    kw = dict(attention_backend="triton")
    sync = _llm(often_qwen3_dir, dflash_dir, 4, False, **kw)
    asy = _llm(often_qwen3_dir, dflash_dir, 4, True, **kw)
    assert asy.engine.runner.backend.fused
    warmed, n_warm = set(forms), len(forms)
    assert all(f[0] for f in warmed)  # the form launch_spec runs
    # 12 tokens (interpreted steps are slow): 8 steps, a draft accepted at the 4th, drafts cut by the budget at the end
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)]
    obs_want = _same_as_sync(sync, asy, PROMPTS[:1], params)
    assert len({na for nd, na in obs_want if nd == 4}) >= 2
    assert any(0 < nd < 4 for nd, _ in obs_want)
    assert len(forms) > n_warm and set(forms[n_warm:]) <= warmed


def test_identical_to_sync_eagle3(often_qwen3_dir, tmp_path):
    """The fused EAGLE-3 step pipelines the same way (the runner's contract is the drafter's fused step)."""
    from drafters import make_eagle3

    eagle = make_eagle3(tmp_path / "eagle", 64, 4, VOCAB)
    sync = _llm(often_qwen3_dir, eagle, 4, False, method="eagle3")
    asy = _llm(often_qwen3_dir, eagle, 4, True, method="eagle3")
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (70, 41, 55)]
    obs_want = _same_as_sync(sync, asy, PROMPTS, params)
    assert len({na for nd, na in obs_want if nd == 4}) >= 2


def test_identical_to_sync_draft_model(often_qwen3_dir, tiny_qwen3_dir):
    """vLLM's draft_model on the fused step pipelines too (it reads no target features): a draft model that
    agrees with the target only at times, and the target drafting for itself (every draft accepted)."""
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (70, 41, 55)]
    for drafter, k in ((tiny_qwen3_dir, 3), (often_qwen3_dir, 5)):
        sync = _llm(often_qwen3_dir, drafter, k, False, method="draft_model")
        asy = _llm(often_qwen3_dir, drafter, k, True, method="draft_model")
        obs = _same_as_sync(sync, asy, PROMPTS, params)
        if drafter == often_qwen3_dir:
            assert all(nd == na for nd, na in obs) and (k, k) in obs


def test_stops_and_different_lengths(often_qwen3_dir, dflash_dir):
    """A stop token id and a stop string hit mid-stream (picked from a free run) while the next step is in
    flight, next to a request that runs to its max_tokens."""
    k = 4
    sync = _llm(often_qwen3_dir, dflash_dir, k, False)
    asy = _llm(often_qwen3_dir, dflash_dir, k, True)
    free = sync.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
    toks0, text1 = free[0].outputs[0].token_ids, free[1].outputs[0].text
    stop_tok = toks0[33]
    first = toks0.index(stop_tok)
    stop_str = text1[len(text1) * 2 // 3 : len(text1) * 2 // 3 + 3].strip() or text1[-3:]
    params = [
        SamplingParams(temperature=0, max_tokens=55, stop_token_ids=[stop_tok]),
        SamplingParams(temperature=0, max_tokens=60, stop=[stop_str]),
        SamplingParams(temperature=0, max_tokens=47, ignore_eos=True),
    ]
    n0 = asy.engine.runner.num_async_spec_steps
    # the free run above went through the async engine too
    asy.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
    inflight: list[bool] = []

    def on_step(eng, n):  # type: ignore[no-untyped-def]
        inflight.append(eng._inflight_spec is not None)

    want, obs_want = _run(sync, PROMPTS, params)
    got, obs_got = _run(asy, PROMPTS, params, on_step)
    assert got == want and obs_got == obs_want
    _check_metrics(sync, asy)
    assert asy.engine.runner.num_async_spec_steps > n0
    # the stop token / stop string came while the next step was already in flight (its output discarded)
    ends = {o[0]: i for i, step in enumerate(want) for o in step if o[1]}
    assert inflight[ends["0"] + 1] and inflight[ends["1"] + 1]
    finals = {o[0]: o[2][0] for step in want for o in step if o[1]}
    assert finals["0"][2] == "stop" and finals["0"][3] == stop_tok and first > 10
    assert finals["1"][2] == "stop" and finals["1"][3] == stop_str
    assert finals["2"][2] == "length"


@pytest.mark.parametrize("method", ["dflash", "eagle3"])
def test_pipelined_up_to_the_end(method, often_qwen3_dir, dflash_dir, tmp_path):
    """The pipeline runs until a request is within one step (K+1 tokens) of its max_tokens: the steps that verify
    drafts cut by the draft budget (max_tokens near) are pipelined too, their num_draft / budget derived on the
    device; step for step the same as the synchronous engine, and no step is launched for a request that its
    in-flight step could finish by length (no wasted, empty engine step)."""
    from drafters import make_eagle3

    k = 4
    drafter = dflash_dir if method == "dflash" else make_eagle3(tmp_path / "eagle", 64, 4, VOCAB)
    sync = _llm(often_qwen3_dir, drafter, k, False, method=method)
    asy = _llm(often_qwen3_dir, drafter, k, True, method=method)
    # one request at a time (with several, the first to near its end drains the pipeline for all); lengths at
    # which this tiny model's drafts get cut in a pipelined step (found by a sweep of 24-47 over two prompts)
    cut_pipelined = 0
    for n in (30, 34, 35, 46):
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)]
        for prompt in PROMPTS[:1]:
            want, obs_want = _run(sync, [prompt], params)
            marks: list[int] = []
            launched: list[int] = []

            def on_step(e, i, launched=launched):  # type: ignore[no-untyped-def]
                launched.append(e.runner.num_async_spec_steps)

            got, obs_got = _run(asy, [prompt], params, on_step, marks)
            assert got == want and obs_got == obs_want
            assert all(step for step in got)  # every engine step returned something
            launched.append(asy.engine.runner.num_async_spec_steps)
            # engine step i launches a pipelined step when the counter grows during it; step i + 1 collects it
            for i in range(len(launched) - 2):
                if launched[i + 1] > launched[i]:
                    cut_pipelined += sum(0 < nd < k for nd, _ in obs_got[marks[i + 1] : marks[i + 2]])
    _check_metrics(sync, asy)
    assert cut_pipelined >= 1


@pytest.mark.parametrize("victim", ["0", "1", "2"])
def test_abort_mid_flight(victim, often_qwen3_dir, dflash_dir):
    """Abort a request while a speculative step is in flight (its blocks are freed, its in-flight output
    discarded): step for step the same as the synchronous engine, no block leaked. The first, a middle or the
    last request: the next step's rows are then a reordered subset or a prefix of the in-flight step's (the
    prefix case crashed the H200 server in session 18: its per-request columns kept the old length)."""
    k = 4
    sync = _llm(often_qwen3_dir, dflash_dir, k, False)
    asy = _llm(often_qwen3_dir, dflash_dir, k, True)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (50, 44, 61)]
    inflight: list[bool] = []

    def on_step(eng, n):  # type: ignore[no-untyped-def]
        inflight.append(eng._inflight_spec is not None)
        if n == 5:
            eng.abort_request(victim)

    want, obs_want = _run(sync, PROMPTS, params, on_step)
    inflight.clear()
    got, obs_got = _run(asy, PROMPTS, params, on_step)
    assert got == want and obs_got == obs_want
    assert inflight[5]  # the abort came with a step in flight
    _check_metrics(sync, asy)
    assert asy.engine.runner.num_async_spec_steps > 0


def test_admission_drains(often_qwen3_dir, dflash_dir):
    """A request added while a step is in flight: the pipeline drains (the in-flight step is returned first,
    the admission comes one step later than in the synchronous engine), every request ends with the same
    output, the same verified drafts, the same metrics, no block leaked."""
    k = 4
    sync = _llm(often_qwen3_dir, dflash_dir, k, False)
    asy = _llm(often_qwen3_dir, dflash_dir, k, True)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (50, 44, 61)]
    inflight: list[bool] = []

    def on_step(eng, n):  # type: ignore[no-untyped-def]
        inflight.append(eng._inflight_spec is not None)
        if n == 7:
            eng.add_request("late", "The quick brown fox", SamplingParams(temperature=0, max_tokens=40))

    want, obs_want = _run(sync, PROMPTS, params, on_step)
    inflight.clear()
    got, obs_got = _run(asy, PROMPTS, params, on_step)
    assert inflight[7]

    def finals(trace):  # type: ignore[no-untyped-def]
        return sorted(o for step in trace for o in step if o[1])

    assert finals(got) == finals(want) and len(finals(want)) == 4
    assert sorted(obs_got) == sorted(obs_want)
    _check_metrics(sync, asy)
    assert sum(inflight) > 10  # pipelined before the admission and again after it


@pytest.mark.parametrize("method", ["dflash", "eagle3"])
def test_random_rows_pipeline_too(method, often_qwen3_dir, dflash_dir, tmp_path):
    """Random-sampling requests (temperature / top-k / top-p; one seeded) beside a greedy one: the in-graph
    rejection sampler runs inside the pipelined steps, consuming the random stream in the same order as the
    synchronous engine (the seeded one: the draws of its positions, which the pipelined steps compute on the
    device), so every output, every verified draft and the metrics are the same; steps with random rows were
    launched while the previous one was in flight. The seeded request alone on the host path (no padding, no
    graphs' sampler) emits the same tokens."""
    from drafters import make_eagle3

    k = 4
    drafter = dflash_dir if method == "dflash" else make_eagle3(tmp_path / "eagle", 64, 4, VOCAB)
    params = [
        SamplingParams(temperature=0, max_tokens=60, ignore_eos=True),
        SamplingParams(temperature=0.8, max_tokens=48, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=20, top_p=0.9, max_tokens=55, ignore_eos=True),
        SamplingParams(temperature=0.9, seed=77, max_tokens=50, ignore_eos=True),
    ]
    prompts = PROMPTS + [PROMPTS[0]]
    runs = []
    for async_on in (False, True):
        llm = _llm(often_qwen3_dir, drafter, k, async_on, method=method, seed=11)
        steps: list[tuple[int, int]] = []
        runner = llm.engine.runner

        def on_step(eng, n, runner=runner, steps=steps):  # type: ignore[no-untyped-def]
            steps.append((runner.num_async_spec_steps, runner.num_sampling_steps))

        runs.append((llm, *_run(llm, prompts, params, on_step), steps))
    (sync, want, obs_want, _), (asy, got, obs_got, steps) = runs
    assert got == want and obs_got == obs_want
    _check_metrics(sync, asy)
    # pipelined steps that sampled: both counters grew across the same engine step at least 5 times
    both = sum(b[0] > a[0] and b[1] > a[1] for a, b in zip(steps, steps[1:]))
    assert both >= 5, steps
    accepted = {na for nd, na in obs_want if nd == k}
    assert 0 in accepted and len(accepted) >= 2
    host = LLM(
        often_qwen3_dir,
        dtype="float32",
        device="cpu",
        speculative_config={"method": method, "model": drafter, "num_speculative_tokens": k},
    )
    assert not host.engine.runner.use_padded
    seeded = asy.generate(prompts[3:], params[3:])[0].outputs[0].token_ids
    assert host.generate(prompts[3:], params[3:])[0].outputs[0].token_ids == seeded


def test_default_follows_graphs(often_qwen3_dir, dflash_dir):
    """On by default where CUDA graphs run the fused step (as async_scheduling); without graphs (here: CPU) it
    is off unless asked for, and async_spec=False turns it off."""
    spec = {"method": "dflash", "model": dflash_dir, "num_speculative_tokens": 4}
    kw = dict(dtype="float32", device="cpu", max_num_seqs=2, padded_decode=True, speculative_config=spec)
    assert not LLM(often_qwen3_dir, **kw).engine.runner.async_spec  # type: ignore[arg-type]
    assert not LLM(often_qwen3_dir, async_scheduling=True, **kw).engine.runner.async_spec  # type: ignore[arg-type]
    assert LLM(often_qwen3_dir, async_spec=True, **kw).engine.runner.async_spec  # type: ignore[arg-type]
    assert not LLM(often_qwen3_dir, async_spec=False, **kw).engine.runner.async_spec  # type: ignore[arg-type]


def test_padded_cpu_path_needs_no_triton(often_qwen3_dir, dflash_dir):
    """A CPU install without triton (README's first command installs none) runs the padded fused step and the
    async pipeline on the torch specifications of the step bookkeeping (spec/step_inputs.py)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] == "triton":
                    raise ImportError("no triton here")
        sys.meta_path.insert(0, Block())
        from specserve import LLM, SamplingParams
        llm = LLM({often_qwen3_dir!r}, dtype="float32", device="cpu", max_num_seqs=2, padded_decode=True,
                  async_spec=True,
                  speculative_config={{"method": "dflash", "model": {dflash_dir!r}, "num_speculative_tokens": 4}})
        out = llm.generate(["a"], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
        r = llm.engine.runner
        print(len(out[0].outputs[0].token_ids), r.use_fused_step, r.num_async_spec_steps > 0, "triton" in sys.modules)
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[-4:] == ["32", "True", "True", "False"]
