"""Shared fixtures: tiny random checkpoints in the real HF formats, with the SmolLM2 tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Triton kernels run under the interpreter on CPU; the flag must be set before anything imports triton
os.environ.setdefault("TRITON_INTERPRET", "1")
torch.set_num_threads(1)  # tiny models: threading only adds overhead

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

VOCAB = 49152  # SmolLM2 tokenizer


@pytest.fixture(scope="session")
def smol_tokenizer():
    from specserve.loading import demo_target_path, load_tokenizer

    return load_tokenizer(demo_target_path())


def _save(model, tok, path: Path, gen_eos: int | None = None) -> str:
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    if gen_eos is not None:
        import json

        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": gen_eos}))
    return str(path)


def build_tiny(arch: str, path: Path, tok, seed: int = 0, **overrides) -> str:
    import transformers

    torch.manual_seed(seed)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    common.update(overrides)
    if arch == "llama":
        cfg = transformers.LlamaConfig(
            tie_word_embeddings=True,
            rope_theta=10000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
            },
            **common,
        )
        model = transformers.LlamaForCausalLM(cfg)
    elif arch == "qwen3":
        cfg = transformers.Qwen3Config(head_dim=16, tie_word_embeddings=False, rope_theta=1e6, **common)
        model = transformers.Qwen3ForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(tie_word_embeddings=False, rope_theta=1e6, **common)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        raise ValueError(arch)
    # larger init so the random model has peaked, non-degenerate distributions
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    return _save(model, tok, path, gen_eos=2)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, smol_tokenizer) -> str:
    return build_tiny("llama", tmp_path_factory.mktemp("tiny_llama"), smol_tokenizer, seed=1)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory, smol_tokenizer) -> str:
    return build_tiny("qwen3", tmp_path_factory.mktemp("tiny_qwen3"), smol_tokenizer, seed=2)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory, smol_tokenizer) -> str:
    return build_tiny("qwen2", tmp_path_factory.mktemp("tiny_qwen2"), smol_tokenizer, seed=3)


# two decoder layers (a first and a last one, the hand-over between layers as with four): for the engine tests that
# run the Triton kernels under the interpreter, whose time grows with the launches, i.e. with the layers
@pytest.fixture(scope="session")
def tiny2_qwen3_dir(tmp_path_factory, smol_tokenizer) -> str:
    return build_tiny(
        "qwen3", tmp_path_factory.mktemp("tiny2_qwen3"), smol_tokenizer, seed=2, num_hidden_layers=2
    )


@pytest.fixture(scope="session")
def tiny2_qwen2_dir(tmp_path_factory, smol_tokenizer) -> str:
    return build_tiny(
        "qwen2", tmp_path_factory.mktemp("tiny2_qwen2"), smol_tokenizer, seed=3, num_hidden_layers=2
    )


@pytest.fixture(scope="session")
def often_qwen3_dir(tiny_qwen3_dir, tmp_path_factory) -> str:
    """tiny_qwen3_dir with two LM-head rows scaled up: target and drafter mostly pick one of two tokens, so
    drafts are right about half the time (every acceptance length shows up; sampled drafts are often accepted)."""

    def edit(w):  # type: ignore[no-untyped-def]
        w["lm_head.weight"][[101, 202]] *= 300

    from drafters import edit_target

    return edit_target(tiny_qwen3_dir, tmp_path_factory.mktemp("often"), edit)
