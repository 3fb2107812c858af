"""vLLM ``serve`` flags pasted from ``vllm serve`` command lines: parsing, one-line exit-2 errors, and their effect on
a real server (``serve_main`` run end to end over a tiny engine, uvicorn's ``Server`` swapped for a recorder so the
app and its uvicorn config can be served from a thread and inspected)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from test_server import ServerThread, assert_error, openai_client, sse_events, tiny_engine

from specserve.server.cli_args import engine_config_from_args, parse_serve_args

MSGS = [{"role": "user", "content": "Hi"}]


# --------------------------------------------------------------------------- parsing


def test_new_flags_parse(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    key.write_text("k")
    cert.write_text("c")
    with caplog.at_level("WARNING"):
        args = parse_serve_args(
            [
                "m",
                "--max-logprobs",
                "-1",
                "--enable-chunked-prefill",
                "--kv-cache-dtype",
                "auto",
                "-q",
                "gguf",
                "-pp",
                "1",
                "--disable-frontend-multiprocessing",
                "--swap-space",
                "4",
                "--max-seq-len-to-capture",
                "8192",
                "--disable-custom-all-reduce",
                "--allowed-origins",
                '["http://a.example", "http://b.example"]',
                "--allowed-methods",
                '["GET", "POST"]',
                "--allowed-headers",
                '["x-api"]',
                "--allow-credentials",
                "--root-path",
                "/api",
                "--ssl-keyfile",
                str(key),
                "--ssl-certfile",
                str(cert),
                "--response-role",
                "bot",
                "--override-generation-config",
                '{"temperature": 0.5, "max_new_tokens": 7, "repetition_penalty": 1.1, "do_sample": true}',
            ]
        )
    assert args.max_logprobs == -1 and args.enable_chunked_prefill is True and args.quantization == "gguf"
    assert args.allowed_origins == ["http://a.example", "http://b.example"]
    assert args.allowed_methods == ["GET", "POST"] and args.allowed_headers == ["x-api"]
    assert args.allow_credentials and args.root_path == "/api" and args.response_role == "bot"
    assert (args.ssl_keyfile, args.ssl_certfile) == (str(key), str(cert))
    # max_new_tokens (generation_config's name) is the request's max_tokens; other keys are ignored, with a warning
    assert args.override_generation_config == {"temperature": 0.5, "max_tokens": 7, "repetition_penalty": 1.1}
    assert "do_sample" in caplog.text and "chunked" not in caplog.text
    engine_config_from_args(args)  # the no-op flags don't reach EngineConfig
    defaults = parse_serve_args(["m"])
    assert defaults.max_logprobs == 20 and defaults.response_role == "assistant"
    assert defaults.allowed_origins == defaults.allowed_methods == defaults.allowed_headers == ["*"]
    assert not defaults.allow_credentials and defaults.root_path is None
    assert defaults.override_generation_config is None and defaults.kv_cache_dtype == "auto"
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert parse_serve_args(["m", "--no-enable-chunked-prefill"]).enable_chunked_prefill is False
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "--no-enable-chunked-prefill has no effect" in warnings[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype fp8: the KV cache has the model's dtype"),
        (["--kv-cache-dtype", "fp8_e5m2"], "only 'auto' is supported"),
        (["--kv-cache-dtype", "int4"], "argument --kv-cache-dtype: invalid choice"),
        (["-q", "awq"], "--quantization awq: specserve loads bf16/fp16/fp32 checkpoints and GGUF files"),
        (["--quantization", "fp8"], "--quantization fp8"),
        (["-pp", "2"], "--pipeline-parallel-size 2: specserve runs on one device"),
        (["--pipeline-parallel-size", "x"], "--pipeline-parallel-size"),
        (["--max-logprobs", "-2"], "--max-logprobs"),
        (["--max-logprobs", "many"], "--max-logprobs"),
        (["--allowed-origins", "http://a.example"], "--allowed-origins: invalid JSON"),
        (["--allowed-headers", '{"a": 1}'], "--allowed-headers: expected a JSON list of strings"),
        (["--override-generation-config", "{temperature: 1}"], "--override-generation-config: invalid JSON"),
        (["--override-generation-config", "[1]"], "expected a JSON object"),
        (["--override-generation-config", '{"temperature": -1}'], "temperature must be non-negative"),
        (["--override-generation-config", '{"max_new_tokens": "x"}'], "max_tokens"),
        (["--override-generation-config", '{"top_p": null}'], "top_p must be a number"),
        (["--ssl-keyfile", "/nonexistent/k.pem", "--ssl-certfile", "/nonexistent/c.pem"], "no such file"),
        (["--ssl-keyfile", __file__], "--ssl-keyfile needs --ssl-certfile"),
        (["--swap-space", "lots"], "--swap-space"),
    ],
)
def test_bad_values_exit_2_one_line(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert_exit_2_one_line(args, needle, capsys)


def assert_exit_2_one_line(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``specserve serve some/model ARGS`` exits 2 with one stderr line: the error, naming ``needle``."""
    from specserve.server.api_server import serve_main

    assert serve_main(["some/model", *args]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("specserve serve: error:") and needle in lines[0], lines[0]


def test_bad_max_n_sequences_env_fails_at_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from specserve.server.api_server import serve_main

    monkeypatch.setenv("VLLM_MAX_N_SEQUENCES", "lots")
    assert serve_main(["some/model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "specserve serve: error: VLLM_MAX_N_SEQUENCES must be an integer, got 'lots'."


# --------------------------------------------------------------------------- over HTTP


class _Borrowed:
    """The module's engine as serve_main's AsyncLLM: everything delegated, except that shutdown is left to us."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def shutdown(self) -> None:
        pass


engine_configs: list[Any] = []  # the EngineConfig each run_serve_main built


def run_serve_main(engine: Any, argv: list[str]) -> Any:
    """``serve_main(argv)`` over ``engine``; returns the ``uvicorn.Config`` it would have served."""
    import uvicorn

    from specserve.engine import async_engine
    from specserve.server.api_server import serve_main

    seen: list[Any] = []

    def borrow(config: Any) -> _Borrowed:
        engine_configs.append(config)
        return _Borrowed(engine)

    class Recorder:
        def __init__(self, config: Any) -> None:
            seen.append(config)
            self.started = True

        def run(self) -> None:
            pass

    with pytest.MonkeyPatch.context() as m:
        m.setattr(async_engine, "AsyncLLM", borrow)
        m.setattr(uvicorn, "Server", Recorder)
        assert serve_main(argv) == 0
    return seen[0]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: str) -> Iterator[Any]:
    eng = tiny_engine(tiny_llama_dir, num_gpu_blocks=64)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def served(engine: Any, tiny_llama_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """serve_main with the new flags, its app live on a thread: (uvicorn config, base url)."""
    tls = tmp_path_factory.mktemp("tls")
    (tls / "k.pem").write_text("k")
    (tls / "c.pem").write_text("c")
    config = run_serve_main(
        engine,
        [
            tiny_llama_dir,
            "--served-model-name",
            "tiny",
            "--max-logprobs",
            "2",
            "--response-role",
            "bot",
            "--override-generation-config",
            '{"max_new_tokens": 3, "temperature": 0}',
            "--allowed-origins",
            '["http://a.example"]',
            "--allow-credentials",
            "--root-path",
            "/api",
            "--ssl-keyfile",
            str(tls / "k.pem"),
            "--ssl-certfile",
            str(tls / "c.pem"),
            "--no-enable-chunked-prefill",
            "--disable-frontend-multiprocessing",
            "--swap-space",
            "4",
        ],
    )
    srv = ServerThread(config.app)
    srv.server.config.root_path = config.root_path  # what uvicorn would serve it with
    with srv:
        yield config, srv.url


@pytest.fixture(scope="module")
def client(served: Any) -> openai.OpenAI:
    return openai_client(served[1])


def test_uvicorn_config(served: Any) -> None:
    config, _ = served
    assert config.root_path == "/api"
    assert config.ssl_keyfile.endswith("k.pem") and config.ssl_certfile.endswith("c.pem")


def test_max_logprobs(served: Any, client: openai.OpenAI) -> None:
    url = served[1]
    base = {"model": "tiny", "prompt": "Numbers:", "max_tokens": 2, "temperature": 0}
    err = assert_error(
        httpx.post(f"{url}/v1/completions", json={**base, "logprobs": 3}), 400, "BadRequestError", "logprobs"
    )
    assert err["message"] == "logprobs must be an integer in [0, 2], got 3."
    assert_error(
        httpx.post(f"{url}/v1/completions", json={**base, "prompt_logprobs": 3}),
        400,
        "BadRequestError",
        "prompt_logprobs",
    )
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tiny", messages=MSGS, logprobs=True, top_logprobs=3)  # type: ignore[arg-type]
    assert exc.value.status_code == 400 and "top_logprobs" in str(exc.value)
    out = client.completions.create(model="tiny", prompt="Numbers:", max_tokens=2, temperature=0, logprobs=2)
    lp = out.choices[0].logprobs
    assert lp is not None and lp.top_logprobs is not None
    assert len(lp.tokens or []) == 2 and all(1 <= len(t) <= 3 for t in lp.top_logprobs)
    chat = client.chat.completions.create(model="tiny", messages=MSGS, logprobs=True, top_logprobs=2)  # type: ignore[arg-type]
    assert chat.choices[0].logprobs is not None
    assert [len(c.top_logprobs) for c in chat.choices[0].logprobs.content or []] == [2, 2, 2]


def test_max_logprobs_above_20(engine: Any) -> None:
    """The engine returns more than 20 logprobs when --max-logprobs allows them (-1: the vocabulary)."""
    config = run_serve_main(engine, ["m", "--served-model-name", "tiny", "--max-logprobs", "-1"])
    assert engine_configs[-1].max_logprobs == -1  # the engine's own bound too
    with pytest.MonkeyPatch.context() as m, ServerThread(config.app) as srv:
        m.setattr(engine.config, "max_logprobs", -1)  # the borrowed engine, as serve_main would build it
        c = openai_client(srv.url)
        chat = c.chat.completions.create(
            model="tiny",
            messages=MSGS,
            max_tokens=2,
            logprobs=True,
            top_logprobs=25,  # type: ignore[arg-type]
        )
        assert chat.choices[0].logprobs is not None
        assert [len(e.top_logprobs) for e in chat.choices[0].logprobs.content or []] == [25, 25]
        r = httpx.post(
            f"{srv.url}/v1/completions",
            json={"model": "tiny", "prompt": "x", "max_tokens": 1, "logprobs": 10**6},
        )
        assert_error(r, 400, "BadRequestError", "logprobs")


def test_response_role(served: Any, client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model="tiny", messages=MSGS)  # type: ignore[arg-type]
    assert out.choices[0].message.role == "bot"
    events = sse_events(
        f"{served[1]}/v1/chat/completions", {"model": "tiny", "messages": MSGS, "stream": True}
    )
    assert events[0]["choices"][0]["delta"] == {"role": "bot", "content": ""}
    assert all("role" not in e["choices"][0]["delta"] for e in events[1:-1] if e["choices"])
    # as vLLM: a continued final message keeps its own role
    cont = client.chat.completions.create(
        model="tiny",
        messages=[*MSGS, {"role": "assistant", "content": "Hello"}],  # type: ignore[list-item]
        extra_body={"add_generation_prompt": False, "continue_final_message": True},
    )
    assert cont.choices[0].message.role == "assistant"


def test_override_generation_config(client: openai.OpenAI) -> None:
    """{"max_new_tokens": 3, "temperature": 0}: a chat request setting neither gets 3 greedy tokens."""
    kw: dict[str, Any] = {"model": "tiny", "messages": MSGS, "extra_body": {"ignore_eos": True}}
    out = client.chat.completions.create(**kw)
    assert out.usage is not None and out.usage.completion_tokens == 3
    greedy = client.chat.completions.create(**kw, max_tokens=3, temperature=0)
    assert out.choices[0].message.content == greedy.choices[0].message.content
    # the request's own values win over the defaults
    longer = client.chat.completions.create(**kw, max_tokens=5)
    assert longer.usage is not None and longer.usage.completion_tokens == 5


def test_cors_and_root_path(served: Any) -> None:
    url = served[1]
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    r = httpx.options(f"{url}/v1/chat/completions", headers={"Origin": "http://a.example", **preflight})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://a.example"
    assert r.headers["access-control-allow-credentials"] == "true"
    r = httpx.options(f"{url}/v1/chat/completions", headers={"Origin": "http://b.example", **preflight})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    r = httpx.get(f"{url}/v1/models", headers={"Origin": "http://a.example"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://a.example"
    # --root-path: requests come with the proxy's prefix stripped; the app knows it (OpenAPI servers)
    assert httpx.get(f"{url}/openapi.json").json()["servers"] == [{"url": "/api"}]
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "tiny"


def test_default_cors_is_open(engine: Any) -> None:
    import asyncio

    from specserve.server.api_server import build_app

    async def preflight() -> httpx.Response:
        transport = httpx.ASGITransport(app=build_app(engine, "tiny"))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            headers = {"Origin": "http://any.example", "Access-Control-Request-Method": "GET"}
            return await c.options("/v1/models", headers=headers)

    r = asyncio.run(preflight())
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
