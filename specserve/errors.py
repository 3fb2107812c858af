"""Errors with a parameter name, mapped to OpenAI-style 4xx bodies by the server."""

from __future__ import annotations


class RequestValidationError(ValueError):
    """A request the engine cannot serve (too long, bad sampling values). ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
