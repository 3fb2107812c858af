"""The frozen target model used for drafter training: loading (HF dir or .gguf) and online features.

Feature taps are given as HF ``hidden_states`` indices: index 0 is the embedding output and index
``i + 1`` is the output of decoder layer ``i`` (un-normed). DFlash layer id ``i`` maps to index ``i + 1``;
an EAGLE-3 ``eagle_aux_hidden_state_layer_ids`` entry ``i`` (vLLM semantics: the residual stream
*entering* layer ``i``) maps to index ``i``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn


class TrainError(ValueError):
    """A user-facing error (bad option, missing file, refused data)."""


def resolve_target_path(target: str | None) -> str:
    """``None`` -> the bundled demo target (SmolLM2 .gguf); else the given path / hub id."""
    if target is None:
        try:
            from specserve.loading import demo_target_path  # type: ignore[attr-defined]
        except ImportError as e:  # pragma: no cover - depends on another module
            raise TrainError("no --target given and specserve.loading.demo_target_path is unavailable") from e
        return str(demo_target_path())
    if target.endswith(".gguf") and not os.path.isfile(target):
        raise TrainError(f"target file not found: {target}")
    return target


def _rope_theta(cfg: Any) -> float:
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        params = getattr(cfg, "rope_parameters", None) or {}
        theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta if theta is not None else 10000.0)


def _rope_scaling(cfg: Any) -> dict | None:
    scaling = getattr(cfg, "rope_scaling", None)
    if scaling is None:
        params = getattr(cfg, "rope_parameters", None)
        if isinstance(params, dict) and params.get("rope_type", "default") != "default":
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        return None
    return dict(scaling) if isinstance(scaling, dict) else None


# --------------------------------------------------------------------------------------------- GGUF


_GGUF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def load_gguf_checkpoint(path: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Dequantize a llama / qwen2 / qwen3 .gguf into (HF config dict, HF-named fp32 state dict)."""
    import gguf
    import numpy as np
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(path)
    fields = reader.fields

    def get(key: str, default: Any = None) -> Any:
        return fields[key].contents() if key in fields else default

    arch = get("general.architecture")
    if arch not in ("llama", "qwen2", "qwen3"):
        raise TrainError(f"unsupported GGUF architecture {arch!r} (supported: llama, qwen2, qwen3)")
    hidden = int(get(f"{arch}.embedding_length"))
    n_heads = int(get(f"{arch}.attention.head_count"))
    n_kv = int(get(f"{arch}.attention.head_count_kv", n_heads))
    head_dim = int(get(f"{arch}.attention.key_length", hidden // n_heads))

    def unpermute(w: np.ndarray, n: int) -> np.ndarray:  # inverse of llama.cpp's q/k permute
        return w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    state: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        shape = [int(x) for x in reversed(t.shape.tolist())]
        a = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        if t.name == "token_embd.weight":
            state["model.embed_tokens.weight"] = torch.from_numpy(a)
            continue
        if t.name == "output_norm.weight":
            state["model.norm.weight"] = torch.from_numpy(a)
            continue
        if t.name == "output.weight":
            state["lm_head.weight"] = torch.from_numpy(a)
            continue
        parts = t.name.split(".")
        if parts[0] != "blk" or parts[2] not in _GGUF_NAMES:
            continue  # e.g. rope_freqs
        kind, suffix = parts[2], parts[-1]
        if arch == "llama" and kind in ("attn_q", "attn_k") and suffix == "weight":
            a = unpermute(a, n_heads if kind == "attn_q" else n_kv)
        if arch == "llama" and kind in ("attn_q", "attn_k") and suffix == "bias":
            a = unpermute(a[:, None], n_heads if kind == "attn_q" else n_kv)[:, 0]
        state[f"model.layers.{parts[1]}.{_GGUF_NAMES[kind]}.{suffix}"] = torch.from_numpy(
            np.ascontiguousarray(a)
        )
    vocab = int(get(f"{arch}.vocab_size", state["model.embed_tokens.weight"].shape[0]))
    arch_name = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
    config = dict(
        architectures=[arch_name],
        model_type=arch,
        hidden_size=hidden,
        intermediate_size=int(get(f"{arch}.feed_forward_length")),
        num_hidden_layers=int(get(f"{arch}.block_count")),
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv,
        head_dim=head_dim,
        rms_norm_eps=float(get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(get(f"{arch}.rope.freq_base", 10000.0)),
        max_position_embeddings=int(get(f"{arch}.context_length", 4096)),
        vocab_size=vocab,
        tie_word_embeddings="lm_head.weight" not in state,
        hidden_act="silu",
        bos_token_id=get("tokenizer.ggml.bos_token_id"),
        eos_token_id=get("tokenizer.ggml.eos_token_id"),
        pad_token_id=get("tokenizer.ggml.padding_token_id"),
    )
    if arch == "qwen2":
        config["attention_bias"] = any(k.endswith("q_proj.bias") for k in state)
    return config, state


def _load_gguf_model(path: str, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg_dict, state = load_gguf_checkpoint(path)
    model_type = cfg_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg_dict)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):  # skip the (slow) random init; every weight comes from the file
        model = AutoModelForCausalLM.from_config(config)
    model = model.to_empty(device="cpu")
    for mod in list(model.modules()):
        if hasattr(mod, "inv_freq") and hasattr(mod, "config"):  # rebuild RoPE buffers lost on meta
            fresh = type(mod)(config=mod.config)
            for bname, buf in fresh.named_buffers(recurse=False):
                setattr(mod, bname, buf)
            if hasattr(fresh, "attention_scaling"):
                mod.attention_scaling = fresh.attention_scaling
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise TrainError(
            f"GGUF weights do not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.to(dtype)


def load_tokenizer(path: str) -> Any:
    """HF tokenizer of an HF directory / hub id, or of a .gguf file (transformers' GGUF converter)."""
    from transformers import AutoTokenizer

    if path.endswith(".gguf"):
        return AutoTokenizer.from_pretrained(
            os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path)
        )
    return AutoTokenizer.from_pretrained(path)


def target_max_positions(path: str) -> int | None:
    """The target's ``max_position_embeddings`` (GGUF ``context_length``) without loading weights."""
    try:
        if path.endswith(".gguf"):
            import gguf

            reader = gguf.GGUFReader(path)
            arch = reader.fields["general.architecture"].contents()
            field = reader.fields.get(f"{arch}.context_length")
            return int(field.contents()) if field is not None else None
        from transformers import AutoConfig

        return int(getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", 0)) or None
    except Exception:  # noqa: BLE001 - only a sizing hint
        return None


# ------------------------------------------------------------------------------------------ target


class _StopForward(Exception):
    pass


@dataclass
class Target:
    """A frozen target LM with online feature extraction."""

    model: nn.Module
    path: str
    dtype: torch.dtype
    device: torch.device
    tap_indices: list[int] = field(default_factory=list)

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_input_embeddings().weight.shape[0])

    @property
    def head_dim(self) -> int:
        cfg = self.config
        return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)

    @property
    def rope_theta(self) -> float:
        return _rope_theta(self.config)

    @property
    def rope_scaling(self) -> dict | None:
        return _rope_scaling(self.config)

    def rope_inv_freq(self) -> tuple[torch.Tensor, float] | None:
        """The target's exact RoPE frequencies (incl. scaling such as llama3), if it exposes them."""
        rot = getattr(self._decoder(), "rotary_emb", None)
        if rot is None or not hasattr(rot, "inv_freq"):
            return None
        return rot.inv_freq.detach().float().cpu().clone(), float(getattr(rot, "attention_scaling", 1.0))

    @property
    def embed_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    def _decoder(self) -> nn.Module:
        dec = self.model.model if hasattr(self.model, "model") else self.model.get_decoder()
        return cast(nn.Module, dec)

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Concatenated taps ``[B, S, n_taps * H]`` for right-padded ``input_ids`` (causal: padding is harmless).

        Runs only as many decoder layers as the deepest tap needs.
        """
        return self._run(input_ids, greedy=False)[0]

    @torch.no_grad()
    def features_and_labels(
        self, input_ids: torch.Tensor, chunk: int = 4096
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The taps and the target's greedy labels ``[B, S]``: at position p (p >= 1) the token the target
        itself would choose after ``input_ids[:, :p]`` (argmax of its logits at p - 1; position 0 keeps its
        token). Greedy verification accepts a draft exactly when it equals these, whatever temperature the
        training answers were sampled at. One full forward; the logits are formed ``chunk`` rows at a time."""
        taps, last = self._run(input_ids, greedy=True)
        assert last is not None
        w = self.lm_head_weight
        flat = last.reshape(-1, last.shape[-1])
        nxt = torch.cat([(flat[i : i + chunk] @ w.T).argmax(-1) for i in range(0, flat.shape[0], chunk)])
        nxt = nxt.view(input_ids.shape).to(input_ids.dtype)
        return taps, torch.cat([input_ids[:, :1], nxt[:, :-1]], dim=1)

    def _run(self, input_ids: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.tap_indices:
            raise TrainError("no feature taps configured")
        dec = self._decoder()
        layers = dec.layers
        captured: dict[int, torch.Tensor] = {}
        deepest = max(self.tap_indices)
        hooks = []

        def make_hook(idx: int):
            def hook(_mod: nn.Module, _inp: Any, out: Any) -> None:
                captured[idx] = out[0] if isinstance(out, tuple) else out
                if idx == deepest and not greedy:
                    raise _StopForward

            return hook

        for idx in sorted(set(self.tap_indices)):
            mod = dec.embed_tokens if idx == 0 else layers[idx - 1]
            hooks.append(mod.register_forward_hook(make_hook(idx)))
        last = None
        try:
            out = dec(input_ids=input_ids, use_cache=False)
            last = (
                out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
            )  # after the final norm
        except _StopForward:
            pass
        finally:
            for h in hooks:
                h.remove()
        return torch.cat([captured[i] for i in self.tap_indices], dim=-1), last


def load_target(path: str, device: torch.device | str, dtype: torch.dtype) -> Target:
    """Load a frozen target from an HF directory / hub id or a .gguf file."""
    device = torch.device(device)
    if path.endswith(".gguf"):
        model = _load_gguf_model(path, dtype)
    else:
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        except TypeError:  # transformers < 4.56
            model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype, attn_implementation="sdpa")
    model = model.to(device).eval()
    model.requires_grad_(False)
    return Target(model=model, path=path, dtype=dtype, device=device)
