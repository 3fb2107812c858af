"""The tokenizer's vocabulary as bytes in a trie, and per-request grammar matchers that turn a grammar state into
the mask of tokens allowed next.

A mask is computed by walking the trie with the grammar's byte automaton, pruning every subtree whose prefix the
grammar rejects; inside a plain JSON string the subtrees without '"', '\\' or control bytes are added wholesale
(they leave the state unchanged), so the walk only visits the few thousand tokens that can end or escape a string.
Masks are cached per grammar state (states repeat: every character of a free string is the same state).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from specserve.structured.grammar import Grammar, State

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _gpt2_byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode (byte-level BPE: every byte is one printable character)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_bytes(tokenizer: Any) -> tuple[list[bytes | None], set[int]]:
    """Each token id's bytes (None for ids with no token) and the ids of special tokens (never allowed by a
    grammar; stop tokens are added where the document may end)."""
    n = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    for tid, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            special.add(int(tid))
    decoder_type = None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        try:
            dec = json.loads(backend.to_str()).get("decoder") or {}
            decoder_type = dec.get("type")
            if decoder_type == "Sequence":
                kinds = {d.get("type") for d in dec.get("decoders", [])}
                decoder_type = "ByteLevel" if "ByteLevel" in kinds else "Sequence"
        except (ValueError, AttributeError):
            decoder_type = None
    out: list[bytes | None] = []
    if decoder_type == "ByteLevel":
        table = _gpt2_byte_decoder()
        added = {int(k) for k in (getattr(tokenizer, "added_tokens_decoder", None) or {})}
        for i, p in enumerate(pieces):
            if p is None:
                out.append(None)
            elif i in added or any(ch not in table for ch in p):
                out.append(p.encode())  # added tokens are stored as text, not byte-mapped
            else:
                out.append(bytes(table[ch] for ch in p))
        return out, special
    for p in pieces:  # SentencePiece style: '▁' is a space, <0xNN> a raw byte
        if p is None:
            out.append(None)
            continue
        m = _BYTE_FALLBACK.match(p)
        out.append(bytes([int(m.group(1), 16)]) if m else p.replace("\u2581", " ").encode())
    return out, special


class _Node:
    __slots__ = ("children", "tokens", "lo", "hi", "special")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.tokens: list[int] = []
        self.lo = 1 << 62
        self.hi = 0
        self.special = False  # a '"', '\\' or control byte on this edge or below


class TokenVocab:
    """The vocabulary's token bytes in a trie; ``size`` is the width of the logits (may exceed the tokenizer)."""

    def __init__(self, tokens: list[bytes | None], special: set[int], size: int) -> None:
        self.size = size
        self.tokens = tokens
        self.special = special
        order = sorted((t, i) for i, t in enumerate(tokens) if t and i not in special and i < size)
        self.sorted_ids = np.array([i for _, i in order], dtype=np.int64)
        self.root = _Node()
        for r, (data, tid) in enumerate(order):
            node = self.root
            for b in data:
                child = node.children.get(b)
                if child is None:
                    child = node.children[b] = _Node()
                    child.special = b == 0x22 or b == 0x5C or b < 0x20
                node = child
                node.lo = min(node.lo, r)
                node.hi = r + 1
            node.tokens.append(tid)
        self._mark_special(self.root)

    @staticmethod
    def _mark_special(root: _Node) -> None:
        order: list[_Node] = []
        stack = [root]
        while stack:
            n = stack.pop()
            order.append(n)
            stack.extend(n.children.values())
        for n in reversed(order):  # children before parents
            if any(c.special for c in n.children.values()):
                n.special = True

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, size: int | None = None) -> TokenVocab:
        cached = getattr(tokenizer, "_specserve_vocab", None)
        width = max(size or 0, len(tokenizer))
        if cached is not None and cached.size == width:
            return cached
        toks, special = token_bytes(tokenizer)
        vocab = cls(toks, special, width)
        try:
            tokenizer._specserve_vocab = vocab
        except AttributeError:
            pass
        return vocab

    def allowed(self, grammar: Grammar, state: State) -> np.ndarray:
        """Bool mask [size]: the tokens whose bytes the grammar accepts from ``state`` (stop tokens not set)."""
        mask = np.zeros(self.size, dtype=bool)
        ids = self.sorted_ids
        work = [(self.root, state)]
        while work:
            node, st = work.pop()
            plain = grammar.in_plain_string(st)
            for b, child in node.children.items():
                if plain and not child.special:
                    mask[ids[child.lo : child.hi]] = True
                    continue
                nst = grammar.step(st, b)
                if not nst:
                    continue
                if child.tokens:
                    mask[child.tokens] = True
                if child.children:
                    work.append((child, nst))
        return mask


class GrammarMatcher:
    """One request's grammar: its state after each committed output token, and masks for the next rows."""

    _MASK_CACHE = 4096

    def __init__(self, grammar: Grammar, vocab: TokenVocab, stop_ids: set[int]) -> None:
        self.grammar = grammar
        self.vocab = vocab
        self.stop_ids = sorted(i for i in stop_ids if 0 <= i < vocab.size)
        self.states: list[State] = [grammar.initial]
        self._masks = grammar.masks

    def advance(self, state: State, token: int) -> State:
        if not state or token >= len(self.vocab.tokens) or token in self.stop_ids:
            return frozenset()
        data = self.vocab.tokens[token]
        if not data:
            return frozenset()
        return self.grammar.advance(state, data)

    def state_after(self, output_ids: list[int]) -> State:
        """The state after the committed output (states are kept per length: rolling back is free)."""
        n = len(output_ids)
        del self.states[n + 1 :]
        while len(self.states) <= n:
            k = len(self.states) - 1
            self.states.append(self.advance(self.states[-1], output_ids[k]))
        return self.states[n]

    def mask(self, state: State) -> np.ndarray:
        """Bool mask [size] of the tokens allowed in ``state``: the grammar's (cached per grammar and state), plus
        the stop tokens where the document may end (or, defensively, where nothing else is allowed)."""
        raw = self._masks.get(state) if state else None
        if raw is None:
            raw = self.vocab.allowed(self.grammar, state) if state else np.zeros(self.vocab.size, dtype=bool)
            if state:
                self._masks[state] = raw
                if len(self._masks) > self._MASK_CACHE:
                    self._masks.popitem(last=False)
        elif state:
            self._masks.move_to_end(state)
        if self.stop_ids and (not state or self.grammar.can_end(state) or not raw.any()):
            raw = raw.copy()
            raw[self.stop_ids] = True
        return raw

    def rows(self, output_ids: list[int], drafts: list[int]) -> np.ndarray:
        """Masks [1 + len(drafts), size] for a verify: row j is the state after the output and drafts[:j]. Past a
        draft the grammar rejects, rows repeat the last valid one (that draft's row rejects it, so they are
        never sampled from)."""
        st = self.state_after(output_ids)
        out = np.empty((1 + len(drafts), self.vocab.size), dtype=bool)
        out[0] = self.mask(st)
        for j, d in enumerate(drafts, start=1):
            if st:
                nxt = self.advance(st, d)
                st = nxt if nxt else frozenset()
            out[j] = self.mask(st) if st else out[j - 1]
        return out
