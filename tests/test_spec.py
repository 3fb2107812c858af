"""Lossless speculative decoding: DFlash, EAGLE-3 and n-gram; vLLM-compatible config, metrics and loading."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from drafters import make_dflash, make_eagle3

from specserve import LLM, SamplingParams
from specserve.config import SpeculativeConfig
from specserve.engine.engine import SpecStats, spec_log_line
from specserve.spec.proposer import DraftInput, Proposer

PROMPTS = [
    "The capital of France is",
    "1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7",
    "Hello there, how are you doing today? I wanted to ask you about the weather in",
    "a",
]
VOCAB = 49152
N = 24


@pytest.fixture(scope="module")
def dflash_dir(tmp_path_factory) -> str:
    return make_dflash(tmp_path_factory.mktemp("dflash"), 64, 4, VOCAB, layer_ids=[0, 2])


@pytest.fixture(scope="module")
def dflash_swa_dir(tmp_path_factory) -> str:
    return make_dflash(
        tmp_path_factory.mktemp("dflash_swa"),
        64,
        4,
        VOCAB,
        layer_ids=[1, 2, 3],
        num_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=8,
        block_size=8,
    )


@pytest.fixture(scope="module")
def eagle_dir(tmp_path_factory) -> str:
    return make_eagle3(tmp_path_factory.mktemp("eagle"), 64, 4, VOCAB)


@pytest.fixture(scope="module")
def eagle_d2t_dir(tmp_path_factory) -> str:
    return make_eagle3(tmp_path_factory.mktemp("eagle_d2t"), 64, 4, VOCAB, draft_vocab=1000)


@pytest.fixture(scope="module")
def baseline(tiny_qwen3_dir):
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=4)
    sp = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)]


def _spec_llm(model: str, spec: dict, **kw) -> LLM:
    return LLM(model, dtype="float32", device="cpu", max_num_seqs=4, speculative_config=spec, **kw)


def _generate(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    sp = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]


def _spec_run(model: str, spec: dict, prompts=PROMPTS, **kw):
    llm = _spec_llm(model, spec, **kw)
    return llm, _generate(llm, prompts)


CASES = [
    ("ngram", 1),
    ("ngram", 4),
    ("dflash", 1),
    ("dflash", 4),
    ("dflash", 15),
    ("eagle3", 1),
    ("eagle3", 4),
]


@pytest.mark.parametrize("method,k", CASES)
def test_greedy_lossless_batched(method, k, tiny_qwen3_dir, baseline, dflash_dir, eagle_dir):
    spec = {"method": method, "num_speculative_tokens": k}
    if method == "ngram":
        spec.update(prompt_lookup_min=1, prompt_lookup_max=3)
    else:
        spec["model"] = dflash_dir if method == "dflash" else eagle_dir
    llm, outs = _spec_run(tiny_qwen3_dir, spec)
    assert outs == baseline
    m = llm.get_metrics()
    assert m["spec_decode_num_drafts"] > 0
    assert m["spec_decode_num_draft_tokens"] >= m["spec_decode_num_drafts"]
    assert len(m["spec_decode_num_accepted_tokens_per_pos"]) == k
    assert sum(m["spec_decode_num_accepted_tokens_per_pos"]) == m["spec_decode_num_accepted_tokens"]
    assert m["num_free_blocks"] == m["num_gpu_blocks"]  # target and drafter blocks all released


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_lossless_each_batch_size(batch, tiny_qwen3_dir, baseline, dflash_dir, eagle_dir):
    for spec in (
        {"method": "dflash", "model": dflash_dir, "num_speculative_tokens": 4},
        {"method": "eagle3", "model": eagle_dir, "num_speculative_tokens": 4},
    ):
        _, outs = _spec_run(tiny_qwen3_dir, spec, prompts=PROMPTS[:batch])
        assert outs == baseline[:batch]


def test_dflash_sliding_window_layers_lossless(tiny_qwen3_dir, baseline, dflash_swa_dir):
    _, outs = _spec_run(
        tiny_qwen3_dir, {"method": "dflash", "model": dflash_swa_dir, "num_speculative_tokens": 7}
    )
    assert outs == baseline


def test_spec_with_preemption_chunking_and_prefix_cache(tiny_qwen3_dir, baseline, dflash_dir, eagle_dir):
    for spec in (
        {"method": "dflash", "model": dflash_dir, "num_speculative_tokens": 4},
        {"method": "eagle3", "model": eagle_dir, "num_speculative_tokens": 3},
    ):
        llm, outs = _spec_run(tiny_qwen3_dir, spec, num_gpu_blocks=9, max_num_batched_tokens=24)
        assert outs == baseline
        m = llm.get_metrics()
        assert m["num_preemptions_total"] > 0
        assert m["num_free_blocks"] == m["num_gpu_blocks"]
        # same prompts again: prefix-cache hits for target and drafter blocks, same output
        sp = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
        again = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)]
        assert again == baseline


class ScriptedProposer(Proposer):
    """Proposes from a known continuation (right=True) or always-wrong tokens (right=False)."""

    method = "scripted"

    def __init__(self, k: int, refs: dict[tuple[int, ...], list[int]], right: bool) -> None:
        super().__init__(k)
        self.refs, self.right = refs, right

    def propose(self, inputs: list[DraftInput], features: torch.Tensor | None) -> list[list[int]]:
        out = []
        for inp in inputs:
            k = min(self.num_speculative_tokens, inp.max_drafts)
            if not inp.draft or k <= 0:
                out.append([])
                continue
            for prompt, cont in self.refs.items():
                if tuple(inp.token_ids[: len(prompt)]) == prompt:
                    done = len(inp.token_ids) - len(prompt)
                    nxt = cont[done : done + k]
                    out.append(nxt if self.right else [(t + 1) % VOCAB for t in nxt])
                    break
            else:
                out.append([])
        return out


@pytest.mark.parametrize("right", [True, False])
def test_scripted_proposer_acceptance(right, tiny_qwen3_dir, smol_tokenizer):
    k = 4
    max_tokens = 1 + 6 * (k + 1)  # prefill token, then 6 full steps of k+1
    base = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=4)
    sp = SamplingParams(temperature=0, max_tokens=max_tokens + k + 1, ignore_eos=True)
    full = [o.outputs[0].token_ids for o in base.generate(PROMPTS[:3], sp)]
    refs = {tuple(smol_tokenizer(p).input_ids): f for p, f in zip(PROMPTS[:3], full)}
    llm = LLM(
        tiny_qwen3_dir,
        dtype="float32",
        device="cpu",
        max_num_seqs=4,
        speculative_config={"method": "ngram", "num_speculative_tokens": k},
    )
    llm.engine.runner.proposer = ScriptedProposer(k, refs, right)
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:3], sp)]
    assert outs == [f[:max_tokens] for f in full]
    m = llm.get_metrics()
    drafts, drafted, accepted = (
        m["spec_decode_num_drafts"],
        m["spec_decode_num_draft_tokens"],
        m["spec_decode_num_accepted_tokens"],
    )
    if right:
        assert drafts == 3 * 6 and drafted == 3 * 6 * k and accepted == drafted
        assert 1 + accepted / drafts == k + 1
        assert m["spec_decode_num_accepted_tokens_per_pos"] == [drafts] * k
    else:
        # one token per step; the last step has no room left for drafts
        assert accepted == 0 and drafts == 3 * (max_tokens - 2)
        assert 1 + accepted / drafts == 1.0


def test_sampling_with_spec_is_seeded_and_reasonable(tiny_qwen3_dir, dflash_dir):
    spec = {"method": "dflash", "model": dflash_dir, "num_speculative_tokens": 4}
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", speculative_config=spec)
    sp = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=11, max_tokens=20, ignore_eos=True)
    a = llm.generate(PROMPTS[0], sp)[0].outputs[0].token_ids
    b = llm.generate(PROMPTS[0], sp)[0].outputs[0].token_ids
    assert a == b and len(a) == 20


def test_near_max_model_len_drafts_fewer(tiny_qwen3_dir, smol_tokenizer, dflash_dir):
    prompt = PROMPTS[2]
    plen = len(smol_tokenizer(prompt).input_ids)
    max_len = plen + 10
    base = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_model_len=max_len)
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    ref = base.generate(prompt, sp)[0].outputs[0].token_ids
    llm = LLM(
        tiny_qwen3_dir,
        dtype="float32",
        device="cpu",
        max_model_len=max_len,
        speculative_config={"method": "dflash", "model": dflash_dir, "num_speculative_tokens": 15},
    )
    out = llm.generate(prompt, sp)[0].outputs[0]
    assert out.token_ids == ref and out.finish_reason == "length"
    m = llm.get_metrics()
    # each step drafts at most the room left before max_model_len (9, 8, ... 1), never K=15
    assert m["spec_decode_num_draft_tokens"] <= sum(range(1, 10))
    assert m["spec_decode_num_draft_tokens"] < 15 * m["spec_decode_num_drafts"]


def test_speculative_config_validation(tiny_qwen3_dir, dflash_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown key 'num_spec_tokens'"):
        SpeculativeConfig.from_any({"method": "ngram", "num_spec_tokens": 3})
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig.from_any({"method": "ngram", "num_speculative_tokens": 0})
    with pytest.raises(ValueError, match="draft_tensor_parallel_size"):
        SpeculativeConfig.from_any(
            {"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2}
        )
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        SpeculativeConfig.from_any(
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}
        )
    with pytest.raises(ValueError, match="'method' must be one of"):
        SpeculativeConfig.from_any({"method": "draft", "model": "x", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="not valid JSON"):
        SpeculativeConfig.from_any("{method: ngram")
    assert (
        SpeculativeConfig.from_any(
            {"model": "z-lab/Qwen3-8B-DFlash-b16", "num_speculative_tokens": 15}
        ).method
        == "dflash"
    )
    assert (
        SpeculativeConfig.from_any({"model": "AngelSlim/Qwen3-8B_eagle3", "num_speculative_tokens": 3}).method
        == "eagle3"
    )
    # vLLM: a model that names no drafter kind is a draft model
    assert (
        SpeculativeConfig.from_any(
            {"model": "HuggingFaceTB/SmolLM2-135M", "num_speculative_tokens": 3}
        ).method
        == "draft_model"
    )
    with pytest.raises(ValueError, match="'model' .* is required for method 'draft_model'"):
        SpeculativeConfig.from_any({"method": "draft_model", "num_speculative_tokens": 3})
    for bad in (1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="'disable_by_batch_size' must be an integer >= 2"):
            SpeculativeConfig.from_any(
                {"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": bad}
            )
    cfg = SpeculativeConfig.from_any(
        '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'
    )
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (4, 4)
    with pytest.raises(ValueError, match="between 1 and block_size-1=15"):
        LLM(
            tiny_qwen3_dir,
            device="cpu",
            speculative_config={"method": "dflash", "model": dflash_dir, "num_speculative_tokens": 16},
        )


def test_drafter_target_mismatch_is_a_clear_error(tiny_qwen3_dir, tmp_path):
    # fc built for 3 taps of hidden 64 but the config lists 2 taps -> width mismatch
    bad = make_dflash(tmp_path / "bad", 64, 4, VOCAB, layer_ids=[0, 1, 2])
    import json

    cfg = json.loads((Path(bad) / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [0, 2]
    (Path(bad) / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="draft/target mismatch"):
        LLM(
            tiny_qwen3_dir,
            device="cpu",
            speculative_config={"method": "dflash", "model": bad, "num_speculative_tokens": 4},
        )
    wide = make_dflash(tmp_path / "wide", 32, 4, VOCAB)
    with pytest.raises(ValueError, match="hidden_size"):
        LLM(
            tiny_qwen3_dir,
            device="cpu",
            speculative_config={"method": "dflash", "model": wide, "num_speculative_tokens": 4},
        )
    far = make_dflash(tmp_path / "far", 64, 40, VOCAB, layer_ids=[1, 30])
    with pytest.raises(ValueError, match="target_layer_ids"):
        LLM(
            tiny_qwen3_dir,
            device="cpu",
            speculative_config={"method": "dflash", "model": far, "num_speculative_tokens": 4},
        )


def test_eagle3_d2t_maps_draft_ids(tiny_qwen3_dir, baseline, eagle_d2t_dir):
    llm, outs = _spec_run(
        tiny_qwen3_dir, {"method": "eagle3", "model": eagle_d2t_dir, "num_speculative_tokens": 3}
    )
    assert outs == baseline
    head = llm.engine.runner.proposer.model
    ids = torch.tensor([0, 1, 5, 999])
    assert head.to_target_ids(ids).tolist() == [0, 2, 10, 1998]  # d2t offsets: target = draft + d2t[draft]
    assert head.draft_vocab_size == 1000


def test_spec_metrics_log_line(tiny_qwen3_dir, dflash_dir, caplog):
    cur = SpecStats(4, 16, 10, [4, 3, 2, 1])
    line = spec_log_line(cur, SpecStats(), 2.0, 4)
    assert line.startswith("SpecDecoding metrics: Mean acceptance length: 3.50")
    assert "Per-position acceptance rate: 1.000, 0.750, 0.500, 0.250" in line
    assert "Avg Draft acceptance rate: 62.5%" in line
    llm = LLM(
        tiny_qwen3_dir,
        dtype="float32",
        device="cpu",
        disable_log_stats=False,
        speculative_config={"method": "dflash", "model": dflash_dir, "num_speculative_tokens": 2},
    )
    llm.engine.config.log_stats_interval = 0.0
    with caplog.at_level(logging.INFO, logger="specserve"):
        llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert any("SpecDecoding metrics: Mean acceptance length" in r.message for r in caplog.records)


@pytest.mark.parametrize("method", ["plain", "ngram", "dflash", "eagle3", "draft_model"])
def test_padded_graph_path_equals_eager(
    method, tiny_qwen3_dir, tiny2_qwen3_dir, baseline, dflash_dir, eagle_dir
):
    """The static-shape path that CUDA graphs replay (padded batch buckets, drafts padded to K, padded drafter
    batch) gives the same greedy tokens as the eager ragged path; on CPU it runs without capture."""
    spec = {
        "plain": None,
        "ngram": {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 3,
        },
        "dflash": {"method": "dflash", "model": dflash_dir, "num_speculative_tokens": 5},
        "eagle3": {"method": "eagle3", "model": eagle_dir, "num_speculative_tokens": 3},
        "draft_model": {"method": "draft_model", "model": tiny2_qwen3_dir, "num_speculative_tokens": 3},
    }[method]
    llm = LLM(
        tiny_qwen3_dir,
        dtype="float32",
        device="cpu",
        max_num_seqs=4,
        speculative_config=spec,
        padded_decode=True,
    )
    assert llm.engine.runner.use_padded
    if method == "draft_model":  # its K-1 one-token steps: the bucketed graph's static path
        assert llm.engine.runner.proposer.graphs is not None
    sp = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    outs = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:3], sp)]  # 3 requests -> bucket 4 (padded)
    assert outs == baseline[:3]


@pytest.mark.parametrize("padded", [False, True])
def test_lm_head_sees_2d_rows(padded, tiny_qwen3_dir, baseline, dflash_dir, eagle_dir):
    """The drafters' query rows reach the LM head as one 2-D [rows, H] GEMM: torch's CPU bf16 linear over the
    strided [b, K, H] view they come from took ~80 ms per call on SmolLM2 (vs ~2.4 ms 2-D), which made DFlash
    3x slower than plain decoding on a 2-core CPU. Outputs stay lossless."""
    for spec in (
        {"method": "dflash", "model": dflash_dir, "num_speculative_tokens": 4},
        {"method": "eagle3", "model": eagle_dir, "num_speculative_tokens": 3},
    ):
        llm = _spec_llm(tiny_qwen3_dir, spec, padded_decode=padded)
        dims: list[int] = []
        heads = [llm.engine.runner.model.lm_head]
        drafter_head = getattr(getattr(llm.engine.runner.proposer, "model", None), "lm_head", None)
        if drafter_head is not None:
            heads.append(drafter_head)

        def record(_m: torch.nn.Module, args: tuple, seen: list[int] = dims) -> None:
            seen.append(args[0].dim())

        for head in heads:
            head.register_forward_pre_hook(record)
        assert _generate(llm) == baseline
        assert llm.get_metrics()["spec_decode_num_drafts"] > 0
        assert dims and set(dims) == {2}, (spec["method"], sorted(set(dims)))


def test_compute_logits_flattens_strided_rows(tiny_qwen3_dir):
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=2)
    model = llm.engine.runner.model
    hidden = torch.randn(3, 5, model.config.hidden_size)
    view = hidden[:, 1:]  # [3, 4, H], not contiguous
    logits = model.compute_logits(view)
    assert logits.shape == (3, 4, model.config.vocab_size)
    ref = torch.nn.functional.linear(view.reshape(-1, view.shape[-1]), model.lm_head.weight).view(3, 4, -1)
    torch.testing.assert_close(logits, ref)
    assert torch.equal(model.compute_logits(hidden[0]), model.lm_head(hidden[0]))


def test_disable_padded_drafter_batch_takes_compacted_path(tiny_qwen3_dir, baseline, dflash_dir, eagle_dir):
    for spec in (
        {"method": "dflash", "model": dflash_dir, "num_speculative_tokens": 4},
        {"method": "eagle3", "model": eagle_dir, "num_speculative_tokens": 3},
    ):
        padded = LLM(
            tiny_qwen3_dir,
            dtype="float32",
            device="cpu",
            max_num_seqs=4,
            padded_decode=True,
            speculative_config=spec,
        )
        assert padded.engine.runner.proposer.graphs is not None
        spec = dict(spec, disable_padded_drafter_batch=True)
        llm = LLM(
            tiny_qwen3_dir,
            dtype="float32",
            device="cpu",
            max_num_seqs=4,
            padded_decode=True,
            speculative_config=spec,
        )
        assert llm.engine.runner.proposer.graphs is None  # ragged host-side drafter batch
        sp = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:3], sp)] == baseline[:3]


def test_spec_max_model_len_caps_drafting(tiny_qwen3_dir, smol_tokenizer, baseline, dflash_dir):
    plen = len(smol_tokenizer(PROMPTS[0]).input_ids)
    cap = plen + 6  # the drafter may only draft while the sequence stays within 6 tokens past the prompt
    llm, outs = _spec_run(
        tiny_qwen3_dir,
        {"method": "dflash", "model": dflash_dir, "num_speculative_tokens": 4, "max_model_len": cap},
        prompts=PROMPTS[:1],
    )
    assert outs == baseline[:1]
    m = llm.get_metrics()
    assert 0 < m["spec_decode_num_draft_tokens"] <= sum(range(1, 6))


def _drafts_by_prefix(
    llm: LLM, prompts, params, watch: int
) -> tuple[list[list[int]], dict, list[tuple[int, bool]]]:
    """Step the engine to the end; per step (running requests at its start, whether any running request holds
    drafts after it), and request ``watch``'s drafts keyed by its committed tokens at the time."""
    eng = llm.engine
    for i, (p, sp) in enumerate(zip(prompts, params)):
        eng.add_request(str(i), p, sp)
    watched = None
    drafts: dict[tuple[int, ...], list[int]] = {}
    steps: list[tuple[int, bool]] = []
    outs: dict[str, list[int]] = {}
    while eng.has_unfinished_requests():
        running = len(eng.scheduler.running) + len(eng.scheduler.waiting)
        for o in eng.step():
            if o.finished:
                outs[o.request_id] = list(o.outputs[0].token_ids)
        reqs = list(eng.scheduler.running)
        watched = next((r for r in reqs if r.request_id == str(watch)), None)
        if watched is not None and watched.spec_token_ids:
            drafts[tuple(watched.token_ids)] = list(watched.spec_token_ids)
        steps.append((running, any(r.spec_token_ids for r in reqs)))
    m = llm.get_metrics()
    assert m["num_free_blocks"] == m["num_gpu_blocks"]  # no KV block leaked
    return [outs[str(i)] for i in range(len(prompts))], drafts, steps


