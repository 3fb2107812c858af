"""AsyncLLM: the engine stepping in a background thread, fed and drained from asyncio (the server's side).

The HTTP layer never blocks the engine: it only enqueues commands and awaits per-request queues that the
engine thread fills with cumulative ``RequestOutput`` snapshots, one per step that produced tokens.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator
from typing import Any

from specserve.config import EngineConfig
from specserve.engine.engine import LLMEngine
from specserve.outputs import RequestOutput
from specserve.sampling_params import SamplingParams

logger = logging.getLogger("specserve")


class EngineDeadError(RuntimeError):
    pass


class AsyncLLM:
    """The engine is built inside its own thread, which then runs every step: all of torch's CPU work happens on
    one thread. With the model loaded on the caller's thread and stepped on another, libgomp keeps two OpenMP
    thread pools; on a machine with as many cores as one pool's threads it then stops spinning between parallel
    regions, and every CPU GEMM paid a sleep / wake-up (SmolLM2 on 2 cores: 18 vs 30 tokens/s)."""

    engine: LLMEngine

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._cmds: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        self._wake = threading.Event()
        self._stop = False
        self._dead: BaseException | None = None
        built = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            try:
                self.engine = LLMEngine(config)
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                failed.append(e)
                return
            finally:
                built.set()
            self._run()

        self._thread = threading.Thread(target=run, name="specserve-engine", daemon=True)
        self._thread.start()
        built.wait()
        if failed:
            self._thread.join()
            raise failed[0]
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        self.model_path = self.engine.model_path
        self.default_sampling_overrides = self.engine.default_sampling_overrides

    # ------------------------------------------------------------------ engine thread
    def _deliver(self, rid: str, item: Any) -> None:
        entry = self._streams.get(rid)
        if entry is None:
            return
        loop, q = entry
        try:
            loop.call_soon_threadsafe(q.put_nowait, item)
        except RuntimeError:  # loop closed
            self._streams.pop(rid, None)

    def _run(self) -> None:
        eng = self.engine
        while not self._stop:
            try:
                while True:
                    try:
                        cmd, arg = self._cmds.get_nowait()
                    except queue.Empty:
                        break
                    if cmd == "add":
                        rid, prompt, params, priority = arg
                        try:
                            eng.add_request(rid, prompt, params, priority)
                        except Exception as e:  # noqa: BLE001 - reported to the caller
                            self._deliver(rid, e)
                    elif cmd == "abort":
                        eng.abort_request(arg)
                        self._streams.pop(arg, None)
                if eng.has_unfinished_requests():
                    for out in eng.step():
                        self._deliver(out.request_id, out)
                        if out.finished:
                            self._streams.pop(out.request_id, None)
                else:
                    self._wake.wait(0.05)
                    self._wake.clear()
            except Exception as e:  # noqa: BLE001
                logger.exception("engine loop died")
                self._dead = e
                for rid in list(self._streams):
                    self._deliver(rid, EngineDeadError(f"engine failed: {e}"))
                self._streams.clear()
                return

    # ------------------------------------------------------------------ asyncio side
    def is_running(self) -> bool:
        return self._dead is None and self._thread.is_alive()

    async def generate(
        self,
        prompt: str | list[int] | dict[str, Any],
        params: SamplingParams,
        request_id: str,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's cumulative outputs. ``priority`` (lower first) needs scheduling_policy="priority";
        a non-zero one under fcfs (or a non-int) raises ValueError before anything is queued."""
        if not self.is_running():
            raise EngineDeadError("the engine is not running")
        # validate here, in the caller, so errors surface before the first output
        self.engine.check_priority(priority)
        _, ids = self.engine.tokenize_prompt(prompt)
        self.engine.validate(ids, params)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Any] = asyncio.Queue()
        self._streams[request_id] = (loop, q)
        self._cmds.put(
            (
                "add",
                (
                    request_id,
                    {"prompt_token_ids": ids, "prompt": prompt if isinstance(prompt, str) else None},
                    params,
                    priority,
                ),
            )
        )
        self._wake.set()
        finished = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                # coalesce: only the newest snapshot matters when several arrived
                while not q.empty() and not item.finished:
                    nxt = q.get_nowait()
                    if isinstance(nxt, BaseException):
                        finished = True
                        raise nxt
                    item = nxt
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self._streams.pop(request_id, None)
                self._cmds.put(("abort", request_id))
                self._wake.set()

    async def abort(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._cmds.put(("abort", request_id))
        self._wake.set()

    def get_metrics(self) -> dict[str, Any]:
        return self.engine.get_metrics()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)
