"""Regular expressions as character NFAs, for vLLM's ``regex`` / ``guided_regex`` (the whole output matches) and
JSON schema's ``pattern`` (a string's content contains a match, as JSON Schema's ``search`` semantics).

Patterns are parsed by Python's own regex parser (``re._parser``) and built into a Thompson NFA. Supported:
literals, ``.``, classes (ranges, ``\\d \\w \\s`` and their negations, negated classes), groups, alternation,
greedy and lazy repeats (bounded ones expanded up to :data:`MAX_EXPAND` copies), and ``^`` / ``$`` / ``\\A`` /
``\\Z`` (whole-match anchors). Back-references, look-around, word boundaries and inline flags are refused.
"""

from __future__ import annotations

import bisect
import unicodedata
from typing import Any

try:  # Python 3.11+
    import re._constants as _c
    import re._parser as _parser
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _parser  # type: ignore[no-redef]

from specserve.structured.grammar import GrammarError

MAX_EXPAND = 256

Pred = tuple[Any, ...]  # ("lit", cp) | ("any",) | ("in", negate, items)


def _category(cat: Any, ch: str) -> bool:
    if cat in (_c.CATEGORY_DIGIT, _c.CATEGORY_UNI_DIGIT):
        return unicodedata.category(ch) == "Nd"
    if cat in (_c.CATEGORY_NOT_DIGIT, _c.CATEGORY_UNI_NOT_DIGIT):
        return unicodedata.category(ch) != "Nd"
    if cat in (_c.CATEGORY_SPACE, _c.CATEGORY_UNI_SPACE):
        return ch.isspace()
    if cat in (_c.CATEGORY_NOT_SPACE, _c.CATEGORY_UNI_NOT_SPACE):
        return not ch.isspace()
    if cat in (_c.CATEGORY_WORD, _c.CATEGORY_UNI_WORD):
        return ch.isalnum() or ch == "_"
    if cat in (_c.CATEGORY_NOT_WORD, _c.CATEGORY_UNI_NOT_WORD):
        return not (ch.isalnum() or ch == "_")
    raise GrammarError(f"regex: unsupported category {cat}.")


def _matches(pred: Pred, ch: str) -> bool:
    kind = pred[0]
    if kind == "lit":
        return ord(ch) == pred[1]
    if kind == "notlit":
        return ord(ch) != pred[1] and ch != "\n"
    if kind == "any":
        return ch != "\n"
    negate, items = pred[1], pred[2]
    cp = ord(ch)
    hit = False
    for op, av in items:
        if op is _c.LITERAL:
            hit = cp == av
        elif op is _c.RANGE:
            hit = av[0] <= cp <= av[1]
        elif op is _c.CATEGORY:
            hit = _category(av, ch)
        else:
            raise GrammarError(f"regex: unsupported class item {op}.")
        if hit:
            break
    return hit != negate


