"""Tests for the prompt-lookup (n-gram) proposer."""

from __future__ import annotations

import time

import numpy as np
import pytest

from specserve.spec.ngram import ngram_propose


def _vllm_kmp_reference(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """A plain-Python transcription of vLLM's reversed-sequence KMP scan (the behaviour we match)."""
    total = len(tokens)
    if total < min_n or k <= 0:
        return []
    rev = tokens[::-1]
    lps = [0] * max_n
    longest, position, prev, i = 0, 0, 0, 1
    while i < total:
        if rev[prev] == rev[i]:
            prev += 1
            if prev >= longest:
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:
                prev = lps[max_n - 1]
            i += 1
        elif prev != 0:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    return tokens[start : start + k]


def test_simple_repeat() -> None:
    # suffix [2, 3] occurred at index 1; the continuation is [4, 2, 3]
    assert ngram_propose([1, 2, 3, 4, 2, 3], 2, 3, 4) == [4, 2, 3]
    assert ngram_propose([1, 2, 3, 4, 2, 3], 2, 3, 2) == [4, 2]


def test_longest_suffix_wins_over_earlier_shorter_match() -> None:
    # [8, 9] occurs at 0 (followed by 100) and [7, 8, 9] at 4 (followed by 200): the longer match wins
    toks = [8, 9, 100, 5, 7, 8, 9, 200, 6, 7, 8, 9]
    assert ngram_propose(toks, 1, 3, 1) == [200]
    # with max_n = 2 only bigrams count and the earliest [8, 9] wins
    assert ngram_propose(toks, 1, 2, 1) == [100]


def test_earliest_occurrence_of_longest_match() -> None:
    # [1, 2] occurs at 0 (-> 10) and at 3 (-> 20): vLLM picks the earliest occurrence
    toks = [1, 2, 10, 1, 2, 20, 1, 2]
    assert ngram_propose(toks, 2, 2, 1) == [10]
    assert ngram_propose(toks, 2, 2, 3) == [10, 1, 2]


def test_no_match_returns_empty() -> None:
    assert ngram_propose([1, 2, 3, 4, 5], 1, 3, 4) == []
    assert ngram_propose([], 1, 3, 4) == []
    assert ngram_propose([7], 1, 3, 4) == []
    # a unigram match exists but min_n = 2 forbids it
    assert ngram_propose([5, 1, 2, 3, 5], 2, 4, 4) == []
    assert ngram_propose([5, 1, 2, 3, 5], 1, 4, 4) == [1, 2, 3, 5]


def test_k_larger_than_continuation() -> None:
    # the earliest match of [4, 5] ends at index 1; only 3 tokens follow it
    assert ngram_propose([4, 5, 6, 4, 5], 2, 2, 10) == [6, 4, 5]
    assert ngram_propose([4, 5, 6, 4, 5], 2, 2, 0) == []


def test_max_model_len_clips_k() -> None:
    toks = [1, 2, 3, 4, 1, 2]
    assert ngram_propose(toks, 2, 2, 4) == [3, 4, 1, 2]
    assert ngram_propose(toks, 2, 2, 4, max_model_len=8) == [3, 4]
    assert ngram_propose(toks, 2, 2, 4, max_model_len=6) == []


def test_max_n_bounds_match_length() -> None:
    # the whole period repeats; with max_n = 1 the proposal follows the earliest unigram match
    toks = [3, 1, 3, 2, 9, 3, 1, 3]
    # longest suffix match: [3, 1, 3] at 0 -> [2, 9, ...]
    assert ngram_propose(toks, 1, 3, 2) == [2, 9]
    # unigram [3] earliest at 0 -> [1, 3]
    assert ngram_propose(toks, 1, 1, 2) == [1, 3]
    # bigram [1, 3] earliest at 1 -> [2, 9]
    assert ngram_propose(toks, 2, 2, 2) == [2, 9]


def test_overlapping_self_match() -> None:
    assert ngram_propose([1, 1, 1, 1], 1, 3, 5) == [1]
    assert ngram_propose([1, 1, 1, 1], 1, 1, 5) == [1, 1, 1]


@pytest.mark.parametrize("alphabet", [2, 3, 6])
def test_matches_vllm_kmp_on_random_sequences(alphabet: int) -> None:
    rng = np.random.default_rng(alphabet)
    for _ in range(400):
        length = int(rng.integers(0, 40))
        toks = rng.integers(0, alphabet, size=length).tolist()
        min_n = int(rng.integers(1, 4))
        max_n = int(rng.integers(min_n, 7))
        k = int(rng.integers(1, 6))
        assert ngram_propose(toks, min_n, max_n, k) == _vllm_kmp_reference(toks, min_n, max_n, k), (
            toks,
            min_n,
            max_n,
            k,
        )
        # numpy input gives the same answer
        assert ngram_propose(np.asarray(toks, dtype=np.int32), min_n, max_n, k) == ngram_propose(
            toks, min_n, max_n, k
        )


def test_long_sequence_is_fast() -> None:
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 32000, size=8192)
    toks[1000:1010] = toks[-10:]  # plant an earlier copy of the last 10 tokens
    t0 = time.perf_counter()
    for _ in range(20):
        out = ngram_propose(toks, 1, 8, 5)
    elapsed = (time.perf_counter() - t0) / 20
    assert out == toks[1010:1015].tolist()  # the 8-gram (max_n) match ends at index 1009
    # generous bounds (a loaded CI machine): they only catch a quadratic pure-Python scan, which takes seconds
    assert elapsed < 0.1, f"{elapsed * 1e3:.2f} ms per call"
    # highly repetitive input (worst case for the number of surviving candidates)
    rep = np.zeros(8192, dtype=np.int64)
    t0 = time.perf_counter()
    assert ngram_propose(rep, 1, 8, 4) == [0, 0, 0, 0]
    assert time.perf_counter() - t0 < 0.5
