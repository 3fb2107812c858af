"""``specserve serve`` arguments: vLLM's flag names, checked at start.

Every bad flag or value ends the process with exit code 2 and a single line on stderr
(``specserve serve: error: ...``) instead of argparse's usage dump.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from dataclasses import fields
from typing import Any

from specserve.config import (
    SCHEDULING_POLICIES,
    TOKENIZER_MODES,
    EngineConfig,
    SpeculativeConfig,
    resolve_cudagraphs,
)
from specserve.errors import OneLineArgumentParser
from specserve.server.reasoning_parsers import REASONING_PARSERS
from specserve.server.tool_parsers import TOOL_PARSERS

logger = logging.getLogger(__name__)

PROG = "specserve serve"
_DOTTED = {"--speculative-config.": "speculative_config", "--compilation-config.": "compilation_config"}
_HUMAN_INT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*$")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30}


def parse_human_int(value: str) -> int | None:
    """vLLM's human-readable lengths: ``1k`` = 1000, ``1K`` = 1024, ``25.6k`` = 25600; ``-1``/``auto`` = None."""
    v = str(value).strip()
    if v.lower() in ("-1", "auto"):
        return None
    m = _HUMAN_INT.match(v)
    if not m:
        raise argparse.ArgumentTypeError(
            f"invalid length {value!r} (expected e.g. 4096, 4k, 4K, 25.6k, or auto)"
        )
    number, suffix = m.group(1), m.group(2)
    if not suffix:
        if "." in number:
            raise argparse.ArgumentTypeError(f"invalid length {value!r}: a decimal needs a k/m/g suffix")
        return int(number)
    if suffix in _BINARY:
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"invalid length {value!r}: decimals are only allowed with decimal suffixes (k, m, g)"
            )
        return int(number) * _BINARY[suffix]
    result = float(number) * _DECIMAL[suffix]
    if result != int(result):
        raise argparse.ArgumentTypeError(f"invalid length {value!r}: not a whole number of tokens")
    return int(result)


def parse_speculative_config(value: str) -> dict[str, Any]:
    """``--speculative-config`` JSON -> dict (``SpeculativeConfig`` checks it once parsed)."""
    return _json_object(value)


def _json_list(value: str) -> list[str]:
    """``--allowed-origins`` / ``--allowed-methods`` / ``--allowed-headers``: a JSON list of strings."""
    try:
        data = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"invalid JSON {value!r}: {e.msg} (at char {e.pos})") from None
    if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
        raise argparse.ArgumentTypeError(f"expected a JSON list of strings, got {value!r}")
    return data


# generation_config keys vLLM takes request defaults from (max_new_tokens is the request's max_tokens)
_GENERATION_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
    "max_tokens": "max_tokens",
}


def parse_generation_overrides(value: str) -> dict[str, Any]:
    """``--override-generation-config`` JSON -> request defaults (SamplingParams names), checked as a request's."""
    from specserve.sampling_params import SamplingParams

    data = parse_speculative_config(value)
    ignored = sorted(k for k in data if k not in _GENERATION_KEYS)
    if ignored:
        logger.warning("--override-generation-config: %s ignored (no request default)", ", ".join(ignored))
    out = {_GENERATION_KEYS[k]: v for k, v in data.items() if k in _GENERATION_KEYS}
    bad = [k for k, v in data.items() if k in _GENERATION_KEYS and (isinstance(v, bool) or v is None)]
    if bad:
        raise argparse.ArgumentTypeError(f"{bad[0]} must be a number, got {data[bad[0]]!r}")
    try:
        SamplingParams(**out)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return out


def _json_object(value: str) -> dict[str, Any]:
    """A JSON object flag (``--speculative-config``, ``--hf-overrides``, ``--compilation-config``)."""
    try:
        data = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"invalid JSON {value!r}: {e.msg} (at char {e.pos})") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}")
    return data


def parse_compilation_config(value: str) -> dict[str, Any]:
    """``--compilation-config`` / ``-cc``: vLLM's JSON object, or a bare integer (its older form: the level)."""
    v = value.strip()
    if re.fullmatch(r"-?\d+", v):
        return {"mode": int(v)}
    return _json_object(value)


