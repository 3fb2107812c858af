"""``specserve train dflash|eagle3``: regenerate responses with the target, train a drafter, export it.

Examples::

    specserve train dflash --target model.gguf --prompts gsm8k_train.jsonl:2000 corpus.txt:500 \\
        --output out/dflash --num-layers 3 --max-steps 2000
    specserve train eagle3 --target Qwen/Qwen3-8B --data out/dflash/data.jsonl --output out/eagle3
    torchrun --nproc-per-node 8 -m specserve.train.cli dflash ...      # DDP
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from specserve.errors import first_line
from specserve.train.data import (
    GSM8K_SUFFIX_MODES,
    SELF_GRIDS,
    EngineGenerator,
    HFGenerator,
    Sample,
    chat_prompt_ids,
    check_not_eval_set,
    clean_question,
    load_prompts,
    load_samples,
    make_sample,
    pick_mask_token_id,
    save_samples,
    self_question_prompts,
    stop_token_ids,
    token_counts,
)
from specserve.train.export import WEIGHT_FORMATS, export_drafter
from specserve.train.losses import POSITION_WEIGHTS
from specserve.train.models import (
    DFlashConfig,
    DFlashDrafter,
    Eagle3Config,
    Eagle3Drafter,
    default_dflash_layer_ids,
    default_eagle3_layer_ids,
    grow_dflash,
)
from specserve.train.target import (
    Target,
    TrainError,
    load_target,
    load_tokenizer,
    resolve_target_path,
    target_max_positions,
)
from specserve.train.trainer import TrainArgs, Trainer, dist_info

_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise TrainError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="specserve train", description="Train a DFlash or EAGLE-3 drafter for a target model.")
    p.add_argument("method", choices=["dflash", "eagle3"])
    g = p.add_argument_group("target and data")
    g.add_argument(
        "--target", default=None, help="HF dir / hub id / .gguf file (default: the bundled demo target)"
    )
    g.add_argument(
        "--prompts", nargs="+", default=[], metavar="FILE[:N]", help=".jsonl/.json/.txt prompt files"
    )
    g.add_argument(
        "--self-prompts",
        type=int,
        default=0,
        metavar="N",
        help="add N questions / math problems the target writes itself (topic grids, sampled at T=0.8)",
    )
    g.add_argument(
        "--self-grid",
        choices=SELF_GRIDS,
        default="mixed",
        help="which instructions --self-prompts uses: mixed (general questions + math problems, the default) or "
        "latex (competition-style math problems with their formulas in LaTeX)",
    )
    g.add_argument(
        "--data",
        nargs="+",
        default=None,
        metavar="FILE",
        help="reuse generated samples .jsonl[.gz] files (skip generation); several are trained on together",
    )
    g.add_argument(
        "--val-data",
        default=None,
        help="validation samples .jsonl[.gz] (as written by generation): loss, accuracy and acceptance "
        "before, during (--eval-every) and after training",
    )
    g.add_argument(
        "--val-samples",
        type=int,
        default=0,
        metavar="N",
        help="hold N random samples of the training data out as the validation set (instead of --val-data)",
    )
    g.add_argument(
        "--output", default=None, help="export directory (config.json, model.safetensors); required to train"
    )
    g.add_argument("--work-dir", default=None, help="checkpoints + generated data (default: --output)")
    g.add_argument("--num-prompts", type=int, default=None, help="cap on the prompts read from files")
    g.add_argument(
        "--prompt-repeats",
        type=int,
        default=1,
        metavar="R",
        help="answer every prompt read from files R times, each with its own sampling seed "
        "(needs --gen-temperature > 0)",
    )
    g.add_argument(
        "--gsm8k-suffix",
        choices=GSM8K_SUFFIX_MODES,
        default="half",
        help="which gsm8k prompts get the step-by-step / \\boxed{} instruction (default: every other one)",
    )
    g.add_argument("--max-new-tokens", type=int, default=512)
    g.add_argument("--max-prompt-length", type=int, default=1024, help="drop longer (templated) prompts")
    g.add_argument("--gen-temperature", type=float, default=0.0)
    g.add_argument(
        "--gen-seed",
        type=int,
        default=None,
        help="base of the per-request sampling seeds (default: --seed, which also picks and shuffles the prompts): "
        "a second sampled data set from the same prompts needs another one",
    )
    g.add_argument("--generator", choices=["auto", "engine", "hf"], default="auto")
    g.add_argument("--gen-batch-size", type=int, default=256, help="hf batch size / engine max_num_seqs")
    g.add_argument("--gen-procs", type=int, default=1, help="generator processes sharing the device(s)")
    g.add_argument("--generate-only", action="store_true", help="stop after writing the data file")
    m = p.add_argument_group("drafter")
    m.add_argument(
        "--num-layers",
        type=int,
        default=None,
        help="DFlash layers (default 5); EAGLE-3 is 1. With --init-from a DFlash drafter of fewer layers, the new "
        "layers are appended with zero output projections (the grown drafter starts as the old one)",
    )
    m.add_argument(
        "--intermediate-size",
        type=int,
        default=None,
        help="default: the target's. With --init-from a narrower DFlash drafter, its MLPs are widened (new "
        "units with zero down-projection: the same function at step 0)",
    )
    m.add_argument("--block-size", type=int, default=16)
    m.add_argument(
        "--target-layer-ids",
        type=int,
        nargs="+",
        default=None,
        help="target layers the drafter reads (default: z-lab's spacing for DFlash, vLLM's for EAGLE-3); with "
        "--init-from, a DFlash drafter grows to tap these too (a superset of its own)",
    )
    m.add_argument("--mask-token-id", type=int, default=None)
    m.add_argument("--draft-vocab-size", type=int, default=None, help="EAGLE-3 reduced vocab (default: full)")
    o = p.add_argument_group("objective and optimisation")
    o.add_argument("--num-anchors", type=int, default=512)
    o.add_argument(
        "--labels",
        choices=("data", "target"),
        default="data",
        help="what the drafter learns to predict: 'data', the tokens of the training answers, or 'target', the "
        "token the target itself would pick greedily at each position (what greedy verification accepts; "
        "differs from 'data' on answers sampled at a temperature; costs one full target forward per batch)",
    )
    o.add_argument("--gamma", type=float, default=None, help="DFlash loss decay (default 7 * block/16)")
    o.add_argument(
        "--position-weight",
        choices=POSITION_WEIGHTS,
        default="decay",
        help="DFlash loss weight of block offset k: 'decay', exp(-(k-1)/gamma); 'prefix' (D-PACE-style), that "
        "times the drafter's detached probability of getting offsets 1..k-1 of the block right (the chance that "
        "verification reaches k), which aims the loss at the expected acceptance length",
    )
    o.add_argument("--ttt-steps", type=int, default=7)
    o.add_argument("--epochs", type=float, default=1.0)
    o.add_argument("--max-steps", type=int, default=None)
    o.add_argument("--batch-size", type=int, default=8, help="sequences per step per process")
    o.add_argument("--lr", type=float, default=6e-4)
    o.add_argument("--warmup-ratio", type=float, default=0.04)
    o.add_argument("--weight-decay", type=float, default=0.0)
    o.add_argument("--max-grad-norm", type=float, default=1.0)
    o.add_argument("--max-length", type=int, default=2048)
    o.add_argument(
        "--save-every", type=int, default=500, help="checkpoint every N steps (0: only at the end)"
    )
    o.add_argument(
        "--max-time",
        type=float,
        default=None,
        help="wall-clock budget in seconds: after a few steps the cosine schedule shrinks to end within it",
    )
    o.add_argument(
        "--init-from",
        default=None,
        help="start from an exported drafter (fine-tune / continue training; fresh optimizer and schedule)",
    )
    o.add_argument("--resume", action="store_true", help="continue from <work-dir>/checkpoint.pt")
    o.add_argument(
        "--export-format",
        choices=WEIGHT_FORMATS,
        default="bfloat16",
        help="weights of the exported drafter: bfloat16 (vLLM / SGLang / specserve) or int8 (weight-only, a "
        "scale per output row: half the size, specserve only)",
    )
    o.add_argument(
        "--eval-only",
        action="store_true",
        help="validate the --init-from drafter on --val-data, print the result as JSON (and write "
        "validation.json into --output if given); no training. EAGLE-3 drafts --ttt-steps tokens per step "
        "(its K), DFlash block_size - 1",
    )
    o.add_argument(
        "--stop-after",
        type=int,
        default=None,
        metavar="N",
        help="stop after step N with a checkpoint, the LR schedule of --max-steps unchanged; the same command with "
        "--resume continues it: one schedule split over several time-limited runs (--init-from starts a new one)",
    )
    o.add_argument(
        "--stop-after-time",
        type=float,
        default=None,
        metavar="S",
        help="like --stop-after, by the clock: stop with a checkpoint after the first step that ends past S seconds "
        "of this run (the LR schedule unchanged; --resume continues it)",
    )
    o.add_argument(
        "--attn-backend",
        choices=["auto", "split", "sdpa", "flex"],
        default="auto",
        help="DFlash drafter attention: flex (FlexAttention, compiled; CUDA), split (materialised scores), "
        "sdpa (dense-mask reference); auto: flex on CUDA with a one-time fallback to split, split on CPU",
    )
    o.add_argument("--log-every", type=int, default=10)
    o.add_argument(
        "--eval-every",
        type=int,
        default=0,
        metavar="N",
        help="validate every N steps (0: only before and after training); needs --val-data or --val-samples",
    )
    r = p.add_argument_group("runtime")
    r.add_argument("--device", default=None, help="cuda / cpu (default: cuda if available)")
    r.add_argument(
        "--dtype", default="auto", choices=["auto", *_DTYPES], help="target dtype (auto: bf16 on GPU)"
    )
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--no-progress", action="store_true")
    return p


def _validate(a: argparse.Namespace) -> None:
    def positive(name: str, v: float | None, allow_zero: bool = False) -> None:
        if v is not None and (v < 0 or (v == 0 and not allow_zero)):
            raise TrainError(f"--{name.replace('_', '-')} must be {'>= 0' if allow_zero else '> 0'}, got {v}")

    for name in (
        "max_new_tokens",
        "max_prompt_length",
        "gen_batch_size",
        "gen_procs",
        "num_anchors",
        "ttt_steps",
    ):
        positive(name, getattr(a, name))
    for name in (
        "batch_size",
        "max_length",
        "lr",
        "num_layers",
        "intermediate_size",
        "num_prompts",
        "prompt_repeats",
    ):
        positive(name, getattr(a, name))
    positive("max_steps", a.max_steps)
    positive("epochs", a.epochs, allow_zero=a.max_steps is not None)
    positive("gamma", a.gamma)
    positive("max_time", a.max_time)
    positive("stop_after", a.stop_after)
    positive("stop_after_time", a.stop_after_time)
    positive("draft_vocab_size", a.draft_vocab_size)
    for name in ("save_every", "self_prompts", "weight_decay", "max_grad_norm", "gen_temperature"):
        positive(name, getattr(a, name), allow_zero=True)
    if not 0 <= a.warmup_ratio < 1:
        raise TrainError(f"--warmup-ratio must be in [0, 1), got {a.warmup_ratio}")
    if a.block_size < 2:
        raise TrainError(f"--block-size must be at least 2, got {a.block_size}")
    if a.method == "eagle3" and a.target_layer_ids is not None and len(a.target_layer_ids) != 3:
        raise TrainError("EAGLE-3 needs exactly 3 --target-layer-ids")
    if a.method == "eagle3" and a.position_weight != "decay":
        raise TrainError(
            "--position-weight is a DFlash option (EAGLE-3 weights its unrolled steps by 0.8**j)"
        )
    if a.eval_only:
        if a.init_from is None or a.val_data is None:
            raise TrainError("--eval-only needs --init-from DRAFTER and --val-data FILE")
    elif a.output is None:
        raise TrainError("the following arguments are required: --output")
    elif a.data is None and not a.prompts and not a.self_prompts:
        raise TrainError("give --prompts FILE... (and/or --self-prompts N) or --data FILE")
    if a.prompt_repeats > 1 and not a.gen_temperature:
        raise TrainError(
            "--prompt-repeats needs --gen-temperature > 0 (greedy answers to a repeated prompt are equal)"
        )
    for path in a.data or []:
        if not os.path.isfile(path):
            raise TrainError(f"data file not found: {path}")
    positive("val_samples", a.val_samples, allow_zero=True)
    positive("eval_every", a.eval_every, allow_zero=True)
    if a.val_data is not None and a.val_samples:
        raise TrainError("give either --val-data or --val-samples, not both")
    if a.val_data is not None and not os.path.isfile(a.val_data):
        raise TrainError(f"validation data file not found: {a.val_data}")
    if a.eval_every and a.val_data is None and not a.val_samples:
        raise TrainError("--eval-every needs a validation set (--val-data FILE or --val-samples N)")
    if a.target is not None and not a.target.endswith(".gguf") and os.path.sep in a.target:
        if not os.path.exists(a.target):
            raise TrainError(f"target not found: {a.target}")


@dataclass
class TrainResult:
    drafter: DFlashDrafter | Eagle3Drafter | None
    output_dir: str
    data_path: str
    metrics: dict[str, Any] = field(default_factory=dict)


def _setup_distributed(device_arg: str | None) -> torch.device:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = torch.cuda.is_available() and (device_arg is None or device_arg.startswith("cuda"))
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(
                backend="nccl" if use_cuda else "gloo", timeout=datetime.timedelta(hours=2)
            )
        if use_cuda:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            return torch.device("cuda", local)
        return torch.device("cpu")
    if device_arg:
        return torch.device(device_arg)
    return torch.device("cuda" if use_cuda else "cpu")


def _log(msg: str) -> None:
    if dist_info()[0] == 0:
        print(msg, file=sys.stderr, flush=True)


@dataclass
class GenJob:
    """One shard of response generation (runs in-process or in a spawned worker)."""

    target_path: str
    generator: str  # "engine" | "hf"
    device: str
    dtype: str
    prompts: list[str]
    asks: list[str]
    max_prompt_length: int
    max_new_tokens: int
    temperature: float
    seed: int
    batch_size: int
    gpu_memory_utilization: float = 0.5
    num_gpu_blocks: int | None = None  # engine KV budget; set when several processes share one GPU
    self_grid: str = "mixed"  # latex: longer problem drafts, keep the first line with math in it


def generate_samples(job: GenJob, target: Target | None = None) -> tuple[list[Sample], dict[str, int], Any]:
    """Self-written questions (if any) + prompts -> chat template -> target responses -> samples.

    Returns (samples, counts, tokenizer)."""
    dtype = _DTYPES[job.dtype]
    gen: Any
    max_len = job.max_prompt_length + job.max_new_tokens
    limit = target_max_positions(job.target_path)
    if limit is not None:
        max_len = min(max_len, limit)
    max_prompt = min(job.max_prompt_length, max_len - job.max_new_tokens)  # every prompt gets the full budget
    if job.generator == "engine":
        gen = EngineGenerator(
            job.target_path,
            dtype=job.dtype,
            device=job.device.split(":")[0],
            max_model_len=max_len,
            max_num_seqs=job.batch_size,
            gpu_memory_utilization=job.gpu_memory_utilization,
            num_gpu_blocks=job.num_gpu_blocks,
        )
        tokenizer = gen.tokenizer()
        gen.stops = stop_token_ids(tokenizer)
    else:
        tokenizer = load_tokenizer(job.target_path)
        if target is None:
            target = load_target(job.target_path, job.device, dtype)
        stops = stop_token_ids(tokenizer, target.config)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
        gen = HFGenerator(target.model, stops, int(pad), job.batch_size)
    try:
        prompts = list(job.prompts)
        n_self = 0
        if job.asks:
            latex = job.self_grid == "latex"
            outs = gen.generate(
                chat_prompt_ids(tokenizer, job.asks), 128 if latex else 64, 0.8, seed=job.seed + 1
            )
            prefer = "$" if latex else None
            qs = [clean_question(tokenizer.decode(o, skip_special_tokens=True), prefer) for o in outs]
            uniq = list(dict.fromkeys(q for q in qs if q))
            n_self = len(uniq)
            prompts += uniq
        prompt_ids = [p for p in chat_prompt_ids(tokenizer, prompts) if len(p) <= max_prompt]
        responses = (
            gen.generate(prompt_ids, job.max_new_tokens, job.temperature, job.seed) if prompt_ids else []
        )
    finally:
        gen.close()
    samples = [make_sample(p, r) for p, r in zip(prompt_ids, responses) if r]
    counts = dict(
        prompts=len(prompt_ids), self_prompts=n_self, response_tokens=sum(len(r) for r in responses)
    )
    return samples, counts, tokenizer


def _generate_shard(job: GenJob) -> tuple[list[Sample], dict[str, int]]:
    samples, counts, _ = generate_samples(job)
    return samples, counts


def _generate_data(
    a: argparse.Namespace, target_path: str, device: torch.device, dtype: torch.dtype, data_path: str
) -> tuple[list[Sample], Target | None, Any, dict[str, Any]]:
    """Prompts -> responses from the target, in ``--gen-procs`` processes. Returns samples, the HF target
    (if it was loaded in this process for generation), the tokenizer (if loaded) and generation stats."""
    prompts = load_prompts(a.prompts, seed=a.seed, gsm8k_suffix=a.gsm8k_suffix) if a.prompts else []
    if a.num_prompts is not None:
        prompts = prompts[: a.num_prompts]
    prompts = [p for p in prompts for _ in range(a.prompt_repeats)]  # request i samples with its own seed
    asks = self_question_prompts(a.self_prompts, seed=a.seed, grid=a.self_grid) if a.self_prompts else []
    t0 = time.time()
    generator = a.generator
    if generator == "auto":
        try:
            import specserve.llm  # noqa: F401

            generator = "engine"
        except ImportError:
            generator = "hf"
    procs = max(1, min(a.gen_procs, len(prompts) + len(asks)))
    dtype_name = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[dtype]
    jobs = [
        GenJob(
            target_path=target_path,
            generator=generator,
            device=str(device),
            dtype=dtype_name,
            prompts=prompts[i::procs],
            asks=asks[i::procs],
            max_prompt_length=a.max_prompt_length,
            max_new_tokens=a.max_new_tokens,
            temperature=a.gen_temperature,
            seed=(a.seed if a.gen_seed is None else a.gen_seed) + 1000 * i,
            batch_size=a.gen_batch_size,
            self_grid=a.self_grid,
            gpu_memory_utilization=0.5 if procs == 1 else 0.95,
            # several engines on one GPU: memory profiling would see the others' allocations, so size each
            # KV cache explicitly (every sequence at full length, 16-token blocks)
            num_gpu_blocks=None
            if procs == 1
            else a.gen_batch_size * -(-(a.max_prompt_length + a.max_new_tokens) // 16) + 64,
        )
        for i in range(procs)
    ]
    _log(
        f"generating responses for {len(prompts)} prompts (+{len(asks)} self-written) with {procs} x {generator}"
    )
    target: Target | None = None
    tokenizer: Any = None
    if procs == 1:
        if generator == "hf":
            target = load_target(target_path, device, dtype)
        samples, counts, tokenizer = generate_samples(jobs[0], target)
        results = [(samples, counts)]
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=procs, mp_context=mp.get_context("spawn")) as pool:
            results = list(pool.map(_generate_shard, jobs))
    samples = [s for r in results for s in r[0]]
    if not samples:
        raise TrainError("no usable prompts (all longer than --max-prompt-length?)")
    save_samples(samples, data_path)
    stats: dict[str, Any] = dict(generator=generator, procs=procs, samples=len(samples))
    for key in ("prompts", "self_prompts", "response_tokens"):
        stats[key] = sum(r[1][key] for r in results)
    stats["seconds"] = round(time.time() - t0, 1)
    stats.update(
        sources=list(a.prompts),
        gsm8k_suffix=a.gsm8k_suffix,
        prompt_repeats=a.prompt_repeats,
        self_grid=a.self_grid,
        seed=a.seed,
        gen_seed=a.gen_seed,
        max_new_tokens=a.max_new_tokens,
        temperature=a.gen_temperature,
        target=target_path,
    )
    with open(data_path + ".meta.json", "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=2)
    _log(
        f"wrote {len(samples)} samples to {data_path} ({stats['response_tokens']} response tokens, "
        f"{stats['seconds']} s)"
    )
    return samples, target, tokenizer, stats


def _build_drafter(
    a: argparse.Namespace, target: Target, samples: list[Sample], tokenizer: Any
) -> DFlashDrafter | Eagle3Drafter:
    cfg = target.config
    n_layers = target.num_layers
    common: dict[str, Any] = dict(
        hidden_size=target.hidden_size,
        intermediate_size=a.intermediate_size or int(cfg.intermediate_size),
        num_attention_heads=int(cfg.num_attention_heads),
        num_key_value_heads=int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
        head_dim=target.head_dim,
        vocab_size=target.vocab_size,
        num_target_layers=n_layers,
        target_hidden_size=target.hidden_size,
        rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)),
        rope_theta=target.rope_theta,
        rope_scaling=target.rope_scaling,
        max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 4096)),
    )
    drafter: DFlashDrafter | Eagle3Drafter
    if a.method == "dflash":
        layers = a.num_layers or 5
        ids = a.target_layer_ids or default_dflash_layer_ids(n_layers, layers)
        _check_layer_ids(ids, n_layers)
        mask_id = a.mask_token_id
        if mask_id is None:
            mask_id = pick_mask_token_id(tokenizer, samples, target.vocab_size)
        if not 0 <= mask_id < target.vocab_size:
            raise TrainError(f"--mask-token-id must be in [0, {target.vocab_size - 1}], got {mask_id}")
        dcfg = DFlashConfig(
            **common,
            num_hidden_layers=layers,
            target_layer_ids=list(ids),
            block_size=a.block_size,
            mask_token_id=int(mask_id),
        )
        drafter = DFlashDrafter(dcfg)
        target.tap_indices = [i + 1 for i in ids]  # DFlash id i = output of layer i
    else:
        if a.num_layers not in (None, 1):
            raise TrainError("EAGLE-3 drafters have exactly one layer (--num-layers 1)")
        ids = a.target_layer_ids or default_eagle3_layer_ids(n_layers)
        _check_layer_ids(ids, n_layers)
        dv = a.draft_vocab_size
        if dv is None and target.vocab_size > 65536:
            dv = 32000
        if dv is not None and dv > target.vocab_size:
            raise TrainError(f"--draft-vocab-size must be <= the target vocab ({target.vocab_size})")
        ecfg = Eagle3Config(**common, num_hidden_layers=1, target_layer_ids=list(ids), draft_vocab_size=dv)
        draft_ids = None
        if not ecfg.shares_lm_head:
            counts = token_counts(samples, target.vocab_size)
            draft_ids = torch.argsort(counts, descending=True, stable=True)[: int(dv)]  # type: ignore[arg-type]
        drafter = Eagle3Drafter(ecfg, draft_token_ids=draft_ids)
        if drafter.lm_head is not None:
            with torch.no_grad():
                drafter.lm_head.weight.copy_(
                    target.lm_head_weight[drafter.draft_token_ids.cpu()].float().cpu()
                )
        target.tap_indices = list(ids)  # vLLM EAGLE-3 id i = the residual stream entering layer i
    rope = target.rope_inv_freq()
    if rope is not None:
        drafter.rotary.set_inv_freq(*rope)
    return drafter


def _check_layer_ids(ids: list[int], n_layers: int) -> None:
    if any(not 0 <= i < n_layers for i in ids):
        raise TrainError(f"--target-layer-ids must be in [0, {n_layers - 1}] for this target, got {ids}")


def _init_drafter(a: argparse.Namespace, target: Target) -> DFlashDrafter | Eagle3Drafter:
    """The drafter exported in ``--init-from`` (its own architecture and taps), checked against the target."""
    from specserve.train.export import load_drafter

    try:
        drafter = load_drafter(a.init_from)
    except (OSError, KeyError, ValueError) as e:
        raise TrainError(f"--init-from {a.init_from}: {e}") from e
    want = DFlashDrafter if a.method == "dflash" else Eagle3Drafter
    if not isinstance(drafter, want):
        raise TrainError(f"--init-from {a.init_from} is not a {a.method} drafter")
    cfg = drafter.config
    if cfg.hidden_size != target.hidden_size or cfg.vocab_size != target.vocab_size:
        raise TrainError(
            f"--init-from {a.init_from} was trained for hidden {cfg.hidden_size} / vocab {cfg.vocab_size}, "
            f"the target has {target.hidden_size} / {target.vocab_size}"
        )
    ids = list(cfg.target_layer_ids)
    if any(not 0 <= i < target.num_layers for i in ids):
        raise TrainError(f"--init-from {a.init_from} taps layers {ids}; the target has {target.num_layers}")
    if isinstance(drafter, DFlashDrafter):
        if a.target_layer_ids is not None:
            _check_layer_ids(a.target_layer_ids, target.num_layers)
        try:
            grow_dflash(drafter, a.num_layers, a.intermediate_size, a.target_layer_ids)
        except ValueError as e:
            raise TrainError(f"--init-from {a.init_from}: {e}") from e
        ids = list(drafter.config.target_layer_ids)
    elif a.target_layer_ids is not None and list(a.target_layer_ids) != ids:
        raise TrainError(
            f"--init-from {a.init_from} taps layers {ids}; EAGLE-3 heads keep their taps "
            f"(got --target-layer-ids {a.target_layer_ids})"
        )
    elif a.intermediate_size not in (None, cfg.intermediate_size):
        raise TrainError(
            f"--init-from {a.init_from} has intermediate size {cfg.intermediate_size}; EAGLE-3 heads are not "
            f"resized (got --intermediate-size {a.intermediate_size})"
        )
    target.tap_indices = [i + 1 for i in ids] if a.method == "dflash" else ids
    rope = target.rope_inv_freq()
    if rope is not None:
        drafter.rotary.set_inv_freq(*rope)
    return drafter


def run(a: argparse.Namespace) -> TrainResult:
    """Generate data (unless ``--data``), train and export. Returns the trained drafter (rank 0 exports)."""
    _validate(a)
    for spec in a.prompts:  # refuse evaluation sets before loading anything
        check_not_eval_set(spec.rsplit(":", 1)[0] if not os.path.exists(spec) else spec)
    device = _setup_distributed(a.device)
    rank, world, _ = dist_info()
    dtype = (
        (torch.bfloat16 if device.type == "cuda" else torch.float32)
        if a.dtype == "auto"
        else _DTYPES[a.dtype]
    )
    torch.manual_seed(a.seed)
    if a.eval_only:
        return _eval_only(a, device, dtype)
    work = a.work_dir or a.output
    os.makedirs(work, exist_ok=True)
    data_paths = list(a.data) if a.data else [os.path.join(work, "data.jsonl")]
    data_path = data_paths[0]
    target_path = resolve_target_path(a.target)
    target: Target | None = None
    tokenizer: Any = None
    gen_stats: dict[str, Any] = {}
    if a.data is None:
        if rank == 0:
            samples, target, tokenizer, gen_stats = _generate_data(a, target_path, device, dtype, data_path)
        if world > 1:
            import torch.distributed as dist

            dist.barrier()
        if rank != 0:
            samples = load_samples(data_path)
    else:
        samples, gen_stats = _load_data(data_paths)
    if a.generate_only:
        return TrainResult(None, a.output, data_path, dict(generation=gen_stats))
    val: list[Sample] = []
    val_source = None
    if a.val_data is not None:
        val, val_source = load_samples(a.val_data), os.path.abspath(a.val_data)
    elif a.val_samples:
        if a.val_samples >= len(samples):
            raise TrainError(
                f"--val-samples {a.val_samples} leaves no training data ({len(samples)} samples)"
            )
        # a split that depends only on the data (not on --seed): continued runs keep the same held-out samples
        order = list(range(len(samples)))
        random.Random(f"val-split:{len(samples)}").shuffle(order)
        held = set(order[: a.val_samples])
        val = [s for i, s in enumerate(samples) if i in held]
        samples = [s for i, s in enumerate(samples) if i not in held]
        val_source = f"{a.val_samples} samples held out of {', '.join(map(os.path.abspath, data_paths))}"
    if target is None:
        target = load_target(target_path, device, dtype)
    if tokenizer is None and a.method == "dflash" and a.mask_token_id is None:
        try:
            tokenizer = load_tokenizer(target_path)
        except Exception:  # noqa: BLE001 - a tokenizer only refines the mask-token choice
            tokenizer = None
    _check_vocab(", ".join(data_paths), samples, target)
    _check_vocab(a.val_data, val, target)
    drafter = _init_drafter(a, target) if a.init_from else _build_drafter(a, target, samples, tokenizer)
    targs = TrainArgs(
        work_dir=work,
        epochs=a.epochs,
        max_steps=a.max_steps,
        batch_size=a.batch_size,
        lr=a.lr,
        warmup_ratio=a.warmup_ratio,
        weight_decay=a.weight_decay,
        max_grad_norm=a.max_grad_norm,
        max_length=a.max_length,
        save_every=a.save_every,
        resume=a.resume,
        seed=a.seed,
        num_anchors=a.num_anchors,
        gamma=a.gamma,
        position_weight=a.position_weight,
        ttt_steps=a.ttt_steps,
        labels=a.labels,
        attn_backend=a.attn_backend,
        log_every=a.log_every,
        stop_after=a.stop_after,
        stop_after_time=a.stop_after_time,
        max_time=a.max_time,
        progress=not a.no_progress,
        eval_every=a.eval_every,
        command="specserve train " + " ".join(a.argv) if hasattr(a, "argv") else None,
    )
    trainer = Trainer(drafter, target, samples, targs, val_samples=val)
    n_params = sum(p.numel() for p in drafter.parameters())
    _log(
        f"{a.method}: {n_params / 1e6:.2f}M trainable params, {len(samples)} samples, "
        f"{trainer.total_steps} steps x {a.batch_size} seqs x {world} procs, taps {target.tap_indices}"
    )
    metrics = trainer.train()
    if rank == 0:
        info = dict(
            command=targs.command,
            method=a.method,
            target=target_path,
            data=dict(
                path=os.path.abspath(data_path)
                if len(data_paths) == 1
                else [os.path.abspath(p) for p in data_paths],
                samples=len(samples),
                tokens=sum(len(s.input_ids) for s in samples),
                loss_tokens=sum(sum(s.loss_mask) for s in samples),
                prompts=a.prompts,
                generation=gen_stats,
                validation=dict(
                    source=val_source,
                    samples=len(val),
                    loss_tokens=sum(sum(s.loss_mask) for s in val),
                )
                if val
                else None,
            ),
            params=n_params,
            world_size=world,
            args={k: v for k, v in vars(a).items() if k != "argv"},
            train={k: v for k, v in metrics.items() if k not in ("history", "val_history")},
            history=metrics["history"],
            val_history=metrics["val_history"],
        )
        if a.init_from:
            info.update(_lineage(a.init_from, int(metrics["steps"])))
        paths = export_drafter(drafter, a.output, info, weight_format=a.export_format)
        size = os.path.getsize(paths["weights"])
        _log(f"exported {a.method} drafter to {a.output} ({size / 1e6:.2f} MB); final {metrics['final']}")
    return TrainResult(drafter, a.output, data_path, metrics)


def _load_data(paths: list[str]) -> tuple[list[Sample], dict[str, Any]]:
    """Samples of every ``--data`` file, in order, and how each was generated (its ``.meta.json``, if any): one
    file's record as is, several as ``files`` [{path, samples, generation}]."""
    samples: list[Sample] = []
    records: list[dict[str, Any]] = []
    for path in paths:
        got = load_samples(path)
        meta: dict[str, Any] = {}
        if os.path.isfile(path + ".meta.json"):
            with open(path + ".meta.json", encoding="utf-8") as f:
                meta = json.load(f)
        samples += got
        records.append(dict(path=os.path.abspath(path), samples=len(got), generation=meta))
    if len(paths) == 1:
        return samples, records[0]["generation"]
    return samples, dict(files=records)


