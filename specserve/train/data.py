"""Training data: prompt loading (with an evaluation-set guard), response regeneration with the target,
JSONL samples ``{"input_ids": [...], "loss_mask": [...]}`` and length-grouped (optionally sharded) batches.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specserve.train.target import TrainError

# ------------------------------------------------------------------------------------------ guard

# file names (lower-cased, any extension) of evaluation sets that must never become training data
_EVAL_NAME_PATTERNS = (
    r"mt[_-]?bench",
    r"gsm8k[_-]?test",
    r"math[_-]?500",
    r"human[_-]?eval",
    r"vicuna[_-]?bench",
    r"mbpp[_-]?sanitized[_-]?test",
    r"aime",
    r"livecodebench",
)
_EVAL_DIRS = ("eagle", "dflash_bench")
# Spec-Bench categories that duplicate evaluation sets (MT-Bench's 8 categories, GSM8K test)
EVAL_CATEGORIES = frozenset(
    {
        "mt_bench",
        "math_reasoning",
        "writing",
        "roleplay",
        "reasoning",
        "math",
        "coding",
        "extraction",
        "stem",
        "humanities",
    }
)


def check_not_eval_set(path: str) -> None:
    """Raise TrainError when ``path`` looks like an evaluation set (mt_bench, gsm8k_test, math500, HumanEval,
    eagle/*, dflash_bench/*, ...)."""
    name = os.path.basename(path).lower()
    for pat in _EVAL_NAME_PATTERNS:
        if re.search(pat, name):
            raise TrainError(f"refusing evaluation set {path!r} as training data")
    parts = [p.lower() for p in os.path.normpath(os.path.abspath(path)).split(os.sep)[:-1]]
    for d in _EVAL_DIRS:
        if d in parts:
            raise TrainError(f"refusing evaluation set {path!r} (under {d}/) as training data")


# ------------------------------------------------------------------------------------------ prompts

GSM8K_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."

SELF_TOPICS = (
    "cooking", "baking bread", "personal finance", "investing", "python programming", "javascript", "sql databases",
    "machine learning", "linear algebra", "probability", "world history", "ancient rome", "the renaissance",
    "astronomy", "black holes", "climate change", "renewable energy", "gardening", "houseplants", "dog training",
    "cats", "fitness", "running", "nutrition", "sleep", "meditation", "learning a language", "english grammar",
    "writing a resume", "job interviews", "public speaking", "time management", "productivity", "travel in japan",
    "travel in europe", "camping", "photography", "painting", "music theory", "learning guitar", "film history",
    "classic literature", "poetry", "chess", "board games", "video game design", "web development", "linux",
    "computer networking", "cybersecurity", "cloud computing", "data structures", "algorithms", "statistics",
    "economics", "marketing", "starting a small business", "negotiation", "psychology", "philosophy", "ethics",
    "biology", "genetics", "chemistry", "physics", "electric cars", "home repair", "car maintenance", "parenting",
    "relationships", "friendship", "mental health", "first aid", "geography", "oceans", "volcanoes", "dinosaurs",
    "space exploration", "robotics", "3d printing", "smartphones", "social media", "email etiquette",
    "writing a short story", "birthday party planning", "wedding planning", "recipes for dinner", "coffee",
    "tea", "wine", "architecture", "interior design", "fashion", "sustainability", "recycling", "mathematics puzzles",
    "riddles", "trivia", "law basics", "taxes", "renting an apartment", "buying a house",
)  # fmt: skip
SELF_STYLES = (
    "",
    " for a complete beginner",
    " that asks for step-by-step instructions",
    " that asks for a short explanation of why something happens",
    " that asks for a list of tips",
    " that asks for a comparison of two things",
    " that involves a small calculation",
    " that asks for a short creative piece of writing",
    " that asks for advice on a personal situation",
    " that asks for an example",
)


# math problems the target writes itself (subjects of school and competition math; no evaluation set is read)
SELF_MATH_TOPICS = (
    "fractions", "percentages", "ratios and rates", "unit conversion", "money and shopping", "time and distance",
    "work and rates", "ages", "averages", "simple interest", "area and perimeter", "volume", "angles",
    "triangles", "circles", "coordinate geometry", "the pythagorean theorem", "similar triangles",
    "linear equations", "systems of equations", "inequalities", "quadratic equations", "polynomials",
    "exponents", "logarithms", "functions", "sequences and series", "arithmetic progressions",
    "geometric progressions", "prime numbers", "divisibility", "remainders", "greatest common divisors",
    "digits of numbers", "counting", "permutations", "combinations", "probability with dice",
    "probability with cards", "expected value", "trigonometry", "complex numbers", "vectors", "matrices",
    "absolute values", "rational expressions", "radicals", "word problems about a farm",
    "word problems about a school", "word problems about a bakery",
)  # fmt: skip
SELF_MATH_STYLES = (
    "an easy grade-school",
    "a multi-step grade-school",
    "a middle-school",
    "a high-school",
    "a challenging competition",
    "a short",
)


# competition-style math problems with their formulas in LaTeX, written by the target itself (``--self-grid latex``):
# the gsm8k-heavy demo data taught the drafters that "$" starts a dollar amount, so inline math ("$p$ and $q$")
# and \frac / \sqrt formulas drafted badly (session 21). Subjects of school / contest math; no evaluation set is read.
SELF_LATEX_TOPICS = (
    "polynomials and their roots", "quadratic equations", "systems of linear equations", "inequalities",
    "absolute value equations", "functions and their inverses", "composition of functions", "exponential equations",
    "logarithms", "arithmetic sequences", "geometric series", "sums of series", "complex numbers", "roots of unity",
    "polar coordinates", "rectangular and polar coordinates", "vectors", "matrices and determinants",
    "trigonometric identities", "trigonometric equations", "the unit circle", "areas of triangles",
    "circles and chords", "inscribed angles", "similar triangles", "the pythagorean theorem", "coordinate geometry",
    "distance and midpoint", "parabolas", "ellipses", "lines and slopes", "volumes of solids", "prime factorization",
    "divisors of an integer", "greatest common divisors and least common multiples", "modular arithmetic",
    "number bases", "digits and place value", "fractions and decimals", "percents", "ratios",
    "counting arrangements", "binomial coefficients", "probability", "expected value", "the binomial theorem",
    "simplifying square roots", "rational expressions", "floor and ceiling functions", "maximum and minimum values",
    "rates and work", "piecewise functions",
)  # fmt: skip
SELF_LATEX_STYLES = (
    "Write a challenging competition math problem about {t}. Write all math in LaTeX between $ signs.",
    "Write a high-school math problem about {t} using LaTeX notation such as $\\frac{{a}}{{b}}$, $x^2$ and "
    "$\\sqrt{{x}}$.",
    "Write a math contest problem about {t} that asks to compute an exact value. Use LaTeX for every formula.",
    "Write a short algebra problem about {t} with formulas in LaTeX, for example $f(x) = 2x + 3$.",
    "Write a math olympiad problem about {t} for students, with all expressions in LaTeX.",
    "Write a math problem about {t} that asks to express the answer in simplest form. Use LaTeX.",
    "Write a precalculus problem about {t}. Put every mathematical expression between $ signs in LaTeX.",
    "Write a problem about {t} that asks to find all real values of $x$. Write math in LaTeX.",
)
SELF_GRIDS = ("mixed", "latex")


def self_question_prompts(n: int, seed: int = 0, grid: str = "mixed") -> list[str]:
    """Instructions asking the target to write one user question, shuffled. ``grid="mixed"``: a topic x style
    grid of general questions plus a topic x level grid of math problems; ``"latex"``: a topic x instruction grid
    of competition-style math problems with their formulas in LaTeX. Past the grid's size they repeat: each
    repeat is a separate request sampled with its own seed (the generators seed request i with ``seed + i``), so
    it yields another question; duplicates are dropped after generation."""
    if grid not in SELF_GRIDS:
        raise TrainError(f"unknown self-prompt grid {grid!r} (choose from {', '.join(SELF_GRIDS)})")
    if grid == "latex":
        grid_list = [
            style.format(t=topic) + " Reply with the problem only."
            for topic in SELF_LATEX_TOPICS
            for style in SELF_LATEX_STYLES
        ]
    else:
        grid_list = [
            f"Write one question a user might ask an AI assistant about {topic}{style}. "
            "Reply with the question only."
            for topic in SELF_TOPICS
            for style in SELF_STYLES
        ] + [
            f"Write {level} math problem about {topic}. Reply with the problem only."
            for topic in SELF_MATH_TOPICS
            for level in SELF_MATH_STYLES
        ]
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        rnd = list(grid_list)
        rng.shuffle(rnd)
        out += rnd[: n - len(out)]
    return out


def clean_question(text: str, prefer: str | None = None) -> str | None:
    """The first non-empty line of a generated question, unquoted; None if unusable. ``prefer``: the first
    usable line that contains this string, if one does (``"$"`` for the LaTeX grid, whose answers often open
    with a line such as "Here's a problem using LaTeX:")."""
    usable = []
    for line in text.strip().splitlines():
        line = line.strip().strip('"').strip()
        line = (
            re.sub(r"^(question\s*\d*\s*[:.-]\s*|\d+[.)]\s*|[-*]\s*)", "", line, flags=re.I)
            .strip()
            .strip('"')
        )
        if 8 <= len(line) <= 500:
            if prefer is None or prefer in line:
                return line
            usable.append(line)
    return usable[0] if usable else None


def _split_spec(spec: str) -> tuple[str, int | None]:
    """``path`` or ``path:N`` (at most N prompts from that file)."""
    if not os.path.exists(spec) and re.search(r":\d+$", spec):
        path, n = spec.rsplit(":", 1)
        return path, int(n)
    return spec, None


def _record_prompt(rec: Any) -> str | None:
    if isinstance(rec, str):
        return rec
    if not isinstance(rec, dict):
        return None
    if isinstance(rec.get("turns"), list) and rec["turns"]:
        return str(rec["turns"][0])
    for key in ("question", "prompt", "instruction", "text", "problem"):
        if isinstance(rec.get(key), str) and rec[key].strip():
            if key == "instruction" and isinstance(rec.get("input"), str) and rec["input"].strip():
                return rec["instruction"] + "\n\n" + rec["input"]
            return rec[key]
    return None


def _mbpp_test_ids(path: str) -> set[int]:
    test = os.path.join(os.path.dirname(os.path.abspath(path)), "mbpp_sanitized_test.jsonl")
    ids: set[int] = set()
    if os.path.isfile(test):
        with open(test, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    ids.add(int(json.loads(line)["task_id"]))
    return ids


def _text_prompts(path: str, rng: random.Random, limit: int | None, chunk_lines: int = 16) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [ln.rstrip() for ln in f]
    is_play = "shakespeare" in os.path.basename(path).lower()
    head = (
        "Continue this scene in the same style:\n" if is_play else "Continue this text in the same style:\n"
    )
    starts = list(range(0, max(1, len(lines) - chunk_lines), chunk_lines))
    rng.shuffle(starts)
    out = []
    for st in starts:
        chunk = "\n".join(lines[st : st + chunk_lines]).strip()
        if len(chunk) >= 40:
            out.append(head + chunk)
        if limit is not None and len(out) >= limit:
            break
    return out


GSM8K_SUFFIX_MODES = ("half", "none", "all")


def load_prompts(specs: Sequence[str], seed: int = 0, gsm8k_suffix: str = "half") -> list[str]:
    """Prompts from ``path[:N]`` specs: .jsonl (``turns[0]``, ``question``, ``prompt``, ``instruction``,
    ``text``), .json arrays (MBPP minus its test split's task_ids), .txt corpora (continuation prompts from
    chunks). Evaluation sets are refused; Spec-Bench MT-Bench / math_reasoning records are dropped.
    ``gsm8k_suffix``: which prompts of a gsm8k file get the step-by-step / ``\\boxed{}`` instruction (every
    other one, none or all); the selection of a ``:N`` cap does not depend on it."""
    if gsm8k_suffix not in GSM8K_SUFFIX_MODES:
        raise TrainError(f"gsm8k_suffix must be one of {', '.join(GSM8K_SUFFIX_MODES)}, got {gsm8k_suffix!r}")
    rng = random.Random(seed)
    prompts: list[str] = []
    for spec in specs:
        path, limit = _split_spec(spec)
        check_not_eval_set(path)
        if not os.path.isfile(path):
            raise TrainError(f"prompt file not found: {path}")
        name = os.path.basename(path).lower()
        got: list[str] = []
        if name.endswith(".txt"):
            got = _text_prompts(path, rng, limit)
        else:
            with open(path, encoding="utf-8") as f:
                if name.endswith(".jsonl"):
                    records = [json.loads(line) for line in f if line.strip()]
                elif name.endswith(".json"):
                    records = json.load(f)
                    if isinstance(records, dict):
                        records = records.get("data", list(records.values()))
                else:
                    raise TrainError(f"unsupported prompt file type: {path} (use .jsonl, .json or .txt)")
            skip_ids = _mbpp_test_ids(path) if name.startswith("mbpp") else set()
            for rec in records:
                if isinstance(rec, dict):
                    if str(rec.get("category", "")).lower() in EVAL_CATEGORIES:
                        continue
                    if skip_ids and int(rec.get("task_id", -1)) in skip_ids:
                        continue
                p = _record_prompt(rec)
                if p and p.strip():
                    got.append(p.strip())
            rng.shuffle(got)
            if "gsm8k" in name and gsm8k_suffix != "none":  # the benchmark's prompt style (half: every other)
                got = [
                    g + GSM8K_SUFFIX if gsm8k_suffix == "all" or i % 2 == 0 else g for i, g in enumerate(got)
                ]
            if limit is not None:
                got = got[:limit]
        if not got:
            raise TrainError(f"no prompts found in {path}")
        prompts.extend(got)
    rng.shuffle(prompts)
    return prompts


# ------------------------------------------------------------------------------------------ samples


@dataclass
class Sample:
    input_ids: list[int]
    loss_mask: list[int]


def make_sample(prompt_ids: Sequence[int], response_ids: Sequence[int]) -> Sample:
    return Sample(list(prompt_ids) + list(response_ids), [0] * len(prompt_ids) + [1] * len(response_ids))


def save_samples(samples: Sequence[Sample], path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps({"input_ids": s.input_ids, "loss_mask": s.loss_mask}) + "\n")
    os.replace(tmp, path)


def load_samples(path: str) -> list[Sample]:
    if not os.path.isfile(path):
        raise TrainError(f"data file not found: {path}")
    out = []
    opener: Any = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            rec = json.loads(line)
            ids, mask = rec.get("input_ids"), rec.get("loss_mask")
            if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask):
                raise TrainError(f"{path}:{i + 1}: need input_ids and loss_mask lists of equal length")
            out.append(Sample(ids, mask))
    if not out:
        raise TrainError(f"no samples in {path}")
    return out


def chat_prompt_ids(tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
    """Apply the chat template (``add_generation_prompt=True``) and tokenize."""
    out = []
    for p in prompts:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        out.append([int(x) for x in ids])
    return out


# ------------------------------------------------------------------------------------------ generation


def stop_token_ids(tokenizer: Any, model_config: Any = None) -> list[int]:
    ids: set[int] = set()
    for src in (getattr(model_config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(x) for x in src)
    for tok in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok) if hasattr(tokenizer, "convert_tokens_to_ids") else None
        if isinstance(tid, int) and tid >= 0 and tid != getattr(tokenizer, "unk_token_id", None):
            if tok == "<|endoftext|>" and ids:
                continue
            ids.add(tid)
    return sorted(ids)


def _cut_at_stop(ids: Sequence[int], stops: set[int]) -> list[int]:
    out = []
    for t in ids:
        t = int(t)
        out.append(t)
        if t in stops:
            break
    return out


class HFGenerator:
    """Responses with transformers' ``generate`` in left-padded batches (prompts sorted by length)."""

    name = "hf"

    def __init__(self, model: Any, stops: Sequence[int], pad_id: int, batch_size: int = 128) -> None:
        self.model = model
        self.stops = list(stops)
        self.pad_id = pad_id
        self.batch_size = batch_size

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, temperature: float, seed: int = 0
    ) -> list[list[int]]:
        from tqdm import tqdm

        device = next(self.model.parameters()).device
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        results: list[list[int]] = [[] for _ in prompt_ids]
        stop_set = set(self.stops)
        bs = self.batch_size
        for start in tqdm(range(0, len(order), bs), desc="generate (hf)", unit="batch"):
            idx = order[start : start + bs]
            width = max(len(prompt_ids[i]) for i in idx)
            ids = torch.full((len(idx), width), self.pad_id, dtype=torch.long)
            att = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):
                p = prompt_ids[i]
                ids[r, width - len(p) :] = torch.tensor(p)
                att[r, width - len(p) :] = 1
            torch.manual_seed(seed + start)
            kwargs: dict[str, Any] = dict(
                max_new_tokens=max_new_tokens, pad_token_id=self.pad_id, eos_token_id=self.stops
            )
            if temperature > 0:
                kwargs.update(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
            else:
                kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            with torch.no_grad():
                out = self.model.generate(input_ids=ids.to(device), attention_mask=att.to(device), **kwargs)
            out = out[:, width:].tolist()
            for r, i in enumerate(idx):
                results[i] = _cut_at_stop(out[r], stop_set)
        return results

    def close(self) -> None:
        pass


class EngineGenerator:
    """Responses with specserve's own engine (``specserve.LLM``)."""

    name = "engine"

    def __init__(
        self,
        target: str,
        *,
        dtype: str,
        device: str,
        max_model_len: int,
        max_num_seqs: int,
        stops: Sequence[int] = (),
        gpu_memory_utilization: float | None = None,
        num_gpu_blocks: int | None = None,
    ) -> None:
        import inspect

        from specserve import LLM

        kwargs: dict[str, Any] = dict(
            model=target,
            dtype=dtype,
            device=device,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=False,
        )
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if num_gpu_blocks is not None:
            kwargs.update(num_gpu_blocks=num_gpu_blocks, block_size=16)
        sig = inspect.signature(LLM.__init__)
        if not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
            kwargs = {k: v for k, v in kwargs.items() if k in sig.parameters}
        self.llm = LLM(**kwargs)
        self.stops = list(stops)

    def tokenizer(self) -> Any:
        return self.llm.get_tokenizer()

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, temperature: float, seed: int = 0
    ) -> list[list[int]]:
        from specserve import SamplingParams

        # request i samples with seed + i: reproducible, and repeated prompts get different answers
        params = [
            SamplingParams(temperature=temperature, max_tokens=max_new_tokens, seed=seed + i)
            for i in range(len(prompt_ids))
        ]
        batch = [{"prompt_token_ids": list(ids)} for ids in prompt_ids]
        try:
            outs = self.llm.generate(batch, params, use_tqdm=True)
        except TypeError:  # an engine without the use_tqdm option
            outs = self.llm.generate(batch, params)
        results = []
        for o in outs:
            c = o.outputs[0]
            ids = [int(t) for t in c.token_ids]
            # the loss mask covers the final EOS: add it back if the engine stopped on it without emitting it
            if (
                getattr(c, "finish_reason", None) == "stop"
                and self.stops
                and (not ids or ids[-1] not in self.stops)
            ):
                reason = getattr(c, "stop_reason", None)
                if reason is None:
                    ids.append(self.stops[0])
                elif isinstance(reason, int):
                    ids.append(reason)
            results.append(ids)
        return results

    def close(self) -> None:
        shutdown = getattr(self.llm, "shutdown", None)
        if callable(shutdown):
            shutdown()
        del self.llm
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------ batching


def batch_plan(
    lengths: Sequence[int],
    batch_size: int,
    epoch: int,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    group: int = 64,
) -> list[list[int]]:
    """This rank's batches for one epoch: a ``DistributedSampler`` shard (shuffled with seed + epoch), then
    length-grouped batches (sorted within windows of ``group`` batches to cut padding), in shuffled order.
    Every rank gets the same number of batches."""
    from torch.utils.data import DistributedSampler

    sampler: DistributedSampler[int] = DistributedSampler(
        range(len(lengths)),  # type: ignore[arg-type]
        num_replicas=world_size,
        rank=rank,
        shuffle=True,
        seed=seed,
        drop_last=False,
    )
    sampler.set_epoch(epoch)
    idx = list(sampler)
    window = batch_size * group
    batches: list[list[int]] = []
    for w in range(0, len(idx), window):
        chunk = sorted(idx[w : w + window], key=lambda i: lengths[i])
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    random.Random(seed * 1000 + epoch).shuffle(batches)
    return batches


def collate(
    samples: Sequence[Sample], idx: Sequence[int], max_length: int, pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``loss_mask`` ``[B, S]`` (sequences truncated to ``max_length``)."""
    seqs = [samples[i] for i in idx]
    width = min(max_length, max(len(s.input_ids) for s in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        n = min(width, len(s.input_ids))
        ids[r, :n] = torch.tensor(s.input_ids[:n])
        mask[r, :n] = torch.tensor(s.loss_mask[:n])
    return ids, mask


def token_counts(samples: Sequence[Sample], vocab_size: int) -> torch.Tensor:
    """Frequency of each token id on loss-masked (response) positions."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in samples:
        ids = torch.tensor([t for t, m in zip(s.input_ids, s.loss_mask) if m], dtype=torch.long)
        if ids.numel():
            counts += torch.bincount(ids.clamp(0, vocab_size - 1), minlength=vocab_size)
    return counts


def iter_chunks(seq: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def pick_mask_token_id(tokenizer: Any, samples: Sequence[Sample], vocab_size: int) -> int:
    """A token id that never occurs in the training data and is not a stop/bos/chat token.

    Preference: pad, unk, then other special / added tokens, then the highest id below ``vocab_size``
    (for padded vocabularies such as Qwen's that is an untrained row, like z-lab's ``<|MASK|>``).
    """
    used: set[int] = set()
    for s in samples:
        used.update(s.input_ids)
    banned = set(used)
    cands: list[int] = []
    if tokenizer is not None:
        for attr in ("eos_token_id", "bos_token_id"):
            v = getattr(tokenizer, attr, None)
            if isinstance(v, int):
                banned.add(v)
        for attr in ("pad_token_id", "unk_token_id"):
            v = getattr(tokenizer, attr, None)
            if isinstance(v, int):
                cands.append(v)
        specials = list(getattr(tokenizer, "all_special_ids", []) or [])
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        cands.extend(sorted(set(specials) | {int(k) for k in added}, reverse=True))
    for c in cands:
        if 0 <= c < vocab_size and c not in banned:
            return int(c)
    for c in range(vocab_size - 1, -1, -1):
        if c not in banned:
            return c
    raise TrainError("could not find an unused token id for the DFlash mask token; pass --mask-token-id")