@pytest.mark.parametrize("method", ["dflash", "eagle3", "draft_model", "ngram"])
@pytest.mark.parametrize("async_on", [False, True])
def test_disable_by_batch_size(
    method, async_on, tiny_qwen3_dir, tiny2_qwen3_dir, baseline, dflash_dir, eagle_dir
):
    """vLLM's disable_by_batch_size: no drafts while more requests than that run; once the batch shrinks,
    drafting resumes with the drafter's context whole (it read the target features of the plain steps): its
    drafts then equal those of a run that drafted at every step, at the same committed tokens."""
    model = {"dflash": dflash_dir, "eagle3": eagle_dir, "draft_model": tiny2_qwen3_dir, "ngram": None}[method]
    spec = {"method": method, "model": model, "num_speculative_tokens": 3}
    if method == "ngram":
        spec.update(prompt_lookup_min=1, prompt_lookup_max=2)
    kw = dict(padded_decode=True, async_spec=async_on, async_scheduling=async_on)
    short = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    long = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    gated = _spec_llm(tiny_qwen3_dir, dict(spec, disable_by_batch_size=2), **kw)
    # async: DFlash's gated plain steps pipeline, its context fed by a graph after the target's (launch_decode);
    # n-gram lookup has no context to feed
    pipelined = method in ("dflash", "ngram")
    assert gated.engine.runner.use_context_step == pipelined
    assert gated.engine.runner.async_scheduling == (async_on and pipelined)
    outs, drafts, steps = _drafts_by_prefix(gated, PROMPTS[:3], [short, long, short], watch=1)
    if async_on and pipelined:
        assert gated.engine.runner.num_async_steps > 0
    assert outs == [baseline[0][:5], baseline[1], baseline[2][:5]]  # lossless
    # three running: no drafts; the two short ones done: drafting resumed
    assert steps[0][0] == 3 and not any(has for n, has in steps if n > 2)
    assert any(has for n, has in steps if n <= 2) and drafts
    m = gated.get_metrics()
    assert m["spec_decode_num_drafts"] > 0
    always = _spec_llm(tiny_qwen3_dir, spec, **kw)
    outs1, ref, _ = _drafts_by_prefix(always, PROMPTS[1:2], [long], watch=0)
    assert outs1 == [baseline[1]]
    common = [k for k in drafts if k in ref]
    assert len(common) >= 3
    assert all(drafts[k] == ref[k] for k in common)
    # the threshold counts requests: at 3 the same three requests draft from the first step on
    three = _spec_llm(tiny_qwen3_dir, dict(spec, disable_by_batch_size=3), **kw)
    outs3, _, steps3 = _drafts_by_prefix(three, PROMPTS[:3], [short, long, short], watch=1)
    # (n-gram lookup finds nothing to draft after the first step here)
    assert outs3 == outs and steps3[0] == (3, method != "ngram")