def _check_vocab(path: str | None, samples: list[Sample], target: Target) -> None:
    """Samples whose token ids the target cannot embed are a one-line error naming their file."""
    for s in samples:
        if max(s.input_ids) >= target.vocab_size or min(s.input_ids) < 0:
            raise TrainError(f"{path}: token ids outside the target vocab ({target.vocab_size})")


def _lineage(init_from: str, steps: int) -> dict[str, Any]:
    """A continued run's provenance: the ``--init-from`` drafter's own earlier runs plus that run itself (command,
    steps, seconds, final metrics, validation), so an exported drafter's training.json tells its whole training."""
    path = os.path.join(init_from, "training.json")
    try:
        with open(path, encoding="utf-8") as f:
            prev = json.load(f)
    except (OSError, ValueError):
        return dict(earlier_runs=None, total_steps_all_runs=None)  # weights of unknown history
    runs = list(prev.get("earlier_runs") or [])
    train = prev.get("train") or {}
    runs.append(
        dict(
            command=prev.get("command"),
            steps=train.get("steps"),
            seconds=train.get("seconds"),
            final=train.get("final"),
            val=train.get("val"),
            data=prev.get("data"),  # path, sizes, how it was generated (sources, temperature), validation set
        )
    )
    known = [r.get("steps") for r in runs]
    total = steps + sum(known) if all(isinstance(n, int) for n in known) else None
    return dict(earlier_runs=runs, total_steps_all_runs=total)


