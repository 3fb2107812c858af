"""speculative_config.disable_when_slower (specserve/spec/gate.py): drafting turns off while speculation measures
clearly slower than plain decoding (tokens a request gets per speculative step < 0.9 x speculative / plain step
time), probes again later, and the outputs stay the target's own greedy tokens through every switch."""

from __future__ import annotations

import pytest
from drafters import make_dflash

from specserve import LLM, SamplingParams
from specserve.config import SpeculativeConfig
from specserve.spec.gate import PLAIN, SPEC, SpeculationGate

PROMPTS = ["The capital of France is", "1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7 8 9 10", "Hello there, how"]
N = 40


def _drive(gate: SpeculationGate, steps: int, t_spec: float, t_plain: float, acc) -> list[str]:  # type: ignore[no-untyped-def]
    """Run ``steps`` decode steps at batch 2 as the engine would: a step verifies drafts when the previous step
    proposed them; ``acc(i)`` tokens per request for speculative step i. Returns each step's kind."""
    now, kinds, verifies = 0.0, [], False
    for i in range(steps):
        proposes = gate.drafting_on(2)  # asked while the step runs, before it is recorded
        if verifies:
            kind, now = SPEC, now + t_spec
        else:
            kind, now = ("transition" if proposes else PLAIN), now + t_plain
        gate.record(kind, 2, now, acc(i) if kind == SPEC else 1.0)
        kinds.append(kind)
        verifies = proposes
    return kinds


def test_gate_turns_speculation_off_when_slower_and_probes_with_growing_waits():
    gate = SpeculationGate()
    kinds = _drive(gate, 400, t_spec=2.5, t_plain=1.0, acc=lambda i: 2.0)
    assert kinds[: 1 + gate.warmup] == ["transition"] + [SPEC] * gate.warmup  # starts drafting
    assert gate.t[(SPEC, 2)] == pytest.approx(2.5) and gate.t[(PLAIN, 2)] == pytest.approx(1.0)
    assert gate.ratio(2) == pytest.approx(2.5)
    assert not gate.drafting_on(2) or gate.remaining > 0  # off, or in a probe
    assert kinds.count(PLAIN) > 0.8 * len(kinds)  # 2.0 tokens per 2.5x step loses: mostly plain
    # probes come back with waits doubling from probe_min up to probe_max
    runs, n = [], 0
    for k in kinds:
        if k == PLAIN:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    assert gate.num_probes >= 3
    assert runs[1:4] == [gate.probe_min, 2 * gate.probe_min, 4 * gate.probe_min]


def test_gate_keeps_drafting_when_faster_and_comes_back_when_acceptance_rises():
    gate = SpeculationGate()
    kinds = _drive(gate, 100, t_spec=2.5, t_plain=1.0, acc=lambda i: 3.5)
    # after measuring the plain step once, speculation wins and stays on
    assert gate.drafting_on(2) and kinds[-40:] == [SPEC] * 40
    assert kinds.count(PLAIN) == gate.measure

    # low acceptance first (gated), then high: a probe sees it and drafting stays on
    gate = SpeculationGate()
    kinds = _drive(gate, 300, t_spec=2.5, t_plain=1.0, acc=lambda i: 1.2 if i < 40 else 4.0)
    assert PLAIN in kinds[20:40] and kinds[-50:] == [SPEC] * 50
    assert gate.probe_every == gate.probe_min


def test_a_new_request_halves_the_wait_for_the_next_probe():
    gate = SpeculationGate()
    _drive(gate, 160, t_spec=2.5, t_plain=1.0, acc=lambda i: 2.0)  # early in a 128-step wait
    every = gate.probe_every  # the wait after the next losing probe: 256
    assert every == 16 * gate.probe_min and gate.state == PLAIN and gate.remaining > every // 4
    gate.record(None, 0, 0.0)  # a prefill step
    assert gate.probe_every == every // 2 and gate.remaining == every // 4
    kinds = _drive(gate, every // 4 + 2, t_spec=2.5, t_plain=1.0, acc=lambda i: 2.0)
    assert kinds[-2:] == ["transition", SPEC]


def test_near_break_even_keeps_drafting():
    """Within the margin (2.3 tokens a step at a 2.5x step cost) switching would cost more than it saves."""
    gate = SpeculationGate()
    kinds = _drive(gate, 100, t_spec=2.5, t_plain=1.0, acc=lambda i: 2.3)
    assert kinds.count(PLAIN) == gate.measure and gate.drafting_on(2)


def test_gate_keeps_estimates_per_batch_size_and_skips_mixed_intervals():
    gate = SpeculationGate()
    gate.record(SPEC, 1, 1.0, 3.0)
    gate.record(SPEC, 2, 2.0, 3.0)  # another batch size: no interval
    gate.record(None, 0, 0.0)  # a prefill step in between: no interval either
    gate.record(SPEC, 2, 5.0, 3.0)
    assert gate.t == {}
    gate.record(SPEC, 2, 6.5, 3.0)
    assert gate.t == {(SPEC, 2): pytest.approx(1.5)}
    assert gate.acc == pytest.approx(3.0)


def test_config_key():
    sc = SpeculativeConfig.from_any(
        '{"method": "ngram", "num_speculative_tokens": 2, "disable_when_slower": true}'
    )
    assert sc is not None and sc.disable_when_slower is True
    sc = SpeculativeConfig.from_any({"method": "ngram", "num_speculative_tokens": 2})
    assert sc is not None and sc.disable_when_slower is False
    with pytest.raises(ValueError, match="'disable_when_slower' must be a boolean"):
        SpeculativeConfig.from_any({"method": "ngram", "num_speculative_tokens": 2, "disable_when_slower": 1})


class _FakeClock:
    """Step times as the engine's gate sees them: a step that verified drafts costs ``t_spec``, any other 1."""

    def __init__(self, engine, t_spec: float) -> None:  # type: ignore[no-untyped-def]
        self.engine, self.t_spec, self.now = engine, t_spec, 0.0

    def __call__(self) -> float:
        info = self.engine._step_info
        self.now += self.t_spec if info is not None and info[0] == SPEC else 1.0
        return self.now


@pytest.fixture(scope="module")
def baseline(tiny_qwen3_dir):
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=4)
    sp = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)]


