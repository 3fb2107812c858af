"""Structured outputs: the grammar automaton, its token masks on the real SmolLM2 tokenizer (against a brute-force
walk), the engine (every output valid under jsonschema, speculative decoding lossless under the constraint) and the
server (response_format, structured_outputs, guided_*, named / required tool_choice) through the openai client."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from drafters import make_dflash
from test_server import tiny_openai_client

from specserve import LLM, SamplingParams, StructuredOutputsParams
from specserve.errors import RequestValidationError
from specserve.structured import Grammar, GrammarError, GrammarMatcher, TokenVocab

VOCAB = 49152

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        "ok": {"type": ["boolean", "null"]},
        "score": {"type": "number"},
    },
    "required": ["name", "age"],
}

# every value bounded (no free strings or numbers): a random tiny model must finish such a document
BOUNDED = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "flags": {"type": "array", "items": {"type": ["null", "boolean"]}, "maxItems": 3},
        "n": {"const": 7},
        "code": {"type": "string", "pattern": "^[A-C]{2}-\\d$"},
    },
    "required": ["ok", "color", "code"],
}
WORDS = r"(yes|no)( [a-c]{1,3}){2}: \d"


def accepts(g: Grammar, text: str) -> bool:
    st = g.advance(g.initial, text.encode())
    return bool(st) and g.can_end(st)


@pytest.mark.parametrize(
    "doc, ok",
    [
        ('{"name": "x", "age": 3}', True),
        (
            '{ "name" : "\\u00e9\\"\\n" ,\n  "age" : -30 , "tags": ["a","b"], "ok": null, "score": 1.5e-3}',
            True,
        ),
        ('{"name": "x", "age": 3, "ok": true, "score": 0}', True),
        ('{"age": 3, "name": "x"}', False),  # properties come in the schema's order
        ('{"name": "x"}', False),  # a required property missing
        ('{"name": "x", "age": 3.5}', False),  # integer
        ('{"name": "x", "age": 03}', False),  # leading zero
        ('{"name": "x", "age": 3, "zz": 1}', False),  # no additional properties where properties are declared
        ('{"name": "x", "age": 3, "tags": ["a", "b", "a"]}', False),  # maxItems
        ('{"name": "x", "age": 3, "tags": ["c"]}', False),  # enum
        ('{"name": "x", "age": 3,}', False),  # trailing comma
        ('{"name": "a\x01", "age": 3}', False),  # raw control byte in a string
        ('{"name": "\\q", "age": 3}', False),  # bad escape
        ('{"name": "x", "age": 3} x', False),
    ],
)
def test_schema_documents(doc: str, ok: bool) -> None:
    assert accepts(Grammar.json_schema(PERSON), doc) is ok
    if ok:  # the automaton's language is inside the schema's
        jsonschema.validate(json.loads(doc), PERSON)


def test_json_object_choice_refs_and_whitespace() -> None:
    g = Grammar.json_any()
    for doc in ["{}", '{"a": [1, -2.5E+3, {"b": null}, [], "s"], "c": true}']:
        assert accepts(g, doc)
    for doc in ["[1]", '"s"', '{"a": tru}', '{"a": 1', "{} {}"]:
        assert not accepts(g, doc)
    c = Grammar.choice(["yes", "no", "yes please"])
    assert [accepts(c, t) for t in ["yes", "no", "yes please", "ye", "nope", " yes"]] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    # a recursive $ref (a tree) and anyOf / const
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"anyOf": [{"const": 1}, {"type": "string"}]},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/node",
    }
    g = Grammar.json_schema(tree)
    assert accepts(g, '{"v": 1, "kids": [{"v": "x"}, {"v": 1, "kids": [{"v": "y", "kids": []}]}]}')
    assert not accepts(g, '{"v": 2}') and not accepts(g, '{"kids": []}')
    # disable_any_whitespace: compact JSON only
    g = Grammar.json_schema(PERSON, max_ws=0)
    assert accepts(g, '{"name":"a b","age":1}') and not accepts(g, '{"name": "a b", "age": 1}')
    # whitespace between tokens is capped: a model cannot pad forever
    g = Grammar.json_any()
    assert g.advance(g.initial, b"{" + b" " * 32)
    assert not g.advance(g.initial, b"{" + b" " * 33)


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"type": "string", "pattern": "(a)\\1"}, "groupref is not supported"),
        ({"type": "integer", "minimum": 0}, "minimum"),
        ({"type": "object", "properties": {"x": {"type": "string", "maxLength": 3}}}, "maxLength"),
        ({"$ref": "#/$defs/missing"}, "cannot resolve"),
        ({"type": "frobnicate"}, "unknown type"),
        ({"enum": []}, "non-empty"),
        ({"type": "object", "required": ["a"], "additionalProperties": True}, "not declared"),
        (False, "accepts nothing"),
        ("{not json", "not valid JSON"),
    ],
)
def test_unsupported_or_bad_schemas_are_clear_errors(schema: Any, words: str) -> None:
    with pytest.raises(GrammarError, match=words):
        Grammar.json_schema(schema)


def test_masks_equal_a_brute_force_walk(smol_tokenizer: Any) -> None:
    """On the real tokenizer: each token is allowed exactly when the automaton accepts its bytes (the trie walk's
    pruning and the wholesale string subtrees change nothing), the stop token exactly where the document may end."""
    vocab = TokenVocab.from_tokenizer(smol_tokenizer, VOCAB)
    g = Grammar.json_schema(PERSON)
    m = GrammarMatcher(g, vocab, {2})
    doc = '{"name": "Zo\\u00e9 \\"Z\\" 12", "age": -12, "tags": ["a"], "score": 2.5e3}'
    ids = smol_tokenizer.encode(doc, add_special_tokens=False)
    assert smol_tokenizer.decode(ids) == doc
    special = vocab.special  # never allowed: skip_special_tokens would drop them from the text
    assert set(smol_tokenizer.all_special_ids) <= special and len(special) > 3
    for n in sorted({0, 1, 3, 5, 7, len(ids) // 2, len(ids) - 2, len(ids)}):
        st = m.state_after(ids[:n])
        mask = m.mask(st)
        brute = [i not in special and bool(b) and bool(g.advance(st, b)) for i, b in enumerate(vocab.tokens)]
        brute[2] = g.can_end(st)
        assert mask.tolist() == brute, n
        assert n == len(ids) or mask[ids[n]]
    assert m.mask(m.state_after(ids)).sum() == 1  # a finished document may only stop
    # a regex over characters, multi-byte ones included
    g = Grammar.regex(r"[a-zé]+ (\d{2}|ü+)")
    m = GrammarMatcher(g, vocab, {2})
    ids = smol_tokenizer.encode("cafés üü", add_special_tokens=False)
    for n in range(len(ids) + 1):
        st = m.state_after(ids[:n])
        brute = [i not in special and bool(b) and bool(g.advance(st, b)) for i, b in enumerate(vocab.tokens)]
        brute[2] = g.can_end(st)
        assert m.mask(st).tolist() == brute, n


def test_random_walks_never_reach_a_dead_end(smol_tokenizer: Any) -> None:
    """Whatever allowed tokens a sampler picks, the grammar always offers a way on (or the stop token where the
    document is whole): e.g. no lead byte of a multi-byte character the pattern cannot finish."""
    import random

    vocab = TokenVocab.from_tokenizer(smol_tokenizer, VOCAB)
    rng = random.Random(0)
    for g in (Grammar.json_schema(BOUNDED), Grammar.regex(WORDS), Grammar.regex(r"[^a-z]\w{2}\s?\d+")):
        m = GrammarMatcher(g, vocab, {2})
        for _ in range(12):
            st = g.initial
            for _ in range(40):
                mask = m.mask(st)
                allowed = [int(i) for i in mask.nonzero()[0] if i != 2]
                assert allowed or g.can_end(st), st
                if not allowed:
                    break
                st = m.advance(st, rng.choice(allowed))
                assert st


# --------------------------------------------------------------------------- engine
PROMPTS = ["The capital of France is", "Hello there", "a", "1 2 3 4"]


@pytest.fixture(scope="module")
def plain_llm(tiny_qwen3_dir: str) -> LLM:
    return LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=4)


def _texts(llm: LLM, params: SamplingParams) -> list[list[Any]]:
    return [[c for c in o.outputs] for o in llm.generate(PROMPTS, params)]


def test_engine_outputs_are_valid(plain_llm: LLM) -> None:
    so = StructuredOutputsParams(json=BOUNDED)
    greedy = SamplingParams(temperature=0, max_tokens=160, structured_outputs=so)
    sampled = SamplingParams(temperature=1.0, seed=3, n=2, max_tokens=160, structured_outputs=so)
    for params in (greedy, sampled):
        for outs in _texts(plain_llm, params):
            for c in outs:
                assert c.finish_reason == "stop", c.text
                jsonschema.validate(json.loads(c.text), BOUNDED)
    choice = SamplingParams(
        temperature=1.0,
        seed=0,
        n=3,
        max_tokens=8,
        structured_outputs=StructuredOutputsParams(choice=["yes", "no", "maybe so"]),
    )
    seen = {c.text for outs in _texts(plain_llm, choice) for c in outs}
    assert seen <= {"yes", "no", "maybe so"} and len(seen) >= 2
    # a whole-output regex (Python's re is the oracle)
    rx = SamplingParams(
        temperature=1.0, seed=1, n=2, max_tokens=32, structured_outputs=StructuredOutputsParams(regex=WORDS)
    )
    for outs in _texts(plain_llm, rx):
        for c in outs:
            assert c.finish_reason == "stop" and re.fullmatch(WORDS, c.text), c.text
    # without the constraint the same model writes no JSON
    free = _texts(plain_llm, SamplingParams(temperature=0, max_tokens=16))
    assert not any(c.text.lstrip().startswith("{") for outs in free for c in outs)
    # vLLM's disable_any_whitespace: no whitespace outside strings (BOUNDED has none inside)
    so = StructuredOutputsParams(json=BOUNDED, disable_any_whitespace=True)
    for outs in _texts(plain_llm, SamplingParams(temperature=0, max_tokens=60, structured_outputs=so)):
        text = outs[0].text
        assert outs[0].finish_reason == "stop" and not any(c in text for c in " \n\t\r"), text
        jsonschema.validate(json.loads(text), BOUNDED)
    # compiled grammars are shared by requests with the same schema, never by schemas that differ in key order
    xy = {"x": {"type": "boolean"}, "y": {"type": "boolean"}}
    for props in (xy, dict(reversed(xy.items()))):
        schema = {"type": "object", "properties": props, "required": ["x", "y"]}
        sp = SamplingParams(
            temperature=0, max_tokens=120, structured_outputs=StructuredOutputsParams(json=schema)
        )
        assert list(json.loads(plain_llm.generate(["a"], sp)[0].outputs[0].text)) == list(props)
    # the engine keeps serving after a bad request; no KV blocks leak
    with pytest.raises(RequestValidationError, match="minimum"):
        plain_llm.generate(
            ["x"],
            SamplingParams(
                structured_outputs=StructuredOutputsParams(json={"type": "integer", "minimum": 0})
            ),
        )
    assert plain_llm.get_metrics()["num_free_blocks"] == plain_llm.get_metrics()["num_gpu_blocks"]


def test_structured_outputs_params_validation() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(json={}, choice=["a"])
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="grammar is not supported"):
        StructuredOutputsParams(grammar="root ::= 'a'")


@pytest.mark.parametrize(
    "spec",
    [
        {"method": "dflash", "num_speculative_tokens": 4},
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
        {"method": "draft_model", "num_speculative_tokens": 3},
    ],
    ids=["dflash", "ngram", "draft_model"],
)
def test_speculative_decoding_is_lossless_under_the_constraint(
    spec: dict[str, Any], plain_llm: LLM, tiny_qwen3_dir: str, tmp_path_factory: Any
) -> None:
    """Drafts are proposed without the grammar; each verify row is masked by the state after the drafts before it,
    so the committed tokens equal constrained plain decoding's (and drafts the grammar rejects are rejected)."""
    spec = dict(spec)
    if spec["method"] == "dflash":
        spec["model"] = make_dflash(tmp_path_factory.mktemp("so_dflash"), 64, 4, VOCAB, layer_ids=[0, 2])
    elif spec["method"] == "draft_model":
        spec["model"] = (
            tiny_qwen3_dir  # the target as its own draft: its unconstrained picks, right in strings
        )
    params = SamplingParams(
        temperature=0, max_tokens=64, structured_outputs=StructuredOutputsParams(json=PERSON)
    )
    want = [o.outputs[0].token_ids for o in plain_llm.generate(PROMPTS, params)]
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=4, speculative_config=spec)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    assert got == want
    m = llm.get_metrics()
    assert m["spec_decode_num_drafts"] > 0
    if spec["method"] != "dflash":  # the random DFlash drafter is never right; these are
        assert m["spec_decode_num_accepted_tokens"] > 0


