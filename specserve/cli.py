"""``specserve`` command line: generate | serve | run-batch | chat | complete | bench serve|latency|throughput | train |
eval-acceptance."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from specserve.errors import OneLineArgumentParser, first_line


def _die(msg: str) -> int:
    print(f"specserve: error: {msg}", file=sys.stderr)
    return 2


def _generate_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="specserve generate", description="Generate completions offline.")
    p.add_argument("--model", default=None, help="HF dir, .gguf file, or hub id (default: the bundled demo)")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--prompt", action="append", default=None, help="prompt text (repeatable)")
    p.add_argument(
        "--prompts-file", default=None, help="a .txt (one prompt per line) or .jsonl file of prompts"
    )
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="per-request sampling seed")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--speculative-config", "-sc", default=None, help="JSON, as vLLM's --speculative-config")
    p.add_argument("--no-speculation", action="store_true", help="turn off the demo's default drafter")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    p.add_argument("--json", action="store_true", help="print one JSON object per completion")
    p.add_argument("--verbose", "-v", action="store_true")
    return p


def _read_prompts_file(path: str) -> list[str]:
    out: list[str] = []
    with open(path) as f:
        if path.endswith(".jsonl"):
            for line in f:
                if line.strip():
                    d = json.loads(line)
                    turns = d.get("turns")
                    out.append(turns[0] if turns else d.get("prompt") or d.get("question") or d["text"])
        else:
            out = [line.rstrip("\n") for line in f if line.strip()]
    return out


def generate_main(argv: list[str]) -> int:
    args = _generate_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )
    prompts = list(args.prompt or [])
    try:
        if args.prompts_file:
            prompts += _read_prompts_file(args.prompts_file)
    except (OSError, ValueError, KeyError) as e:
        return _die(f"cannot read --prompts-file {args.prompts_file}: {e}")
    if not prompts:
        return _die("give --prompt TEXT or --prompts-file FILE")
    try:
        from specserve import LLM, SamplingParams
        from specserve.assets import default_speculative_config

        spec = args.speculative_config
        if spec is None and args.model is None and not args.no_speculation:
            spec = default_speculative_config(args.device)
        if args.no_speculation:
            spec = None
        params = SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            seed=args.seed,
            max_tokens=args.max_tokens,
        )
        llm = LLM(
            model=args.model,
            tokenizer=args.tokenizer,
            dtype=args.dtype,
            device=args.device,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            speculative_config=spec,
            enforce_eager=args.enforce_eager,
            enable_prefix_caching=args.enable_prefix_caching,
        )
        many = len(prompts) > 1
        if args.chat:
            outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=many)
        else:
            outs = llm.generate(prompts, params, use_tqdm=many)
    except (ValueError, OSError, RuntimeError) as e:
        return _die(first_line(e))
    for prompt, out in zip(prompts, outs):
        comp = out.outputs[0]
        if args.json:
            print(
                json.dumps(
                    {
                        "prompt": prompt,
                        "text": comp.text,
                        "token_ids": comp.token_ids,
                        "finish_reason": comp.finish_reason,
                    }
                )
            )
        elif many:
            print(f"### {prompt}\n{comp.text}\n")
        else:
            print(comp.text)
    if args.verbose:
        print(json.dumps(llm.get_metrics()), file=sys.stderr)
    return 0


USAGE = """usage: specserve <command> [options]

commands:
  generate          generate completions offline (specserve generate --prompt TEXT)
  serve [MODEL]     OpenAI-compatible server (drop-in for `vllm serve`)
  run-batch         run an OpenAI batch file offline (as `vllm run-batch -i IN.jsonl -o OUT.jsonl`)
  chat              chat with a running server (as `vllm chat`; -q MESSAGE for one turn)
  complete          complete prompts on a running server (as `vllm complete`)
  bench serve       benchmark a running server (drop-in for `vllm bench serve`)
  bench latency     latency of one batch, in-process (drop-in for `vllm bench latency`)
  bench throughput  offline throughput, in-process (drop-in for `vllm bench throughput`)
  train dflash|eagle3   train a drafter for a target model
  eval-acceptance   measure acceptance length and speedup of a drafter on datasets
"""


def _quiet_libraries() -> None:
    import os
    import warnings

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("generate", "train", "eval-acceptance"):
        _quiet_libraries()
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "--version":
        from specserve import __version__

        print(__version__)
        return 0
    if cmd == "generate":
        return generate_main(rest)
    if cmd == "serve":
        from specserve.server.api_server import serve_main

        return serve_main(rest)
    if cmd == "bench":
        sub = rest[0] if rest else None
        if sub == "serve":
            from specserve.bench.serve import bench_main

            return bench_main(rest[1:])
        if sub in ("latency", "throughput"):
            _quiet_libraries()
            from specserve.bench.offline import latency_main, throughput_main

            return (latency_main if sub == "latency" else throughput_main)(rest[1:])
        return _die("usage: specserve bench serve|latency|throughput [options]")
    if cmd == "run-batch":
        _quiet_libraries()
        from specserve.run_batch import main as run_batch_main

        return run_batch_main(rest)
    if cmd in ("chat", "complete"):
        from specserve.client_cli import main as client_main

        return client_main(cmd, rest)
    if cmd == "train":
        from specserve.train.cli import main as train_main

        return train_main(rest)
    if cmd == "eval-acceptance":
        from specserve.spec.eval_acceptance import main as eval_main

        return eval_main(rest)
    return _die(f"unknown command {cmd!r}\n{USAGE}")
