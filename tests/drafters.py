"""Tiny random drafter checkpoints in the real formats (z-lab DFlash, LlamaForCausalLMEagle3), and a tiny random
chat target with a word-level tokenizer and a chat template (for data generation through the chat template)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def _layer(
    prefix: str,
    H: int,
    nh: int,
    nkv: int,
    hd: int,
    inter: int,
    qk_norm: bool,
    in_dim: int | None = None,
    std: float = 0.05,
) -> dict[str, torch.Tensor]:
    d = in_dim or H
    w = {
        f"{prefix}self_attn.q_proj.weight": torch.randn(nh * hd, d) * std,
        f"{prefix}self_attn.k_proj.weight": torch.randn(nkv * hd, d) * std,
        f"{prefix}self_attn.v_proj.weight": torch.randn(nkv * hd, d) * std,
        f"{prefix}self_attn.o_proj.weight": torch.randn(H, nh * hd) * std,
        f"{prefix}mlp.gate_proj.weight": torch.randn(inter, H) * std,
        f"{prefix}mlp.up_proj.weight": torch.randn(inter, H) * std,
        f"{prefix}mlp.down_proj.weight": torch.randn(H, inter) * std,
        f"{prefix}input_layernorm.weight": 1 + 0.1 * torch.randn(H),
        f"{prefix}post_attention_layernorm.weight": 1 + 0.1 * torch.randn(H),
    }
    if qk_norm:
        w[f"{prefix}self_attn.q_norm.weight"] = 1 + 0.1 * torch.randn(hd)
        w[f"{prefix}self_attn.k_norm.weight"] = 1 + 0.1 * torch.randn(hd)
    return w


def make_dflash(
    path: Path,
    target_hidden: int,
    target_layers: int,
    vocab: int,
    *,
    layer_ids: list[int] | None = None,
    num_layers: int = 2,
    block_size: int = 16,
    mask_token_id: int = 0,
    seed: int = 0,
    layer_types: list[str] | None = None,
    sliding_window: int | None = None,
) -> str:
    torch.manual_seed(seed)
    H, nh, nkv, hd, inter = target_hidden, 4, 2, 16, 96
    ids = layer_ids if layer_ids is not None else [1, max(1, target_layers - 2)]
    w: dict[str, torch.Tensor] = {}
    for i in range(num_layers):
        w.update(_layer(f"layers.{i}.", H, nh, nkv, hd, inter, qk_norm=True))
    w["fc.weight"] = torch.randn(H, len(ids) * target_hidden) * 0.05
    w["hidden_norm.weight"] = torch.ones(H)
    w["norm.weight"] = torch.ones(H)
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": block_size,
        "num_target_layers": target_layers,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": ids},
        "hidden_size": H,
        "intermediate_size": inter,
        "num_hidden_layers": num_layers,
        "num_attention_heads": nh,
        "num_key_value_heads": nkv,
        "head_dim": hd,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1e6,
        "max_position_embeddings": 4096,
        "layer_types": layer_types or ["full_attention"] * num_layers,
        "sliding_window": sliding_window,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": vocab,
        "torch_dtype": "float32",
    }
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in w.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


def make_eagle3(
    path: Path,
    target_hidden: int,
    target_layers: int,
    vocab: int,
    *,
    draft_vocab: int | None = None,
    with_lm_head: bool = False,
    seed: int = 0,
    heads: tuple[int, int] = (4, 2),
) -> str:
    """``heads``: (attention heads, KV heads) of its layer (head dim 16)."""
    torch.manual_seed(seed)
    H, (nh, nkv), hd, inter = target_hidden, heads, 16, 96
    w = _layer("midlayer.", H, nh, nkv, hd, inter, qk_norm=False, in_dim=2 * H)
    w["midlayer.hidden_norm.weight"] = torch.ones(H)
    w["fc.weight"] = torch.randn(H, 3 * target_hidden) * 0.05
    w["norm.weight"] = torch.ones(H)
    dv = draft_vocab or vocab
    if with_lm_head or dv != vocab:
        w["lm_head.weight"] = torch.randn(dv, H) * 0.05
        # draft id i -> target id 2*i (offset i): a non-trivial d2t mapping
        w["d2t"] = torch.arange(dv, dtype=torch.long)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[torch.arange(dv) * 2] = True
        w["t2d"] = t2d
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": inter,
        "num_attention_heads": nh,
        "num_key_value_heads": nkv,
        "head_dim": hd,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1e6,
        "max_position_embeddings": 4096,
        "vocab_size": vocab,
        "draft_vocab_size": dv,
        "tie_word_embeddings": False,
        "target_hidden_size": target_hidden,
        "torch_dtype": "float32",
    }
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in w.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


def edit_target(src: str, dst: Path, edit) -> str:  # type: ignore[no-untyped-def]
    """A copy of the checkpoint dir ``src`` in ``dst`` with ``edit(state_dict)`` applied to its weights."""
    shutil.copytree(src, dst, dirs_exist_ok=True)
    w = load_file(str(dst / "model.safetensors"))
    edit(w)
    save_file(w, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


def tiny_chat_target(
    d: Path, words: list[str], *, seed: int, vocab_size: int, num_layers: int, max_position: int
) -> str:
    """A random Qwen3 target saved with a word-level tokenizer over ``<unk> <|im_start|> <|im_end|> user assistant``
    + ``words`` (ids in that order; other words are ``<unk>``) and a chat template; returns its directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    vocab = ["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", *words]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
        "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<|im_start|>", eos_token="<|im_end|>",
        chat_template=template,
    )  # fmt: skip
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=num_layers,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=max_position,
        eos_token_id=2, bos_token_id=1, tie_word_embeddings=True,
    )  # fmt: skip
    Qwen3ForCausalLM(cfg).save_pretrained(str(d))
    hf_tok.save_pretrained(str(d))
    return str(d)
