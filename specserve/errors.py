"""Errors with a parameter name, mapped to OpenAI-style 4xx bodies by the server; the commands' one-line errors."""

from __future__ import annotations

import argparse
from typing import NoReturn


class RequestValidationError(ValueError):
    """A request the engine cannot serve (too long, bad sampling values). ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse that reports errors in one line (no usage dump) and still exits with code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def first_line(e: BaseException) -> str:
    """An exception as the one line a command prints (its type's name when it has no message)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def parse_exit_code(e: SystemExit) -> int:
    """argparse's exit as a return code: --help 0, a bad flag 2 (its one-line message already printed)."""
    return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)


def startup_exit_code(e: BaseException) -> int:
    """A command that could not start: 2 for a bad argument or model (ValueError), 1 for the machine's errors."""
    return 2 if isinstance(e, ValueError) else 1