def _non_negative_float(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {value!r}") from None
    if not f >= 0.0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return f


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _fraction(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {value!r}") from None
    if not 0.0 < f <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {f}")
    return f


def make_arg_parser() -> OneLineArgumentParser:
    p = OneLineArgumentParser(
        prog=PROG,
        description="OpenAI-compatible server (vLLM-compatible flags) with lossless speculative decoding.",
        allow_abbrev=False,
    )
    p.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="HF directory, GGUF file or hub id; omitted: the bundled demo (SmolLM2-135M-Instruct).",
    )
    p.add_argument("--model", dest="model_flag", default=None, help=argparse.SUPPRESS)
    g = p.add_argument_group("frontend")
    g.add_argument("--host", default=None, help="Bind address (default: all interfaces).")
    g.add_argument("--port", type=int, default=8000, help="Port (default: 8000).")
    g.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="Name(s) exposed by /v1/models and accepted in the 'model' field (default: the model path).",
    )
    g.add_argument(
        "--api-key",
        default=None,
        help="Require 'Authorization: Bearer <key>' on /v1/* (also env VLLM_API_KEY / SPECSERVE_API_KEY).",
    )
    g.add_argument(
        "--chat-template",
        default=None,
        help="Chat template file or inline Jinja (overrides the tokenizer's).",
    )
    g.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="Parse tool calls out of chat outputs when a request gives tools (needs --tool-call-parser).",
    )
    g.add_argument(
        "--tool-call-parser",
        default=None,
        choices=list(TOOL_PARSERS),
        help="Tool-call format of the model's chat template: hermes (Hermes, Qwen2.5, Qwen3).",
    )
    g.add_argument(
        "--reasoning-parser",
        default=None,
        choices=list(REASONING_PARSERS),
        help="Split the model's <think> block into reasoning_content: qwen3, deepseek_r1.",
    )
    g.add_argument(
        "--response-role", default="assistant", help="Role of chat completion replies (default: assistant)."
    )
    g.add_argument(
        "--max-logprobs",
        type=int,
        default=20,
        help="Most logprobs / top_logprobs / prompt_logprobs a request may ask for (default: 20; -1: the vocabulary).",
    )
    g.add_argument(
        "--allowed-origins", type=_json_list, default=["*"], help='CORS origins, JSON (default: ["*"]).'
    )
    g.add_argument(
        "--allowed-methods", type=_json_list, default=["*"], help='CORS methods, JSON (default: ["*"]).'
    )
    g.add_argument(
        "--allowed-headers", type=_json_list, default=["*"], help='CORS headers, JSON (default: ["*"]).'
    )
    g.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials.")
    g.add_argument(
        "--root-path", default=None, help="ASGI root_path when served behind a path-prefixing proxy."
    )
    g.add_argument("--ssl-keyfile", default=None, help="TLS private key file (HTTPS).")
    g.add_argument("--ssl-certfile", default=None, help="TLS certificate file (HTTPS).")
    g.add_argument(
        "--uvicorn-log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
    )
    g.add_argument("--disable-uvicorn-access-log", action="store_true")
    g.add_argument(
        "--disable-log-requests", action="store_true", help=argparse.SUPPRESS
    )  # vLLM compat, no-op
    g.add_argument("--enable-log-requests", action="store_true", help=argparse.SUPPRESS)  # vLLM compat, no-op
    g.add_argument("--disable-frontend-multiprocessing", action="store_true", help=argparse.SUPPRESS)  # no-op
    g.add_argument("--uds", default=None, help="Serve on this Unix domain socket instead of --host / --port.")
    g.add_argument(
        "--api-server-count", type=_positive_int, default=1, help="API server processes (specserve runs one)."
    )
    g.add_argument(
        "--return-tokens-as-token-ids",
        action="store_true",
        help="Logprobs name tokens as 'token_id:N' (a request's return_tokens_as_token_ids overrides it).",
    )
    g.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="usage.prompt_tokens_details.cached_tokens: the prompt tokens the prefix cache served.",
    )
    g.add_argument(
        "--enable-force-include-usage",
        action="store_true",
        help="Streams end with a usage chunk even when the request's stream_options does not ask for one.",
    )
    g.add_argument("--disable-fastapi-docs", action="store_true", help="No /docs, /redoc or /openapi.json.")
    g.add_argument(
        "--chat-template-content-format",
        default="auto",
        choices=["auto", "string", "openai"],
        help="How message content reaches the chat template: string (text parts joined), openai (the list of "
        "parts), auto (openai when the template loops over a message's content, else string).",
    )

    add_engine_args(p)
    add_speculative_args(p)
    return p


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """vLLM's engine flags (``serve``, ``bench latency``, ``bench throughput``)."""
    e = p.add_argument_group("engine")
    e.add_argument("--tokenizer", default=None, help="Tokenizer path/id (default: the model's).")
    e.add_argument(
        "--tokenizer-mode",
        default="auto",
        choices=[*TOKENIZER_MODES, "mistral", "custom"],  # the last two: refused with a reason
        help="auto / hf: the fast tokenizer; slow: transformers' slow (Python) tokenizer.",
    )
    e.add_argument(
        "--config-format", default="auto", choices=["auto", "hf", "mistral"], help="auto / hf: config.json."
    )
    e.add_argument(
        "--hf-overrides",
        type=_json_object,
        default=None,
        help="JSON merged over the model's HF config, e.g. '{\"max_position_embeddings\": 65536}'.",
    )
    e.add_argument("--revision", default=None, help="Hub ids: the model's branch, tag or commit.")
    e.add_argument(
        "--tokenizer-revision", default=None, help="Hub ids: the --tokenizer's branch, tag or commit."
    )
    e.add_argument(
        "--download-dir",
        default=None,
        help="Where hub downloads are cached (default: the Hugging Face cache).",
    )
    e.add_argument(
        "--hf-token",
        nargs="?",
        const=True,
        default=None,
        help="Hugging Face token for gated / private hub ids (no value: the stored login, as without the flag).",
    )
    e.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16", "half", "float"]
    )
    e.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N.")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument(
        "--max-model-len",
        type=parse_human_int,
        default=None,
        help="Context length (prompt + output); accepts 1k (=1000), 1K (=1024), 25.6k, auto.",
    )
    e.add_argument(
        "--max-num-seqs", type=_positive_int, default=None, help="Max concurrently running sequences."
    )
    e.add_argument(
        "--max-model-seqs", dest="max_model_seqs", type=_positive_int, default=None, help=argparse.SUPPRESS
    )  # common typo of --max-num-seqs: accepted with a warning
    e.add_argument(
        "--max-num-batched-tokens", type=parse_human_int, default=None, help="Token budget per step."
    )
    e.add_argument(
        "--gpu-memory-utilization",
        type=_fraction,
        default=None,
        help="Fraction of device memory for weights + activations + KV cache.",
    )
    e.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Automatic prefix caching (default: on).",
    )
    e.add_argument("--block-size", type=int, default=None, choices=[8, 16, 32, 64, 128])
    e.add_argument(
        "--num-gpu-blocks",
        "--num-gpu-blocks-override",
        dest="num_gpu_blocks",
        type=_positive_int,
        default=None,
        help=argparse.SUPPRESS,
    )
    e.add_argument("--trust-remote-code", action="store_true")
    e.add_argument(
        "--scheduling-policy",
        default="fcfs",
        choices=list(SCHEDULING_POLICIES),
        help="fcfs: arrival order; priority: by each request's priority (lower first), then arrival.",
    )
    e.add_argument("--enforce-eager", action="store_true", help="Disable CUDA graphs.")
    e.add_argument(
        "--compilation-config",
        "-cc",
        type=parse_compilation_config,
        default=None,
        help='vLLM\'s JSON: "cudagraph_mode" ("NONE": no CUDA graphs), "cudagraph_capture_sizes" / '
        '"max_cudagraph_capture_size" (steps of more tokens run the same step eagerly); its torch.compile keys are '
        "ignored (specserve does not compile). Also --compilation-config.KEY VALUE.",
    )
    e.add_argument(
        "-O",
        "--optimization-level",
        dest="optimization_level",
        type=int,
        default=None,
        choices=[0, 1, 2, 3],
        help="vLLM's -O0..-O3: 0 turns CUDA graphs off (as --enforce-eager); 1-3 keep them.",
    )
    e.add_argument(
        "--max-cudagraph-capture-size",
        type=_positive_int,
        default=None,
        help="Largest step (in tokens) captured as a CUDA graph; larger steps run eagerly (default: all).",
    )
    e.add_argument(
        "--cuda-graph-sizes", type=_positive_int, nargs="+", default=None, help=argparse.SUPPRESS
    )  # older vLLM: the capture sizes (their largest bounds the captured steps)
    e.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Prepare the next decode step on the host while the device runs the current one "
        "(default: on with CUDA graphs).",
    )
    e.add_argument(
        "--async-spec",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Launch the next fused speculative step (DFlash, EAGLE-3; greedy or random sampling) before the "
        "current one's tokens reach the host (default: on with CUDA graphs; on the H200 a DFlash K=15 step of an 8B "
        "shape 5.83 vs 5.92-6.07 ms, SmolLM2 chat +5-18%% tokens/s).",
    )
    e.add_argument(
        "--load-format",
        choices=["auto", "dummy"],
        default="auto",
        help="dummy: random weights from config.json (benchmarking), as vLLM's --load-format dummy.",
    )
    e.add_argument(
        "--generation-config",
        default="auto",
        help="'auto' (use the model's generation_config.json as request defaults), 'vllm', or a folder.",
    )
    e.add_argument(
        "--override-generation-config",
        type=parse_generation_overrides,
        default=None,
        help="JSON merged over the generation-config request defaults, e.g. '{\"temperature\": 0.5}'.",
    )
    e.add_argument(
        "--enable-chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Always on: prefill is chunked under --max-num-batched-tokens.",
    )
    e.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"],
        help="auto only: the KV cache has the model's dtype.",
    )
    e.add_argument("--quantization", "-q", default=None, help="gguf or unset (GGUF files are detected).")
    e.add_argument("--disable-log-stats", action="store_true", help="Turn off the periodic stats log.")
    e.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, help=argparse.SUPPRESS)
    e.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1, help=argparse.SUPPRESS)
    e.add_argument("--data-parallel-size", "-dp", type=int, default=1, help=argparse.SUPPRESS)
    e.add_argument("--cpu-offload-gb", type=_non_negative_float, default=0.0, help=argparse.SUPPRESS)
    # vLLM compat, no-ops: CPU swap space, CUDA-graph capture length, multi-GPU all-reduce
    e.add_argument("--swap-space", type=float, default=None, help=argparse.SUPPRESS)
    e.add_argument("--max-seq-len-to-capture", type=int, default=None, help=argparse.SUPPRESS)
    e.add_argument("--disable-custom-all-reduce", action="store_true", help=argparse.SUPPRESS)