def _padded_llm(model: str, spec: dict, async_on: bool) -> LLM:
    """The engine on the padded (graph) path, its steps pipelined or not."""
    return LLM(
        model,
        dtype="float32",
        device="cpu",
        max_num_seqs=4,
        padded_decode=True,
        async_spec=async_on,
        async_scheduling=async_on,
        speculative_config=spec,
    )


@pytest.mark.parametrize("async_on", [False, True])
def test_engine_gates_a_losing_drafter_and_stays_lossless(async_on, tiny_qwen3_dir, baseline, tmp_path):
    """A random DFlash drafter (about 1 token a step) at a 2.5x step cost: the engine turns drafting off, probes
    it again, and every output is the target's greedy one; no KV block leaks."""
    dflash = make_dflash(tmp_path, 64, 4, 49152, layer_ids=[0, 2])
    spec = {"method": "dflash", "model": dflash, "num_speculative_tokens": 3, "disable_when_slower": True}
    llm = _padded_llm(tiny_qwen3_dir, spec, async_on)
    eng = llm.engine
    assert eng.gate is not None and eng.runner.gate is eng.gate
    eng._clock = _FakeClock(eng, 2.5)
    sp = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)] == baseline
    g = eng.gate
    assert g.ratio(3) == pytest.approx(2.5)
    assert g.num_plain_steps > N // 3 and g.num_probes >= 2
    # async: the gated plain steps pipelined, the drafter's context fed by its graph after the target's
    assert (eng.runner.num_async_steps > N // 4) == async_on
    m = llm.get_metrics()
    assert m["spec_decode_num_drafts"] > 0
    assert m["num_free_blocks"] == m["num_gpu_blocks"]
    # without the gate the same drafter drafts at every step
    spec.pop("disable_when_slower")
    always = _padded_llm(tiny_qwen3_dir, spec, async_on)
    assert always.engine.gate is None
    assert [o.outputs[0].token_ids for o in always.generate(PROMPTS, sp)] == baseline
    assert always.get_metrics()["spec_decode_num_drafts"] > 2 * m["spec_decode_num_drafts"]


def test_engine_keeps_a_winning_drafter(tiny_qwen3_dir, baseline):
    """The target as its own draft model accepts every draft (4 tokens a step): at a 2.5x step cost the gate
    measures plain steps once and keeps drafting."""
    spec = {
        "method": "draft_model",
        "model": tiny_qwen3_dir,
        "num_speculative_tokens": 3,
        "disable_when_slower": True,
    }
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=4, speculative_config=spec)
    eng = llm.engine
    eng._clock = _FakeClock(eng, 2.5)
    sp = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)] == baseline
    g = eng.gate
    assert g.drafting_on(3) and g.acc is not None and g.acc > 3
    assert g.num_plain_steps == g.measure and g.num_probes == 1
    m = llm.get_metrics()
    assert m["spec_decode_num_accepted_tokens"] == m["spec_decode_num_draft_tokens"] > 0


def test_engine_gate_measures_ngram_drafts(tiny_qwen3_dir):
    """Prompt lookup drafts fewer than K tokens when its match is short: those steps still measure acceptance
    (only drafts cut by max_tokens are left out), so the gate decides for n-gram too."""
    spec = {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 2,
        "disable_when_slower": True,
    }
    sp = SamplingParams(temperature=0, max_tokens=3 * N, ignore_eos=True)
    plain = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=4)
    ref = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, sp)]
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=4, speculative_config=spec)
    eng = llm.engine
    eng._clock = _FakeClock(eng, 2.5)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)] == ref
    g = eng.gate
    assert g.acc_n > 0 and g.ratio(3) == pytest.approx(2.5)
    assert g.num_plain_steps > g.measure  # under 2.25 tokens a step: gated after measuring
