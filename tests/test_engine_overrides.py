"""vLLM's --hf-overrides, --tokenizer-mode and --max-cudagraph-capture-size as EngineConfig fields: validation, the
overridden target config (transformers with the same config as the oracle), slow tokenizers, and which CUDA-graph
buckets are captured (the capture itself simulated: CI has no GPU)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import pytest
import torch
import transformers

from specserve import SamplingParams
from specserve.config import EngineConfig, ModelConfig
from specserve.engine.engine import LLMEngine
from specserve.loading import apply_hf_overrides, demo_target_path, load_tokenizer, resolve_checkpoint
from specserve.loading.checkpoint import merge_overrides, override_hf_config
from specserve.runner import cuda_graphs
from specserve.runner.cuda_graphs import BucketedGraphs, batch_buckets, capture_limit, captured_buckets

PROMPT = "The capital of France is Paris, and the capital of Italy is"


def _engine(model: str, **kw: Any) -> LLMEngine:
    kw.setdefault("num_gpu_blocks", 64)
    return LLMEngine(EngineConfig(model=model, dtype="float32", device="cpu", **kw))


def _greedy(eng: LLMEngine, prompts: list[Any], n: int = 12) -> list[list[int]]:
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    ids = [eng.add_request(str(i), p, sp) for i, p in enumerate(prompts)]
    done: dict[str, list[int]] = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    return [done[i] for i in ids]


def _hf_greedy(model: Any, ids: list[int], n: int = 12) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return out[0, len(ids) :].tolist()  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("bad", [["rope_theta", 1.0], "{}", {1: 2}, 3])
def test_hf_overrides_must_be_a_dict_with_string_keys(bad: Any) -> None:
    with pytest.raises(ValueError, match="hf_overrides must be a dict with string keys"):
        EngineConfig(model=None, hf_overrides=bad)


@pytest.mark.parametrize("mode", ["mistral", "custom"])
def test_tokenizer_mode_mistral_and_custom_are_refused(mode: str) -> None:
    with pytest.raises(
        ValueError, match=rf"^tokenizer_mode '{mode}' is not supported \(use auto, hf or slow\)$"
    ):
        EngineConfig(model=None, tokenizer_mode=mode)
    with pytest.raises(ValueError, match="tokenizer_mode must be one of auto, hf, slow"):
        EngineConfig(model=None, tokenizer_mode="fast")


@pytest.mark.parametrize("bad", [0, -16, True, 8.0, "64"])
def test_max_cudagraph_capture_size_must_be_positive(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_cudagraph_capture_size must be a positive integer"):
        EngineConfig(model=None, max_cudagraph_capture_size=bad)


def test_defaults_and_valid_values() -> None:
    cfg = EngineConfig(model=None)
    assert (cfg.hf_overrides, cfg.tokenizer_mode, cfg.max_cudagraph_capture_size) == (None, "auto", None)
    cfg = EngineConfig(
        model=None,
        hf_overrides={"rope_scaling": {"factor": 2.0}},
        tokenizer_mode="slow",
        max_cudagraph_capture_size=1,
    )
    assert cfg.hf_overrides == {"rope_scaling": {"factor": 2.0}} and cfg.tokenizer_mode == "slow"
    assert EngineConfig(model=None, tokenizer_mode="hf").max_cudagraph_capture_size is None


# ------------------------------------------------------------------------------------------------ hf_overrides
def test_merge_overrides_is_recursive_and_copies() -> None:
    base = {"a": 1, "rope": {"type": "llama3", "factor": 8.0, "deep": {"x": 1, "y": 2}}, "l": [1]}
    over = {"rope": {"factor": 2.0, "deep": {"y": 3}}, "l": [2], "new": {"k": 1}}
    out = merge_overrides(base, over)
    assert out == {
        "a": 1,
        "rope": {"type": "llama3", "factor": 2.0, "deep": {"x": 1, "y": 3}},
        "l": [2],
        "new": {"k": 1},
    }
    assert base["rope"]["factor"] == 8.0 and base["rope"]["deep"] == {"x": 1, "y": 2}  # type: ignore[index]
    out["new"]["k"] = 5
    assert over["new"] == {"k": 1}
    assert merge_overrides(base, {"rope": None})["rope"] is None  # a non-dict replaces a dict


def test_override_hf_config_rope_and_length(tiny_llama_dir: str) -> None:
    hf = resolve_checkpoint(tiny_llama_dir).hf_config
    base = ModelConfig.from_hf(hf)
    assert base.rope_theta == 10000.0 and base.rope_scaling is not None
    assert base.rope_scaling["rope_type"] == "llama3" and base.rope_scaling["factor"] == 8.0

    # vLLM-style top-level rope_theta lands where this transformers reads it (rope_parameters, when it has them)
    mc = ModelConfig.from_hf(override_hf_config(hf, {"rope_theta": 500.0, "max_position_embeddings": 333}))
    assert (mc.rope_theta, mc.max_position_embeddings) == (500.0, 333)
    assert mc.rope_scaling is not None and mc.rope_scaling["rope_type"] == "llama3"
    # a nested rope_scaling override merges into the current scaling; another rope_type replaces it
    mc = ModelConfig.from_hf(override_hf_config(hf, {"rope_scaling": {"factor": 2.0}}))
    assert mc.rope_scaling is not None and mc.rope_scaling["factor"] == 2.0
    assert mc.rope_scaling["rope_type"] == "llama3" and mc.rope_scaling["low_freq_factor"] == 1.0
    mc = ModelConfig.from_hf(override_hf_config(hf, {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}))
    assert (
        mc.rope_scaling is not None
        and mc.rope_scaling["rope_type"] == "linear"
        and mc.rope_scaling["factor"] == 4.0
    )
    assert "low_freq_factor" not in mc.rope_scaling
    assert ModelConfig.from_hf(override_hf_config(hf, {"rope_scaling": None})).rope_scaling is None
    # everything else untouched; the original config too
    same = ModelConfig.from_hf(
        override_hf_config(hf, {"max_position_embeddings": base.max_position_embeddings})
    )
    assert same == base
    assert ModelConfig.from_hf(hf) == base
    # an override the config class rejects: one clear ValueError
    with pytest.raises(ValueError, match="hf_overrides .* do not give a valid LlamaConfig"):
        override_hf_config(hf, {"num_attention_heads": "four"})


def test_apply_hf_overrides_logs_and_keeps_the_checkpoint(
    tiny_qwen3_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = resolve_checkpoint(tiny_qwen3_dir)
    assert apply_hf_overrides(ckpt, None) is ckpt and apply_hf_overrides(ckpt, {}) is ckpt
    with caplog.at_level(logging.INFO, logger="specserve"):
        new = apply_hf_overrides(ckpt, {"max_position_embeddings": 4096, "rope_theta": 123.0})
    assert "max_position_embeddings=4096" in caplog.text and "rope_theta=123.0" in caplog.text
    assert new is not ckpt and (new.path, new.gguf_file) == (ckpt.path, ckpt.gguf_file)
    assert new.hf_config.max_position_embeddings == 4096 and ckpt.hf_config.max_position_embeddings == 1024
    assert ModelConfig.from_hf(new.hf_config).rope_theta == 123.0


def test_hf_overrides_on_a_gguf_config() -> None:
    """The config transformers derives from a GGUF file is overridden like a config.json."""
    ckpt = resolve_checkpoint(demo_target_path())
    new = apply_hf_overrides(ckpt, {"max_position_embeddings": 999, "rope_theta": 5.0})
    assert new.gguf_path == ckpt.gguf_path
    mc, base = ModelConfig.from_hf(new.hf_config), ModelConfig.from_hf(ckpt.hf_config)
    assert (mc.max_position_embeddings, mc.rope_theta) == (999, 5.0)
    assert (base.max_position_embeddings, base.rope_theta) == (8192, 100000.0)
    assert (mc.num_hidden_layers, mc.vocab_size, mc.tie_word_embeddings) == (30, 49152, True)


def test_engine_honours_hf_overrides_as_transformers_does(tiny2_qwen3_dir: str, smol_tokenizer: Any) -> None:
    """rope_theta and max_position_embeddings overridden: the engine's config, its max_model_len default and its
    greedy tokens follow, and match transformers' model built on the same overridden config."""
    overrides = {"rope_theta": 50.0, "max_position_embeddings": 512}
    eng = _engine(tiny2_qwen3_dir, hf_overrides=overrides)
    assert eng.model_config.rope_theta == 50.0 and eng.model_config.max_position_embeddings == 512
    assert eng.max_model_len == 512
    ids = smol_tokenizer(PROMPT).input_ids
    ours = _greedy(eng, [{"prompt_token_ids": ids}])[0]

    plain_engine = _engine(tiny2_qwen3_dir)
    assert plain_engine.max_model_len == 1024
    plain = _greedy(plain_engine, [{"prompt_token_ids": ids}])[0]

    cfg = transformers.AutoConfig.from_pretrained(tiny2_qwen3_dir)
    cfg.rope_parameters["rope_theta"] = 50.0  # transformers 5 reads rope_theta from here
    cfg.max_position_embeddings = 512
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        tiny2_qwen3_dir, config=cfg, dtype=torch.float32
    )
    assert ours == _hf_greedy(ref_model.eval(), ids)
    assert ours != plain  # the override changed what the model computes


