"""Engine, model, cache, scheduler and speculative-decoding configuration.

``SpeculativeConfig`` accepts the same JSON keys as vLLM's ``--speculative-config`` and rejects
unknown keys and impossible values with a message naming the key.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, fields
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")
SPEC_METHODS = ("dflash", "eagle3", "eagle", "draft_model", "ngram")
TOKENIZER_MODES = ("auto", "hf", "slow")
SCHEDULING_POLICIES = ("fcfs", "priority")  # vLLM's --scheduling-policy


@dataclass
class ModelConfig:
    """The few numbers of a decoder checkpoint the engine needs (read from an HF config)."""

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v bias (Qwen2)
    qk_norm: bool  # per-head q/k RMSNorm (Qwen3)
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_hf(cls, hf: Any) -> ModelConfig:
        archs = list(getattr(hf, "architectures", None) or [])
        arch = archs[0] if archs else ""
        if not arch:
            mt = getattr(hf, "model_type", "")
            arch = {
                "llama": "LlamaForCausalLM",
                "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM",
            }.get(mt, "")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"Unsupported architecture {arch or '<none>'!r}; specserve supports {', '.join(SUPPORTED_ARCHITECTURES)}."
            )
        nh = int(hf.num_attention_heads)
        hidden = int(hf.hidden_size)
        head_dim = getattr(hf, "head_dim", None) or hidden // nh
        rope_theta, rope_scaling = rope_from_hf(hf)
        eos = getattr(hf, "eos_token_id", None)
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        return cls(
            architecture=arch,
            model_type=str(getattr(hf, "model_type", "")),
            vocab_size=int(hf.vocab_size),
            hidden_size=hidden,
            intermediate_size=int(hf.intermediate_size),
            num_hidden_layers=int(hf.num_hidden_layers),
            num_attention_heads=nh,
            num_key_value_heads=int(getattr(hf, "num_key_value_heads", None) or nh),
            head_dim=int(head_dim),
            rms_norm_eps=float(getattr(hf, "rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(getattr(hf, "max_position_embeddings", 2048)),
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            attention_bias=bool(getattr(hf, "attention_bias", arch == "Qwen2ForCausalLM")),
            qk_norm=arch == "Qwen3ForCausalLM",
            bos_token_id=getattr(hf, "bos_token_id", None),
            eos_token_ids=[int(e) for e in eos_ids if e is not None],
        )


def rope_from_hf(hf: Any) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) across transformers 4.x (rope_theta/rope_scaling) and 5.x (rope_parameters)."""
    params = getattr(hf, "rope_parameters", None)
    scaling = getattr(hf, "rope_scaling", None)
    theta = getattr(hf, "rope_theta", None)
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        if params.get("rope_type", "default") != "default":
            scaling = dict(params)
    if scaling is not None and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    return float(theta if theta is not None else 10000.0), (dict(scaling) if scaling else None)


