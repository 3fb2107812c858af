"""``specserve chat`` / ``specserve complete`` (vLLM's CLI clients) against a live server on a tiny random Llama,
answers checked against the same requests made with the ``openai`` client; the conversation carried across
turns; API keys; server and connection errors as one line."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from test_server import MAX_MODEL_LEN, ServerThread, free_port, openai_client, tiny_engine

from specserve.cli import main

NAME = "tiny"
KEY = "sk-cli-test"


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: str) -> Iterator[Any]:
    eng = tiny_engine(tiny_llama_dir, num_gpu_blocks=64)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def url(engine: Any) -> Iterator[str]:
    """Greedy by default (the generation-config override), so the CLI's answers can be compared."""
    from specserve.server.api_server import build_app

    app = build_app(engine, NAME, generation_overrides={"temperature": 0.0, "max_tokens": 12})
    with ServerThread(app) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def auth_url(engine: Any) -> Iterator[str]:
    from specserve.server.api_server import build_app

    app = build_app(engine, NAME, api_key=KEY, generation_overrides={"temperature": 0.0, "max_tokens": 12})
    with ServerThread(app) as srv:
        yield srv.url


def _cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _chat(url: str, messages: list[dict[str, str]], key: str = "unused") -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)
    out = client.chat.completions.create(model=NAME, messages=messages)  # type: ignore[arg-type]
    return out.choices[0].message.content or ""


def test_chat_quick_equals_the_openai_client(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _cli(capsys, ["chat", "--url", f"{url}/v1", "-q", "Name three colours.", "--stats"])
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == f"Using model: {NAME}"  # the first model of /v1/models
    want = _chat(url, [{"role": "user", "content": "Name three colours."}])
    assert want and out.startswith(f"Using model: {NAME}\n{want}\n")
    assert lines[-1].startswith("[prompt tokens: ") and "completion tokens: 12," in lines[-1]


def test_chat_interactive_keeps_the_conversation(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello there.\nAnd again?\n"))
    argv = ["chat", "--url", f"{url}/v1", "--model-name", NAME, "--system-prompt", "Be brief."]
    rc, out, err = _cli(capsys, argv)
    assert rc == 0, err
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there."}]
    first = _chat(url, conv)
    second = _chat(
        url, [*conv, {"role": "assistant", "content": first}, {"role": "user", "content": "And again?"}]
    )
    alone = _chat(
        url, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "And again?"}]
    )
    assert second != alone  # the history changes the answer, so the check below sees it
    assert out == (
        f"Using model: {NAME}\nPlease enter a message for the chat model:\n> {first}\n> {second}\n> "
    )


def test_complete_quick_interactive_and_max_tokens(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rc, out, err = _cli(capsys, ["complete", "--url", f"{url}/v1", "-q", "The sky is", "--max-tokens", "5"])
    assert rc == 0, err
    client = openai_client(url)
    want = client.completions.create(model=NAME, prompt="The sky is", max_tokens=5).choices[0].text
    assert want and out == f"Using model: {NAME}\n{want}\n"
    # interactively: one completion per line read, each on its own
    monkeypatch.setattr("sys.stdin", io.StringIO("The sky is\nOnce upon\n"))
    rc, out, err = _cli(capsys, ["complete", "--url", f"{url}/v1", "--max-tokens", "5"])
    other = client.completions.create(model=NAME, prompt="Once upon", max_tokens=5).choices[0].text
    assert rc == 0, err
    assert out == f"Using model: {NAME}\nPlease enter prompt to complete:\n> {want}\n> {other}\n> "


def test_errors_are_one_line(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # quick mode: the server's 404 / 400 end the command with exit 1
    rc, _, err = _cli(capsys, ["chat", "--url", f"{url}/v1", "--model-name", "nope", "-q", "hi"])
    assert rc == 1 and err == "specserve chat: error: HTTP 404: The model `nope` does not exist.\n"
    rc, _, err = _cli(
        capsys, ["complete", "--url", f"{url}/v1", "-q", "hi", "--max-tokens", str(MAX_MODEL_LEN + 1)]
    )
    assert rc == 1 and "HTTP 400: max_tokens=" in err and len(err.splitlines()) == 1
    rc, _, err = _cli(capsys, ["chat", "--url", f"http://127.0.0.1:{free_port()}/v1", "-q", "hi"])
    assert rc == 1 and err.startswith("specserve chat: error: cannot reach ") and len(err.splitlines()) == 1
    rc, _, err = _cli(capsys, ["complete", "--max-tokens", "0", "-q", "hi"])
    assert rc == 2 and "--max-tokens must be at least 1" in err
    # interactively a failed turn is dropped and the next one is answered as if it had not happened
    long = " ".join(["word"] * (MAX_MODEL_LEN + 10))
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{long}\nHello there.\n"))
    rc, out, err = _cli(capsys, ["chat", "--url", f"{url}/v1"])
    assert rc == 0 and "maximum context length" in err and len(err.splitlines()) == 1
    want = _chat(url, [{"role": "user", "content": "Hello there."}])
    assert out.endswith(f"> > {want}\n> ")


def test_api_key_flag_and_env(
    auth_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    rc, _, err = _cli(capsys, ["chat", "--url", f"{auth_url}/v1", "-q", "hi"])
    assert rc == 1 and "HTTP 401" in err
    want = _chat(auth_url, [{"role": "user", "content": "hi"}], key=KEY)
    rc, out, err = _cli(capsys, ["chat", "--url", f"{auth_url}/v1", "-q", "hi", "--api-key", KEY])
    assert rc == 0 and out.endswith(f"\n{want}\n"), err
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    rc, out, err = _cli(capsys, ["chat", "--url", f"{auth_url}/v1", "-q", "hi"])
    assert rc == 0 and out.endswith(f"\n{want}\n"), err
    rc, _, err = _cli(capsys, ["chat", "--url", f"{auth_url}/v1", "-q", "hi", "--api-key", "wrong"])
    assert rc == 1 and "HTTP 401" in err  # the flag overrides the environment