class Regex:
    """A compiled pattern: NFA states 0..n-1, ``trans[s]`` = [(pred, t)], ``eps[s]`` = [t]; a match state is a
    frozenset of NFA states closed under epsilon moves."""

    def __init__(self, pattern: str, search: bool = False) -> None:
        self.pattern = pattern
        try:
            parsed = _parser.parse(pattern)
        except Exception as e:  # re.error
            raise GrammarError(f"regex {pattern!r} does not compile: {e}") from None
        flags = getattr(getattr(parsed, "state", None), "flags", 0)
        if flags & ~(_c.SRE_FLAG_UNICODE):
            raise GrammarError(f"regex {pattern!r}: inline flags are not supported.")
        self.trans: list[list[tuple[Pred, int]]] = []
        self.eps: list[list[int]] = []
        items = list(parsed)
        lead = (
            bool(items) and items[0][0] is _c.AT and items[0][1] in (_c.AT_BEGINNING, _c.AT_BEGINNING_STRING)
        )
        trail = bool(items) and items[-1][0] is _c.AT and items[-1][1] in (_c.AT_END, _c.AT_END_STRING)
        start = self._new()
        end = start
        if search and not lead:  # JSON Schema's pattern: a match anywhere in the string
            end = self._star_any(end)
        end = self._seq(items, end)
        if search and not trail:
            end = self._star_any(end)
        self.final = end
        self._closures: dict[frozenset[int], frozenset[int]] = {}
        self.initial = self._closure({start})
        self._step_cache: dict[tuple[frozenset[int], str], frozenset[int]] = {}
        self._viable: dict[tuple[frozenset[int], bytes], bool] = {}

    # ------------------------------------------------------------------ construction
    def _new(self) -> int:
        self.trans.append([])
        self.eps.append([])
        return len(self.trans) - 1

    def _edge(self, a: int, pred: Pred) -> int:
        b = self._new()
        self.trans[a].append((pred, b))
        return b

    def _star_any(self, a: int) -> int:
        b = self._new()
        self.eps[a].append(b)
        self.trans[b].append((("in", True, []), b))  # any character, newlines too
        return b

    def _seq(self, items: Any, a: int) -> int:
        for op, av in items:
            a = self._item(op, av, a)
        return a

    def _item(self, op: Any, av: Any, a: int) -> int:
        if op is _c.LITERAL:
            return self._edge(a, ("lit", av))
        if op is _c.NOT_LITERAL:
            return self._edge(a, ("notlit", av))
        if op is _c.ANY:
            return self._edge(a, ("any",))
        if op is _c.IN:
            negate = bool(av) and av[0][0] is _c.NEGATE
            return self._edge(a, ("in", negate, [x for x in av if x[0] is not _c.NEGATE]))
        if op is _c.SUBPATTERN:
            _, add_flags, del_flags, sub = av
            if add_flags or del_flags:
                raise GrammarError(f"regex {self.pattern!r}: inline flags are not supported.")
            return self._seq(sub, a)
        if op is _c.BRANCH:
            end = self._new()
            for alt in av[1]:
                s = self._new()
                self.eps[a].append(s)
                self.eps[self._seq(alt, s)].append(end)
            return end
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", None)):
            lo, hi, sub = av
            if lo > MAX_EXPAND or (hi is not _c.MAXREPEAT and hi > MAX_EXPAND):
                raise GrammarError(
                    f"regex {self.pattern!r}: repeat counts above {MAX_EXPAND} are not supported."
                )
            for _ in range(lo):
                a = self._seq(sub, a)
            if hi is _c.MAXREPEAT:
                loop = self._new()
                self.eps[a].append(loop)
                self.eps[self._seq(sub, loop)].append(loop)
                return loop
            end = self._new()
            self.eps[a].append(end)
            for _ in range(hi - lo):
                a = self._seq(sub, a)
                self.eps[a].append(end)
            return end
        if op is _c.AT and av in (_c.AT_BEGINNING, _c.AT_BEGINNING_STRING, _c.AT_END, _c.AT_END_STRING):
            return a  # the whole text is matched anyway
        raise GrammarError(f"regex {self.pattern!r}: {str(op).lower()} is not supported.")

    # ------------------------------------------------------------------ matching
    def _closure(self, states: set[int]) -> frozenset[int]:
        todo = list(states)
        seen = set(states)
        while todo:
            s = todo.pop()
            for t in self.eps[s]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)

    def step(self, states: frozenset[int], ch: str) -> frozenset[int]:
        key = (states, ch)
        hit = self._step_cache.get(key)
        if hit is None:
            nxt = {t for s in states for pred, t in self.trans[s] if _matches(pred, ch)}
            hit = self._closure(nxt) if nxt else frozenset()
            if len(self._step_cache) > 100_000:
                self._step_cache.clear()
            self._step_cache[key] = hit
        return hit

    def accepts(self, states: frozenset[int]) -> bool:
        return self.final in states

    def viable(self, states: frozenset[int], pending: bytes) -> bool:
        """Whether some character that begins with the UTF-8 bytes ``pending`` can be read next: a byte-level
        walk must not enter a multi-byte character no pattern branch accepts (a dead end)."""
        key = (states, pending)
        hit = self._viable.get(key)
        if hit is None:
            lo, hi = _utf8_interval(pending)
            hit = any(_may_match(p, lo, hi) for s in states for p, _ in self.trans[s])
            self._viable[key] = hit
        return hit


