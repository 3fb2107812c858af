"""Reasoning parsing for chat completions (vLLM's ``--reasoning-parser``): the model's thinking, between
``<think>`` and ``</think>``, goes to ``reasoning_content``; the rest is the answer's ``content``.

``qwen3``: Qwen3 writes ``<think>...</think>`` itself when it thinks; an output without ``</think>`` (thinking
switched off, or a template that put an empty think block in the prompt) is all content.
``deepseek_r1``: the chat template opens ``<think>`` in the prompt, so the output starts inside the reasoning; an
output without ``</think>`` is all reasoning (cut before the model finished thinking).

The streaming parser emits each part as it comes, holding back a suffix that may begin a tag.
"""

from __future__ import annotations

REASONING_PARSERS = ("qwen3", "deepseek_r1")

START, END = "<think>", "</think>"


def _held(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``tags``."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


def extract_reasoning(text: str, parser: str) -> tuple[str | None, str | None]:
    """The whole output -> (reasoning or None, content or None); the same split as streaming it."""
    stream = ReasoningStream(parser)
    r1, c1 = stream.feed(text)
    r2, c2 = stream.finish()
    return (r1 + r2 or None), (c1 + c2 or None)


class ReasoningStream:
    """Incremental parsing of one choice's text: ``feed(delta)`` / ``finish()`` -> (reasoning delta, content
    delta). qwen3 reasons only in an output that opens with ``<think>``; deepseek_r1 starts inside the reasoning
    (skipping a ``<think>`` the model writes itself). Either ends it at ``</think>``."""

    def __init__(self, parser: str) -> None:
        if parser not in REASONING_PARSERS:
            raise ValueError(
                f"unknown reasoning parser {parser!r}; choose from {', '.join(REASONING_PARSERS)}"
            )
        self.parser = parser
        self.buf = ""
        self.state = "reasoning" if parser == "deepseek_r1" else "open"
        self.opening = True  # the output's first characters may still be <think>

    def feed(self, delta: str) -> tuple[str, str]:
        self.buf += delta
        return self._drain(final=False)

    def finish(self) -> tuple[str, str]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        while True:
            if self.opening:
                if self.buf.startswith(START):
                    self.buf, self.opening = self.buf[len(START) :], False
                    if self.state == "open":
                        self.state = "reasoning"
                    continue
                if not final and START.startswith(self.buf):
                    break  # empty, or a prefix of <think>: wait for more
                self.opening = False
                if self.state == "open":  # qwen3 without a think block: all content
                    self.state = "content"
                continue
            if self.state == "reasoning":
                i = self.buf.find(END)
                if i >= 0:
                    reasoning.append(self.buf[:i])
                    self.buf, self.state = self.buf[i + len(END) :], "content"
                    continue
                keep = 0 if final else _held(self.buf, (END,))
                reasoning.append(self.buf[: len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep :]
                break
            content.append(self.buf)
            self.buf = ""
            break
        return "".join(reasoning), "".join(content)
