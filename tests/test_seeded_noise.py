"""The counter-based noise of seeded requests (specserve.layers.seeded_noise): the Triton kernel (interpreted on
CPU) gives the torch form's bits, the values are uniform / exponential, and they depend on key, position, stream
and column."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton decorates the kernels

import torch  # noqa: E402
from stats import chi2_pvalue  # noqa: E402

from specserve.layers import seeded_noise as sn  # noqa: E402


def _keys(n: int) -> torch.Tensor:
    return torch.tensor([sn.seed_key(s) for s in range(n)], dtype=torch.int64)


def test_fmix32_matches_python_integers() -> None:
    vals = [0, 1, 2, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xDEADBEEF, 0xFFFFFFFF]
    got = sn.fmix32(torch.tensor(vals, dtype=torch.int64)).tolist()
    assert got == [sn._fmix32_int(v) for v in vals]
    assert all(0 <= g <= 0xFFFFFFFF for g in got)
    assert sn._fmix32_int(0) == 0 and sn._fmix32_int(1) == 0x514E28B7  # MurmurHash3's fmix32 reference value


def test_triton_kernel_equals_torch_form() -> None:
    from specserve.layers.triton_noise import race_noise_triton

    keys = torch.tensor([sn.seed_key(s) for s in (0, 1, -7, 2**40, 123456789)], dtype=torch.int64)
    pos = torch.tensor([0, 1, 4095, 2**31 - 1, 77], dtype=torch.int64)
    for vocab in (1, 1000, 1024, 2500):
        u = sn.race_uniform_torch(keys, pos, vocab)
        assert torch.equal(race_noise_triton(keys, pos, vocab), u)
        # -log by the kernel: the torch form's values up to the last bits of the log
        torch.testing.assert_close(race_noise_triton(keys, pos, vocab, log=True), -u.log(), rtol=1e-6, atol=0)
    assert race_noise_triton(keys[:0], pos[:0], 10).shape == (0, 10)
    from specserve.layers.triton_noise import accept_uniform_triton

    first = pos.clamp(max=2**31 - 20)
    for k in (1, 3, 16):
        assert torch.equal(accept_uniform_triton(keys, first, k), sn.accept_uniform_torch(keys, first, k))
    # the acceptance uniform of (key, n) does not depend on where n sits in the block
    a = sn.accept_uniform_torch(keys, first, 8)
    assert torch.equal(a[:, 3:], sn.accept_uniform_torch(keys, first + 3, 5))


def test_race_uniforms_are_uniform_and_never_0_or_1() -> None:
    u = sn.race_uniform_torch(_keys(64), torch.arange(64) * 3, 4096)
    assert u.dtype == torch.float32
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert float(u.min()) >= 2**-24 and float(u.max()) <= 1 - 2**-24
    counts = torch.histc(u.flatten(), bins=64, min=0, max=1)
    assert chi2_pvalue(counts.long(), torch.full((64,), 1 / 64)) > 0.001
    e = sn.race_exponential(_keys(64), torch.arange(64), 4096)
    assert torch.isfinite(e).all() and float(e.min()) > 0
    assert abs(float(e.mean()) - 1) < 0.01 and abs(float(e.var()) - 1) < 0.03


def test_draws_depend_on_key_position_stream_and_column() -> None:
    keys, pos = _keys(4), torch.tensor([10, 10, 10, 10])
    u = sn.race_uniform_torch(keys, pos, 512)
    # different seeds, same position: uncorrelated rows
    assert abs(float(torch.corrcoef(u[:2])[0, 1])) < 0.15
    # one seed, neighbouring positions: uncorrelated rows; the same position: the same row
    k = keys[:1].expand(3)
    v = sn.race_uniform_torch(k, torch.tensor([10, 11, 10]), 512)
    assert torch.equal(v[0], v[2]) and abs(float(torch.corrcoef(v[:2])[0, 1])) < 0.15
    assert torch.equal(v[0], u[0])
    # the acceptance stream is not the race's: u of position n differs from any race value of position n
    a = sn.accept_uniform(keys, pos, 3)
    assert a.dtype == torch.float64 and a.shape == (4, 3)
    assert float(a.min()) > 0 and float(a.max()) <= 1
    assert len(set(a.flatten().tolist())) == 12
    # accept uniforms over many positions: uniform
    b = sn.accept_uniform(_keys(8), torch.zeros(8, dtype=torch.int64), 2000)
    counts = torch.histc(b.flatten().float(), bins=20, min=0, max=1)
    assert chi2_pvalue(counts.long(), torch.full((20,), 1 / 20)) > 0.001


_HOPPER_COMPILE_SCRIPT = r"""
import specserve.layers.triton_noise as tn
from sm90 import compile_sm90

for log in (False, True):
    k, reg, stack = compile_sm90(tn._race_noise_kernel, dict(out_ptr="fp32", key_ptr="i64", pos_ptr="i64"),
                                 dict(BLOCK=1024, LOG=log), 4, 3, not_divisible=("V",))
    print(f"REG:{reg} STACK:{stack}")
    assert stack == 0
_, _, stack = compile_sm90(tn._accept_uniform_kernel, dict(out_ptr="fp64", key_ptr="i64", first_ptr="i64"),
                           dict(K_PAD=16), 1, 1, not_divisible=("K",))
assert stack == 0
ptx = k.asm["ptx"]
assert "mul.lo.s32" in ptx or "mul.lo.u32" in ptx  # 32-bit wrapping products, not 64-bit ones
print("OK")
"""


def test_noise_kernel_compiles_for_hopper() -> None:
    """The interpreter accepts code the compiler rejects (module globals that are not constexprs did): compile the
    kernel for sm_90 (no GPU needed) as the engine launches it."""
    from sm90 import run_script

    run_script(_HOPPER_COMPILE_SCRIPT)


def test_runner_warms_the_seeded_host_kernels(often_qwen3_dir, monkeypatch):
    """The warm-up a CUDA runner does at capture launches the race noise at the model's vocabulary and the
    acceptance uniforms for 1, 2 and K drafts: the kernel variants a seeded host-path request would compile."""
    from specserve import LLM

    calls: list = []
    monkeypatch.setattr(sn, "race_exponential", lambda keys, pos, vocab: calls.append(("race", vocab)))
    monkeypatch.setattr(sn, "accept_uniform", lambda keys, first, k: calls.append(("accept", k)))
    spec = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    llm = LLM(often_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=2, speculative_config=spec)
    llm.engine.runner._warm_seeded_host_kernels()
    vocab = llm.engine.runner.model_config.vocab_size
    assert sorted(calls) == [("accept", 1), ("accept", 2), ("accept", 5), ("race", vocab)]
