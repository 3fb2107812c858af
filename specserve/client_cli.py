"""``specserve chat`` and ``specserve complete``: vLLM's command-line clients of a running server.

As ``vllm chat`` / ``vllm complete``: ``--url`` (default ``http://localhost:8000/v1``), ``--model-name`` (default:
the first model of ``/v1/models``), ``--api-key`` (else ``OPENAI_API_KEY``); ``-q/--quick MESSAGE`` sends one
message and exits, otherwise each line read after the ``> `` prompt is sent until end of input. ``chat`` keeps the
conversation (``--system-prompt`` first) and streams the answer; ``complete`` streams a completion of each line
(``--max-tokens``). ``--stats`` (chat) prints the token counts after each answer. A server error is printed as one
line: in ``--quick`` mode it ends the command (exit 1); interactively the turn is dropped and the prompt returns.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import httpx

from specserve.errors import parse_exit_code
from specserve.server.cli_args import OneLineArgumentParser

DEFAULT_URL = "http://localhost:8000/v1"


class ClientError(Exception):
    """A server or connection error, as one line."""


def _parser(kind: str) -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog=f"specserve {kind}",
        description=f"{'Chat with' if kind == 'chat' else 'Generate completions from'} a running server "
        "(vLLM-compatible).",
        allow_abbrev=False,
    )
    p.add_argument(
        "--url", default=DEFAULT_URL, help="URL of the OpenAI-compatible API (default: %(default)s)."
    )
    p.add_argument(
        "--model-name", default=None, help="The model to use (default: the first model listed by /v1/models)."
    )
    p.add_argument("--api-key", default=None, help="API key (overrides OPENAI_API_KEY).")
    p.add_argument("-q", "--quick", default=None, metavar="MESSAGE", help="Send one message and exit.")
    if kind == "chat":
        p.add_argument("--system-prompt", default=None, help="A system message that opens the conversation.")
        p.add_argument("--stats", action="store_true", help="Print the token counts after each answer.")
    else:
        p.add_argument("--max-tokens", type=int, default=None, help="Tokens to generate per completion.")
    return p


class _Client:
    def __init__(self, url: str, api_key: str | None) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(600.0, connect=10.0))

    def _fail(self, r: httpx.Response) -> ClientError:
        r.read()
        try:
            msg = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            msg = r.text.strip().splitlines()[0] if r.text.strip() else r.reason_phrase
        return ClientError(f"HTTP {r.status_code}: {msg}")

    def first_model(self) -> str:
        try:
            r = self.http.get(f"{self.url}/models")
        except httpx.HTTPError as e:
            raise ClientError(f"cannot reach {self.url}: {e}") from None
        if r.status_code != 200:
            raise self._fail(r)
        data = r.json().get("data") or []
        if not data:
            raise ClientError(f"{self.url}/models lists no models")
        return str(data[0]["id"])

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """POST a streaming request; yield each ``data:`` event's JSON until ``[DONE]``."""
        try:
            with self.http.stream("POST", f"{self.url}{path}", json={**body, "stream": True}) as r:
                if r.status_code != 200:
                    raise self._fail(r)
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if "error" in event:  # an error after the stream began
                        raise ClientError(str(event["error"].get("message", event["error"])))
                    yield event
        except httpx.HTTPError as e:
            raise ClientError(f"cannot reach {self.url}: {e}") from None


def _print_chat_stream(events: Iterator[dict[str, Any]], stats: bool) -> str:
    parts: list[str] = []
    usage = None
    for ev in events:
        for choice in ev.get("choices") or []:
            text = (choice.get("delta") or {}).get("content")
            if text:
                parts.append(text)
                print(text, end="", flush=True)
        usage = ev.get("usage") or usage
    print()
    if stats and usage:
        print(
            f"[prompt tokens: {usage.get('prompt_tokens')}, completion tokens: {usage.get('completion_tokens')}, "
            f"total tokens: {usage.get('total_tokens')}]"
        )
    return "".join(parts)


def _print_completion_stream(events: Iterator[dict[str, Any]]) -> str:
    parts: list[str] = []
    for ev in events:
        for choice in ev.get("choices") or []:
            text = choice.get("text")
            if text:
                parts.append(text)
                print(text, end="", flush=True)
    print()
    return "".join(parts)


def _lines() -> Iterator[str]:
    while True:
        try:
            yield input("> ")
        except EOFError:
            return


def _run(kind: str, args: argparse.Namespace) -> int:
    api_key = args.api_key if args.api_key is not None else os.environ.get("OPENAI_API_KEY")
    client = _Client(args.url, api_key)
    model = args.model_name or client.first_model()
    print(f"Using model: {model}")
    conversation: list[dict[str, str]] = []
    if kind == "chat" and args.system_prompt is not None:
        conversation.append({"role": "system", "content": args.system_prompt})

    def turn(message: str) -> None:
        if kind == "chat":
            conversation.append({"role": "user", "content": message})
            body: dict[str, Any] = {"model": model, "messages": conversation}
            if args.stats:
                body["stream_options"] = {"include_usage": True}
            try:
                answer = _print_chat_stream(client.stream("/chat/completions", body), args.stats)
            except ClientError:
                conversation.pop()  # the turn did not happen
                raise
            conversation.append({"role": "assistant", "content": answer})
        else:
            body = {"model": model, "prompt": message}
            if args.max_tokens is not None:
                body["max_tokens"] = args.max_tokens
            _print_completion_stream(client.stream("/completions", body))

    if args.quick is not None:
        turn(args.quick)
        return 0
    print(
        "Please enter a message for the chat model:" if kind == "chat" else "Please enter prompt to complete:"
    )
    for line in _lines():
        try:
            turn(line)
        except ClientError as e:
            print(f"specserve {kind}: error: {e}", file=sys.stderr)
    return 0


def main(kind: str, argv: list[str]) -> int:
    """``specserve chat|complete ...``; returns the exit code."""
    parser = _parser(kind)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return parse_exit_code(e)
    if kind == "complete" and args.max_tokens is not None and args.max_tokens < 1:
        print(
            f"specserve complete: error: --max-tokens must be at least 1, got {args.max_tokens}",
            file=sys.stderr,
        )
        return 2
    try:
        return _run(kind, args)
    except ClientError as e:
        print(f"specserve {kind}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print()
        return 130
