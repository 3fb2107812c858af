"""Priority scheduling (vLLM's ``--scheduling-policy priority``): the waiting queue and the running list ordered by
(priority, arrival_time), lower first; the preemption victim is the lowest-priority running request; fcfs is
unchanged (arrival order, the newest running request preempted) and rejects non-zero priorities."""

from __future__ import annotations

import asyncio

import pytest

from specserve import LLM, SamplingParams
from specserve.config import EngineConfig
from specserve.engine.block_manager import BlockManager
from specserve.engine.request import Request, RequestStatus
from specserve.engine.scheduler import Scheduler, SchedulerOutput

PROMPTS = [
    "Hello there, how are you doing today? I wanted to ask",
    "The capital of France is",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16",
    "Once upon a time",
]


# ---------------------------------------------------------------------- scheduler (pure Python)
def _req(name: str, priority: int, arrival: float, n: int = 16) -> Request:
    return Request(
        request_id=name,
        prompt_token_ids=list(range(1, n + 1)),
        params=SamplingParams(max_tokens=8),
        max_tokens=8,
        arrival_time=arrival,
        priority=priority,
    )


def _sched(policy: str, num_blocks: int = 64, max_num_seqs: int = 1) -> Scheduler:
    return Scheduler(
        BlockManager(num_blocks, 16, False),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=64,
        max_model_len=256,
        policy=policy,
    )


def _run(out: SchedulerOutput) -> None:
    """What the engine does after a step: the scheduled tokens are computed, a token is sampled where due."""
    for s in out.scheduled:
        samples = s.samples
        s.req.num_computed_tokens += s.num_new_tokens
        if samples:
            s.req.token_ids.append(7)


def _admission_order(policy: str, reqs: list[Request]) -> list[str]:
    sch = _sched(policy)
    for r in reqs:
        sch.add(r)
    order = []
    while sch.has_unfinished():
        out = sch.schedule()
        assert len(out.scheduled) == 1 and not out.preempted
        req = out.scheduled[0].req
        order.append(req.request_id)
        sch.finish(req, RequestStatus.FINISHED_STOPPED)
    assert sch.bm.num_free_blocks == 64
    return order


def test_admission_order_by_priority_then_arrival():
    def reqs() -> list[Request]:  # added in this order; arrival times as added
        return [_req("a5", 5, 0.0), _req("b0", 0, 1.0), _req("c3", 3, 2.0), _req("d0", 0, 3.0)]

    assert _admission_order("priority", reqs()) == ["b0", "d0", "c3", "a5"]
    assert _admission_order("fcfs", reqs()) == ["a5", "b0", "c3", "d0"]
    # the key is the arrival time, not the order of add() calls
    late_added = [_req("x0", 0, 5.0), _req("y0", 0, 4.0), _req("z1", 1, 0.0)]
    assert _admission_order("priority", late_added) == ["y0", "x0", "z1"]
    assert _admission_order("fcfs", late_added) == ["x0", "y0", "z1"]


def test_scheduler_rejects_unknown_policy():
    with pytest.raises(ValueError, match="fcfs, priority"):
        _sched("lifo")
    with pytest.raises(ValueError, match="fcfs or priority"):
        EngineConfig(model=None, scheduling_policy="lifo")
    assert EngineConfig(model=None).scheduling_policy == "fcfs"


def _preemption_setup(policy: str) -> tuple[Scheduler, dict[str, Request]]:
    """Three 16-token prompts (one block each) in 4 blocks, then two waiting requests; after the prefill step each
    running request needs a second block and only one is free: one request is preempted."""
    sch = _sched(policy, num_blocks=4, max_num_seqs=3)
    r = {
        "a": _req("a", 1, 0.0),
        "b": _req("b", 5, 1.0),
        "c": _req("c", 0, 2.0),
    }
    for x in r.values():
        sch.add(x)
    out = sch.schedule()
    assert sorted(s.req.request_id for s in out.scheduled) == ["a", "b", "c"] and not out.preempted
    _run(out)
    r["d"] = _req("d", 5, 3.0)  # same priority as b, arrived after it
    r["e"] = _req("e", 2, 4.0)
    sch.add(r["d"])
    sch.add(r["e"])
    return sch, r