def _eval_only(a: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> TrainResult:
    """``--eval-only``: validation of an exported drafter (loss, accuracy, tau, chain_tau), no training."""
    target_path = resolve_target_path(a.target)
    val = load_samples(a.val_data)
    target = load_target(target_path, device, dtype)
    _check_vocab(a.val_data, val, target)
    drafter = _init_drafter(a, target)
    targs = TrainArgs(
        work_dir=a.work_dir or a.output or ".",
        batch_size=a.batch_size,
        max_length=a.max_length,
        num_anchors=a.num_anchors,
        gamma=a.gamma,
        position_weight=a.position_weight,
        ttt_steps=a.ttt_steps,
        attn_backend="split",
        progress=False,
    )
    t0 = time.time()
    v = Trainer(drafter, target, val, targs, val_samples=val).evaluate()
    result = dict(
        method=a.method,
        drafter=os.path.abspath(a.init_from),
        target=target_path,
        val_data=os.path.abspath(a.val_data),
        seconds=round(time.time() - t0, 2),
        **v,
    )
    rank, _, _ = dist_info()
    if rank == 0:
        print(json.dumps(result), flush=True)
        if a.output:
            os.makedirs(a.output, exist_ok=True)
            with open(os.path.join(a.output, "validation.json"), "w", encoding="utf-8") as f:
                json.dump(result, f, indent=2)
    return TrainResult(drafter, a.output or "", a.val_data, dict(val=result))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    a.argv = argv
    return a


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``specserve train`` (``argv`` excludes 'train'). Returns 0, or 2 on a user error."""
    try:
        run(parse_args(argv))
    except SystemExit as e:  # --help
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    except (TrainError, FileNotFoundError) as e:
        print(f"specserve train: error: {first_line(e)}", file=sys.stderr)
        return 2
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
