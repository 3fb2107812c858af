"""Structured outputs (vLLM's ``structured_outputs`` / ``response_format`` / ``guided_*``): a byte-level grammar
automaton (any JSON, a JSON-schema subset, a choice of strings) and the masks of allowed tokens it gives per step."""

from specserve.structured.grammar import Grammar, GrammarError
from specserve.structured.vocab import GrammarMatcher, TokenVocab, token_bytes

__all__ = ["Grammar", "GrammarError", "GrammarMatcher", "TokenVocab", "token_bytes"]
