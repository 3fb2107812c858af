"""The speculative step's bookkeeping kernels (specserve/spec/step_kernels.py, interpreted on CPU) compute the
same integers as their torch specifications (specserve/spec/step_inputs.py), over random verify outputs, budgets,
block tables and padding."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton decorates the kernels

import importlib

import pytest
import torch

pytest.importorskip("triton")

from specserve.spec import step_inputs as si  # noqa: E402
from specserve.spec import step_kernels as sk  # noqa: E402

if type(sk._dflash_query_kernel).__name__ != "InterpretedFunction":
    sk = importlib.reload(sk)  # imported earlier without TRITON_INTERPRET


def _tables(g: torch.Generator, b: int, mb: int) -> torch.Tensor:
    """Block tables with a few trailing -1 (a table that does not cover the block) and garbage rows."""
    bt = torch.randint(0, 50, (b, mb), generator=g, dtype=torch.int32)
    for j in range(b):
        cut = int(torch.randint(1, mb + 1, (1,), generator=g))
        bt[j, cut:] = -1
    return bt


@pytest.mark.parametrize("k", [1, 4, 7, 15])
def test_dflash_query_inputs_kernel_matches_ref(k: int) -> None:
    q, b, bs = k + 1, 5, 4
    mb = -(-(12 + 2 * q) // bs) + 1  # the random table cuts leave some query blocks covered, some not
    kinds = set()
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        packed = torch.randint(0, 1000, (b, q + 1), generator=g)
        packed[:, q] = torch.randint(-1, q + 2, (b,), generator=g)  # n_match, also out of range
        aux = torch.zeros(b, 3, dtype=torch.int32)
        aux[:, 0] = torch.randint(-1, k + 2, (b,), generator=g)  # num_draft
        aux[:, 1] = torch.randint(-3, 3 * q, (b,), generator=g)  # budget
        first = torch.randint(0, 12, (b,), generator=g)
        pos = (first[:, None] + torch.arange(q)).view(-1)
        slots = torch.randint(-1, 200, (b * q,), generator=g)
        bt = _tables(g, b, mb)
        seq = torch.where(torch.arange(b) < b - 1, first + q, 0).to(torch.int32)  # the last row: padding
        args = (packed, aux, pos, slots, bt, seq, k, 77, bs)
        ref = si.dflash_query_inputs_ref(*args)
        out = sk.dflash_query_inputs(*args)
        names = ["ctx_slots", "ids", "qpos", "qslots", "qseq", "active"]
        for name, r, o in zip(names, ref, out):
            assert o.dtype == r.dtype and o.shape == r.shape, name
            assert torch.equal(o, r), (name, seed)
        assert not ref[5][-1]  # padding never drafts
        kinds |= set(ref[5][:-1].tolist())
    assert kinds == {True, False}  # both drafting and non-drafting requests occurred


@pytest.mark.parametrize("k", [1, 4, 15])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_async_step_inputs_kernel_matches_ref(k: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n, q, bs, mb = 4, k + 1, 4, 12
    prev = torch.randint(0, 1000, (n, q + 1 + k), generator=g)
    prev[:, q] = torch.randint(-1, q + 2, (n,), generator=g)
    prev[0, q + 1 :] = -1  # no drafts made for request 0
    prev_nd = torch.randint(0, k + 1, (n,), generator=g)
    prev_budget = torch.randint(-2, 3 * q, (n,), generator=g)
    prev_first = torch.randint(0, 10, (n,), generator=g)
    bt = _tables(g, n, mb)
    args = (prev, prev_nd, prev_budget, prev_first, bt, k, bs)
    ref = si.async_step_inputs_ref(*args)
    out = sk.async_step_inputs(*args)
    names = ["ids", "pos", "slots", "seq", "num_draft", "budget", "first"]
    for name, r, o in zip(names, ref, out):
        assert o.dtype == r.dtype and o.shape == r.shape, name
        assert torch.equal(o, r), name
    assert int(ref[4][0]) == 0  # no drafts: nothing to verify
    # into=: the same values stored straight into (strided) static buffers, by the kernel and by the torch spec
    for fn in (si.async_step_inputs_ref, sk.async_step_inputs):
        raw = torch.full((4 * n * q,), -9, dtype=torch.int64)
        aux = torch.full((n, 3), -9, dtype=torch.int32)  # 3 columns: the third must stay untouched
        seq = torch.full((n,), -9, dtype=torch.int32)
        into = (raw[: n * q], raw[n * q : 2 * n * q], raw[2 * n * q : 3 * n * q], seq, aux)
        got = fn(*args, into=into)
        for name, r, o, d in zip(names[:4], ref, got, into):
            assert o.data_ptr() == d.data_ptr() and torch.equal(d, r), (name, fn.__name__)
        assert torch.equal(got[4], ref[4]) and torch.equal(got[5], ref[5]) and torch.equal(got[6], ref[6])
        assert torch.equal(aux[:, 0].long(), ref[4]) and torch.equal(aux[:, 1].long(), ref[5])
        assert bool((aux[:, 2] == -9).all()) and bool((raw[3 * n * q :] == -9).all())
    with pytest.raises(ValueError, match="into"):
        sk.async_step_inputs(*args, into=(raw[: n * q], raw[: n * q], raw[: n * q], seq.long(), aux))


def test_step_kernels_validate_shapes() -> None:
    k = 3
    with pytest.raises(ValueError, match="packed"):
        sk.dflash_query_inputs(
            torch.zeros(2, k + 1, dtype=torch.int64),
            torch.zeros(2, 2, dtype=torch.int32),
            torch.zeros(2 * (k + 1), dtype=torch.int64),
            torch.zeros(2 * (k + 1), dtype=torch.int64),
            torch.zeros(2, 4, dtype=torch.int32),
            torch.zeros(2, dtype=torch.int32),
            k,
            0,
            4,
        )
    with pytest.raises(ValueError, match="int64"):
        sk.async_step_inputs(
            torch.zeros(2, 2 * k + 2, dtype=torch.int64),
            torch.zeros(2, dtype=torch.int32),
            torch.zeros(2, dtype=torch.int64),
            torch.zeros(2, dtype=torch.int64),
            torch.zeros(2, 4, dtype=torch.int32),
            k,
            4,
        )
