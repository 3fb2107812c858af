"""``specserve bench serve``: a drop-in for ``vllm bench serve`` (see ``specserve.bench.serve.bench_main``)."""

from __future__ import annotations

from typing import Any

__all__ = ["bench_main"]


def __getattr__(name: str) -> Any:  # lazy: keep `import specserve.bench` cheap
    if name == "bench_main":
        from specserve.bench.serve import bench_main

        return bench_main
    raise AttributeError(name)