def test_priority_preempts_lowest_priority_running_request():
    sch, r = _preemption_setup("priority")
    assert [x.request_id for x in sch.running] == ["c", "a", "b"]  # sorted by (priority, arrival)
    out = sch.schedule()
    # the victim is b (priority 5), neither the newest (c) nor the one that ran out of blocks
    assert out.preempted == [r["b"]]
    assert [(s.req.request_id, s.num_new_tokens) for s in out.scheduled] == [("c", 1), ("a", 1)]
    assert (
        r["b"].status is RequestStatus.WAITING and r["b"].num_computed_tokens == 0 and not r["b"].block_table
    )
    assert r["b"].arrival_time == 1.0 and r["b"].num_preemptions == 1
    # re-queued at its sorted place: after e (priority 2), before d (same priority, arrived later)
    assert [x.request_id for x in sch.waiting] == ["e", "b", "d"]
    _run(out)
    for name in ("c", "a"):
        sch.finish(r[name], RequestStatus.FINISHED_STOPPED)
    admitted = []
    while sch.has_unfinished():
        out = sch.schedule()
        admitted += [s.req.request_id for s in out.scheduled if s.req.request_id not in admitted]
        _run(out)
        for s in out.scheduled:
            if s.req.num_output_tokens >= 2:
                sch.finish(s.req, RequestStatus.FINISHED_LENGTH)
    assert admitted == ["e", "b", "d"]
    assert sch.bm.num_free_blocks == 4


def test_fcfs_preempts_newest_running_request():
    sch, r = _preemption_setup("fcfs")
    assert [x.request_id for x in sch.running] == ["a", "b", "c"]  # arrival order, priorities ignored
    out = sch.schedule()
    assert out.preempted == [r["c"]]  # the newest, though its priority value is the lowest
    assert [(s.req.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 1)]
    assert [x.request_id for x in sch.waiting] == ["c", "d", "e"]  # back at the head, as before


def test_priority_running_order_after_admission():
    """A high-priority request admitted after others runs first in the next step (and is never the victim)."""
    sch = _sched("priority", max_num_seqs=3)
    lo, hi = _req("lo", 4, 0.0), _req("hi", -1, 1.0)
    sch.add(lo)
    _run(sch.schedule())
    sch.add(hi)
    out = sch.schedule()
    assert [s.req.request_id for s in out.scheduled] == ["lo", "hi"]  # running first, then admitted
    _run(out)
    assert [x.request_id for x in sch.running] == ["hi", "lo"]
    assert [s.req.request_id for s in sch.schedule().scheduled] == ["hi", "lo"]


# ---------------------------------------------------------------------- engine
def _llm(model: str, policy: str, **kw) -> LLM:
    return LLM(model, dtype="float32", device="cpu", scheduling_policy=policy, **kw)


@pytest.fixture(scope="module")
def prio_llm(tiny2_qwen3_dir):
    return _llm(tiny2_qwen3_dir, "priority", max_num_seqs=1, num_gpu_blocks=32)


@pytest.fixture(scope="module")
def fcfs_llm(tiny2_qwen3_dir):
    return _llm(tiny2_qwen3_dir, "fcfs", max_num_seqs=1, num_gpu_blocks=32)


SP = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PRIORITIES = [3, 0, 2, 1]


def _finish_order(llm: LLM, priorities: list[int] | None) -> tuple[list[str], dict[str, list[int]]]:
    eng = llm.engine
    free0 = eng.block_manager.num_free_blocks
    for i, p in enumerate(PROMPTS):
        if priorities is None:
            eng.add_request(f"r{i}", p, SP)
        else:
            eng.add_request(f"r{i}", p, SP, priority=priorities[i])
    order, tokens = [], {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                order.append(out.request_id)
                tokens[out.request_id] = out.outputs[0].token_ids
    assert eng.block_manager.num_free_blocks == free0  # no KV block leaked
    return order, tokens


def test_engine_serves_in_priority_order(prio_llm, fcfs_llm):
    order, tokens = _finish_order(prio_llm, PRIORITIES)
    assert order == ["r1", "r3", "r2", "r0"]
    fcfs_order, fcfs_tokens = _finish_order(fcfs_llm, None)
    assert fcfs_order == ["r0", "r1", "r2", "r3"]
    assert tokens == fcfs_tokens  # priority changes the order, not the tokens
    assert all(len(t) == 6 for t in tokens.values())
    # priority mode with all priorities equal: arrival order
    assert _finish_order(prio_llm, [0, 0, 0, 0])[0] == ["r0", "r1", "r2", "r3"]


def test_llm_generate_priority(prio_llm, fcfs_llm):
    outs = prio_llm.generate(PROMPTS, SP, priority=PRIORITIES)
    ref = fcfs_llm.generate(PROMPTS, SP)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref]  # input order
    served = sorted(range(len(outs)), key=lambda i: outs[i].metrics["first_token_time"])
    assert served == [1, 3, 2, 0]
    m = prio_llm.get_metrics()
    assert m["num_free_blocks"] == m["num_gpu_blocks"]
    # n > 1: every child gets the parent's priority
    eng = prio_llm.engine
    eng.add_request("n2", PROMPTS[1], SamplingParams(n=2, max_tokens=2), priority=-4)
    kids = [r for r in eng.requests.values() if r.parent_id == "n2"]
    assert len(kids) == 2 and all(k.priority == -4 for k in kids)
    eng.abort_request("n2")
    assert not eng.has_unfinished_requests()


