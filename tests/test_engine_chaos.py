"""The engine under a random mix of what a server sees at once: prompts sharing prefixes (prefix-cache hits),
requests that end in their prefill's step (max_tokens=1), n=2, priorities (with --scheduling-policy priority),
aborts at random steps, too few KV blocks (preemption) and a small token budget (chunked prefill), with the target
drafting for itself (a draft model equal to the target: every draft must be accepted when its KV follows the
committed sequence). Invariants: every greedy output is the target's own greedy continuation of its prompt, every
draft is accepted, aborted requests end as aborted, and no KV block leaks; seeded sampling (plain and DFlash) gives
each request the tokens it gets when served alone."""

from __future__ import annotations

import random
from typing import Any

import pytest

from specserve import LLM, SamplingParams
from specserve.config import EngineConfig
from specserve.engine.engine import LLMEngine

VOCAB = 49152

N = 20
BASE = "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25"
PROMPTS = [
    BASE,
    BASE + " 26 27",
    BASE + " and then",
    "The capital of France is",
    BASE[:20],
    "a b c d e f g h i j",
]


@pytest.fixture(scope="module")
def reference(tiny_qwen3_dir: str) -> dict[str, list[int]]:
    """Each prompt's greedy continuation, alone (plain decoding, no prefix cache, roomy cache)."""
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=1, enable_prefix_caching=False)
    sp = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    return {p: o.outputs[0].token_ids for p, o in zip(PROMPTS, llm.generate(PROMPTS, sp))}


@pytest.fixture(scope="module")
def dflash_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from drafters import make_dflash

    return str(make_dflash(tmp_path_factory.mktemp("dflash"), 64, 4, VOCAB, layer_ids=[0, 2]))


@pytest.mark.parametrize(
    ("seed", "policy", "padded", "method"),
    [
        (0, "priority", True, "draft_model"),
        (1, "fcfs", False, "draft_model"),
        (2, "priority", True, "dflash"),
    ],
)
def test_random_mix_keeps_outputs_and_blocks(
    seed: int,
    policy: str,
    padded: bool,
    method: str,
    tiny_qwen3_dir: str,
    dflash_dir: str,
    reference: dict[str, list[int]],
) -> None:
    """draft_model: the target itself (every draft accepted); dflash: a random drafter (lossless outputs only)."""
    rng = random.Random(seed)
    drafter = tiny_qwen3_dir if method == "draft_model" else dflash_dir
    spec = {"method": method, "model": drafter, "num_speculative_tokens": 3}
    eng = LLMEngine(
        EngineConfig(
            model=tiny_qwen3_dir,
            dtype="float32",
            device="cpu",
            max_num_seqs=4,
            num_gpu_blocks=9,  # 4 sequences of a ~50-token prompt + 20 tokens need 20 blocks: preemption happens
            max_num_batched_tokens=24,
            speculative_config=spec,
            scheduling_policy=policy,
            padded_decode=padded,
            async_scheduling=padded,
        )
    )
    expected: dict[str, tuple[str, int, int]] = {}  # request id -> (prompt, max_tokens, n)
    aborted: set[str] = set()
    finished: dict[str, Any] = {}
    pending = 40  # requests still to add
    steps = 0
    while pending or eng.has_unfinished_requests():
        steps += 1
        assert steps < 2000, "the engine stopped making progress"
        for _ in range(rng.choice([0, 0, 1, 2]) if pending else 0):
            prompt = rng.choice(PROMPTS)
            max_tokens = rng.choice([1, 1, 2, 5, N, N])
            n = rng.choice([1, 1, 2])
            prio = rng.randint(-2, 2) if policy == "priority" else 0
            sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, n=n)
            rid = eng.add_request(None, prompt, sp, prio)
            expected[rid] = (prompt, max_tokens, n)
            pending -= 1
        live = [r for r in expected if r not in finished and r not in aborted]
        if live and rng.random() < 0.04:
            victim = rng.choice(live)
            eng.abort_request(victim)
            aborted.add(victim)
        for out in eng.step():
            if out.finished:
                finished[out.request_id] = out
    assert set(finished) | aborted == set(expected)
    m = eng.get_metrics()
    assert m["num_free_blocks"] == m["num_gpu_blocks"]  # nothing leaked, aborts and preemptions included
    assert m["num_preemptions_total"] > 0 and m["prefix_cache_hits"] > 0  # the mix exercised both
    assert m["spec_decode_num_draft_tokens"] > 0
    if method == "draft_model":
        assert m["spec_decode_num_accepted_tokens"] == m["spec_decode_num_draft_tokens"]
    checked = 0
    for rid, out in finished.items():
        prompt, max_tokens, n = expected[rid]
        assert len(out.outputs) == n
        for o in out.outputs:
            if rid in aborted and o.finish_reason == "abort":
                assert o.token_ids == reference[prompt][: len(o.token_ids)]
                continue
            assert o.finish_reason == "length"
            assert o.token_ids == reference[prompt][:max_tokens], (rid, prompt, max_tokens)
            checked += 1
    assert checked >= 30


@pytest.mark.parametrize("method", [None, "dflash"])
def test_seeded_sampling_under_the_mix(method: str | None, tiny_qwen3_dir: str, dflash_dir: str) -> None:
    """Seeded sampling (temperature 0.9) under the same mix: a seeded request's tokens are a function of its
    seed, prompt and position only (counter-based draws), so each equals the same request served alone, whatever
    ran beside it, was preempted or hit the prefix cache."""
    spec = None if method is None else {"method": method, "model": dflash_dir, "num_speculative_tokens": 3}
    base: dict[str, Any] = {
        "model": tiny_qwen3_dir,
        "dtype": "float32",
        "device": "cpu",
        "speculative_config": spec,
    }
    rng = random.Random(5)
    jobs = [(rng.choice(PROMPTS), rng.randint(0, 3), rng.choice([1, 2, 5, N, N])) for _ in range(24)]
    alone = LLMEngine(EngineConfig(**base, max_num_seqs=1, enable_prefix_caching=False))
    ref: dict[tuple[str, int], list[int]] = {}
    for prompt, seed, _ in jobs:
        if (prompt, seed) not in ref:
            sp = SamplingParams(temperature=0.9, seed=seed, max_tokens=N, ignore_eos=True)
            rid = alone.add_request(None, prompt, sp)
            while alone.has_unfinished_requests():
                for out in alone.step():
                    if out.finished and out.request_id == rid:
                        ref[prompt, seed] = out.outputs[0].token_ids
    eng = LLMEngine(
        EngineConfig(**base, max_num_seqs=4, num_gpu_blocks=9, max_num_batched_tokens=24, padded_decode=True)
    )
    ids: dict[str, tuple[str, int, int]] = {}
    got: dict[str, list[int]] = {}

    def step() -> None:
        for out in eng.step():
            if out.finished:
                got[out.request_id] = out.outputs[0].token_ids

    for i, (prompt, seed, m) in enumerate(jobs):
        sp = SamplingParams(temperature=0.9, seed=seed, max_tokens=m, ignore_eos=True)
        ids[eng.add_request(None, prompt, sp)] = (prompt, seed, m)
        if i % 3 == 2:  # a step between some arrivals
            step()
    while eng.has_unfinished_requests():
        step()
    m = eng.get_metrics()
    assert m["num_preemptions_total"] > 0 and m["num_free_blocks"] == m["num_gpu_blocks"]
    assert len({tuple(v) for v in ref.values()}) > 1  # the seeds do give different samples
    for rid, (prompt, seed, mt) in ids.items():
        assert got[rid] == ref[prompt, seed][:mt], (prompt, seed, mt)
