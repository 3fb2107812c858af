"""OpenAI-compatible HTTP server: ``build_app`` (FastAPI app over an engine) and ``serve_main`` (``specserve serve``)."""

from __future__ import annotations

from typing import Any

__all__ = ["build_app", "serve_main"]


def __getattr__(name: str) -> Any:  # lazy: keep `import specserve.server` cheap
    if name in __all__:
        from specserve.server import api_server

        return getattr(api_server, name)
    raise AttributeError(name)
