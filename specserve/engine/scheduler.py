"""Continuous batching with chunked prefill and preemption by recompute (pure Python).

Every step schedules, per request, the tokens whose KV is not yet computed (``token_ids[num_computed:]``)
plus the drafts proposed for it in the previous step. Running requests go first (oldest first); when blocks
run out, the newest running request is preempted (its blocks are freed and it is recomputed later). Waiting
requests are admitted while the token budget, ``max_num_seqs`` and free blocks allow. With ``policy="priority"``
(vLLM's ``--scheduling-policy priority``) the waiting queue and the running list are kept sorted by
``(priority, arrival_time)`` (lower value first; a preempted request keeps its arrival time), so the head is admitted
first and the preemption victim is the lowest-priority running request; ``"fcfs"`` ignores priorities.

``prefill_alone`` (set by the engine when the runner has prefill CUDA graphs, i.e. up to that many tokens): a
request's prefill chunk that fits the graphs runs as a step of its own instead of joining the decode batch, which
would make the whole step an eagerly launched varlen forward; SGLang likewise runs prefill and decode batches
apart. A burst of more than :data:`PREFILL_ALONE_MAX_WAITING` waiting requests is admitted together as before (one
batched prefill beats many small ones).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from specserve.config import SCHEDULING_POLICIES
from specserve.engine.block_manager import BlockManager
from specserve.engine.request import Request, RequestStatus

PREFILL_ALONE_MAX_WAITING = 4


def _priority_key(req: Request) -> tuple[int, float]:
    return (req.priority, req.arrival_time)


def _insert_sorted(queue: deque[Request] | list[Request], req: Request, before_equal: bool) -> None:
    """Insert req into queue (sorted by priority, then arrival) after the requests with the same key, or before
    them with ``before_equal``; scans from the back, where new arrivals go."""
    key = _priority_key(req)
    i = len(queue)
    while i > 0:
        k = _priority_key(queue[i - 1])
        if k < key or (k == key and not before_equal):
            break
        i -= 1
    queue.insert(i, req)


@dataclass
class ScheduledRequest:
    req: Request
    num_new_tokens: int  # committed tokens to run (prompt chunk, or 1 for decode)
    spec_token_ids: list[int]  # drafts appended after them (verified this step)

    @property
    def start(self) -> int:
        return self.req.num_computed_tokens

    @property
    def samples(self) -> bool:
        """True when this step reaches the end of the request's known tokens (so a token is sampled)."""
        return self.req.num_computed_tokens + self.num_new_tokens == self.req.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    preempted: list[Request]
    # requests in the batch (disable_by_batch_size): the running ones plus the waiting ones max_num_seqs admits
    # (vLLM schedules those in one step; a prefill_alone step takes them one by one)
    batch_size: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens + len(s.spec_token_ids) for s in self.scheduled)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        num_lookahead_slots: int = 0,
        policy: str = "fcfs",
    ) -> None:
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling policy must be one of {', '.join(SCHEDULING_POLICIES)}; got {policy!r}."
            )
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        # slots reserved past the scheduled tokens (the drafter writes its block there: K+1 with speculation)
        self.lookahead = num_lookahead_slots
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.prefill_alone = 0  # see the module docstring (0: off)
        self.policy = policy
        self.by_priority = policy == "priority"  # waiting and running sorted by (priority, arrival_time)

    def add(self, req: Request) -> None:
        if self.by_priority:
            _insert_sorted(self.waiting, req, before_equal=False)
        else:
            self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _slots_needed(self, req: Request, n: int) -> int:
        return req.num_computed_tokens + n + self.lookahead

    def _preempt(self, req: Request) -> None:
        self.bm.free_request(req)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.num_preemptions += 1
        self.num_preemptions += 1
        if self.by_priority:  # ahead of the waiting requests of its priority that arrived after it
            _insert_sorted(self.waiting, req, before_equal=True)
        else:
            self.waiting.appendleft(req)

    def _admit(self, budget: int) -> ScheduledRequest | None:
        """Admit the first waiting request with up to ``budget`` of its tokens (prefix-cache hits first), or
        None when its blocks do not fit (it stays waiting, holding nothing)."""
        req = self.waiting[0]
        if req.num_computed_tokens == 0 and not req.block_table:
            hits = self.bm.match_prefix(req)
            if hits and not self.bm.can_allocate(
                req, self._slots_needed(req, 0) + len(hits) * self.bm.block_size
            ):
                hits = []
            self.bm.allocate_prefix(req, hits)
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        if not self.bm.allocate(req, self._slots_needed(req, n)):
            self.bm.free_request(req)
            req.num_computed_tokens = 0
            return None
        self.waiting.popleft()
        req.status = RequestStatus.RUNNING
        if self.by_priority:  # running.pop() (the preemption victim) stays the lowest-priority request
            _insert_sorted(self.running, req, before_equal=False)
        else:
            self.running.append(req)
        return ScheduledRequest(req, n, [])

    def _schedule_prefill_alone(self) -> SchedulerOutput | None:
        """A step of one prefill chunk that fits ``prefill_alone`` tokens: a running request's next chunk, else a
        newly admitted request's; None when there is none (or its blocks do not fit: the usual path decides)."""
        limit = min(self.prefill_alone, self.max_num_batched_tokens)
        for req in self.running:
            n = req.num_tokens - req.num_computed_tokens
            if n > 1:
                if n > limit or not self.bm.allocate(req, self._slots_needed(req, n)):
                    return None
                req.spec_token_ids = []
                return SchedulerOutput([ScheduledRequest(req, n, [])], [], self._batch_size())
        if not self.waiting or len(self.waiting) > PREFILL_ALONE_MAX_WAITING:
            return None
        if len(self.running) >= self.max_num_seqs:
            return None
        req = self.waiting[0]
        if req.num_tokens - req.num_computed_tokens > limit:  # longer prompts: the usual (batched) path
            return None
        s = self._admit(limit)
        return SchedulerOutput([s], [], self._batch_size()) if s is not None else None

    def _batch_size(self) -> int:
        return min(len(self.running) + len(self.waiting), self.max_num_seqs)

    def schedule(self) -> SchedulerOutput:
        if self.prefill_alone:
            out = self._schedule_prefill_alone()
            if out is not None:
                return out
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = req.num_tokens - req.num_computed_tokens
            spec = req.spec_token_ids if n == 1 else []
            if n > budget:
                n = budget
            if len(spec) > budget - n:
                spec = spec[: max(0, budget - n)]
            while not self.bm.allocate(req, req.num_computed_tokens + n + len(spec) + self.lookahead):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            else:
                req.spec_token_ids = spec
                scheduled.append(ScheduledRequest(req, n, list(spec) if spec else []))
                budget -= n + len(spec)
                i += 1
                continue
            break  # the request itself was preempted: nothing after it can run either
        # admit waiting requests (never the ones preempted in this very step)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            s = self._admit(budget)
            if s is None:
                break
            scheduled.append(s)
            budget -= s.num_new_tokens
        return SchedulerOutput(scheduled, preempted, self._batch_size())

    def finish(self, req: Request, status: RequestStatus) -> None:
        req.status = status
        if req in self.running:
            self.running.remove(req)
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        self.bm.free_request(req)
