"""Resolve a model argument (None / local dir / .gguf / HF hub id) to a local checkpoint and read its weights."""

from __future__ import annotations

import copy
import dataclasses
import glob
import json
import logging
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from specserve.loading.demo import demo_target_path, specserve_cache_dir
from specserve.loading.gguf_loader import iter_gguf_weights, load_gguf_config, load_gguf_tokenizer

logger = logging.getLogger(__name__)

_META_PATTERNS = ["*.json", "*.jinja", "tokenizer*", "*.model", "*.tiktoken", "merges.txt", "vocab.txt"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class Checkpoint:
    """A local checkpoint: an HF directory (safetensors / pytorch_model.bin) or one GGUF file in ``path``."""

    path: str
    hf_config: Any  # transformers.PretrainedConfig
    gguf_file: str | None = None
    generation_config: dict[str, Any] = field(default_factory=dict)

    @property
    def gguf_path(self) -> str | None:
        return os.path.join(self.path, self.gguf_file) if self.gguf_file else None

    def weight_files(self) -> list[str]:
        """The files holding the weights (the .gguf, the safetensors shards, or the pytorch_model*.bin files)."""
        return [self.gguf_path] if self.gguf_path else _weight_files(self.path)

    def iter_weights(self, dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(HF parameter name, tensor)``; floating tensors are cast to ``dtype``, integer ones kept."""
        if self.gguf_path:
            yield from iter_gguf_weights(self.gguf_path, dtype)
            return
        for f in _weight_files(self.path):
            if f.endswith(".safetensors"):
                from safetensors import safe_open

                from specserve.loading import int8

                with safe_open(f, framework="pt") as sf:
                    q = int8.quantized_names(sf.keys(), lambda n: sf.get_slice(n).get_dtype() == "I8")
                    scales = {n + int8.SCALE_SUFFIX for n in q}  # read with their weight (compact drafters)
                    for name in sf.keys():
                        if name in q:
                            scale = sf.get_tensor(name + int8.SCALE_SUFFIX)
                            yield name, int8.dequantize(sf.get_tensor(name), scale, dtype)
                        elif name not in scales:
                            yield name, _cast(sf.get_tensor(name), dtype)
            else:
                try:
                    sd = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
                except RuntimeError:  # legacy (non-zip) format cannot be mmapped
                    sd = torch.load(f, map_location="cpu", weights_only=True)
                for name, t in sd.items():
                    yield name, _cast(t, dtype)

    def load_state_dict(self, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        return dict(self.iter_weights(dtype))


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype) if t.is_floating_point() else t


def _weight_files(path: str) -> list[str]:
    """Safetensors (index, then any *.safetensors), else pytorch_model.bin (index, then pytorch_model*.bin)."""
    for index_name, pattern in (
        ("model.safetensors.index.json", "*.safetensors"),
        ("pytorch_model.bin.index.json", "pytorch_model*.bin"),
    ):
        index = os.path.join(path, index_name)
        if os.path.isfile(index):
            with open(index) as fh:
                shards = sorted(set(json.load(fh)["weight_map"].values()))
            missing = [s for s in shards if not os.path.isfile(os.path.join(path, s))]
            if missing:
                raise ValueError(
                    f"Checkpoint '{path}' is incomplete: {index_name} lists missing {', '.join(missing)}."
                )
            return [os.path.join(path, s) for s in shards]
        files = sorted(glob.glob(os.path.join(path, pattern)))
        if files:
            return files
    raise ValueError(
        f"No weights found in '{path}': expected model.safetensors (or shards with model.safetensors.index.json), "
        "pytorch_model.bin, or a .gguf file."
    )


def _hf_config(path: str, trust_remote_code: bool) -> Any:
    from transformers import AutoConfig, PretrainedConfig

    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, OSError) as e:
        if trust_remote_code or ("model type" not in str(e) and "model_type" not in str(e)):
            raise ValueError(f"Cannot read config.json in '{path}': {_one_line(e)}") from None
        return PretrainedConfig.from_pretrained(
            path
        )  # unknown or no model_type: keep the raw fields (drafters, speculators checkpoints)


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_hub_id(model: str) -> bool:
    return bool(_HUB_ID.match(model)) and ".." not in model


def _hub_download(repo: str, patterns: list[str], revision: str | None, cache_dir: str | None = None) -> str:
    """``snapshot_download`` (``revision``: a branch, tag or commit; ``cache_dir``: vLLM's ``--download-dir``, else
    the Hugging Face cache) honouring HF_HUB_OFFLINE at call time; every failure becomes a one-line ValueError."""
    from huggingface_hub import constants, snapshot_download

    offline = constants.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").upper() in (
        "1",
        "ON",
        "YES",
        "TRUE",
    )
    try:
        return snapshot_download(
            repo, revision=revision, allow_patterns=patterns, local_files_only=offline, cache_dir=cache_dir
        )
    except Exception as e:
        raise ValueError(
            f"Cannot download '{repo}' from the Hugging Face Hub (offline or not found): {_one_line(e)}. "
            "Pass a local directory."
        ) from None


def _download_checkpoint(
    repo: str, revision: str | None, trust_remote_code: bool, cache_dir: str | None
) -> str:
    path = _hub_download(repo, _META_PATTERNS + (["*.py"] if trust_remote_code else []), revision, cache_dir)
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as fh:
            weights = sorted(set(json.load(fh)["weight_map"].values()))
    else:
        weights = ["*.safetensors"]
    path = _hub_download(repo, weights, revision, cache_dir)
    if not glob.glob(os.path.join(path, "*.safetensors")):
        path = _hub_download(repo, ["pytorch_model*.bin"], revision, cache_dir)
    return path


def _find_gguf(path: str) -> tuple[str, str] | None:
    """(dir, file name) when ``path`` is a .gguf file or a directory without config.json holding exactly one."""
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise ValueError(
                f"Model path '{path}' is a file but not a .gguf; pass a checkpoint directory or a .gguf."
            )
        return os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    if os.path.isfile(os.path.join(path, "config.json")):
        return None
    ggufs = sorted(os.path.basename(p) for p in glob.glob(os.path.join(path, "*.gguf")))
    if len(ggufs) > 1:
        raise ValueError(
            f"Directory '{path}' holds several .gguf files ({', '.join(ggufs)}); pass one file path."
        )
    return (os.path.abspath(path), ggufs[0]) if ggufs else None


def resolve_checkpoint(
    model: str | None,
    *,
    trust_remote_code: bool = False,
    revision: str | None = None,
    download_dir: str | None = None,
) -> Checkpoint:
    """None -> the demo target; a local dir with config.json; a .gguf path or a dir with one .gguf; or an HF hub id."""
    if model is None:
        model = demo_target_path()
    model = os.path.expanduser(str(model))
    if not os.path.exists(model):
        if model.endswith(".gguf") or not is_hub_id(model):
            raise ValueError(
                f"Model '{model}' not found: no such local path, and it is not a Hugging Face Hub id."
            )
        model = _download_checkpoint(model, revision, trust_remote_code, download_dir)
    gg = _find_gguf(model)
    if gg is not None:
        gdir, gfile = gg
        try:
            hf_config = load_gguf_config(os.path.join(gdir, gfile), _gguf_cache())
        except Exception as e:
            raise ValueError(
                f"Cannot read the GGUF file '{os.path.join(gdir, gfile)}': {_one_line(e)}"
            ) from None
        return Checkpoint(path=gdir, hf_config=hf_config, gguf_file=gfile)
    path = os.path.abspath(model)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(
            f"No config.json (and no .gguf file) in '{path}'; is it a model checkpoint directory?"
        )
    _weight_files(path)  # fail early, naming what is missing
    gen: dict[str, Any] = {}
    gen_file = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen_file):
        with open(gen_file) as fh:
            gen = json.load(fh)
    return Checkpoint(path=path, hf_config=_hf_config(path, trust_remote_code), generation_config=gen)


def config_only_checkpoint(model: str, *, trust_remote_code: bool = False) -> Checkpoint:
    """A local directory with config.json only (``load_format="dummy"``: random weights, for benchmarks)."""
    path = os.path.abspath(os.path.expanduser(model))
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"load_format='dummy' needs a local directory with config.json; got '{model}'.")
    return Checkpoint(path=path, hf_config=_hf_config(path, trust_remote_code))


def _gguf_cache() -> Any:
    return specserve_cache_dir() / "gguf"


# --------------------------------------------------------------------------------------------- hf_overrides
def merge_overrides(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged over it: a dict value merged key by key (recursively) into a dict it
    replaces, anything else replacing outright. Neither argument is modified."""
    out = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        old = out.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            out[key] = merge_overrides(old, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _fold_rope_overrides(merged: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """transformers 5 keeps rope_theta and the scaling in ``rope_parameters`` (which wins over a ``rope_theta``
    key): fold vLLM-style ``rope_theta`` / ``rope_scaling`` overrides into it, so they are not silently ignored."""
    params = merged.get("rope_parameters")
    if not isinstance(params, dict) or "rope_parameters" in overrides:
        return
    if "rope_scaling" in overrides:
        scaling = merged.pop("rope_scaling")
        theta = params.get("rope_theta")
        if scaling is None:  # back to plain rotary embeddings
            params = {"rope_type": "default"}
        else:
            scaling = dict(scaling)
            if "type" in scaling:
                scaling.setdefault("rope_type", scaling.pop("type"))
            kind = scaling.get("rope_type", params.get("rope_type", "default"))
            # merged over the current scaling; another rope_type replaces it (its keys would be stale)
            params = (
                merge_overrides(params, scaling) if kind == params.get("rope_type", "default") else scaling
            )
        if theta is not None:
            params["rope_theta"] = theta
    if "rope_theta" in overrides:
        params = {**params, "rope_theta": merged.pop("rope_theta")}
    merged["rope_parameters"] = params


def override_hf_config(hf_config: Any, overrides: Mapping[str, Any]) -> Any:
    """A new HF config: ``hf_config``'s fields with ``overrides`` merged over them (``merge_overrides``), built by
    its own class as if config.json held the merged values (so transformers' own normalisation applies)."""
    merged = merge_overrides(hf_config.to_dict(), overrides)
    _fold_rope_overrides(merged, overrides)
    try:
        new = type(hf_config).from_dict(merged)
    except Exception as e:
        raise ValueError(
            f"hf_overrides {dict(overrides)!r} do not give a valid {type(hf_config).__name__}: {_one_line(e)}"
        ) from None
    name = getattr(hf_config, "_name_or_path", None)
    if name:
        new._name_or_path = name
    return new


def apply_hf_overrides(ckpt: Checkpoint, overrides: Mapping[str, Any] | None) -> Checkpoint:
    """vLLM's ``--hf-overrides`` for the target: ``ckpt`` with its HF config overridden (the checkpoint itself when
    there is nothing to override). Every target source goes through here once resolved (HF directory, hub id,
    GGUF, ``load_format="dummy"``); drafters never do."""
    if not overrides:
        return ckpt
    logger.info(
        "hf_overrides: %s of %s's config overridden",
        ", ".join(f"{k}={v!r}" for k, v in overrides.items()),
        ckpt.gguf_path or ckpt.path,
    )
    return dataclasses.replace(ckpt, hf_config=override_hf_config(ckpt.hf_config, overrides))


def load_tokenizer(
    source: str | Checkpoint | None,
    *,
    trust_remote_code: bool = False,
    revision: str | None = None,
    download_dir: str | None = None,
    tokenizer_mode: str = "auto",
) -> Any:
    """A transformers tokenizer for a checkpoint, a local dir / .gguf, an HF hub id, or None (the demo target).

    GGUF tokenizers are converted once and cached under ``specserve_cache_dir()/gguf``. ``tokenizer_mode`` (vLLM's
    --tokenizer-mode): ``auto`` / ``hf`` what transformers builds (the fast tokenizer), ``slow`` its slow (Python /
    sentencepiece) tokenizer, a ValueError where there is none (GGUF sources, tokenizers only transformers' fast
    backend implements)."""
    from transformers import AutoTokenizer

    from specserve.config import TOKENIZER_MODES

    if tokenizer_mode not in TOKENIZER_MODES:
        raise ValueError(f"tokenizer_mode {tokenizer_mode!r} is not supported (use auto, hf or slow)")
    slow = tokenizer_mode == "slow"
    if source is None:
        source = demo_target_path()
    if isinstance(source, Checkpoint):
        if source.gguf_path:
            _no_slow_gguf(slow, source.gguf_path)
            return load_gguf_tokenizer(source.gguf_path, _gguf_cache())
        path = source.path
    else:
        path = os.path.expanduser(source)
        if not os.path.exists(path):
            if path.endswith(".gguf") or not is_hub_id(path):
                raise ValueError(
                    f"Tokenizer '{path}' not found: no such local path, and it is not a Hugging Face Hub id."
                )
            path = _hub_download(
                path, _META_PATTERNS + (["*.py"] if trust_remote_code else []), revision, download_dir
            )
        gg = _find_gguf(path)
        has_tok = any(
            os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json")
        )
        if gg is not None and not (os.path.isdir(path) and has_tok):
            _no_slow_gguf(slow, os.path.join(*gg))
            return load_gguf_tokenizer(os.path.join(*gg), _gguf_cache())
    try:
        if not slow:
            return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, use_fast=False)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"Cannot load a tokenizer from '{path}': {_one_line(e)}") from None
    if getattr(tok, "is_fast", False):
        # transformers 5 ignores use_fast=False: its Llama / Qwen / Mistral tokenizers exist only as fast ones
        import transformers

        raise ValueError(
            f"tokenizer_mode 'slow': '{path}' has no slow tokenizer (transformers {transformers.__version__} builds "
            f"{type(tok).__name__}, a fast tokenizer, and has no slow (Python / sentencepiece) class for it); "
            "use tokenizer_mode 'auto'."
        )
    return tok


def _no_slow_gguf(slow: bool, gguf: str) -> None:
    if slow:
        raise ValueError(
            f"tokenizer_mode 'slow' does not apply to the GGUF '{gguf}': its tokenizer is built from the GGUF "
            "metadata as a fast tokenizer. Use tokenizer_mode 'auto', or pass a tokenizer directory."
        )