@dataclass
class SpeculativeConfig:
    """vLLM-compatible ``--speculative-config``."""

    method: str
    model: str | None = None
    num_speculative_tokens: int = 0
    disable_padded_drafter_batch: bool = False
    # vLLM's: no drafts for the next step while more than this many requests are in the batch
    disable_by_batch_size: int | None = None
    # specserve's: no drafts while speculation measures slower than plain decoding (specserve/spec/gate.py)
    disable_when_slower: bool = False
    draft_tensor_parallel_size: int | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    enforce_eager: bool | None = None
    max_model_len: int | None = None
    revision: str | None = None  # the drafter's hub revision (vLLM's key)

    @classmethod
    def from_any(cls, value: SpeculativeConfig | dict[str, Any] | str | None) -> SpeculativeConfig | None:
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config is not valid JSON: {e.msg} (at char {e.pos})") from None
        if not isinstance(value, dict):
            raise ValueError("speculative_config must be a JSON object")
        return cls.from_dict(value)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpeculativeConfig:
        known = {f.name for f in fields(cls)}
        for key in d:
            if key == "tensor_parallel_size":
                raise ValueError(
                    "speculative_config: 'tensor_parallel_size' is not a speculative-config key; "
                    "use 'draft_tensor_parallel_size'."
                )
            if key not in known:
                raise ValueError(
                    f"speculative_config: unknown key {key!r}; allowed keys: {', '.join(sorted(known))}."
                )
        d = dict(d)
        method = d.get("method")
        model = d.get("model")
        from specserve.loading import speculators

        # a local speculators checkpoint names its method and K (as vLLM reads them)
        spec_raw = speculators.read_config(model) if isinstance(model, str) else None
        if spec_raw is not None:
            if method is None:
                method = speculators.method_of(spec_raw)
            if d.get("num_speculative_tokens") is None:
                d["num_speculative_tokens"] = speculators.num_speculative_tokens(spec_raw)
        if method is None:
            method = infer_method(model)
        if method == "[ngram]":
            method = "ngram"
        if method not in SPEC_METHODS:
            raise ValueError(
                f"speculative_config: 'method' must be one of {', '.join(SPEC_METHODS)}, got {method!r}."
            )
        d["method"] = method
        if method == "ngram" and model in ("ngram", "[ngram]"):
            d["model"] = None
        k = d.get("num_speculative_tokens")
        if k is None:
            raise ValueError("speculative_config: 'num_speculative_tokens' is required.")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(
                f"speculative_config: 'num_speculative_tokens' must be a positive integer, got {k!r}."
            )
        if k > 128:
            raise ValueError(f"speculative_config: 'num_speculative_tokens' must be at most 128, got {k}.")
        if method != "ngram" and not d.get("model"):
            raise ValueError(
                f"speculative_config: 'model' (the drafter checkpoint) is required for method {method!r}."
            )
        dtp = d.get("draft_tensor_parallel_size")
        if dtp is not None and dtp != 1:
            raise ValueError(
                f"speculative_config: 'draft_tensor_parallel_size' must be 1 or the target's tensor parallel size (1), got {dtp!r}."
            )
        lo, hi = d.get("prompt_lookup_min"), d.get("prompt_lookup_max")
        if lo is None and hi is None:
            lo = hi = 5
        elif lo is None:
            lo = hi
        elif hi is None:
            hi = lo
        for name, v in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"speculative_config: {name!r} must be a positive integer, got {v!r}.")
        if lo > hi:
            raise ValueError(
                f"speculative_config: 'prompt_lookup_min' ({lo}) must be <= 'prompt_lookup_max' ({hi})."
            )
        d["prompt_lookup_min"], d["prompt_lookup_max"] = lo, hi
        for name in ("disable_padded_drafter_batch", "enforce_eager", "disable_when_slower"):
            if d.get(name) is not None and not isinstance(d[name], bool):
                raise ValueError(f"speculative_config: {name!r} must be a boolean, got {d[name]!r}.")
        rev = d.get("revision")
        if rev is not None and not isinstance(rev, str):
            raise ValueError(f"speculative_config: 'revision' must be a string, got {rev!r}.")
        mml = d.get("max_model_len")
        if mml is not None and (not isinstance(mml, int) or mml < 1):
            raise ValueError(f"speculative_config: 'max_model_len' must be a positive integer, got {mml!r}.")
        dbs = d.get("disable_by_batch_size")
        if dbs is not None and (not isinstance(dbs, int) or isinstance(dbs, bool) or dbs < 2):
            raise ValueError(
                f"speculative_config: 'disable_by_batch_size' must be an integer >= 2, got {dbs!r}."
            )
        d.setdefault("disable_padded_drafter_batch", False)
        d["disable_when_slower"] = bool(d.get("disable_when_slower"))
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def infer_method(model: str | None) -> str:
    """vLLM's rule: infer the method from the drafter path when 'method' is omitted; a model that names no
    drafter kind is a draft model (a smaller LM with the target's tokenizer)."""
    if model is None:
        raise ValueError("speculative_config: give 'method' or a drafter 'model' to infer it from.")
    if model in ("ngram", "[ngram]"):
        return "ngram"
    low = model.lower()
    if "dflash" in low:
        return "dflash"
    if "eagle3" in low:
        return "eagle3"
    if "eagle" in low:
        return "eagle"
    return "draft_model"


CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
# vLLM compilation_config keys with an effect here; its others (torch.compile passes) are accepted and ignored
COMPILATION_KEYS = (
    "cudagraph_mode",
    "cudagraph_capture_sizes",
    "max_cudagraph_capture_size",
    "mode",
    "level",
)


def _positive(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def resolve_cudagraphs(
    compilation_config: dict[str, Any] | int | None,
    *,
    optimization_level: int | None = None,
    max_capture_size: int | None = None,
    capture_sizes: list[int] | None = None,
) -> tuple[bool, int | None]:
    """vLLM's graph settings -> (no CUDA graphs, ``max_cudagraph_capture_size``). ``compilation_config`` (a dict,
    or an int: its level): ``cudagraph_mode`` "NONE" turns graphs off (any other mode keeps specserve's whole-step
    graphs), as does ``optimization_level`` 0 (-O0) unless a mode is given; the cap is ``max_capture_size`` (the
    flag), else the config's ``max_cudagraph_capture_size``, else the largest of its ``cudagraph_capture_sizes`` (or
    ``capture_sizes``, older vLLM's --cuda-graph-sizes); None: every bucket. Keys without an effect are logged."""
    if not isinstance(compilation_config, (dict, int, type(None))) or isinstance(compilation_config, bool):
        raise ValueError(f"compilation_config must be a dict or an int, got {compilation_config!r}")
    cc = dict(compilation_config) if isinstance(compilation_config, dict) else {}
    ignored = sorted(k for k in cc if k not in COMPILATION_KEYS)
    if ignored:
        logging.getLogger("specserve").warning(
            "compilation_config: %s ignored (specserve captures whole steps as CUDA graphs and compiles nothing)",
            ", ".join(ignored),
        )
    eager = False
    mode = cc.get("cudagraph_mode")
    if mode is not None:
        if not isinstance(mode, str) or mode.upper() not in CUDAGRAPH_MODES:
            raise ValueError(f"cudagraph_mode {mode!r} is not one of {', '.join(CUDAGRAPH_MODES)}")
        eager = mode.upper() == "NONE"
    elif optimization_level == 0:  # vLLM's -O0: no CUDA graphs (an explicit cudagraph_mode wins)
        eager = True
    sizes = cc.get("cudagraph_capture_sizes", capture_sizes)
    if sizes is not None and (
        not isinstance(sizes, list) or not sizes or not all(_positive(x) for x in sizes)
    ):
        raise ValueError(f"cudagraph_capture_sizes must be a list of positive ints, got {sizes!r}")
    cap = cc.get("max_cudagraph_capture_size")
    if cap is not None and not _positive(cap):
        raise ValueError(f"max_cudagraph_capture_size must be a positive int, got {cap!r}")
    if max_capture_size is not None:
        cap = max_capture_size
    elif cap is None and sizes:
        cap = max(sizes)
    return eager, cap


@dataclass
class EngineConfig:
    """Everything the engine needs; built by ``LLM`` / the server from user arguments."""

    model: str | None
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    # hub ids only (vLLM's --revision / --tokenizer-revision / --download-dir): a branch, tag or commit, and the
    # directory downloads are cached in (default: the Hugging Face cache)
    revision: str | None = None
    tokenizer_revision: str | None = None
    download_dir: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 8
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    num_gpu_blocks: int | None = None  # explicit KV budget (blocks); overrides memory profiling
    gpu_memory_utilization: float = 0.9
    cpu_kv_cache_gb: float = 1.0
    enable_prefix_caching: bool = True
    seed: int = 0
    speculative_config: SpeculativeConfig | None = None
    enforce_eager: bool = False
    trust_remote_code: bool = False
    generation_config: str = "auto"
    disable_log_stats: bool = True
    # most (prompt) logprobs a request may ask for, as vLLM's --max-logprobs; -1: the vocabulary
    max_logprobs: int = 20
    log_stats_interval: float = 10.0
    attention_backend: str = "auto"  # auto | torch | triton
    load_format: str = "auto"  # auto | dummy (random weights from config.json, as vLLM's --load-format dummy)
    # decode/verify steps padded to static shapes (what CUDA graphs replay); None = on with CUDA graphs
    padded_decode: bool | None = None
    # plain decode steps: schedule and fill step N+1 while step N runs (vLLM's --async-scheduling); None = on with
    # CUDA graphs, True = wherever the padded path runs (CPU tests), False = off
    async_scheduling: bool | None = None
    # fused speculative steps (DFlash, EAGLE-3; greedy or random rows): launch verify step N+1 (inputs built
    # on the device from N's output) before N's tokens reach the host; needs the fused step; None = on with CUDA
    # graphs (as async_scheduling), False = off
    async_spec: bool | None = None
    # vLLM's --hf-overrides: keys merged (nested dicts recursively) over the target model's HF config (config.json,
    # or the config of a GGUF) before the engine reads it; never the drafter's
    hf_overrides: dict[str, Any] | None = None
    # vLLM's --tokenizer-mode: auto / hf (the fast tokenizer) | slow (transformers' slow tokenizer, where one exists)
    tokenizer_mode: str = "auto"
    # vLLM's --max-cudagraph-capture-size: the most tokens a captured CUDA graph step may have (decode / verify steps:
    # batch bucket x tokens per request; prefill: the token bucket); larger buckets run the same padded step
    # eagerly. None = capture every bucket
    max_cudagraph_capture_size: int | None = None
    # vLLM's --scheduling-policy: fcfs (arrival order) | priority (request priority, lower first, then arrival)
    scheduling_policy: str = "fcfs"

    def __post_init__(self) -> None:
        if self.dtype not in (
            "auto",
            "float32",
            "bfloat16",
            "float16",
            "half",
            "float",
            "bf16",
            "fp16",
            "fp32",
        ):
            raise ValueError(f"dtype must be one of auto, float32, bfloat16, float16; got {self.dtype!r}.")
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda; got {self.device!r}.")
        if not isinstance(self.max_num_seqs, int) or self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}.")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be at least 1, got {self.max_model_len}.")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be at least 1, got {self.max_num_batched_tokens}.")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}.")
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ValueError(f"block_size must be one of 8, 16, 32, 64, 128; got {self.block_size}.")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be at least 1, got {self.num_gpu_blocks}.")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be auto or dummy; got {self.load_format!r}.")
        if self.hf_overrides is not None and (
            not isinstance(self.hf_overrides, dict) or not all(isinstance(k, str) for k in self.hf_overrides)
        ):
            raise ValueError(
                f"hf_overrides must be a dict with string keys (a JSON object), got {self.hf_overrides!r}."
            )
        if self.tokenizer_mode in ("mistral", "custom"):
            raise ValueError(
                f"tokenizer_mode {self.tokenizer_mode!r} is not supported (use auto, hf or slow)"
            )
        if self.tokenizer_mode not in TOKENIZER_MODES:
            raise ValueError(f"tokenizer_mode must be one of auto, hf, slow; got {self.tokenizer_mode!r}.")
        cap = self.max_cudagraph_capture_size
        if cap is not None and not _positive(cap):
            raise ValueError(f"max_cudagraph_capture_size must be a positive integer, got {cap!r}.")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be fcfs or priority; got {self.scheduling_policy!r}.")
        self.speculative_config = SpeculativeConfig.from_any(self.speculative_config)
