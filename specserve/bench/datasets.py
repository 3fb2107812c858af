"""Prompt sets for ``specserve bench serve``, shaped like vLLM's ``vllm/benchmarks/datasets``.

Supported: ``random`` (random token ids), ``sharegpt`` (JSON conversations), ``custom`` (JSONL with a
``prompt`` column), ``hf`` (MT-Bench style rows: prompt = ``turns[0]``; read with ``datasets`` when it is
installed and the name is not a local file, else from the local JSON/JSONL given by ``--dataset-path``),
and ``spec_bench`` (Spec-Bench ``question.jsonl``). ``datasets`` is imported lazily and never required.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

logger = logging.getLogger(__name__)

DATASET_NAMES = ("random", "sharegpt", "custom", "hf", "spec_bench")
MT_BENCH_NAMES = ("philschmid/mt-bench",)


@dataclass
class SampleRequest:
    """One benchmark request: the prompt (text, or token ids), its token count and the requested output length."""

    prompt: str | list[int]
    prompt_len: int
    expected_output_len: int
    request_id: str | None = None


class TokenizerLike(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any: ...


# --------------------------------------------------------------------------- tokenizers


class RemoteTokenizer:
    """Token counting through a running server's ``/tokenize`` and ``/detokenize`` (vLLM's endpoints).

    Used when the served model's tokenizer cannot be loaded locally (e.g. the bundled demo model)."""

    def __init__(
        self, base_url: str, model: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name_or_path = f"{self.base_url}/tokenize"
        self._client = httpx.Client(timeout=60.0, headers=headers or {})
        self.vocab_size: int | None = None

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.model is not None:
            body = {"model": self.model, **body}
        r = self._client.post(self.base_url + path, json=body)
        if r.status_code != 200:
            raise RuntimeError(f"{path} failed with HTTP {r.status_code}: {r.text[:200]}")
        return r.json()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(
            self._post("/tokenize", {"prompt": text, "add_special_tokens": add_special_tokens})["tokens"]
        )

    def __call__(self, text: str, add_special_tokens: bool = True) -> Any:
        class _Enc:
            def __init__(self, ids: list[int]) -> None:
                self.input_ids = ids

        return _Enc(self.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self._post("/detokenize", {"tokens": list(ids)})["prompt"])

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        **_: Any,
    ) -> Any:
        ids = self._post("/tokenize", {"messages": messages, "add_generation_prompt": add_generation_prompt})[
            "tokens"
        ]
        return list(ids) if tokenize else self.decode(ids)

    def close(self) -> None:
        self._client.close()