def test_hf_overrides_on_the_dummy_load_path_and_invalid_results(tiny2_qwen3_dir: str) -> None:
    eng = _engine(tiny2_qwen3_dir, load_format="dummy", hf_overrides={"max_position_embeddings": 300})
    assert eng.max_model_len == 300 and eng.model_config.max_position_embeddings == 300
    # an override that makes the model invalid fails the engine's own config checks
    with pytest.raises(ValueError, match="Unsupported architecture 'GPT2LMHeadModel'"):
        _engine(tiny2_qwen3_dir, hf_overrides={"architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(
        ValueError,
        match=r"max_model_len \(1024\) is greater than the model's max_position_embeddings \(512\)",
    ):
        _engine(tiny2_qwen3_dir, max_model_len=1024, hf_overrides={"max_position_embeddings": 512})


def test_hf_overrides_apply_to_the_target_only(tiny2_qwen3_dir: str) -> None:
    """A draft model read from the target's own directory keeps the checkpoint's config."""
    spec = {"method": "draft_model", "model": tiny2_qwen3_dir, "num_speculative_tokens": 2}
    eng = _engine(tiny2_qwen3_dir, speculative_config=spec, hf_overrides={"rope_theta": 50.0})
    assert eng.model_config.rope_theta == 50.0 and eng.runner.model.config.rope_theta == 50.0
    draft = eng.runner.proposer.model  # type: ignore[union-attr]
    assert draft.config.rope_theta == 1e6


# ------------------------------------------------------------------------------------------------ tokenizer_mode
@pytest.fixture(scope="module")
def slow_tok_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Qwen3 whose tokenizer is a slow (pure Python) one: ByT5's bytes, the model's vocabulary its size."""
    from conftest import build_tiny

    tok = transformers.ByT5Tokenizer()
    return build_tiny(
        "qwen3", tmp_path_factory.mktemp("slow_tok"), tok, num_hidden_layers=2, vocab_size=len(tok)
    )


def test_tokenizer_mode_slow(slow_tok_dir: str, tiny2_qwen3_dir: str) -> None:
    tok = load_tokenizer(slow_tok_dir, tokenizer_mode="slow")
    assert isinstance(tok, transformers.ByT5Tokenizer) and not tok.is_fast
    assert tok.encode("hi") == [107, 108, 1]
    # a directory whose tokenizer exists only as a fast one: a clear error, not a silent fast tokenizer
    assert load_tokenizer(tiny2_qwen3_dir, tokenizer_mode="hf").is_fast
    with pytest.raises(ValueError, match=r"tokenizer_mode 'slow': '.*' has no slow tokenizer \(transformers"):
        load_tokenizer(tiny2_qwen3_dir, tokenizer_mode="slow")
    # GGUF tokenizers are built from the file's metadata: no slow form (refused before any parsing)
    with pytest.raises(ValueError, match="tokenizer_mode 'slow' does not apply to the GGUF"):
        load_tokenizer(demo_target_path(), tokenizer_mode="slow")
    with pytest.raises(ValueError, match="tokenizer_mode 'mistral' is not supported"):
        load_tokenizer(tiny2_qwen3_dir, tokenizer_mode="mistral")


def test_engine_tokenizer_mode(slow_tok_dir: str, tiny2_qwen3_dir: str) -> None:
    eng = _engine(slow_tok_dir, tokenizer_mode="slow")
    assert isinstance(eng.tokenizer, transformers.ByT5Tokenizer)
    assert eng.tokenize_prompt("hi")[1] == [107, 108, 1]
    out = _greedy(eng, ["hi"], n=4)[0]
    assert len(out) == 4 and all(0 <= t < 384 for t in out)
    with pytest.raises(ValueError, match="has no slow tokenizer"):
        _engine(tiny2_qwen3_dir, tokenizer_mode="slow")
    assert _engine(tiny2_qwen3_dir, tokenizer_mode="hf").tokenizer.is_fast


# ------------------------------------------------------------------------------------------------ capture size
def test_captured_buckets() -> None:
    buckets = batch_buckets(32)
    assert buckets == [1, 2, 4, 8, 16, 24, 32]
    assert captured_buckets(buckets, 1, None) == buckets
    assert captured_buckets(buckets, 1, 16) == [1, 2, 4, 8, 16]
    assert captured_buckets(buckets, 1, 17) == [1, 2, 4, 8, 16]
    assert captured_buckets(buckets, 16, 64) == [1, 2, 4]  # a K=15 verify step: 16 tokens per request
    assert captured_buckets(buckets, 16, 15) == []
    assert captured_buckets(buckets, 4, 512) == buckets
    assert captured_buckets([512, 16, 64, 32], 1, 64) == [16, 32, 64]  # prefill token buckets, any order


class _FakeGraph:
    """Stands in for torch.cuda.CUDAGraph: ``replay`` counts."""

    capturing: _FakeGraph | None = None

    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1

    def pool(self) -> str:
        return "pool"


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """BucketedGraphs' capture path on the CPU: torch.cuda's streams and graphs replaced by stand-ins."""

    class Stream:
        def __init__(self, *a: Any) -> None:
            pass

        def wait_stream(self, s: Any) -> None:
            pass

    @contextlib.contextmanager
    def graph(g: _FakeGraph, pool: Any = None) -> Any:
        _FakeGraph.capturing = g
        try:
            yield
        finally:
            _FakeGraph.capturing = None

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)


def test_bucketed_graphs_capture_only_the_buckets_that_fit(
    fake_cuda: None, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[tuple[int, bool]] = []  # (bucket, inside a capture)
    prepared: list[int] = []

    def fn(b: int) -> torch.Tensor:
        calls.append((b, _FakeGraph.capturing is not None))
        return torch.full((b,), float(len(calls)))

    cuda = torch.device("cuda")
    with caplog.at_level(logging.INFO, logger="specserve"), capture_limit(8, 4):  # q = 4: 2 requests fit
        g = BucketedGraphs("target q_len=4", fn, [8, 1, 4, 2], cuda, True, prepare=prepared.append)
    assert sorted(g.graphs) == [1, 2] and g.eager_buckets == [4, 8] and g.pool == "pool"
    assert [b for b, captured in calls if captured] == [2, 1]  # largest first
    assert [b for b, _ in calls if b in (4, 8)] == [8, 4]  # the eager buckets warmed once each
    assert prepared == [8, 4, 2, 1]
    assert (
        "captured 2 CUDA graphs for target q_len=4 (buckets [1, 2]; 2 more run eagerly: [4, 8])"
        in caplog.text
    )

    calls.clear()
    out = g.run(2)
    assert calls == [] and g.graphs[2].replays == 1 and out is g.outputs[2]  # type: ignore[attr-defined]
    out = g.run(8)
    assert calls == [(8, False)] and out.shape == (8,)  # the same padded step, eagerly

    # outside any limit (and with an explicit capture_only) the default behaviour: every bucket captured
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="specserve"):
        full = BucketedGraphs("prefill", fn, [1, 2, 4], cuda, True)
    assert sorted(full.graphs) == [1, 2, 4] and full.eager_buckets == []
    assert "captured 3 CUDA graphs for prefill (buckets [1, 2, 4]) in" in caplog.text
    with capture_limit(1, 1):
        only = BucketedGraphs("x", fn, [1, 2, 4], cuda, True, capture_only=[4])
    assert sorted(only.graphs) == [4] and only.eager_buckets == [1, 2]
    assert cuda_graphs._CAPTURE_LIMIT.get() is None  # the context is reset


@pytest.fixture(scope="module")
def dflash_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from conftest import VOCAB
    from drafters import make_dflash

    return make_dflash(tmp_path_factory.mktemp("ov_dflash"), 64, 2, VOCAB, layer_ids=[0, 1])


def test_runner_buckets_follow_the_step_q_and_outputs_stay(tiny2_qwen3_dir: str, dflash_dir: str) -> None:
    """On the padded path (what CUDA graphs replay; no capture on the CPU) every graph set of a step gets the
    step's eager buckets (target, sampling, the drafter's query / fused / context graphs, prefill by tokens), and
    greedy outputs are those of the unlimited engine."""
    spec = {"method": "dflash", "model": dflash_dir, "num_speculative_tokens": 3}
    kw: dict[str, Any] = dict(padded_decode=True, max_num_seqs=4, speculative_config=spec)
    prompts = ["Hello there, how are you", "1 2 3 4 5 6 7 8", "Once upon a time"]
    eng = _engine(tiny2_qwen3_dir, max_cudagraph_capture_size=4, **kw)
    r = eng.runner
    assert r.graphs[1].buckets == [1, 2, 4] and r.graphs[1].eager_buckets == []
    assert r.graphs[4].eager_buckets == [2, 4]  # q = K+1 = 4 tokens a request: only batch 1 fits
    for q in (1, 4):
        assert r.sample_graphs[q].eager_buckets == r.graphs[q].eager_buckets
    p = r.proposer
    assert p is not None and r.use_fused_step and r.use_context_step
    assert p.graphs.eager_buckets == [2, 4] and p.fused.eager_buckets == [2, 4]  # type: ignore[attr-defined]
    assert p.context.eager_buckets == []  # type: ignore[attr-defined]
    assert r.prefill_graphs is not None and r.prefill_graphs.eager_buckets == r.prefill_graphs.buckets
    limited = _greedy(eng, prompts)

    ref = _engine(tiny2_qwen3_dir, **kw)
    assert ref.runner.graphs[4].eager_buckets == [] and ref.runner.prefill_graphs.eager_buckets == []  # type: ignore[union-attr]
    assert limited == _greedy(ref, prompts)
    assert r.num_fused_steps > 0  # the graph-shaped fused steps ran