@pytest.mark.parametrize("k", [1, 4])
def test_draft_model_lossless(k, tiny_qwen3_dir, tiny2_qwen3_dir, baseline):
    """vLLM's draft_model: another (smaller) LM with the target's tokenizer drafts greedily; lossless."""
    llm, outs = _spec_run(tiny_qwen3_dir, {"model": tiny2_qwen3_dir, "num_speculative_tokens": k})
    assert llm.engine.runner.proposer.method == "draft_model"
    assert outs == baseline
    m = llm.get_metrics()
    assert m["spec_decode_num_drafts"] > 0 and len(m["spec_decode_num_accepted_tokens_per_pos"]) == k
    assert m["num_free_blocks"] == m["num_gpu_blocks"]


@pytest.mark.parametrize("padded", [False, True])
def test_requests_ending_at_prefill_stay_in_the_prefix_cache(padded, tiny_qwen3_dir, baseline):
    """A request that ends in its prefill's step (max_tokens=1) leaves its full blocks in the prefix cache (no
    later step registers them), with the draft model's KV in them valid: the same prompts again hit every whole
    block but the last token's, and the target drafting for itself still has every draft accepted."""
    spec = {"method": "draft_model", "model": tiny_qwen3_dir, "num_speculative_tokens": 3}
    llm = _spec_llm(tiny_qwen3_dir, spec, padded_decode=padded)
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    first = llm.generate(PROMPTS, one)
    assert [o.outputs[0].token_ids for o in first] == [b[:1] for b in baseline]
    assert [o.num_cached_tokens for o in first] == [0] * len(PROMPTS)
    bs = llm.config.block_size
    whole = [(len(o.prompt_token_ids) - 1) // bs * bs for o in first]
    assert sum(whole) >= 2 * bs  # the prompts span whole blocks, so the check below can fail
    sp = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    again = llm.generate(PROMPTS, sp)
    assert [o.num_cached_tokens for o in again] == whole
    assert [o.outputs[0].token_ids for o in again] == baseline
    m = llm.get_metrics()
    assert 0 < m["spec_decode_num_accepted_tokens"] == m["spec_decode_num_draft_tokens"]
    assert m["num_free_blocks"] == m["num_gpu_blocks"]


@pytest.mark.parametrize("padded", [False, True])
def test_draft_model_self_draft_accepts_everything(padded, tiny_qwen3_dir, baseline):
    """The target as its own draft model (float32): every draft is the target's greedy token, so every draft is
    accepted. This holds only if the draft model's paged cache follows the committed sequence exactly: through
    chunked prefill, preemption (recompute), prefix-cache hits, steps gated by disable_by_batch_size and the
    draft budget near max_tokens."""
    k = 3
    spec = {"method": "draft_model", "model": tiny_qwen3_dir, "num_speculative_tokens": k}
    llm, outs = _spec_run(
        tiny_qwen3_dir, spec, num_gpu_blocks=9, max_num_batched_tokens=24, padded_decode=padded
    )
    # padded: the one-token steps run as the bucketed graph's static path (eager on the CPU)
    assert (llm.engine.runner.proposer.graphs is not None) == padded
    assert outs == baseline
    m = llm.get_metrics()
    assert m["num_preemptions_total"] > 0
    assert m["spec_decode_num_draft_tokens"] > 0
    assert m["spec_decode_num_accepted_tokens"] == m["spec_decode_num_draft_tokens"]
    # drafts cut short (draft budget, token budget) are accepted whole too; most run the full K
    assert m["spec_decode_num_accepted_tokens_per_pos"][0] == m["spec_decode_num_drafts"]
    assert m["spec_decode_num_draft_tokens"] > (k - 1) * m["spec_decode_num_drafts"]
    assert m["num_free_blocks"] == m["num_gpu_blocks"]
    # the same prompts again: prefix-cache hits for the target and the draft model's blocks
    sp = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)] == baseline
    m2 = llm.get_metrics()
    assert m2["prefix_cache_hits"] > m["prefix_cache_hits"]
    assert m2["spec_decode_num_accepted_tokens"] == m2["spec_decode_num_draft_tokens"]
    # gated while 3 run, drafting once 2 are done: still every draft accepted
    gated = _spec_llm(tiny_qwen3_dir, dict(spec, disable_by_batch_size=2), padded_decode=padded)
    short = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    long = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    outs3 = [o.outputs[0].token_ids for o in gated.generate(PROMPTS[:3], [short, long, short])]
    assert outs3 == [baseline[0][:5], baseline[1], baseline[2][:5]]
    m3 = gated.get_metrics()
    assert 0 < m3["spec_decode_num_accepted_tokens"] == m3["spec_decode_num_draft_tokens"]


