"""``specserve run-batch -i INPUT.jsonl -o OUTPUT.jsonl --model M``: vLLM's ``run-batch``, OpenAI's batch file
format run offline.

Each input line is an OpenAI batch request ``{"custom_id": ..., "method": "POST", "url": "/v1/chat/completions" |
"/v1/completions", "body": {...}}``. The whole file is checked first (a malformed line: one-line error naming it,
exit 2, nothing run); then every request goes through the server's own handlers in-process (the FastAPI app over an
ASGI transport, no socket), all at once so the engine batches them, and the output file gets one line per input
line, in input order: ``{"id": "specserve-...", "custom_id": ..., "response": {"status_code": 200, "request_id":
..., "body": <the response>}, "error": null}``; a request the server refuses keeps its line with the status code and
``"error"`` set to the server's error object (``body`` null), as vLLM writes them. Engine flags are ``serve``'s
(no ``--model``: the bundled demo with its drafter).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from typing import Any

from specserve.errors import first_line, parse_exit_code, startup_exit_code
from specserve.server.cli_args import (
    OneLineArgumentParser,
    add_engine_args,
    add_speculative_args,
    engine_config_from_args,
    parse_engine_command,
)

PROG = "specserve run-batch"
URLS = ("/v1/chat/completions", "/v1/completions")


class BatchInputError(ValueError):
    pass


def make_parser() -> OneLineArgumentParser:
    p = OneLineArgumentParser(prog=PROG, description="Run an OpenAI batch file offline.", allow_abbrev=False)
    p.add_argument("-i", "--input-file", required=True, help="OpenAI batch input (JSONL), or - for stdin.")
    p.add_argument(
        "-o", "--output-file", required=True, help="Where to write the results (JSONL), or - for stdout."
    )
    p.add_argument(
        "--model",
        dest="model_tag",
        default=None,
        help="HF directory, GGUF file or hub id (default: the bundled demo, SmolLM2-135M-Instruct + its drafter).",
    )
    p.add_argument(
        "--served-model-name", nargs="+", default=None, help="Name(s) the requests' 'model' field may use."
    )
    p.add_argument("--response-role", default="assistant", help="Role of chat completion replies.")
    p.add_argument(
        "--max-concurrency", type=int, default=256, help="Requests in flight at once (default: %(default)s)."
    )
    p.add_argument("--disable-tqdm", action="store_true")
    add_engine_args(p)
    add_speculative_args(p)
    return p


def read_requests(text: str) -> list[dict[str, Any]]:
    """Parse and check every line of a batch file (blank lines skipped); BatchInputError names the bad line."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except json.JSONDecodeError as e:
            raise BatchInputError(f"line {n}: not valid JSON ({e.msg})") from None
        if not isinstance(req, dict):
            raise BatchInputError(f"line {n}: expected a JSON object")
        missing = [k for k in ("custom_id", "method", "url", "body") if k not in req]
        if missing:
            raise BatchInputError(f"line {n}: missing {', '.join(missing)}")
        if not isinstance(req["custom_id"], str):
            raise BatchInputError(f"line {n}: custom_id must be a string")
        if req["custom_id"] in seen:
            raise BatchInputError(f"line {n}: custom_id {req['custom_id']!r} is used twice")
        seen.add(req["custom_id"])
        if req["method"] != "POST":
            raise BatchInputError(f"line {n}: method must be POST, got {req['method']!r}")
        if not isinstance(req["body"], dict):
            raise BatchInputError(f"line {n}: body must be a JSON object")
        out.append(req)
    if not out:
        raise BatchInputError("the input file has no requests")
    return out


def _line(custom_id: str, status: int, body: Any, error: Any) -> dict[str, Any]:
    return {
        "id": f"specserve-{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": {
            "status_code": status,
            "request_id": f"specserve-batch-{uuid.uuid4().hex}",
            "body": body,
        },
        "error": error,
    }


async def run_requests(
    app: Any, requests: list[dict[str, Any]], max_concurrency: int, progress: bool = True
) -> list[dict[str, Any]]:
    """Each request through ``app`` (ASGI, in-process); the output lines in input order."""
    import httpx
    from tqdm import tqdm

    sem = asyncio.Semaphore(max_concurrency)
    bar = tqdm(total=len(requests), desc="Running batch", disable=not progress)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://batch", timeout=None) as client:

        async def one(req: dict[str, Any]) -> dict[str, Any]:
            cid = req["custom_id"]
            try:
                if req["url"] not in URLS:
                    msg = f"URL {req['url']} was used. Supported endpoints: {', '.join(URLS)}."
                    return _line(cid, 400, None, {"message": msg, "type": "BadRequestError", "code": 400})
                if req["body"].get("stream"):
                    msg = "stream is not supported in a batch."
                    return _line(cid, 400, None, {"message": msg, "type": "BadRequestError", "code": 400})
                async with sem:
                    r = await client.post(req["url"], json=req["body"])
                data = r.json()
                if r.status_code == 200:
                    return _line(cid, 200, data, None)
                return _line(cid, r.status_code, None, data.get("error", data))
            finally:
                bar.update(1)

        lines = list(await asyncio.gather(*(one(r) for r in requests)))
    bar.close()
    return lines


def _read_input(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    if path.startswith(("http://", "https://")):
        raise BatchInputError("--input-file: URLs are not supported; give a local file")
    with open(path, encoding="utf-8") as f:
        return f.read()


def main(argv: list[str]) -> int:
    parser = make_parser()
    try:
        args = parse_engine_command(parser, argv)
        if args.max_concurrency < 1:
            parser.error(f"argument --max-concurrency: must be at least 1, got {args.max_concurrency}")
    except SystemExit as e:
        return parse_exit_code(e)

    def fail(msg: str, code: int) -> int:
        print(f"{PROG}: error: {msg}", file=sys.stderr)
        return code

    try:
        requests = read_requests(_read_input(args.input_file))
        if args.output_file != "-":
            out_dir = os.path.dirname(os.path.abspath(args.output_file))
            if not os.path.isdir(out_dir):
                raise BatchInputError(f"--output-file: no such directory {out_dir}")
        config = engine_config_from_args(args)
    except (BatchInputError, ValueError) as e:
        return fail(str(e), 2)
    except OSError as e:
        return fail(f"cannot read {args.input_file}: {e.strerror or e}", 2)

    from specserve.engine.async_engine import AsyncLLM
    from specserve.server.api_server import build_app, served_model_names

    try:
        engine = AsyncLLM(config)
    except (ValueError, OSError, RuntimeError) as e:
        return fail(first_line(e), startup_exit_code(e))
    try:
        app = build_app(engine, served_model_names(args), response_role=args.response_role)
        lines = asyncio.run(run_requests(app, requests, args.max_concurrency, progress=not args.disable_tqdm))
    finally:
        engine.shutdown()
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if args.output_file == "-":
        sys.stdout.write(text)
    else:
        with open(args.output_file, "w", encoding="utf-8") as f:
            f.write(text)
    ok = sum(1 for line in lines if line["error"] is None)
    print(f"{ok} of {len(lines)} requests succeeded; results in {args.output_file}", file=sys.stderr)
    return 0