def add_speculative_args(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("speculative decoding")
    s.add_argument(
        "--speculative-config",
        "-sc",
        type=parse_speculative_config,
        default=None,
        help='JSON, e.g. \'{"method": "dflash", "model": "z-lab/Qwen3-8B-DFlash-b16", '
        '"num_speculative_tokens": 4}\'. Also --speculative-config.KEY VALUE.',
    )
    s.add_argument(
        "--no-speculation",
        action="store_true",
        help="Turn speculative decoding off (also the demo model's default drafter).",
    )


def _coerce_json_scalar(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def preprocess_argv(argv: list[str]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Normalize ``--foo_bar`` to ``--foo-bar`` and pull out the dotted JSON keys: ``--speculative-config.KEY
    VALUE`` (``-sc.KEY``) and ``--compilation-config.KEY VALUE`` (``-cc.KEY``), returned per flag's dest."""
    out: list[str] = []
    dotted: dict[str, dict[str, Any]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            out.extend(argv[i:])
            break
        if arg.startswith(("-sc.", "-cc.")):
            arg = ("--speculative-config" if arg.startswith("-sc") else "--compilation-config") + arg[3:]
        if arg.startswith("--"):
            name, eq, val = arg.partition("=")
            head, dot, rest = name.partition(".")
            name = head.replace("_", "-") + dot + rest
            prefix = next((p for p in _DOTTED if name.startswith(p)), None)
            if prefix is not None:
                key = name[len(prefix) :]
                into = dotted.setdefault(_DOTTED[prefix], {})
                if eq:
                    into[key] = _coerce_json_scalar(val)
                elif i + 1 < len(argv):
                    into[key] = _coerce_json_scalar(argv[i + 1])
                    i += 1
                else:
                    into[key] = True
                i += 1
                continue
            arg = name + eq + val
        out.append(arg)
        i += 1
    return out, dotted


def parse_serve_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``specserve serve`` arguments (exits 2 with one line on errors)."""
    parser = make_arg_parser()
    args = parse_engine_command(parser, argv)
    if args.model_flag is not None:
        if args.model_tag is not None and args.model_tag != args.model_flag:
            parser.error(f"two models given: {args.model_tag!r} (positional) and --model {args.model_flag!r}")
        args.model_tag = args.model_flag
    if args.max_logprobs < -1:
        parser.error(f"argument --max-logprobs: must be -1 (no cap) or at least 0, got {args.max_logprobs}")
    if args.ssl_keyfile is not None and args.ssl_certfile is None:
        parser.error("--ssl-keyfile needs --ssl-certfile")
    for flag, path in (("--ssl-keyfile", args.ssl_keyfile), ("--ssl-certfile", args.ssl_certfile)):
        if path is not None and not os.path.isfile(path):
            parser.error(f"argument {flag}: no such file {path!r}")
    if args.api_server_count != 1:
        parser.error(f"--api-server-count {args.api_server_count}: specserve runs one API server (use 1)")
    if not 0 < args.port < 65536:
        parser.error(f"argument --port: must be in 1..65535, got {args.port}")
    if args.api_key is None:
        args.api_key = os.environ.get("VLLM_API_KEY") or os.environ.get("SPECSERVE_API_KEY") or None
    return args


def parse_engine_command(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse a command built on :func:`add_engine_args` / :func:`add_speculative_args` (``bench latency``,
    ``bench throughput``, ``run-batch``): ``--speculative-config.KEY VALUE`` merged, the engine checks run."""
    argv, dotted = preprocess_argv(list(argv))
    args = parser.parse_args(argv)
    for dest, pairs in dotted.items():
        if not hasattr(args, dest):
            parser.error(f"unrecognized arguments: --{dest.replace('_', '-')}.{next(iter(pairs))}")
        setattr(args, dest, {**(getattr(args, dest) or {}), **pairs})
    check_engine_args(parser, args)
    return args


def check_engine_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The engine flags' checks that need no model (``parser.error``: one line, exit 2)."""
    if args.max_model_seqs is not None:
        logger.warning(
            "--max-model-seqs is not a vLLM flag; treating it as --max-num-seqs=%d.", args.max_model_seqs
        )
        if args.max_num_seqs is None:
            args.max_num_seqs = args.max_model_seqs
    for flag, size in (
        ("--tensor-parallel-size", args.tensor_parallel_size),
        ("--pipeline-parallel-size", args.pipeline_parallel_size),
    ):
        if size != 1:
            parser.error(f"{flag} {size}: specserve runs on one device (use 1)")
    if args.data_parallel_size != 1:
        parser.error(f"--data-parallel-size {args.data_parallel_size}: specserve runs one engine (use 1)")
    if args.cpu_offload_gb > 0:
        parser.error(
            f"--cpu-offload-gb {args.cpu_offload_gb:g}: specserve keeps all weights on the device (use 0)"
        )
    if args.tokenizer_mode in ("mistral", "custom"):
        parser.error(f"--tokenizer-mode {args.tokenizer_mode}: not supported (use auto, hf or slow)")
    if args.config_format == "mistral":
        parser.error(
            "--config-format mistral: not supported (specserve reads HF config.json; use auto or hf)"
        )
    _resolve_cudagraph_args(parser, args)
    if args.kv_cache_dtype != "auto":
        parser.error(
            f"--kv-cache-dtype {args.kv_cache_dtype}: the KV cache has the model's dtype (only 'auto' is supported)"
        )
    if args.quantization is not None and args.quantization.lower() != "gguf":
        parser.error(
            f"--quantization {args.quantization}: specserve loads bf16/fp16/fp32 checkpoints and GGUF files "
            "(use gguf or leave it unset)"
        )
    if args.enable_chunked_prefill is False:
        logger.warning("--no-enable-chunked-prefill has no effect: specserve always chunks prefill.")
    from specserve.sampling_params import max_n_sequences

    try:  # a bad VLLM_MAX_N_SEQUENCES fails here, not in every request's 400
        max_n_sequences()
    except ValueError as e:
        parser.error(str(e))
    if args.speculative_config is not None:
        try:
            SpeculativeConfig.from_any(args.speculative_config)
        except ValueError as e:
            parser.error(f"argument --speculative-config/-sc: {e}")


def _resolve_cudagraph_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--compilation-config`` / ``-O`` / ``--max-cudagraph-capture-size`` / ``--cuda-graph-sizes`` -> the
    engine's two knobs, ``args.enforce_eager`` and ``args.max_cudagraph_capture_size`` (``resolve_cudagraphs``)."""
    try:
        eager, cap = resolve_cudagraphs(
            args.compilation_config,
            optimization_level=args.optimization_level,
            max_capture_size=args.max_cudagraph_capture_size,
            capture_sizes=args.cuda_graph_sizes,
        )
    except ValueError as e:
        parser.error(f"--compilation-config: {e}")
    args.enforce_eager = args.enforce_eager or eager
    args.max_cudagraph_capture_size = cap


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Build the ``EngineConfig``; raises ValueError (with the field named) on impossible values."""
    if getattr(args, "enable_auto_tool_choice", False) and args.tool_call_parser is None:
        raise ValueError(
            "--enable-auto-tool-choice needs --tool-call-parser (one of: " + ", ".join(TOOL_PARSERS) + ")"
        )
    if isinstance(args.hf_token, str):  # read by huggingface_hub for every download of this process
        os.environ["HF_TOKEN"] = args.hf_token
    kwargs: dict[str, Any] = {
        "model": args.model_tag,
        "tokenizer": args.tokenizer,
        "revision": args.revision,
        "tokenizer_revision": args.tokenizer_revision,
        "download_dir": args.download_dir,
        "dtype": args.dtype,
        "device": args.device,
        "max_model_len": args.max_model_len,
        "seed": args.seed,
        "speculative_config": None if args.no_speculation else args.speculative_config,
        "enforce_eager": args.enforce_eager,
        "load_format": args.load_format,
        "trust_remote_code": args.trust_remote_code,
        "tokenizer_mode": args.tokenizer_mode,
        "hf_overrides": args.hf_overrides,
        "scheduling_policy": args.scheduling_policy,
        "generation_config": args.generation_config,
        "disable_log_stats": args.disable_log_stats,
    }
    optional = {
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "enable_prefix_caching": args.enable_prefix_caching,
        "block_size": args.block_size,
        "num_gpu_blocks": args.num_gpu_blocks,
        "async_scheduling": args.async_scheduling,
        "async_spec": args.async_spec,
        "max_cudagraph_capture_size": args.max_cudagraph_capture_size,
        "max_logprobs": getattr(args, "max_logprobs", None),  # serve's flag only
    }
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    if kwargs["speculative_config"] is None and args.model_tag is None and not args.no_speculation:
        kwargs["speculative_config"] = _demo_speculative_config(args.device)
    known = {f.name for f in fields(EngineConfig)}
    return EngineConfig(**{k: v for k, v in kwargs.items() if k in known})


def _demo_speculative_config(device: str | None) -> Any:
    """The bundled demo's default drafter (None while no drafter is bundled); K depends on the device."""
    from specserve.assets import default_speculative_config

    return default_speculative_config(device)


def print_error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)