def _utf8_interval(pending: bytes) -> tuple[int, int]:
    """The code points whose UTF-8 encoding begins with the (incomplete) bytes ``pending``."""
    first = pending[0]
    n = 2 if first <= 0xDF else 3 if first <= 0xEF else 4
    value = first & (0x1F if n == 2 else 0x0F if n == 3 else 0x07)
    for b in pending[1:]:
        value = (value << 6) | (b & 0x3F)
    free = 6 * (n - len(pending))
    least = (0x80, 0x800, 0x10000)[n - 2]  # shorter encodings of smaller code points are not UTF-8
    return max(value << free, least), min(((value + 1) << free) - 1, 0x10FFFF)


def _may_match(pred: Pred, lo: int, hi: int) -> bool:
    """Whether ``pred`` accepts some code point in [lo, hi] (exact up to 65536 code points, else assumed for
    categories and negated classes)."""
    kind = pred[0]
    if kind == "lit":
        return lo <= pred[1] <= hi
    if kind in ("notlit", "any"):
        return hi > lo or (lo != pred[1] if kind == "notlit" else lo != 10)
    if hi - lo < 65536:
        return any(_matches(pred, chr(cp)) for cp in range(lo, hi + 1) if not 0xD800 <= cp <= 0xDFFF)
    negate, items = pred[1], pred[2]
    if negate:
        return True  # a class's complement meets any interval this large
    for op, av in items:
        if op is _c.LITERAL and lo <= av <= hi:
            return True
        if op is _c.RANGE and av[0] <= hi and av[1] >= lo:
            return True
        if op is _c.CATEGORY and _category_meets(av, lo, hi):
            return True
    return False


_CATEGORY_RANGES: dict[Any, tuple[list[int], list[int]]] = {}


def _category_meets(cat: Any, lo: int, hi: int) -> bool:
    """Whether the category has a code point in [lo, hi]: \\d, \\s and \\w by their code point ranges (one scan
    of Unicode on first use); their negations always (no interval this large is all digits, spaces or word
    characters)."""
    positive = (
        _c.CATEGORY_DIGIT,
        _c.CATEGORY_UNI_DIGIT,
        _c.CATEGORY_SPACE,
        _c.CATEGORY_UNI_SPACE,
        _c.CATEGORY_WORD,
        _c.CATEGORY_UNI_WORD,
    )
    if cat not in positive:
        return True
    table = _CATEGORY_RANGES.get(cat)
    if table is None:
        starts: list[int] = []
        ends: list[int] = []
        inside_prev = False
        for cp in range(0x110000):
            inside = not 0xD800 <= cp <= 0xDFFF and _category(cat, chr(cp))
            if inside and not inside_prev:
                starts.append(cp)
            elif inside_prev and not inside:
                ends.append(cp - 1)
            inside_prev = inside
        if inside_prev:
            ends.append(0x10FFFF)
        table = _CATEGORY_RANGES[cat] = (starts, ends)
    starts, ends = table
    i = bisect.bisect_right(starts, hi) - 1  # the last range starting at or below hi (ranges are disjoint)
    return i >= 0 and ends[i] >= lo


def utf8_step(pending: bytes, b: int) -> tuple[bytes, str | None] | None:
    """Add byte ``b`` to a partial UTF-8 character: (pending, None) while incomplete, (b"", char) when complete,
    None when the bytes cannot be UTF-8."""
    data = pending + bytes([b])
    first = data[0]
    need = (
        1
        if first < 0x80
        else 2
        if 0xC2 <= first <= 0xDF
        else 3
        if 0xE0 <= first <= 0xEF
        else 4
        if 0xF0 <= first <= 0xF4
        else 0
    )
    if need == 0 or (len(data) > 1 and not 0x80 <= b <= 0xBF):
        return None
    if len(data) < need:
        return data, None
    try:
        return b"", data.decode("utf-8")
    except UnicodeDecodeError:
        return None