# --------------------------------------------------------------------------- server
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "set_light",
            "parameters": {
                "type": "object",
                "properties": {"on": {"type": "boolean"}, "color": {"enum": ["red", "blue"]}},
                "required": ["on", "color"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"enum": ["UTC", "CET"]}},
                "required": ["tz"],
            },
        },
    },
]


@pytest.fixture(scope="module")
def client(tiny_llama_dir: str) -> Iterator[openai.OpenAI]:
    yield from tiny_openai_client(tiny_llama_dir)


def _chat(client: openai.OpenAI, stream: bool = False, **kw: Any) -> Any:
    kw = {"max_tokens": 160, "temperature": 0, **kw}
    return client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Turn on the light."}], stream=stream, **kw
    )


def test_server_response_format_and_vllm_fields(client: openai.OpenAI) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "light", "schema": BOUNDED, "strict": True}}
    r = _chat(client, response_format=rf)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), BOUNDED)
    # streamed: the same text
    text = "".join(
        ch.choices[0].delta.content or ""
        for ch in _chat(client, stream=True, response_format=rf)
        if ch.choices
    )
    assert text == r.choices[0].message.content
    # vLLM's structured_outputs and guided_* fields, on chat and on completions
    assert (
        _chat(client, extra_body={"structured_outputs": {"json": BOUNDED}}).choices[0].message.content == text
    )
    assert _chat(client, extra_body={"guided_json": json.dumps(BOUNDED)}).choices[0].message.content == text
    compact = _chat(
        client, extra_body={"structured_outputs": {"json": BOUNDED, "disable_any_whitespace": True}}
    )
    assert json.loads(compact.choices[0].message.content) and " " not in compact.choices[0].message.content
    c = client.completions.create(
        model="tiny",
        prompt="Answer:",
        max_tokens=8,
        temperature=0,
        extra_body={"guided_choice": ["left", "right"]},
    )
    assert c.choices[0].text in ("left", "right")
    c = client.completions.create(
        model="tiny",
        prompt="Answer:",
        max_tokens=8,
        temperature=0,
        extra_body={"structured_outputs": {"choice": ["up", "down"]}},
    )
    assert c.choices[0].text in ("up", "down")
    c = client.completions.create(
        model="tiny", prompt="Answer:", max_tokens=16, temperature=0, extra_body={"guided_regex": WORDS}
    )
    assert re.fullmatch(WORDS, c.choices[0].text) and c.choices[0].finish_reason == "stop"
    r = _chat(client, max_tokens=24, response_format={"type": "json_object"})
    assert r.choices[0].message.content.lstrip().startswith("{")


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
        ({"response_format": {"type": "xml"}}, "type must be"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "string", "maxLength": 3}},
                }
            },
            "maxLength",
        ),
        ({"extra_body": {"guided_regex": "(?=a)b"}}, "assert is not supported"),
        ({"extra_body": {"guided_grammar": "root ::= 'a'"}}, "grammar is not supported"),
        ({"extra_body": {"structured_outputs": {"json": {}, "choice": ["a"]}}}, "exactly one"),
        ({"extra_body": {"structured_outputs": {"jsn": {}}}}, "unknown field"),
        (
            {"response_format": {"type": "json_object"}, "extra_body": {"guided_choice": ["a"]}},
            "Only one kind",
        ),
        ({"tool_choice": "required"}, "tools` must be set"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "has not been passed",
        ),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "cannot be combined",
        ),
    ],
)
def test_server_bad_structured_requests_are_400(
    client: openai.OpenAI, kw: dict[str, Any], words: str
) -> None:
    with pytest.raises(openai.BadRequestError, match=words):
        _chat(client, **kw)
    assert _chat(client, max_tokens=4).choices[0].finish_reason == "length"  # the server carries on


def _check_calls(calls: list[Any]) -> None:
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert calls
    for c in calls:
        assert c.type == "function" and c.id
        jsonschema.validate(json.loads(c.function.arguments), by_name[c.function.name])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_server_named_and_required_tool_choice(client: openai.OpenAI, stream: bool) -> None:
    """vLLM's forced tool calls: the output is constrained to the call's JSON and returned as tool_calls with
    empty content; a named choice calls that function ("stop"), "required" one or more ("tool_calls")."""
    for choice, finish in (
        ({"type": "function", "function": {"name": "get_time"}}, "stop"),
        ("required", "tool_calls"),
    ):
        r = _chat(client, stream, tools=TOOLS, tool_choice=choice)
        if stream:
            calls, content, fin = [], "", None
            for ch in r:
                for c in ch.choices:
                    content += c.delta.content or ""
                    calls += c.delta.tool_calls or []
                    fin = c.finish_reason or fin
        else:
            calls, content, fin = (
                r.choices[0].message.tool_calls,
                r.choices[0].message.content,
                r.choices[0].finish_reason,
            )
        assert content == "" and fin == finish
        _check_calls(calls)
        if isinstance(choice, dict):
            assert [c.function.name for c in calls] == ["get_time"]