def test_priority_validation(prio_llm, fcfs_llm):
    msg = r"Got priority 1 but priority scheduling is not enabled \(--scheduling-policy priority\)\."
    with pytest.raises(ValueError, match=msg):
        fcfs_llm.generate(PROMPTS[:1], SP, priority=[1])
    with pytest.raises(ValueError, match="Got priority -2 but"):
        fcfs_llm.generate(PROMPTS[:2], SP, priority=[0, -2])  # the first one is not queued either
    with pytest.raises(ValueError, match=msg):
        fcfs_llm.engine.add_request("x", PROMPTS[0], SP, priority=1)
    assert not fcfs_llm.engine.has_unfinished_requests() and not fcfs_llm.engine.parents
    assert len(fcfs_llm.generate(PROMPTS[:1], SP, priority=[0])) == 1  # 0 is fcfs's only priority
    with pytest.raises(ValueError, match="lengths of prompts and priority"):
        prio_llm.generate(PROMPTS[:2], SP, priority=[1])
    for bad in (True, 1.0, "1", None):
        with pytest.raises(ValueError, match="priority must be an integer"):
            prio_llm.engine.add_request("y", PROMPTS[0], SP, priority=bad)  # type: ignore[arg-type]
    assert not prio_llm.engine.has_unfinished_requests() and not prio_llm.engine.parents


def test_priority_with_preemption_and_async_scheduling(tiny2_qwen3_dir):
    """Few blocks force preemptions; the async decode pipeline (padded path on CPU) runs with the sorted running
    list: tokens equal the fcfs run's, nothing leaks."""
    kw = dict(
        num_gpu_blocks=10,
        max_num_seqs=3,
        max_num_batched_tokens=32,
        padded_decode=True,
        async_scheduling=True,
    )
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prio = _llm(tiny2_qwen3_dir, "priority", **kw)
    fcfs = _llm(tiny2_qwen3_dir, "fcfs", **kw)
    outs = prio.generate(PROMPTS, sp, priority=[2, 0, 1, 0])
    ref = fcfs.generate(PROMPTS, sp)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref]
    for llm in (prio, fcfs):
        m = llm.get_metrics()
        assert m["num_preemptions_total"] > 0
        assert m["num_free_blocks"] == m["num_gpu_blocks"]
    assert prio.engine.runner.num_async_steps > 0


def test_async_llm_priority(tiny2_qwen3_dir, monkeypatch):
    from specserve.engine import async_engine

    seen: list[int] = []

    class Recording(async_engine.LLMEngine):
        def add_request(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            seen.append(args[3] if len(args) > 3 else kwargs.get("priority", 0))
            return super().add_request(*args, **kwargs)

    monkeypatch.setattr(async_engine, "LLMEngine", Recording)

    async def run(eng, priority: int):  # type: ignore[no-untyped-def]
        last = None
        async for out in eng.generate("hello", SamplingParams(max_tokens=3, temperature=0), "r", priority):
            last = out
        return last

    for policy in ("fcfs", "priority"):
        cfg = EngineConfig(
            model=tiny2_qwen3_dir,
            device="cpu",
            dtype="float32",
            num_gpu_blocks=16,
            max_num_seqs=2,
            scheduling_policy=policy,
        )
        eng = async_engine.AsyncLLM(cfg)
        try:
            if policy == "fcfs":
                with pytest.raises(ValueError, match="Got priority 3 but priority scheduling is not enabled"):
                    asyncio.run(run(eng, 3))
                assert seen == []  # rejected in the caller, before anything was queued
            else:
                out = asyncio.run(run(eng, 3))
                assert out is not None and out.finished and len(out.outputs[0].token_ids) == 3
                assert seen == [3]
            with pytest.raises(ValueError, match="priority must be an integer"):
                asyncio.run(run(eng, True))  # type: ignore[arg-type]
        finally:
            eng.shutdown()
