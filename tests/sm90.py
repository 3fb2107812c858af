"""Compile Triton kernels for sm_90 (Hopper) without a GPU and read their register / stack use: the interpreter
the other tests run accepts code the compiler rejects, and a register spill (stack > 0) is what turns a fast tile
into a slow one on the H200. The checks run as scripts in a subprocess without ``TRITON_INTERPRET``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compile_sm90(
    fn: Any,
    ptrs: dict[str, str],
    const: dict[str, Any],
    num_warps: int,
    num_stages: int,
    floats: tuple[str, ...] = (),
    not_divisible: tuple[str, ...] = (),
    divisible_ints: bool = True,
) -> tuple[Any, int, int]:
    """(compiled kernel, registers, stack bytes) of ``fn`` for sm_90. Pointer args get the dtype in ``ptrs``, names
    in ``floats`` fp32, the rest i32; like the JIT's specialisation, pointers (and, with ``divisible_ints``, the int
    args not in ``not_divisible``) are taken as divisible by 16."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # constexpr parameters left out take their defaults, as the JIT does
    const = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **const}
    sig = {
        n: ("*" + ptrs[n]) if n in ptrs else "constexpr" if n in const else "fp32" if n in floats else "i32"
        for n in fn.arg_names
    }
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(fn.arg_names)
        if n in ptrs or (divisible_ints and sig[n] == "i32" and n not in not_divisible)
    }
    kernel = triton.compile(
        ASTSource(fn, sig, const, attrs),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run(
            [cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True
        ).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    assert m, usage
    return kernel, int(m.group(1)), int(m.group(2))


def run_script(script: str) -> str:
    """Run a check script (which prints "OK" last) compiled-mode: no TRITON_INTERPRET, the repo and tests/ on the
    path; asserts it succeeded and returns its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "tests"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr
    return proc.stdout