def count_tokens(tokenizer: Any, text: str, add_special_tokens: bool = True) -> int:
    return len(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def apply_chat_template(tokenizer: Any, prompt: str) -> str:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    return text if isinstance(text, str) else str(text[0])


# --------------------------------------------------------------------------- file helpers


def _read_records(path: str) -> list[dict[str, Any]]:
    """JSON (a list, or {"data": [...]}) or JSONL records."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if stripped.startswith("["):
        data = json.loads(text)
        return [r for r in data if isinstance(r, dict)]
    if stripped.startswith("{") and "\n" not in stripped.strip():
        obj = json.loads(stripped)
        if isinstance(obj, dict) and isinstance(obj.get("data"), list):
            return [r for r in obj["data"] if isinstance(r, dict)]
        return [obj]
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if isinstance(rec, dict):
            records.append(rec)
    return records


def _first_prompt(row: dict[str, Any]) -> str | None:
    """The first user turn of a row in the common prompt-set layouts."""
    turns = row.get("turns")
    if isinstance(turns, list) and turns:
        first = turns[0]
        return (
            first if isinstance(first, str) else (first.get("content") if isinstance(first, dict) else None)
        )
    for key in ("prompt", "question", "instruction", "input", "text", "problem"):
        v = row.get(key)
        if isinstance(v, str) and v:
            return v
    for key in ("conversations", "messages", "conversation"):
        conv = row.get(key)
        if isinstance(conv, list) and conv and isinstance(conv[0], dict):
            v = conv[0].get("value", conv[0].get("content"))
            if isinstance(v, str):
                return v
    return None


def _shuffled(rows: list[Any], seed: int, shuffle: bool) -> list[Any]:
    rows = list(rows)
    if shuffle:
        random.Random(seed).shuffle(rows)
    return rows


def maybe_oversample(
    requests: list[SampleRequest], num_requests: int, seed: int, no_oversample: bool
) -> list[SampleRequest]:
    """Repeat random samples (seeded) up to ``num_requests``, as vLLM does, unless ``no_oversample``."""
    if not requests:
        raise ValueError("the dataset produced no usable prompts")
    if len(requests) >= num_requests or no_oversample:
        if len(requests) < num_requests:
            logger.warning(
                "only %d prompts available (asked for %d; --no-oversample)", len(requests), num_requests
            )
        return requests[:num_requests]
    rng = random.Random(seed)
    extra = [rng.choice(requests) for _ in range(num_requests - len(requests))]
    logger.info("oversampled %d prompts to reach %d", len(extra), num_requests)
    return requests + [SampleRequest(r.prompt, r.prompt_len, r.expected_output_len) for r in extra]


def assign_request_ids(requests: list[SampleRequest], prefix: str) -> list[SampleRequest]:
    for i, r in enumerate(requests):
        r.request_id = f"{prefix}{i}"
    return requests


# --------------------------------------------------------------------------- datasets


def _templated(
    prompts: Iterable[str], tokenizer: Any, num_requests: int, output_len: int, skip_chat_template: bool
) -> list[SampleRequest]:
    out: list[SampleRequest] = []
    for prompt in prompts:
        if len(out) >= num_requests:
            break
        if not skip_chat_template:
            prompt = apply_chat_template(tokenizer, prompt)
        out.append(SampleRequest(prompt, count_tokens(tokenizer, prompt), output_len))
    return out


_FILLER = (
    "The quick brown fox jumps over the lazy dog while seven wizards quietly hex the jovial kings. "
    "In 1984 a small river town built 23 bridges, three libraries and one observatory; scientists "
    "measured stars, poets counted syllables, and engineers argued about tolerances, voltages and gears. "
    "Every morning the market opened with apples, bread, coffee, dates, eggs, figs, grapes and honey."
)


def _token_pool(tokenizer: Any) -> list[int]:
    """Token ids to draw random prompts from: the whole vocabulary minus special tokens when known,
    else the ids of a built-in paragraph (remote tokenizers)."""
    size = getattr(tokenizer, "vocab_size", None)
    if isinstance(size, int) and size > 0 and not isinstance(tokenizer, RemoteTokenizer):
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        return [i for i in range(size) if i not in special]
    return sorted(set(tokenizer.encode(_FILLER, add_special_tokens=False)))


def random_requests(
    tokenizer: Any,
    num_requests: int,
    input_len: int = 1024,
    output_len: int = 128,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    seed: int = 0,
) -> list[SampleRequest]:
    """Random token-id prompts of ``input_len`` (+- range_ratio) tokens, decoded to text."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    if input_len < 1 or output_len < 1:
        raise ValueError("--random-input-len and --random-output-len must be at least 1")
    rng = random.Random(seed)
    pool = _token_pool(tokenizer)
    prefix = [rng.choice(pool) for _ in range(prefix_len)]
    out: list[SampleRequest] = []
    for _ in range(num_requests):
        lo_in, hi_in = int(input_len * (1 - range_ratio)), int(input_len * (1 + range_ratio))
        lo_out, hi_out = int(output_len * (1 - range_ratio)), int(output_len * (1 + range_ratio))
        n_in = max(1, rng.randint(lo_in, hi_in))
        n_out = max(1, rng.randint(lo_out, hi_out))
        ids = prefix + [rng.choice(pool) for _ in range(n_in)]
        text = tokenizer.decode(ids)
        # decoding then re-encoding can merge or split tokens: trim back to the target once
        re_ids = tokenizer.encode(text, add_special_tokens=False)
        if len(re_ids) > prefix_len + n_in:
            text = tokenizer.decode(re_ids[: prefix_len + n_in])
            re_ids = tokenizer.encode(text, add_special_tokens=False)
        out.append(SampleRequest(text, len(re_ids), n_out))
    return out


def sharegpt_requests(
    path: str,
    tokenizer: Any,
    num_requests: int,
    output_len: int | None = None,
    seed: int = 0,
    shuffle: bool = True,
) -> list[SampleRequest]:
    """ShareGPT JSON: prompt = first turn, output length = the reference answer's (unless ``output_len``)."""
    rows = [
        r for r in _read_records(path) if len(r.get("conversations", r.get("conversation", [])) or []) >= 2
    ]
    out: list[SampleRequest] = []
    for row in _shuffled(rows, seed, shuffle):
        if len(out) >= num_requests:
            break
        conv = row.get("conversations", row.get("conversation"))
        prompt = conv[0].get("value", conv[0].get("content"))
        completion = conv[1].get("value", conv[1].get("content"))
        if not isinstance(prompt, str) or not isinstance(completion, str):
            continue
        p_len = count_tokens(tokenizer, prompt)
        o_len = output_len if output_len is not None else count_tokens(tokenizer, completion)
        # vLLM's is_valid_sequence: drop tiny and very long pairs
        if p_len < 4 or (output_len is None and o_len < 4) or p_len > 1024 or p_len + o_len > 2048:
            continue
        out.append(SampleRequest(prompt, p_len, o_len))
    return out


def custom_requests(
    path: str,
    tokenizer: Any,
    num_requests: int,
    output_len: int = 256,
    skip_chat_template: bool = False,
    seed: int = 0,
    shuffle: bool = True,
) -> list[SampleRequest]:
    """JSONL with a ``prompt`` column (optional ``output_tokens`` used when ``output_len`` is -1)."""
    rows = _read_records(path)
    if rows and "prompt" not in rows[0]:
        raise ValueError(f"{path}: custom datasets need a 'prompt' field in every record")
    out: list[SampleRequest] = []
    for row in _shuffled(rows, seed, shuffle):
        if len(out) >= num_requests:
            break
        prompt = row.get("prompt")
        if not isinstance(prompt, str):
            continue
        o_len = output_len
        if o_len == -1:
            if "output_tokens" not in row:
                raise ValueError(
                    f"{path}: --custom-output-len -1 needs an 'output_tokens' field in every record"
                )
            o_len = int(row["output_tokens"])
        if not skip_chat_template:
            prompt = apply_chat_template(tokenizer, prompt)
        out.append(SampleRequest(prompt, count_tokens(tokenizer, prompt), o_len))
    return out


def _hf_rows(
    hf_name: str, split: str, subset: str | None, seed: int, shuffle: bool
) -> Iterator[dict[str, Any]]:
    try:
        import datasets  # noqa: F401 - optional dependency
    except ImportError:
        raise ValueError(
            f"reading {hf_name!r} from the Hugging Face Hub needs the `datasets` package; install it, or pass "
            "--dataset-path with a local JSON/JSONL copy (e.g. mt_bench_question.jsonl)"
        ) from None
    from datasets import load_dataset

    ds = load_dataset(hf_name, name=subset, split=split, streaming=True)
    if shuffle:
        ds = ds.shuffle(seed=seed)
    yield from ds


def hf_requests(
    tokenizer: Any,
    num_requests: int,
    hf_name: str | None = None,
    dataset_path: str | None = None,
    split: str = "train",
    subset: str | None = None,
    output_len: int | None = None,
    skip_chat_template: bool = False,
    seed: int = 0,
    shuffle: bool = True,
) -> list[SampleRequest]:
    """HF prompt sets (MT-Bench: prompt = ``turns[0]``, 256 output tokens by default)."""
    name = hf_name or dataset_path
    if not name:
        raise ValueError("--dataset-name hf needs --hf-name or --dataset-path")
    local = dataset_path if dataset_path and os.path.exists(dataset_path) else None
    rows: Iterable[dict[str, Any]]
    if local is not None:
        rows = _shuffled(_read_records(local), seed, shuffle)
    else:
        rows = _hf_rows(name, split, subset, seed, shuffle)
    prompts = (p for p in (_first_prompt(r) for r in rows) if p)
    return _templated(prompts, tokenizer, num_requests, output_len or 256, skip_chat_template)


def spec_bench_requests(
    path: str,
    tokenizer: Any,
    num_requests: int,
    output_len: int = 256,
    category: str | None = None,
    skip_chat_template: bool = False,
    seed: int = 0,
    shuffle: bool = True,
) -> list[SampleRequest]:
    """Spec-Bench ``question.jsonl`` (prompt = ``turns[0]``), optionally one ``category``."""
    rows = _read_records(path)
    if category:
        rows = [r for r in rows if r.get("category") == category]
        if not rows:
            raise ValueError(f"{path}: no records with category {category!r}")
    prompts = (p for p in (_first_prompt(r) for r in _shuffled(rows, seed, shuffle)) if p)
    return _templated(prompts, tokenizer, num_requests, output_len, skip_chat_template)


def get_samples(args: Any, tokenizer: Any) -> list[SampleRequest]:
    """Build the request list for ``bench serve`` arguments (vLLM's names)."""
    name = args.dataset_name
    n = args.num_prompts
    shuffle = not args.disable_shuffle
    if name in ("sharegpt", "custom", "spec_bench") and not args.dataset_path:
        raise ValueError(f"--dataset-name {name} needs --dataset-path")
    if name == "random":
        reqs = random_requests(
            tokenizer,
            n,
            input_len=args.random_input_len,
            output_len=args.random_output_len,
            range_ratio=args.random_range_ratio,
            prefix_len=args.random_prefix_len,
            seed=args.seed,
        )
    elif name == "sharegpt":
        reqs = sharegpt_requests(
            args.dataset_path, tokenizer, n, args.sharegpt_output_len, args.seed, shuffle
        )
    elif name == "custom":
        reqs = custom_requests(
            args.dataset_path,
            tokenizer,
            n,
            args.custom_output_len,
            args.skip_chat_template,
            args.seed,
            shuffle,
        )
    elif name == "hf":
        reqs = hf_requests(
            tokenizer,
            n,
            hf_name=args.hf_name,
            dataset_path=args.dataset_path,
            split=args.hf_split or "train",
            subset=args.hf_subset,
            output_len=args.hf_output_len,
            skip_chat_template=args.skip_chat_template,
            seed=args.seed,
            shuffle=shuffle,
        )
    elif name == "spec_bench":
        reqs = spec_bench_requests(
            args.dataset_path,
            tokenizer,
            n,
            args.spec_bench_output_len,
            args.spec_bench_category,
            args.skip_chat_template,
            args.seed,
            shuffle,
        )
    else:
        raise ValueError(f"unknown --dataset-name {name!r}; choose from {', '.join(DATASET_NAMES)}")
    reqs = maybe_oversample(reqs, n, args.seed, args.no_oversample)
    return assign_request_ids(reqs, args.request_id_prefix)