def test_drafter_without_a_method_named_nowhere_is_a_clear_error(tiny_qwen3_dir, dflash_dir, tmp_path):
    """A DFlash checkpoint whose path does not say so is inferred as a draft model (vLLM's rule); loading it says
    which method to set."""
    import shutil

    plain = tmp_path / "my-drafter"
    shutil.copytree(dflash_dir, plain)
    with pytest.raises(ValueError, match='DFlash drafter .* set "method": "dflash"'):
        LLM(
            tiny_qwen3_dir,
            device="cpu",
            speculative_config={"model": str(plain), "num_speculative_tokens": 2},
        )


def test_draft_model_context_caps_drafting(tiny_qwen3_dir, smol_tokenizer, baseline, tmp_path):
    """No drafts past the draft model's own context (its max_position_embeddings), as vLLM; still lossless."""
    import json
    import shutil

    plen = len(smol_tokenizer(PROMPTS[0]).input_ids)
    short = tmp_path / "short-context-lm"
    shutil.copytree(tiny_qwen3_dir, short)
    cfg = json.loads((short / "config.json").read_text())
    cfg["max_position_embeddings"] = plen + 6
    (short / "config.json").write_text(json.dumps(cfg))
    llm, outs = _spec_run(
        tiny_qwen3_dir, {"model": str(short), "num_speculative_tokens": 4}, prompts=PROMPTS[:1]
    )
    assert outs == baseline[:1] and llm.engine.runner.draft_max_model_len == plen + 6
    m = llm.get_metrics()
    # the target as its own draft: every draft accepted, and only while the sequence stays within plen + 6
    assert 0 < m["spec_decode_num_draft_tokens"] == m["spec_decode_num_accepted_tokens"] <= sum(range(1, 6))


def test_draft_model_vocab_mismatch_is_a_clear_error(tiny_qwen3_dir, tmp_path):
    import json
    import shutil

    bad = tmp_path / "draft"
    shutil.copytree(tiny_qwen3_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["vocab_size"] = 1000
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="vocabulary of 1000 tokens, the target 49152"):
        LLM(
            tiny_qwen3_dir,
            device="cpu",
            speculative_config={"model": str(bad), "num_speculative_tokens": 2},
        )
