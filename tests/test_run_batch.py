"""``specserve run-batch`` (vLLM's run-batch, OpenAI's batch format) on a tiny random Llama: the output lines in
input order with the bodies a live server returns for the same requests, refused requests kept as error lines,
and malformed input files refused before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_server import MAX_MODEL_LEN, ServerThread, openai_client, tiny_engine

from specserve.cli import main
from specserve.run_batch import BatchInputError, read_requests

NAME = "tiny"
CHAT = {
    "model": NAME,
    "messages": [{"role": "user", "content": "Say something."}],
    "max_tokens": 9,
    "temperature": 0,
}
COMP = {"model": NAME, "prompt": "Once upon a time", "max_tokens": 7, "temperature": 0}


def _req(cid: str, url: str, body: dict[str, Any]) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}) + "\n"


def _argv(model: str, inp: Path, out: str) -> list[str]:
    return [
        "run-batch", "-i", str(inp), "-o", out, "--model", model, "--served-model-name", NAME, "--device", "cpu",
        "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "1", "--disable-tqdm",
    ]  # fmt: skip


def test_outputs_match_the_server(
    tiny_llama_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text(
        _req("chat-1", "/v1/chat/completions", CHAT)
        + "\n"  # blank lines are skipped
        + _req("comp-1", "/v1/completions", COMP)
        + _req("emb", "/v1/embeddings", {"model": NAME, "input": "x"})
        + _req("bad-model", "/v1/chat/completions", {**CHAT, "model": "nope"})
        + _req("too-long", "/v1/completions", {**COMP, "max_tokens": MAX_MODEL_LEN + 1})
        + _req("stream", "/v1/completions", {**COMP, "stream": True})
    )
    out = tmp_path / "out.jsonl"
    assert main(_argv(tiny_llama_dir, inp, str(out))) == 0
    err = capsys.readouterr().err
    assert "2 of 6 requests succeeded" in err
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == ["chat-1", "comp-1", "emb", "bad-model", "too-long", "stream"]
    assert len({x["id"] for x in lines}) == 6 and all(x["id"].startswith("specserve-") for x in lines)
    status = {x["custom_id"]: x["response"]["status_code"] for x in lines}
    assert status == {
        "chat-1": 200,
        "comp-1": 200,
        "emb": 400,
        "bad-model": 404,
        "too-long": 400,
        "stream": 400,
    }
    by = {x["custom_id"]: x for x in lines}
    for cid in ("emb", "bad-model", "too-long", "stream"):
        assert by[cid]["response"]["body"] is None and by[cid]["error"]["message"]
    assert by["bad-model"]["error"]["message"] == "The model `nope` does not exist."
    assert "Supported endpoints" in by["emb"]["error"]["message"]
    chat, comp = by["chat-1"]["response"]["body"], by["comp-1"]["response"]["body"]
    assert by["chat-1"]["error"] is None and chat["object"] == "chat.completion"
    assert comp["object"] == "text_completion" and comp["usage"]["completion_tokens"] == 7

    # the same requests to a live server over the same weights (one sequence at a time, as the batch ran)
    eng = tiny_engine(tiny_llama_dir, max_num_seqs=1)
    try:
        from specserve.server.api_server import build_app

        with ServerThread(build_app(eng, NAME)) as srv:
            client = openai_client(srv.url)
            want_chat = client.chat.completions.create(**CHAT).choices[0].message.content  # type: ignore[call-overload]
            want_comp = client.completions.create(**COMP).choices[0].text  # type: ignore[call-overload]
    finally:
        eng.shutdown()
    assert chat["choices"][0]["message"]["content"] == want_chat
    assert comp["choices"][0]["text"] == want_comp


def test_stdin_to_stdout(
    tiny_llama_dir: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(_req("only", "/v1/completions", COMP)))
    assert main(_argv(tiny_llama_dir, Path("-"), "-")) == 0
    out = capsys.readouterr().out
    (line,) = [json.loads(x) for x in out.splitlines()]
    assert line["custom_id"] == "only" and line["response"]["status_code"] == 200


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not json\n", "line 1: not valid JSON"),
        ('{"custom_id": "a", "method": "POST", "url": "/v1/completions"}\n', "line 1: missing body"),
        (
            _req("a", "/v1/completions", COMP) + _req("a", "/v1/completions", COMP),
            "line 2: custom_id 'a' is used twice",
        ),
        (
            '{"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {}}\n',
            "method must be POST",
        ),
        ("\n\n", "no requests"),
    ],
)
def test_bad_files_refused_before_running(
    text: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(BatchInputError, match=needle):
        read_requests(text)
    inp = tmp_path / "in.jsonl"
    inp.write_text(text)
    out = tmp_path / "out.jsonl"
    # a model path that does not exist: the file is refused before any engine is built
    assert main(_argv("/nonexistent/model", inp, str(out))) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_missing_input_and_bad_output_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run-batch", "-i", str(tmp_path / "none.jsonl"), "-o", str(tmp_path / "o.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    inp = tmp_path / "in.jsonl"
    inp.write_text(_req("a", "/v1/completions", COMP))
    assert main(["run-batch", "-i", str(inp), "-o", str(tmp_path / "no" / "o.jsonl")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert main(["run-batch", "-i", str(inp)]) == 2
    assert "the following arguments are required: -o/--output-file" in capsys.readouterr().err
