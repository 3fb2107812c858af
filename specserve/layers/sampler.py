"""On-device sampling: temperature, min-p, top-k, top-p, seeded exponential-race sampling, logprobs.

Semantics follow vLLM's V1 sampler:

* greedy rows (temperature < 1e-5 or top_k == 1) take the argmax of the raw logits;
* random rows: logits / temperature -> min-p -> top-k -> top-p, then a draw from the softmax by the
  exponential race ``argmax(probs / E)`` with ``E ~ Exp(1)``, which equals a categorical draw;
* logprobs are the log-softmax of the raw logits (vLLM's default ``raw_logprobs``).

Everything is batched over rows and vocabulary.  Rows of seeded requests draw their noise from
:mod:`specserve.layers.seeded_noise`: a hash of the request's seed and the position of the token being
sampled, so a seeded request's tokens depend on nothing else (not the batch, not the graphs, not the
step pipelining); the other rows draw from torch's generator (``fallback`` or the default one).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specserve.layers.seeded_noise import race_exponential, seed_key
from specserve.sampling_params import SamplingParams

_GREEDY_EPS = 1e-5


@dataclass
class SamplingTensors:
    """Per-row sampling parameters as device tensors, plus host flags that let kernels skip work.

    Greedy rows store temperature 0 and neutral filters (top_k 0, top_p 1, min_p 0): none of the
    filters can change an argmax, so this changes nothing for them and keeps the host flags
    (``no_top_k`` ...) describing only the rows that sample.
    """

    temperature: torch.Tensor  # [B] float32; 0 for greedy rows
    top_k: torch.Tensor  # [B] int64; 0 = disabled
    top_p: torch.Tensor  # [B] float32; 1.0 = disabled
    min_p: torch.Tensor  # [B] float32; 0.0 = disabled
    greedy: torch.Tensor  # [B] bool
    seed_keys: list[int]  # per row: the request's seed key (seeded_noise.seed_key), 0 = unseeded
    positions: list[int] | None  # per row: the position of the token it samples (needed by seeded rows)
    all_greedy: bool
    all_random: bool
    no_top_k: bool
    no_top_p: bool
    no_min_p: bool

    @property
    def num_rows(self) -> int:
        return len(self.seed_keys)

    @classmethod
    def from_params(
        cls,
        params: Sequence[SamplingParams],
        positions: Sequence[int] | None = None,
        device: torch.device | str | None = None,
    ) -> SamplingTensors:
        """``positions``: the position (index in prompt + output) of the token each row samples; required when
        a random row has a seed (its noise is a function of seed and position)."""
        n = len(params)
        if positions is not None and len(positions) != n:
            raise ValueError(f"got {len(positions)} positions for {n} sampling params")
        keys = [row_seed_key(p) for p in params]
        if any(keys) and positions is None:
            raise ValueError("seeded sampling rows need the positions of the tokens they sample")
        greedy = [p.greedy for p in params]
        rows = [param_row(p) for p in params]
        temperature = [r[0] for r in rows]
        top_k = [r[1] for r in rows]
        top_p = [r[2] for r in rows]
        min_p = [r[3] for r in rows]
        return cls(
            temperature=torch.tensor(temperature, dtype=torch.float32, device=device),
            top_k=torch.tensor(top_k, dtype=torch.int64, device=device),
            top_p=torch.tensor(top_p, dtype=torch.float32, device=device),
            min_p=torch.tensor(min_p, dtype=torch.float32, device=device),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            seed_keys=keys,
            positions=list(positions) if positions is not None else None,
            all_greedy=all(greedy),
            all_random=not any(greedy),
            no_top_k=all(k <= 0 for k in top_k),
            no_top_p=all(p >= 1.0 for p in top_p),
            no_min_p=all(m <= 0.0 for m in min_p),
        )

    def repeat_interleave(self, counts: Sequence[int]) -> SamplingTensors:
        """Expand per-request rows to per-token rows (row i repeated counts[i] times).

        The host flags stay valid (they hold for any subset of rows).  The copies of a row sample consecutive
        positions (its position, then the next ones).
        """
        if len(counts) != self.num_rows:
            raise ValueError(f"got {len(counts)} counts for {self.num_rows} rows")
        total = int(sum(counts))
        reps = torch.tensor(list(counts), dtype=torch.int64, device=self.temperature.device)

        def rep(t: torch.Tensor) -> torch.Tensor:
            return t.repeat_interleave(reps, dim=0, output_size=total)

        keys = [key for key, c in zip(self.seed_keys, counts) for _ in range(c)]
        pos = None
        if self.positions is not None:
            pos = [p + i for p, c in zip(self.positions, counts) for i in range(c)]
        return SamplingTensors(
            temperature=rep(self.temperature),
            top_k=rep(self.top_k),
            top_p=rep(self.top_p),
            min_p=rep(self.min_p),
            greedy=rep(self.greedy),
            seed_keys=keys,
            positions=pos,
            all_greedy=self.all_greedy,
            all_random=self.all_random,
            no_top_k=self.no_top_k,
            no_top_p=self.no_top_p,
            no_min_p=self.no_min_p,
        )


def param_row(p: SamplingParams) -> tuple[float, int, float, float]:
    """(temperature, top_k, top_p, min_p) of one request as SamplingTensors stores them: a greedy request gets
    temperature 0 and neutral filters."""
    if p.greedy:
        return 0.0, 0, 1.0, 0.0
    return float(p.temperature), int(p.top_k), float(p.top_p), float(p.min_p)


def row_seed_key(p: SamplingParams) -> int:
    """The seed key a request's random draws use (:func:`specserve.layers.seeded_noise.seed_key`), 0 when it has no
    seed or is greedy (its seed draws nothing)."""
    return seed_key(p.seed) if p.seed is not None and not p.greedy else 0


def static_sampling_tensors(
    temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> SamplingTensors:
    """SamplingTensors over per-row device tensors (as ``param_row`` fills them) with every filter switched on.

    For code that cannot look at the values on the host (CUDA graphs): the host flags then claim nothing, and
    apply_sampling_constraints runs every step; the neutral values (temperature 0 -> divide by 1, min_p 0,
    top_k 0, top_p 1) make each a no-op, so the result equals that of ``from_params``' tensors.  Rows with
    temperature below the greedy threshold are greedy.
    """
    n = int(temperature.shape[0])
    return SamplingTensors(
        temperature=temperature.to(torch.float32),
        top_k=top_k.to(torch.int64),
        top_p=top_p.to(torch.float32),
        min_p=min_p.to(torch.float32),
        greedy=temperature < _GREEDY_EPS,
        seed_keys=[0] * n,
        positions=None,
        all_greedy=False,
        all_random=False,
        no_top_k=False,
        no_top_p=False,
        no_min_p=False,
    )


def apply_sampling_constraints(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """[N, V] logits -> new float32 [N, V] logits with temperature, min-p, top-k and top-p applied.

    Order as in vLLM: divide by temperature (greedy rows by 1), min-p (drop tokens whose probability is
    below ``min_p * max prob``), top-k (keep the values at or above the k-th largest: ties with it all stay, as in
    vLLM's top-k-only path), top-p (keep each value whose mass strictly above it, within the top-k set, is below
    top_p: the smallest prefix of the sorted distribution that reaches top_p, with every value tied with its last
    entry; the top value always stays).  Ties are kept whole so that a threshold decides each set: the sort-free
    Triton sampler (:mod:`specserve.layers.triton_sampling`) keeps the same sets, and the graphs' and the host's
    samplers the same tokens, also on bf16 logits where ties are common.  Dropped entries are -inf.  Never modifies
    ``logits``.
    """
    out = logits.to(torch.float32)
    if not st.all_greedy:
        temp = torch.where(st.greedy, torch.ones_like(st.temperature), st.temperature)
        out = out / temp.unsqueeze(1)
    elif out.data_ptr() == logits.data_ptr():
        out = out.clone()
    if not st.no_min_p:
        # p_i < min_p * p_max  <=>  l_i < l_max + log(min_p); min_p == 0 gives -inf (keep all)
        thresh = out.amax(dim=-1, keepdim=True) + torch.log(st.min_p).unsqueeze(1)
        out = out.masked_fill(out < thresh, float("-inf"))
    if st.no_top_k and st.no_top_p:
        return out
    sorted_logits, order = out.sort(dim=-1, descending=True)
    vocab = out.shape[-1]
    if not st.no_top_k:
        k = torch.where(st.top_k > 0, st.top_k, torch.full_like(st.top_k, vocab)).clamp(max=vocab)
        kth = sorted_logits.gather(1, (k - 1).to(torch.int64).unsqueeze(1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if not st.no_top_p:
        probs = sorted_logits.softmax(dim=-1)
        cum = probs.cumsum(dim=-1)
        mass_before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=-1)
        # the sorted prefix whose mass before each entry is below top_p (at least the top entry), then every value
        # at or above its last one: the runs of ties each keep or drop whole (a run's first entry decides it)
        n_keep = (mass_before < st.top_p.unsqueeze(1)).sum(dim=-1, keepdim=True).clamp(min=1)
        last = sorted_logits.gather(1, n_keep - 1)
        drop = (sorted_logits < last) & (st.top_p < 1.0).unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(sorted_logits).scatter_(-1, order, sorted_logits)


def seeded_rows(
    seed_keys: Sequence[int],
    positions: Sequence[int] | torch.Tensor | None,
    device: torch.device | str | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The rows with a seed key (non-zero ``seed_keys[i]``) as device tensors (row indices, keys, their
    ``positions``), or None when no row has one."""
    seeded = [i for i, key in enumerate(seed_keys) if key]
    if not seeded:
        return None
    if positions is None:
        raise ValueError("seeded rows need positions")
    idx = torch.tensor(seeded, dtype=torch.int64, device=device)
    keys = torch.tensor([seed_keys[i] for i in seeded], dtype=torch.int64, device=device)
    pos = torch.as_tensor(positions, dtype=torch.int64, device=device).index_select(0, idx)
    return idx, keys, pos


