"""Host (Python) time of one plain decode step of the engine, with the model's cost taken out.

    python benchmarks/host_overhead.py [--device cpu|cuda] [--batches 1 8] [--tokens 256] [--profile]

Builds the engine on a tiny random Llama (1 layer, hidden 64, the SmolLM2 vocabulary and real SmolLM2
tokenizer, ``load_format="dummy"``) on the padded decode path (``padded_decode=True``, the CUDA-graph path;
eager on CPU) and replaces the padded forward (``runner.graphs[1].fn``) by a stub that returns the packed
verify output directly: next tokens taken from a fixed, realistic token stream (English, code, multi-byte
UTF-8, emojis), so incremental detokenization does real work. What is left is the host time of a step:
scheduler, block manager, ``PaddedBatch.fill``, output processing, detokenization, ``RequestOutput``
construction and the ``LLM.generate`` loop.

Reports microseconds per engine step (and per token) for ``LLM.generate`` at each batch size (greedy,
ignore_eos, ``--tokens`` new tokens per request, prompt of 40 tokens; the prefill step is included but
amortised), the best of ``--repeats`` runs, as wall time and as process CPU time (steadier on a shared
machine; the stub keeps everything on one thread). ``--profile`` also prints a cProfile breakdown (top functions by
cumulative and by own time) of LLM.generate at the largest batch (the server's AsyncLLM runs the same
``LLMEngine.step`` in its engine thread; only the hand-off of each RequestOutput to asyncio is added).  ``--real-model`` keeps the real forward (for total step time).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

TEXT = (
    "The quick brown fox jumps over the lazy dog. Héllo wörld, naïve café — “quotes” and ‘apostrophes’.\n"
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n"
    "Emojis: 😀🎉👍🏽 🇫🇷, CJK: 你好，世界。日本語のテキスト。 Math: ∑ x² ≤ ∞.  Tabs\tand   spaces.\n"
)


def build_model_dir(root: str) -> str:
    import transformers

    from specserve.loading import demo_target_path, load_tokenizer

    tok = load_tokenizer(demo_target_path())
    cfg = transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    cfg.save_pretrained(root)
    tok.save_pretrained(root)
    return root


def stub_forward(llm, stream: list[int]) -> None:  # type: ignore[no-untyped-def]
    """Replace the padded q=1 forward by a stub: packed[j] = [next token of the stream, 0]."""
    runner = llm.engine.runner
    graphs = runner.graphs[1]
    pos = [0]
    logits = torch.zeros(1, 1)
    n = len(stream)
    # packed rows [token, n_match=0], the stream twice so that any b consecutive rows are one slice
    rows = torch.tensor([[t, 0] for t in stream + stream], dtype=torch.int64)

    def fn(b: int):  # type: ignore[no-untyped-def]
        i = pos[0] % n
        pos[0] = i + b
        return logits, None, rows[i : i + b]

    graphs.fn = fn
    graphs.graphs.clear()


def run_generate(llm, batch: int, tokens: int, repeats: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    from specserve import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    prompts = [{"prompt_token_ids": list(range(100 + j, 140 + j))} for j in range(batch)]
    llm.generate(prompts, sp)  # warm-up
    best = best_cpu = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        llm.generate(prompts, sp)
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    # per step (one token per request per step; the prefill step amortised)
    return best * 1e6 / tokens, best_cpu * 1e6 / tokens


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--real-model", action="store_true")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from specserve import LLM

    tmp = tempfile.mkdtemp(prefix="host_overhead-")
    model_dir = build_model_dir(tmp)
    llm = LLM(
        model_dir,
        load_format="dummy",
        dtype="float32" if args.device == "cpu" else "bfloat16",
        device=args.device,
        max_model_len=4096,
        max_num_seqs=max(args.batches),
        padded_decode=True,
        enforce_eager=args.device == "cpu",
        enable_prefix_caching=True,
    )
    tok = llm.get_tokenizer()
    stream = tok(TEXT * 4).input_ids
    if not args.real_model:
        stub_forward(llm, stream)
    rows = {}
    for b in args.batches:
        us, cpu = run_generate(llm, b, args.tokens, args.repeats)
        rows[f"batch {b}"] = {"us_per_step": round(us, 1), "cpu_us_per_step": round(cpu, 1)}
        print(
            f"batch {b}: {us:8.1f} us/step wall  {cpu:8.1f} us/step process CPU  {us / b:8.1f} us/token",
            flush=True,
        )
    print(json.dumps(rows))
    if args.profile:
        from specserve import SamplingParams

        b = max(args.batches)
        sp = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
        prompts = [{"prompt_token_ids": list(range(100 + j, 140 + j))} for j in range(b)]
        pr = cProfile.Profile()
        pr.enable()
        llm.generate(prompts, sp)
        pr.disable()
        print(f"\n=== cProfile: LLM.generate, batch {b}, {args.tokens} tokens ===")
        st = pstats.Stats(pr).sort_stats("cumulative")
        st.print_stats(args.top)
        st.sort_stats("tottime").print_stats(args.top)

    return 0


if __name__ == "__main__":
    raise SystemExit(main())
