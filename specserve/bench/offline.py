"""``specserve bench latency`` and ``specserve bench throughput``: vLLM's offline benchmarks, same flags and report.

Both build the engine from ``serve``'s engine flags (``--model``, ``--dtype``, ``--max-model-len``,
``--speculative-config``, ...; no ``--model``: the bundled demo with its drafter, ``--no-speculation`` to turn it
off) and run it in-process, as ``vllm bench latency`` / ``vllm bench throughput`` do:

* ``latency``: ``--batch-size`` prompts of ``--input-len`` random token ids, ``--output-len`` tokens each (EOS
  ignored), generated together ``--num-iters-warmup`` + ``--num-iters`` times; prints ``Avg latency: ... seconds``
  and the 10/25/50/75/90/99th percentiles; ``--output-json`` writes ``avg_latency``, ``latencies``, ``percentiles``.
* ``throughput``: ``--num-prompts`` requests from the ``bench serve`` datasets (``--dataset-name random`` by
  default, ``sharegpt`` when only ``--dataset-path`` is given), submitted at once; prints ``Throughput: ...
  requests/s, ... total tokens/s, ... output tokens/s`` and the token totals; ``--output-json`` writes vLLM's keys.

Sampling is vLLM's (temperature 1.0, top_p 1.0, ``ignore_eos``); ``--temperature`` (ours) changes it, e.g. 0 for
greedy speculative runs. With a drafter, both also print the acceptance of the measured part (not the warm-up):
acceptance rate and length (1 + accepted / drafts), as ``bench serve`` does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from specserve.errors import first_line, parse_exit_code, startup_exit_code
from specserve.server.cli_args import (
    OneLineArgumentParser,
    add_engine_args,
    add_speculative_args,
    engine_config_from_args,
    parse_engine_command,
)

PERCENTAGES = (10, 25, 50, 75, 90, 99)


def _positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


def _parser(prog: str, description: str) -> OneLineArgumentParser:
    p = OneLineArgumentParser(prog=prog, description=description, allow_abbrev=False)
    p.add_argument(
        "--model",
        dest="model_tag",
        default=None,
        help="HF directory, GGUF file or hub id (default: the bundled demo, SmolLM2-135M-Instruct + its drafter).",
    )
    add_engine_args(p)
    add_speculative_args(p)
    p.add_argument("--n", type=int, default=1, help="Sequences generated per prompt.")
    p.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="Sampling temperature (default 1.0, as vLLM's benchmark; 0 for greedy).",
    )
    p.add_argument("--output-json", default=None, help="Write the results to this JSON file.")
    p.add_argument(
        "--disable-detokenize",
        action="store_true",
        help="Accepted for vLLM compatibility; outputs are always detokenized.",
    )
    p.add_argument("--disable-tqdm", action="store_true")
    return p


def latency_parser() -> OneLineArgumentParser:
    p = _parser(
        "specserve bench latency",
        "Benchmark the latency of processing a single batch of requests till completion.",
    )
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-iters-warmup", type=int, default=10, help="Iterations to run for warmup.")
    p.add_argument("--num-iters", type=int, default=30, help="Iterations to benchmark.")
    return p


def throughput_parser() -> OneLineArgumentParser:
    from specserve.bench.serve import add_dataset_args

    p = _parser("specserve bench throughput", "Benchmark offline inference throughput.")
    add_dataset_args(p, default_name=None)
    p.set_defaults(request_id_prefix="throughput-")
    return p


def _build_llm(args: argparse.Namespace) -> Any:
    from specserve.llm import LLM

    return LLM.from_engine_config(engine_config_from_args(args))


def _spec_counters(llm: Any) -> Any:
    """The engine's speculative counters in ``bench serve``'s form (what it reads from ``/metrics``)."""
    from specserve.bench.serve import SpecDecodeMetrics

    m = llm.get_metrics()
    return SpecDecodeMetrics(
        num_drafts=m["spec_decode_num_drafts"],
        num_draft_tokens=m["spec_decode_num_draft_tokens"],
        num_accepted_tokens=m["spec_decode_num_accepted_tokens"],
        accepted_per_pos=dict(enumerate(m["spec_decode_num_accepted_tokens_per_pos"])),
    )


def _spec_summary(llm: Any, before: Any) -> dict[str, Any] | None:
    """Acceptance of what ran since ``before`` (``bench serve``'s arithmetic), with K; None without drafts."""
    from specserve.bench.serve import spec_decode_stats

    k = llm.get_metrics()["num_speculative_tokens"]
    stats = spec_decode_stats(before, _spec_counters(llm)) if k else None
    return None if stats is None else {"num_speculative_tokens": k, **stats}


def _print_spec(spec: dict[str, Any] | None) -> None:
    if spec is None:
        return
    print(
        f"Speculative decoding (K={spec['num_speculative_tokens']}): acceptance rate {spec['acceptance_rate']:.2f}%, "
        f"acceptance length {spec['acceptance_length']:.2f} ({spec['accepted_tokens']} of "
        f"{spec['draft_tokens']} draft tokens accepted in {spec['num_drafts']} drafts)"
    )


def _iters(n: int, desc: str, disable: bool) -> Any:
    from tqdm import tqdm

    return tqdm(range(n), desc=desc, disable=disable)


def run_latency(args: argparse.Namespace) -> dict[str, Any]:
    from specserve.sampling_params import SamplingParams

    for name in ("--input-len", "--output-len", "--batch-size", "--n", "--num-iters"):
        _positive(name, getattr(args, name[2:].replace("-", "_")))
    if args.num_iters_warmup < 0:
        raise ValueError(f"--num-iters-warmup must be at least 0, got {args.num_iters_warmup}")
    print(args)
    llm = _build_llm(args)
    limit = llm.engine.max_model_len
    if args.input_len + args.output_len > limit:
        raise ValueError(
            f"--input-len {args.input_len} + --output-len {args.output_len} exceeds max_model_len={limit}; "
            "raise --max-model-len or shorten them"
        )
    vocab = int(getattr(llm.get_tokenizer(), "vocab_size", 0) or 0) or 10000
    rng = np.random.default_rng(args.seed)
    ids = rng.integers(min(10000, vocab), size=(args.batch_size, args.input_len)).tolist()
    prompts = [{"prompt_token_ids": row} for row in ids]
    params = SamplingParams(
        n=args.n, temperature=args.temperature, top_p=1.0, ignore_eos=True, max_tokens=args.output_len
    )

    def run_to_completion() -> float:
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        elapsed = time.perf_counter() - start
        got = {len(c.token_ids) for o in outs for c in o.outputs}
        if got != {args.output_len}:
            raise RuntimeError(f"expected {args.output_len} output tokens per sequence, got {sorted(got)}")
        return elapsed

    print("Warming up...")
    for _ in _iters(args.num_iters_warmup, "Warmup iterations", args.disable_tqdm):
        run_to_completion()
    before = _spec_counters(llm)
    latencies = np.array(
        [run_to_completion() for _ in _iters(args.num_iters, "Bench iterations", args.disable_tqdm)]
    )
    spec = _spec_summary(llm, before)
    percentiles = np.percentile(latencies, PERCENTAGES)
    print(f"Avg latency: {np.mean(latencies)} seconds")
    for percentage, percentile in zip(PERCENTAGES, percentiles):
        print(f"{percentage}% percentile latency: {percentile} seconds")
    _print_spec(spec)
    results: dict[str, Any] = {
        "avg_latency": float(np.mean(latencies)),
        "latencies": latencies.tolist(),
        "percentiles": {str(p): float(v) for p, v in zip(PERCENTAGES, percentiles)},
    }
    if spec is not None:
        results["spec_decode"] = spec
    return results


def run_throughput(args: argparse.Namespace) -> dict[str, Any]:
    from specserve.bench.datasets import get_samples
    from specserve.bench.serve import resolve_dataset_lens
    from specserve.sampling_params import SamplingParams

    _positive("--num-prompts", args.num_prompts)
    _positive("--n", args.n)
    if args.dataset_name is None:
        args.dataset_name = "sharegpt" if args.dataset_path else "random"
    if args.dataset_name in ("sharegpt", "custom", "spec_bench") and not args.dataset_path:
        raise ValueError(f"--dataset-name {args.dataset_name} needs --dataset-path")
    resolve_dataset_lens(args)
    print(args)
    llm = _build_llm(args)
    requests = get_samples(args, llm.get_tokenizer())
    limit = llm.engine.max_model_len
    prompts: list[Any] = []
    params: list[Any] = []
    for r in requests:
        if r.prompt_len + r.expected_output_len > limit:
            raise ValueError(
                f"a request needs {r.prompt_len} prompt + {r.expected_output_len} output tokens, more than "
                f"max_model_len={limit}; raise --max-model-len or shorten --input-len / --output-len"
            )
        prompts.append({"prompt_token_ids": list(r.prompt)} if isinstance(r.prompt, list) else r.prompt)
        params.append(
            SamplingParams(
                n=args.n,
                temperature=args.temperature,
                top_p=1.0,
                ignore_eos=True,
                max_tokens=r.expected_output_len,
            )
        )
    before = _spec_counters(llm)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=not args.disable_tqdm)
    elapsed = time.perf_counter() - start
    spec = _spec_summary(llm, before)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outs)
    output_tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    total = prompt_tokens + output_tokens
    print(
        f"Throughput: {len(outs) / elapsed:.2f} requests/s, {total / elapsed:.2f} total tokens/s, "
        f"{output_tokens / elapsed:.2f} output tokens/s"
    )
    print(f"Total num prompt tokens:  {prompt_tokens}")
    print(f"Total num output tokens:  {output_tokens}")
    _print_spec(spec)
    results: dict[str, Any] = {
        "elapsed_time": elapsed,
        "num_requests": len(outs),
        "total_num_tokens": total,
        "total_output_tokens": output_tokens,
        "requests_per_second": len(outs) / elapsed,
        "tokens_per_second": total / elapsed,
        "output_tokens_per_second": output_tokens / elapsed,
    }
    if spec is not None:
        results["spec_decode"] = spec
    return results


def _main(kind: str, argv: list[str]) -> int:
    parser = latency_parser() if kind == "latency" else throughput_parser()
    try:
        args = parse_engine_command(parser, argv)
    except SystemExit as e:  # --help or a bad flag
        return parse_exit_code(e)
    try:
        results = run_latency(args) if kind == "latency" else run_throughput(args)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"{parser.prog}: error: {first_line(e)}", file=sys.stderr)
        return startup_exit_code(e)
    except KeyboardInterrupt:
        return 130
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=4)
    return 0


def latency_main(argv: list[str]) -> int:
    """``specserve bench latency ...`` (argv after ``bench latency``). Returns the exit code."""
    return _main("latency", argv)


def throughput_main(argv: list[str]) -> int:
    """``specserve bench throughput ...`` (argv after ``bench throughput``). Returns the exit code."""
    return _main("throughput", argv)