def draw_exponential(
    num_rows: int,
    vocab: int,
    seed_keys: Sequence[int],
    positions: Sequence[int] | torch.Tensor | None,
    fallback: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """[num_rows, vocab] float32 Exp(1) noise, never 0 (so ``0 / E`` is never NaN).

    Row i with a seed key (non-zero ``seed_keys[i]``) gets the seeded race noise of the token at
    ``positions[i]`` (:func:`specserve.layers.seeded_noise.race_exponential`) and nothing else; the other rows
    come from ``fallback`` (or torch's default generator).
    """
    e = torch.empty(num_rows, vocab, dtype=torch.float32, device=device)
    rows = seeded_rows(seed_keys, positions, e.device)
    if rows is None or len(rows[0]) < num_rows:
        e.exponential_(generator=fallback)
        e.clamp_(min=torch.finfo(torch.float32).tiny)
    if rows is not None:
        idx, keys, pos = rows
        noise = race_exponential(keys, pos, vocab)
        if len(idx) == num_rows:
            return noise
        e.index_copy_(0, idx, noise)
    return e


GREEDY_TAIL_ENV = "SPECSERVE_GREEDY_TAIL"
GREEDY_TAIL_DEFAULT = "triton"  # what "auto" means on CUDA


def greedy_tail_on(device: torch.device) -> bool:
    """Whether the graphs' greedy verification (``greedy_verify``) and drafter argmaxes (:func:`argmax_graph`) run
    as the one-launch Triton kernels of :mod:`specserve.layers.triton_argmax` instead of torch's reductions:
    ``SPECSERVE_GREEDY_TAIL`` = ``triton``, ``torch`` or ``auto`` (default: :data:`GREEDY_TAIL_DEFAULT` on CUDA,
    torch elsewhere); read per call, i.e. per graph capture. ``triton`` on a CPU device needs
    ``TRITON_INTERPRET=1`` (the tests). H100, session 35 (benchmarks/results/h100-2026-12-06-s35): SmolLM2-135M
    plain decode at batch 1 0.568-0.569 -> 0.559-0.561 ms a step, DFlash K=7 0.966-0.975 -> 0.944-0.953 ms; the
    Qwen3-8B shape unchanged (5.78 ms at batch 1, 5.93 at 8)."""
    mode = os.environ.get(GREEDY_TAIL_ENV, "").strip() or "auto"
    if mode not in ("auto", "triton", "torch"):
        raise ValueError(f"{GREEDY_TAIL_ENV} must be auto, triton or torch, got {mode!r}")
    if mode == "auto":
        return device.type == "cuda" and GREEDY_TAIL_DEFAULT == "triton"
    return mode == "triton"


SAMPLER_ENV = "SPECSERVE_SAMPLER"


def sampler_mode() -> str:
    """``SPECSERVE_SAMPLER``: which form the graphs' random sampler (``sample_verify``) takes: ``torch`` (sorts
    each row for top-k / top-p: ~60-160 small kernels), ``triton`` (the sort-free launches of
    :mod:`specserve.layers.triton_sampling`; on a CPU device under ``TRITON_INTERPRET=1``: the tests) or ``auto``
    (the default: Triton's on CUDA, where it measured faster than torch's at every measured shape, 1.2-2.2x with
    top_p 0.95 and 8-41x without top-k / top-p, and torch's elsewhere: H100, session 37)."""
    mode = os.environ.get(SAMPLER_ENV, "").strip() or "auto"
    if mode not in ("auto", "triton", "torch"):
        raise ValueError(f"{SAMPLER_ENV} must be auto, triton or torch, got {mode!r}")
    return mode


def triton_sampler_on(device: torch.device) -> bool:
    """Whether ``sample_verify`` (not told otherwise) runs the Triton form: ``SPECSERVE_SAMPLER=triton``, or
    ``auto`` on CUDA. Read per call, i.e. per graph capture."""
    mode = sampler_mode()
    return mode == "triton" or (mode == "auto" and device.type == "cuda")


def sort_free_graphs_on(device: torch.device) -> bool:
    """Whether the runner captures a second set of sampling graphs, the Triton form without its top-k / top-p
    rounds, for batches that use neither (on CUDA, when the Triton form is on)."""
    return device.type == "cuda" and triton_sampler_on(device)


def sort_free(params: Sequence[SamplingParams]) -> bool:
    """No random row of the batch needs a top-k or top-p threshold (greedy rows need none)."""
    return all(p.greedy or (p.top_p >= 1.0 and p.top_k <= 0) for p in params)


def argmax_last(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)``; on CPU as ``x.max(-1).indices`` (the same first index on ties and NaN, as torch documents):
    torch's CPU argmax over a vocabulary row is several times slower (2-core VM, session 17: [40, 49152] bf16 3.09 vs
    0.66 ms, fp32 1.23 vs 0.46 ms: ~5% of a batch-8 DFlash K=4 step). CUDA keeps ``argmax`` (see
    :func:`argmax_graph` for the graphs' argmaxes)."""
    if x.device.type == "cpu":
        return x.max(dim=-1).indices
    return x.argmax(dim=-1)


def argmax_graph(x: torch.Tensor) -> torch.Tensor:
    """:func:`argmax_last` for the CUDA graphs' greedy argmaxes (the drafters' proposals): under
    :func:`greedy_tail_on` the one-launch Triton kernel (the same indices; a torch argmax is a few kernels more of
    latency in a step), else :func:`argmax_last`. Eager paths keep :func:`argmax_last`, so no request compiles a
    kernel form the graphs' capture did not."""
    if x.dim() >= 1 and x.numel() and greedy_tail_on(x.device):
        from specserve.layers.triton_argmax import argmax_rows

        return argmax_rows(x.reshape(-1, x.shape[-1])).view(x.shape[:-1])
    return argmax_last(x)


def random_sample(
    probs: torch.Tensor,
    seed_keys: Sequence[int],
    positions: Sequence[int] | torch.Tensor | None,
    fallback: torch.Generator | None = None,
) -> torch.Tensor:
    """Categorical draw per row of ``probs`` [N, V] (need not be normalized) via argmax(probs / E)."""
    e = draw_exponential(probs.shape[0], probs.shape[1], seed_keys, positions, fallback, probs.device)
    return argmax_last(probs.to(torch.float32) / e)


def sample(
    logits: torch.Tensor,
    st: SamplingTensors,
    fallback: torch.Generator | None = None,
) -> torch.Tensor:
    """[N, V] logits -> [N] int64 token ids (greedy rows: argmax of the raw logits)."""
    greedy_tokens = argmax_last(logits)
    if st.all_greedy:
        return greedy_tokens
    probs = apply_sampling_constraints(logits, st).softmax(dim=-1)
    random_tokens = random_sample(probs, st.seed_keys, st.positions, fallback)
    if st.all_random:
        return random_tokens
    return torch.where(st.greedy, greedy_tokens, random_tokens)


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """float32 log-softmax of the raw logits (vLLM's default ``raw_logprobs``)."""
    return logits.to(torch.float32).log_softmax(dim=-1)


def gather_logprobs(
    logprobs: torch.Tensor, token_ids: torch.Tensor, num_top: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (chosen logprob [N], chosen rank [N], top ids [N, num_top], top logprobs [N, num_top]).

    The rank is 1-based and counts the tokens whose logprob is >= the chosen one's (vLLM), so the
    argmax has rank 1 and ties share the worst rank.
    """
    token_ids = token_ids.to(device=logprobs.device, dtype=torch.int64)
    chosen = logprobs.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    ranks = (logprobs >= chosen.unsqueeze(-1)).sum(dim=-1)
    if num_top > 0:
        top_lps, top_ids = logprobs.topk(num_top, dim=-1)
    else:
        top_ids = torch.empty(logprobs.shape[0], 0, dtype=torch.int64, device=logprobs.device)
        top_lps = torch.empty(logprobs.shape[0], 0, dtype=logprobs.dtype, device=logprobs.device)
    return chosen, ranks, top_ids, top_lps
