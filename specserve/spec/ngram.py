"""Prompt-lookup (n-gram) drafting, matching vLLM's ``ngram`` proposer.

vLLM (``vllm/v1/spec_decode/ngram_proposer.py``) runs a KMP scan over the reversed sequence.  Its
result, which this function reproduces exactly with vectorized numpy instead of numba:

* L = the largest n <= max_n such that the last n tokens also occur earlier, i.e. as a window that
  ends before the last token (windows may overlap the suffix itself);
* if L < min_n there is no proposal;
* otherwise, among the occurrences of the last L tokens, the EARLIEST one in the sequence wins, and
  the proposal is up to k tokens that follow it.

Cost: O(len * L) vectorized comparisons (one pass per matched suffix length), fine for 8k+ tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def ngram_propose(
    token_ids: Sequence[int] | np.ndarray,
    min_n: int,
    max_n: int,
    k: int,
    max_model_len: int | None = None,
) -> list[int]:
    """Propose up to k tokens that followed the earliest earlier occurrence of the longest suffix n-gram.

    ``max_model_len`` (optional) clips k so that the sequence never grows past it, as vLLM does.
    Returns [] when nothing matches, when k <= 0, or when ``len(token_ids) < min_n``.
    """
    tokens = np.asarray(token_ids)
    total = int(tokens.shape[0])
    if max_model_len is not None:
        k = min(k, max_model_len - total)
    min_n = max(min_n, 1)
    if k <= 0 or max_n < min_n or total < min_n or total < 2:
        return []
    # candidate windows, by their last index e <= total - 2; after step j the survivors match the
    # last j + 1 tokens
    ends = np.arange(total - 1)
    best = 0
    first_end = -1
    for j in range(min(max_n, total - 1)):
        ends = ends[ends >= j]
        ends = ends[tokens[ends - j] == tokens[total - 1 - j]]
        if ends.size == 0:
            break
        best, first_end = j + 1, int(ends[0])
    if best < min_n:
        return []
    start = first_end + 1
    return [int(t) for t in tokens[start : start + k]]
