"""More of ``vllm serve``'s flags and request fields: parsing (one-line exit-2 errors), what reaches the engine's
config, and their effect through a real server (``serve_main`` over a tiny engine, its app served on a thread)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from test_serve_flags import assert_exit_2_one_line, engine_configs, run_serve_main
from test_server import ServerThread, assert_error, openai_client, sse_events, tiny_engine

from specserve.server.api_server import build_app, template_content_format
from specserve.server.cli_args import engine_config_from_args, parse_serve_args

MSGS = [{"role": "user", "content": "Hi"}]
# longer than three 16-token blocks, so a repeat of it is served from the prefix cache
LONG = (
    "Count with me: one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, thirteen, fourteen, "
    "fifteen, sixteen, seventeen, eighteen, nineteen, twenty, twenty-one, twenty-two, twenty-three, twenty-four."
)


# --------------------------------------------------------------------------- parsing


def test_flags_parse_and_reach_the_engine_config(caplog: pytest.LogCaptureFixture) -> None:
    argv = [
        "m",
        "--tokenizer-mode",
        "slow",
        "--config-format",
        "hf",
        "--hf-overrides",
        '{"rope_theta": 5000.0}',
        "--scheduling-policy",
        "priority",
        "-dp",
        "1",
        "--api-server-count",
        "1",
        "--cpu-offload-gb",
        "0",
        "--return-tokens-as-token-ids",
        "--enable-prompt-tokens-details",
        "--enable-force-include-usage",
        "--disable-fastapi-docs",
        "--chat-template-content-format",
        "openai",
        "--uds",
        "/tmp/specserve.sock",
        "-O3",
        "--compilation-config",
        '{"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4, 8, 16], "splitting_ops": []}',
    ]
    with caplog.at_level("WARNING"):
        args = parse_serve_args(argv)
    assert "splitting_ops ignored" in caplog.text
    assert args.return_tokens_as_token_ids and args.enable_prompt_tokens_details
    assert args.enable_force_include_usage and args.disable_fastapi_docs
    assert args.chat_template_content_format == "openai" and args.uds == "/tmp/specserve.sock"
    assert not args.enforce_eager and args.max_cudagraph_capture_size == 16
    cfg = engine_config_from_args(args)
    assert cfg.tokenizer_mode == "slow" and cfg.hf_overrides == {"rope_theta": 5000.0}
    assert (
        cfg.scheduling_policy == "priority" and cfg.max_cudagraph_capture_size == 16 and not cfg.enforce_eager
    )
    defaults = engine_config_from_args(parse_serve_args(["m"]))
    assert defaults.tokenizer_mode == "auto" and defaults.hf_overrides is None
    assert defaults.scheduling_policy == "fcfs" and defaults.max_cudagraph_capture_size is None


@pytest.mark.parametrize(
    ("argv", "eager", "cap"),
    [
        (["-O0"], True, None),
        (["-O", "2"], False, None),
        (["-cc", '{"cudagraph_mode": "NONE"}'], True, None),
        (["-cc", '{"cudagraph_mode": "none"}', "-O3"], True, None),
        (["-O0", "-cc", '{"cudagraph_mode": "FULL"}'], False, None),  # an explicit mode wins over the level
        (["--compilation-config.cudagraph_mode", "NONE"], True, None),
        (["-cc.cudagraph_capture_sizes=[1,2,4,8]"], False, 8),
        (["--compilation_config.max_cudagraph_capture_size", "24"], False, 24),
        (["-cc", '{"max_cudagraph_capture_size": 32, "cudagraph_capture_sizes": [1, 64]}'], False, 32),
        (["--cuda-graph-sizes", "1", "2", "48"], False, 48),
        (["--max-cudagraph-capture-size", "8", "-cc", '{"max_cudagraph_capture_size": 32}'], False, 8),
        (["--compilation-config", "3"], False, None),  # the older form: a bare level
    ],
)
def test_compilation_config(argv: list[str], eager: bool, cap: int | None) -> None:
    args = parse_serve_args(["m", *argv])
    cfg = engine_config_from_args(args)
    assert (cfg.enforce_eager, cfg.max_cudagraph_capture_size) == (eager, cap)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-dp", "2"], "--data-parallel-size 2: specserve runs one engine"),
        (["--api-server-count", "4"], "--api-server-count 4: specserve runs one API server"),
        (["--cpu-offload-gb", "8"], "--cpu-offload-gb 8: specserve keeps all weights on the device"),
        (["--cpu-offload-gb", "-1"], "--cpu-offload-gb: must be at least 0"),
        (["--tokenizer-mode", "mistral"], "--tokenizer-mode mistral: not supported"),
        (["--tokenizer-mode", "fast"], "argument --tokenizer-mode: invalid choice"),
        (["--config-format", "mistral"], "--config-format mistral: not supported"),
        (["--hf-overrides", "[1]"], "--hf-overrides: expected a JSON object"),
        (["--hf-overrides", "{rope: 1}"], "--hf-overrides: invalid JSON"),
        (["--scheduling-policy", "lifo"], "argument --scheduling-policy: invalid choice"),
        (["-O", "5"], "invalid choice: 5"),
        (["-cc", '{"cudagraph_mode": "SOMETIMES"}'], "cudagraph_mode 'SOMETIMES' is not one of NONE"),
        (
            ["-cc", '{"cudagraph_capture_sizes": [0, 8]}'],
            "cudagraph_capture_sizes must be a list of positive ints",
        ),
        (
            ["-cc", '{"max_cudagraph_capture_size": true}'],
            "max_cudagraph_capture_size must be a positive int",
        ),
        (["-cc", "[1, 2]"], "--compilation-config/-cc: expected a JSON object"),
        (["--max-cudagraph-capture-size", "0"], "must be at least 1"),
        (["--chat-template-content-format", "xml"], "invalid choice: 'xml'"),
    ],
)
def test_bad_values_exit_2_one_line(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert_exit_2_one_line(args, needle, capsys)


# --------------------------------------------------------------------------- chat template content format


LOOPS = "{% for m in messages %}{% for p in m['content'] %}[{{ p['text'] }}]{% endfor %}{% endfor %}"


@pytest.mark.parametrize(
    ("template", "fmt"),
    [
        (LOOPS, "openai"),
        (
            "{% for m in messages %}{% for p in m.content if p.type == 'text' %}{{ p.text }}{% endfor %}{% endfor %}",
            "openai",
        ),
        (
            "{% for m in messages %}{% set c = m['content'] %}{% for p in c %}{{ p.text }}{% endfor %}{% endfor %}",
            "openai",
        ),
        (
            "{% for m in messages %}{% for p in m.content | selectattr('type', 'eq', 'text') %}x{% endfor %}"
            "{% endfor %}",
            "openai",
        ),
        ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}", "string"),
        (
            "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% endif %}{% endfor %}",
            "string",
        ),
        ("{% for m in messages %", "string"),  # unparsable: the safe default
    ],
)
def test_template_content_format(template: str, fmt: str) -> None:
    assert template_content_format(template) == fmt


def test_the_bundled_tokenizers_template_takes_strings(engine: Any) -> None:
    assert template_content_format(engine.tokenizer.chat_template) == "string"


# --------------------------------------------------------------------------- over HTTP


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: str) -> Iterator[Any]:
    eng = tiny_engine(tiny_llama_dir, num_gpu_blocks=64)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def served(engine: Any, tiny_llama_dir: str) -> Iterator[tuple[Any, str]]:
    config = run_serve_main(
        engine,
        [
            tiny_llama_dir,
            "--served-model-name",
            "tiny",
            "--return-tokens-as-token-ids",
            "--enable-prompt-tokens-details",
            "--enable-force-include-usage",
            "--disable-fastapi-docs",
            "--uds",
            "/tmp/specserve-test.sock",
        ],
    )
    with ServerThread(config.app) as srv:
        yield config, srv.url


@pytest.fixture(scope="module")
def client(served: tuple[Any, str]) -> openai.OpenAI:
    return openai_client(served[1])


def test_uds_reaches_uvicorn(served: tuple[Any, str]) -> None:
    assert served[0].uds == "/tmp/specserve-test.sock"
    assert engine_configs[-1].model is not None


def test_tokens_as_token_ids(served: tuple[Any, str], client: openai.OpenAI, engine: Any) -> None:
    tok = engine.tokenizer
    kw: dict[str, Any] = {
        "model": "tiny",
        "prompt": "Numbers:",
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": 2,
    }
    ids = client.completions.create(**kw).choices[0]
    names = client.completions.create(**kw, extra_body={"return_tokens_as_token_ids": False}).choices[0]
    assert ids.text == names.text and ids.logprobs is not None and names.logprobs is not None
    tokens = ids.logprobs.tokens or []
    assert len(tokens) == 4 and all(t.startswith("token_id:") for t in tokens)
    token_ids = [int(t.split(":")[1]) for t in tokens]
    assert [tok.decode([t]) for t in token_ids] == names.logprobs.tokens
    assert ids.logprobs.text_offset == names.logprobs.text_offset  # offsets count the text, not the names
    assert ids.logprobs.token_logprobs == names.logprobs.token_logprobs
    for tops in ids.logprobs.top_logprobs or []:
        assert tops and all(k.startswith("token_id:") for k in tops)
    chat = client.chat.completions.create(
        model="tiny",
        messages=MSGS,
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,  # type: ignore[arg-type]
    )
    content = chat.choices[0].logprobs.content or []  # type: ignore[union-attr]
    assert len(content) == 3
    for c in content:
        tid = int(c.token.removeprefix("token_id:"))
        assert c.token == f"token_id:{tid}" and c.bytes == list(tok.decode([tid]).encode())
        assert [t.token.startswith("token_id:") for t in c.top_logprobs] == [True, True]


def test_prompt_tokens_details(client: openai.OpenAI, engine: Any) -> None:
    kw: dict[str, Any] = {"model": "tiny", "prompt": LONG, "max_tokens": 2, "temperature": 0}
    first = client.completions.create(**kw, extra_body={"truncate_prompt_tokens": 40})
    again = client.completions.create(**kw, extra_body={"truncate_prompt_tokens": 40})
    assert first.usage is not None and again.usage is not None
    assert first.usage.prompt_tokens == again.usage.prompt_tokens == 40
    assert first.usage.prompt_tokens_details is not None and again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # the first time nothing is cached
    assert cached == 32  # the two whole 16-token blocks of the 40 (the last token is always computed)
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": LONG}], max_tokens=1
    )
    chat2 = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": LONG}], max_tokens=1
    )
    assert (
        chat.usage is not None and chat2.usage is not None and chat2.usage.prompt_tokens_details is not None
    )
    hit = chat2.usage.prompt_tokens_details.cached_tokens
    assert hit is not None and 0 < hit < chat2.usage.prompt_tokens and hit % engine.config.block_size == 0


def test_force_include_usage(served: tuple[Any, str]) -> None:
    url = served[1]
    for path, body in (
        ("/v1/chat/completions", {"messages": MSGS}),
        ("/v1/completions", {"prompt": "Numbers:"}),
    ):
        base = {"model": "tiny", "max_tokens": 3, "temperature": 0, "stream": True, **body}
        for options in (None, {"include_usage": False}):
            events = sse_events(f"{url}{path}", {**base, "stream_options": options} if options else base)
            assert events[-1] == "[DONE]"
            last = events[-2]
            assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3
            assert set(last["usage"]["prompt_tokens_details"]) == {"cached_tokens"}
            assert all("usage" not in e for e in events[:-2])  # no per-chunk usage unless asked
        cont = sse_events(
            f"{url}{path}",
            {**base, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        )
        assert all(e.get("usage") for e in cont[:-1])


def test_docs_disabled(served: tuple[Any, str], engine: Any) -> None:
    url = served[1]
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(f"{url}{path}").status_code == 404
    assert httpx.get(f"{url}/v1/models").status_code == 200
    with ServerThread(build_app(engine, "tiny")) as srv:  # the default keeps them
        assert httpx.get(f"{srv.url}/openapi.json").status_code == 200
        assert httpx.get(f"{srv.url}/docs").status_code == 200


def test_truncate_prompt_tokens(served: tuple[Any, str], client: openai.OpenAI, engine: Any) -> None:
    url = served[1]
    ids = engine.tokenizer.encode(LONG)
    kw: dict[str, Any] = {"model": "tiny", "max_tokens": 4, "temperature": 0}
    cut = client.completions.create(**kw, prompt=LONG, extra_body={"truncate_prompt_tokens": 5})
    tail = client.completions.create(**kw, prompt=ids[-5:])
    assert cut.usage is not None and cut.usage.prompt_tokens == 5
    assert cut.choices[0].text == tail.choices[0].text
    whole = client.completions.create(**kw, prompt=LONG, extra_body={"truncate_prompt_tokens": -1})
    assert whole.usage is not None and whole.usage.prompt_tokens == len(ids)
    echo = client.completions.create(**kw, prompt=LONG, echo=True, extra_body={"truncate_prompt_tokens": 5})
    assert echo.choices[0].text == engine.tokenizer.decode(ids[-5:]) + cut.choices[0].text
    chat = client.chat.completions.create(
        **kw, messages=[{"role": "user", "content": LONG}], extra_body={"truncate_prompt_tokens": 7}
    )
    assert chat.usage is not None and chat.usage.prompt_tokens == 7
    max_len = int(engine.max_model_len)
    for value, needle in (
        (
            max_len + 1,
            f"truncate_prompt_tokens value ({max_len + 1}) is greater than max_model_len ({max_len})",
        ),
        (0, "truncate_prompt_tokens must be -1 or at least 1"),
        (-2, "truncate_prompt_tokens"),
    ):
        r = httpx.post(f"{url}/v1/completions", json={**kw, "prompt": LONG, "truncate_prompt_tokens": value})
        err = assert_error(r, 400, "BadRequestError", "truncate_prompt_tokens")
        assert needle in err["message"]


def test_content_format_over_tokenize(engine: Any) -> None:
    """--chat-template-content-format: what a content-looping template renders, through /tokenize."""

    def rendered(fmt: str, content: Any) -> str:
        with ServerThread(build_app(engine, "tiny", chat_template_content_format=fmt)) as srv:
            r = httpx.post(
                f"{srv.url}/tokenize",
                json={"messages": [{"role": "user", "content": content}], "chat_template": LOOPS},
            )
            assert r.status_code == 200, r.text
            return str(engine.tokenizer.decode(r.json()["tokens"]))

    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert rendered("auto", parts) == "[a][b]"  # the template loops over content: parts reach it
    assert rendered("openai", "Hi") == "[Hi]"  # a string becomes one text part
    assert rendered("string", parts) == "[][][]"  # "a\nb" iterated as characters: what the template gets


def test_priority_reaches_the_engine(served: tuple[Any, str], tiny_llama_dir: str) -> None:
    url = served[1]
    body = {"model": "tiny", "prompt": "Numbers:", "max_tokens": 2, "priority": 3}
    err = assert_error(httpx.post(f"{url}/v1/completions", json=body), 400, "BadRequestError")
    assert "priority scheduling is not enabled" in err["message"]
    chat = {"model": "tiny", "messages": MSGS, "max_tokens": 2, "priority": -1}
    assert_error(httpx.post(f"{url}/v1/chat/completions", json=chat), 400, "BadRequestError")
    assert httpx.post(f"{url}/v1/completions", json={**body, "priority": 0}).status_code == 200
    resp = {"model": "tiny", "input": "Hi", "max_output_tokens": 2, "priority": 2}
    err = assert_error(httpx.post(f"{url}/v1/responses", json=resp), 400, "BadRequestError")
    assert "priority scheduling is not enabled" in err["message"]
    eng = tiny_engine(tiny_llama_dir, num_gpu_blocks=64, scheduling_policy="priority")
    try:
        with ServerThread(build_app(eng, "tiny")) as srv:
            r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
            r = httpx.post(f"{srv.url}/v1/responses", json=resp, timeout=60)
            assert r.status_code == 200 and r.json()["status"] in ("completed", "incomplete")
    finally:
        eng.shutdown()


def test_offline_llm_takes_the_same_settings(tiny_llama_dir: str) -> None:
    """LLM(hf_overrides=..., tokenizer_mode=..., compilation_config=...) as vLLM's LLM."""
    from specserve import LLM

    llm = LLM(
        tiny_llama_dir,
        device="cpu",
        dtype="float32",
        num_gpu_blocks=16,
        max_model_len=64,
        hf_overrides={"max_position_embeddings": 640},
        tokenizer_mode="hf",
        compilation_config={"cudagraph_mode": "NONE", "cudagraph_capture_sizes": [1, 2, 4]},
    )
    assert llm.config.enforce_eager and llm.config.max_cudagraph_capture_size == 4
    assert llm.engine.checkpoint.hf_config.max_position_embeddings == 640
    with pytest.raises(ValueError, match="cudagraph_mode 'ALWAYS'"):
        LLM(tiny_llama_dir, device="cpu", compilation_config={"cudagraph_mode": "ALWAYS"})
    with pytest.raises(ValueError, match="compilation_config must be a dict or an int"):
        LLM(tiny_llama_dir, device="cpu", compilation_config="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "cmd",
    [
        ["generate"],
        ["eval-acceptance", "--dataset", "d.jsonl", "-sc", "{}"],
        ["bench", "serve"],
        ["bench", "latency"],
        ["bench", "throughput"],
        ["run-batch", "-i", "in.jsonl", "-o", "out.jsonl"],
        ["chat"],
        ["complete"],
        ["serve"],
        ["train", "dflash", "--target", "t", "--prompts", "p.jsonl", "--output", "o"],
    ],
)
def test_every_command_reports_a_bad_flag_in_one_line(
    cmd: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped flag: exit 2 and one line naming it (no usage dump), whatever the command."""
    from specserve.cli import main
    from specserve.errors import parse_exit_code

    try:
        rc = main([*cmd, "--no-such-flag"])
    except SystemExit as e:
        rc = parse_exit_code(e)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, lines
    assert "error" in lines[0] and "--no-such-flag" in lines[0], lines[0]


def test_short_dotted_speculative_keys() -> None:
    """``-sc.KEY VALUE`` as ``--speculative-config.KEY VALUE`` (vLLM's short form), merged over ``-sc`` JSON."""
    args = parse_serve_args(
        ["m", "-sc", '{"method": "ngram"}', "-sc.num_speculative_tokens", "3", "-sc.prompt_lookup_max=4"]
    )
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
