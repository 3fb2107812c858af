"""Byte-level automata for structured outputs: any JSON, a JSON-schema subset, and a fixed choice of strings.

A compiled :class:`Grammar` is a table of schema nodes; its matcher state is a ``frozenset`` of stacks (tuples of
frames, the innermost last), so alternatives (``anyOf``, enums, optional properties) are followed side by side as in
an NFA and a state is an immutable, hashable value: masks are cached per state, and rolling back a rejected draft is
taking an earlier state.  ``step(state, byte)`` is memoized.

Frames:

* ``("V", sid, ws)``: a value of node ``sid`` is expected; ``ws`` whitespace bytes read before it;
* ``("L", lit, pos)``: inside the literal ``lit`` (keys, ``true`` / ``false`` / ``null``, enum and const values);
* ``("S", esc)``: inside a JSON string; esc 0 plain, -1 after a backslash, k > 0 hex digits of a ``\\u`` escape left;
* ``("N", integer, sub)``: inside a number (the JSON number lexer; ``sub`` in :data:`_NUM_ACCEPT` may end it);
* ``("R", rid, nfa, pending)``: a whole-output regex (``regex.Regex`` ``rid``; ``nfa`` its state set, ``pending``
  the bytes of a character not yet complete); ``("P", rid, nfa, pending)``: inside a JSON string with a
  ``pattern`` (no escapes there);
* ``("O", sid, phase, idx, ws)`` / ``("A", sid, phase, count, ws)``: inside an object / array.

Whitespace between tokens of the JSON text is allowed up to :data:`MAX_WS` bytes in a row (a model cannot pad
forever; ``max_ws=0``: vLLM's ``disable_any_whitespace``, compact JSON); properties of a schema object come in the schema's order, optional ones may be left out (xgrammar's
order, which vLLM uses by default); unknown properties only where ``additionalProperties`` allows them, after the
declared ones.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

MAX_WS = 32
_WS = frozenset(b" \t\n\r")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_DIGITS = frozenset(b"0123456789")
_NUM_ACCEPT = frozenset((2, 3, 5, 8))
_QUOTE, _BSLASH = 0x22, 0x5C

Stack = tuple[tuple[Any, ...], ...]
State = frozenset[Stack]

# keywords that only annotate (ignored); "format" is an annotation in JSON Schema 2020-12 unless a validator opts in
_ANNOTATIONS = frozenset(
    (
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "format",
        "$defs",
        "definitions",
        "contentEncoding",
        "contentMediaType",
    )
)
_SUPPORTED = frozenset(
    (
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minItems",
        "maxItems",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "pattern",
    )
)


class GrammarError(ValueError):
    """A schema or choice that cannot be compiled (unsupported keyword, bad reference, ...)."""


def _num_next(integer: bool, sub: int, b: int) -> int | None:
    """The JSON number lexer: the next sub-state, or None when ``b`` cannot continue the number."""
    digit = b in _DIGITS
    if sub == 1:  # after '-'
        return 2 if b == 0x30 else 3 if digit else None
    if sub in (2, 3):  # '0' / a leading digit and more
        if sub == 3 and digit:
            return 3
        if integer:
            return None
        return 4 if b == 0x2E else 6 if b in (0x65, 0x45) else None
    if sub in (4, 5):  # after '.' / fraction digits
        if digit:
            return 5
        return 6 if sub == 5 and b in (0x65, 0x45) else None
    if sub == 6:  # after 'e'
        return 7 if b in (0x2B, 0x2D) else 8 if digit else None
    if sub in (7, 8):  # after the exponent's sign / exponent digits
        return 8 if digit else None
    return None


class Grammar:
    """A compiled structured-output grammar (see the module docstring). Build with :meth:`json_schema`,
    :meth:`json_any` or :meth:`choice`."""

    def __init__(self, max_ws: int = MAX_WS) -> None:
        self.max_ws = max_ws
        self.kinds: list[tuple[Any, ...]] = []
        self.regexes: list[Any] = []
        self.initial: State = frozenset()
        self._refs: dict[str, int] = {}
        self._step_cache: dict[tuple[State, int], State] = {}
        # allowed-token masks per state (GrammarMatcher's; shared by every request compiled to this grammar)
        self.masks: OrderedDict[State, Any] = OrderedDict()
        self._any = self._add(("any",))
        self._obj_any = self._add(("object", (), self._any))
        self._arr_any = self._add(("array", self._any, 0, None))

    def _add(self, kind: tuple[Any, ...]) -> int:
        self.kinds.append(kind)
        return len(self.kinds) - 1

    # ------------------------------------------------------------------ constructors
    @classmethod
    def json_any(cls, object_only: bool = True, max_ws: int = MAX_WS) -> Grammar:
        """Any JSON object (``response_format: {"type": "json_object"}``), or any JSON value."""
        g = cls(max_ws)
        g.initial = frozenset({(("V", g._obj_any if object_only else g._any, 0),)})
        return g

    @classmethod
    def json_schema(cls, schema: Any, max_ws: int = MAX_WS) -> Grammar:
        """A JSON document valid under ``schema`` (a dict, or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}.")
        g = cls(max_ws)
        root = g._compile(schema, schema, "#")
        g.initial = frozenset({(("V", root, 0),)})
        return g

    @classmethod
    def choice(cls, choices: Iterable[Any]) -> Grammar:
        """Exactly one of the strings in ``choices`` (vLLM's ``guided_choice``)."""
        opts = list(choices) if not isinstance(choices, (str, bytes)) else None
        if not opts or not all(isinstance(c, str) and c for c in opts):
            raise GrammarError("choice must be a non-empty list of non-empty strings.")
        g = cls()
        g.initial = frozenset({(("L", c.encode(), 0),) for c in opts})
        return g

    @classmethod
    def regex(cls, pattern: Any) -> Grammar:
        """The whole output matches ``pattern`` (vLLM's ``guided_regex``)."""
        from specserve.structured.regex import Regex

        if not isinstance(pattern, str) or not pattern:
            raise GrammarError("regex must be a non-empty string.")
        g = cls()
        rx = Regex(pattern)
        g.regexes.append(rx)
        g.initial = frozenset({(("R", 0, rx.initial, b""),)})
        return g

    # ------------------------------------------------------------------ JSON schema -> nodes
    def _compile(self, s: Any, doc: Any, where: str) -> int:
        if s is True or s == {}:
            return self._any
        if s is False:
            raise GrammarError(f"{where}: the schema `false` accepts nothing.")
        if not isinstance(s, dict):
            raise GrammarError(f"{where}: a schema must be an object or a boolean, got {type(s).__name__}.")
        unknown = sorted(k for k in s if k not in _SUPPORTED and k not in _ANNOTATIONS)
        if unknown:
            raise GrammarError(f"{where}: unsupported JSON schema keyword(s) {', '.join(unknown)}.")
        if "$ref" in s:
            if len([k for k in s if k in _SUPPORTED]) > 1:
                s = self._merge_all(
                    [{k: v for k, v in s.items() if k != "$ref"}, self._resolve(s["$ref"], doc)]
                )
                return self._compile(s, doc, where)
            return self._ref(s["$ref"], doc)
        if "allOf" in s:
            parts = s["allOf"]
            if not isinstance(parts, list) or not parts:
                raise GrammarError(f"{where}: allOf must be a non-empty list.")
            resolved = [
                self._resolve(p["$ref"], doc) if isinstance(p, dict) and "$ref" in p else p for p in parts
            ]
            base = {k: v for k, v in s.items() if k != "allOf"}
            return self._compile(self._merge_all([base, *resolved]), doc, where)
        if "const" in s:
            return self._add(("lit", self._lit(s["const"])))
        if "enum" in s:
            vals = s["enum"]
            if not isinstance(vals, list) or not vals:
                raise GrammarError(f"{where}: enum must be a non-empty list.")
            return self._add(("union", tuple(self._add(("lit", self._lit(v))) for v in vals)))
        for key in ("anyOf", "oneOf"):
            if key in s:
                alts = s[key]
                if not isinstance(alts, list) or not alts:
                    raise GrammarError(f"{where}: {key} must be a non-empty list.")
                base = {k: v for k, v in s.items() if k not in ("anyOf", "oneOf") and k not in _ANNOTATIONS}
                sids = []
                for i, a in enumerate(alts):
                    if base and isinstance(a, dict):
                        a = self._merge_all([base, a])
                    sids.append(self._compile(a, doc, f"{where}/{key}/{i}"))
                return self._add(("union", tuple(sids)))
        t = s.get("type")
        if t is None:
            if "properties" in s or "additionalProperties" in s or "required" in s:
                t = "object"
            elif "items" in s or "minItems" in s or "maxItems" in s:
                t = "array"
            else:
                return self._any
        if isinstance(t, list):
            if not t:
                raise GrammarError(f"{where}: type must not be an empty list.")
            return self._add(("union", tuple(self._typed(x, s, doc, where) for x in t)))
        return self._typed(t, s, doc, where)

    def _typed(self, t: Any, s: dict[str, Any], doc: Any, where: str) -> int:
        if t == "object":
            props = s.get("properties", {})
            if not isinstance(props, dict):
                raise GrammarError(f"{where}: properties must be an object.")
            required = s.get("required", [])
            if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
                raise GrammarError(f"{where}: required must be a list of strings.")
            missing = [r for r in required if r not in props]
            if missing:
                raise GrammarError(f"{where}: required properties {missing} are not declared in properties.")
            extra_s = s.get("additionalProperties", not props)
            entries = tuple(
                (self._lit(name), self._compile(sub, doc, f"{where}/properties/{name}"), name in required)
                for name, sub in props.items()
            )
            extra = None if extra_s is False else self._compile(extra_s, doc, f"{where}/additionalProperties")
            return self._add(("object", entries, extra))
        if t == "array":
            items = self._compile(s.get("items", True), doc, f"{where}/items")
            lo, hi = s.get("minItems", 0), s.get("maxItems")
            if not isinstance(lo, int) or lo < 0 or (hi is not None and (not isinstance(hi, int) or hi < lo)):
                raise GrammarError(
                    f"{where}: minItems / maxItems must be integers with 0 <= minItems <= maxItems."
                )
            return self._add(("array", items, lo, hi))
        if t in ("string", "number", "integer", "boolean", "null"):
            bad = [k for k in s if k in ("properties", "items")]
            if bad:
                raise GrammarError(f"{where}: {bad[0]} does not apply to type {t!r}.")
            if t == "string" and "pattern" in s:
                from specserve.structured.regex import Regex

                if not isinstance(s["pattern"], str):
                    raise GrammarError(f"{where}: pattern must be a string.")
                self.regexes.append(Regex(s["pattern"], search=True))
                return self._add(("pstring", len(self.regexes) - 1))
            return self._add(
                ("string",)
                if t == "string"
                else ("number", t == "integer")
                if t in ("number", "integer")
                else ("bool",)
                if t == "boolean"
                else ("null",)
            )
        raise GrammarError(f"{where}: unknown type {t!r}.")

    @staticmethod
    def _lit(value: Any) -> bytes:
        try:
            return json.dumps(value, ensure_ascii=False, separators=(", ", ": ")).encode()
        except (TypeError, ValueError) as e:
            raise GrammarError(f"cannot write {value!r} as JSON: {e}") from None

    @staticmethod
    def _resolve(ref: Any, doc: Any) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise GrammarError(f"only local references ('#/...') are supported, got {ref!r}.")
        node = doc
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise GrammarError(f"cannot resolve the reference {ref!r}.")
        return node

    def _ref(self, ref: Any, doc: Any) -> int:
        if isinstance(ref, str) and ref in self._refs:
            return self._refs[ref]
        target = self._resolve(ref, doc)
        sid = self._add(("union", ()))  # placeholder: recursive references point here while compiling
        self._refs[ref] = sid
        self.kinds[sid] = ("union", (self._compile(target, doc, ref),))
        return sid

    @staticmethod
    def _merge_all(parts: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p in parts:
            if p is True or p == {}:
                continue
            if not isinstance(p, dict):
                raise GrammarError(f"allOf / $ref parts must be objects, got {p!r}.")
            for k, v in p.items():
                if k in _ANNOTATIONS:
                    continue
                if k == "properties" and k in out:
                    out[k] = {**out[k], **v}
                elif k == "required" and k in out:
                    out[k] = list(dict.fromkeys([*out[k], *v]))
                elif k in out and out[k] != v:
                    raise GrammarError(f"allOf: conflicting values for {k!r}.")
                else:
                    out[k] = v
        return out

    # ------------------------------------------------------------------ the automaton
    def step(self, state: State, b: int) -> State:
        """The state after byte ``b`` (empty: ``b`` is not allowed)."""
        key = (state, b)
        hit = self._step_cache.get(key)
        if hit is not None:
            return hit
        out: set[Stack] = set()
        for stack in state:
            out.update(self._step(stack, b))
        res = frozenset(out)
        if len(self._step_cache) > 200_000:
            self._step_cache.clear()
        self._step_cache[key] = res
        return res

    def advance(self, state: State, data: bytes) -> State:
        for b in data:
            state = self.step(state, b)
            if not state:
                break
        return state

    def can_end(self, state: State) -> bool:
        """The text read so far is a whole document (a stop token may come now)."""
        for stack in state:
            if not stack:
                return True
            if len(stack) == 1 and stack[0][0] == "N" and stack[0][2] in _NUM_ACCEPT:
                return True
            if len(stack) == 1 and stack[0][0] == "R" and not stack[0][3]:
                if self.regexes[stack[0][1]].accepts(stack[0][2]):
                    return True
        return False

    @staticmethod
    def in_plain_string(state: State) -> bool:
        """Inside a JSON string with no escape pending: every byte but '"', '\\' and control bytes keeps the
        state as it is (the vocabulary walk adds such tokens wholesale)."""
        if len(state) != 1:
            return False
        (stack,) = state
        return bool(stack) and stack[-1] == ("S", 0)

    def _step(self, stack: Stack, b: int) -> Iterable[Stack]:
        if not stack:
            return ()
        top, rest = stack[-1], stack[:-1]
        t = top[0]
        if t == "S":
            esc = top[1]
            if esc == 0:
                if b == _QUOTE:
                    return (rest,)
                if b == _BSLASH:
                    return (rest + (("S", -1),),)
                return () if b < 0x20 else (stack,)
            if esc == -1:
                if b in b'"\\/bfnrt':
                    return (rest + (("S", 0),),)
                return (rest + (("S", 4),),) if b == 0x75 else ()
            return (rest + (("S", esc - 1),),) if b in _HEX else ()
        if t == "L":
            lit, pos = top[1], top[2]
            if lit[pos] != b:
                return ()
            return (rest,) if pos + 1 == len(lit) else (rest + (("L", lit, pos + 1),),)
        if t == "N":
            nxt = _num_next(top[1], top[2], b)
            if nxt is not None:
                return (rest + (("N", top[1], nxt),),)
            return self._step(rest, b) if top[2] in _NUM_ACCEPT else ()
        if t == "R" or t == "P":
            rid, nfa, pending = top[1], top[2], top[3]
            if t == "P" and not pending:
                if b == _QUOTE:
                    return (rest,) if self.regexes[rid].accepts(nfa) else ()
                if b == _BSLASH or b < 0x20:
                    return ()
            from specserve.structured.regex import utf8_step

            got = utf8_step(pending, b)
            if got is None:
                return ()
            pending, ch = got
            if ch is not None:
                nfa = self.regexes[rid].step(nfa, ch)
                if not nfa:
                    return ()
            elif not self.regexes[rid].viable(nfa, pending):
                return ()
            return (rest + ((t, rid, nfa, pending),),)
        if t == "V":
            if b in _WS:
                return (rest + (("V", top[1], top[2] + 1),),) if top[2] < self.max_ws else ()
            return self._start(rest, top[1], b)
        if t == "O":
            return self._object(rest, top, b)
        if t == "A":
            return self._array(rest, top, b)
        raise AssertionError(f"unknown frame {top!r}")

    def _start(self, rest: Stack, sid: int, b: int) -> list[Stack]:
        """Begin a value of node ``sid`` with its first (non-whitespace) byte ``b``."""
        k = self.kinds[sid]
        kind = k[0]
        if kind == "union":
            out: list[Stack] = []
            for s in k[1]:
                out.extend(self._start(rest, s, b))
            return out
        if kind == "lit":
            return list(self._step(rest + (("L", k[1], 0),), b))
        if kind == "any":
            if b == 0x7B:
                return [rest + (("O", self._obj_any, 0, 0, 0),)]
            if b == 0x5B:
                return [rest + (("A", self._arr_any, 0, 0, 0),)]
            if b == _QUOTE:
                return [rest + (("S", 0),)]
            if b == 0x2D or b in _DIGITS:
                return self._number(rest, False, b)
            lit = {0x74: b"true", 0x66: b"false", 0x6E: b"null"}.get(b)
            return [rest + (("L", lit, 1),)] if lit else []
        if kind == "object":
            return [rest + (("O", sid, 0, 0, 0),)] if b == 0x7B else []
        if kind == "array":
            return [rest + (("A", sid, 0, 0, 0),)] if b == 0x5B else []
        if kind == "string":
            return [rest + (("S", 0),)] if b == _QUOTE else []
        if kind == "pstring":
            return [rest + (("P", k[1], self.regexes[k[1]].initial, b""),)] if b == _QUOTE else []
        if kind == "number":
            return self._number(rest, k[1], b)
        if kind == "bool":
            lit = {0x74: b"true", 0x66: b"false"}.get(b)
            return [rest + (("L", lit, 1),)] if lit else []
        if kind == "null":
            return [rest + (("L", b"null", 1),)] if b == 0x6E else []
        raise AssertionError(f"unknown node {k!r}")

    @staticmethod
    def _number(rest: Stack, integer: bool, b: int) -> list[Stack]:
        if b == 0x2D:
            return [rest + (("N", integer, 1),)]
        if b == 0x30:
            return [rest + (("N", integer, 2),)]
        return [rest + (("N", integer, 3),)] if b in _DIGITS else []

    def _keys(self, sid: int, idx: int) -> tuple[list[int], bool, bool]:
        """For an object at property index ``idx``: the declared properties that may come next, whether an
        undeclared key may come (additionalProperties, once no required property is left), whether '}' may."""
        _, props, extra = self.kinds[sid]
        cand: list[int] = []
        j = idx
        while j < len(props):
            cand.append(j)
            if props[j][2]:
                break
            j += 1
        done = j >= len(props)  # no required property left from idx
        return cand, done and extra is not None, done

    def _object(self, rest: Stack, top: tuple[Any, ...], b: int) -> list[Stack]:
        _, sid, phase, idx, ws = top
        if b in _WS:
            return [rest + (("O", sid, phase, idx, ws + 1),)] if ws < self.max_ws else []
        _, props, extra = self.kinds[sid]
        if phase in (0, 3):  # after '{' / after ','
            cand, free, close = self._keys(sid, idx)
            if b == 0x7D:
                return [rest] if phase == 0 and close else []
            if b != _QUOTE:
                return []
            out = [rest + (("O", sid, 1, j, 0), ("L", props[j][0], 1)) for j in cand]
            if free:
                out.append(rest + (("O", sid, 1, -1, 0), ("S", 0)))
            return out
        if phase == 1:  # after a key
            if b != 0x3A:
                return []
            if idx >= 0:
                return [rest + (("O", sid, 2, idx + 1, 0), ("V", props[idx][1], 0))]
            return [rest + (("O", sid, 2, len(props), 0), ("V", extra, 0))]
        # phase 2: after a value
        cand, free, close = self._keys(sid, idx)
        if b == 0x2C:
            return [rest + (("O", sid, 3, idx, 0),)] if cand or free else []
        if b == 0x7D:
            return [rest] if close else []
        return []

    def _array(self, rest: Stack, top: tuple[Any, ...], b: int) -> list[Stack]:
        _, sid, phase, count, ws = top
        if b in _WS:
            return [rest + (("A", sid, phase, count, ws + 1),)] if ws < self.max_ws else []
        _, items, lo, hi = self.kinds[sid]
        if phase == 0 and b == 0x5D:
            return [rest] if lo == 0 else []
        if phase in (0, 3):
            if hi is not None and count >= hi:
                return []
            return self._start(rest + (("A", sid, 2, count + 1, 0),), items, b)
        if b == 0x2C:
            return [rest + (("A", sid, 3, count, 0),)] if hi is None or count < hi else []
        if b == 0x5D:
            return [rest] if count >= lo else []
        return []
