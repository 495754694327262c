"""A user's regular expression applied to rank output (``progress_pattern``): run by Google's
RE2, in time linear in the line, never by Python's backtracking ``re``.

Python's ``re`` takes seconds on ``(a+)+$`` against 30 characters, and the pattern runs on every
line (up to 64 KiB) of a job, in the triggerer's event loop too. RE2 has no backreferences or
lookaround, which is what makes it linear; its cost per character still grows with the compiled
program, so that is bounded too (``.{1000}x`` took 1.3 s on one 64 KiB line, ``(.*a){100}``, at
most this size, 9 ms). Only whether a line matches is asked, so no groups are captured.
"""

from __future__ import annotations

import typing
from typing import Protocol

import re2

MAX_PATTERN_CHARS = 1000
MAX_PROGRAM_SIZE = 1000  # RE2's compiled instructions: bounds the work per character
UNSUPPORTED = (
    "RE2 has no backreferences (\\1), lookahead or lookbehind ((?=, (?!, (?<=, (?<!), atomic or "
    "possessive groups, and writes Python's \\Z as \\z"
)


class Pattern(Protocol):
    def search(self, text: str) -> object | None: ...


class PatternError(ValueError):
    """A pattern RE2 cannot run in bounded time; the message says why."""


def compile_pattern(text: str) -> Pattern:
    """``text`` compiled by RE2; ``PatternError`` when it cannot be, or would be too large."""
    if len(text) > MAX_PATTERN_CHARS:
        raise PatternError(f"is {len(text)} characters long (at most {MAX_PATTERN_CHARS})")
    options = re2.Options()
    options.log_errors = False  # the refusal is ours to report, not a line on stderr
    options.never_capture = True
    try:
        compiled = re2.compile(text, options)
    except re2.error as error:
        reason = error.args[0] if error.args else error
        reason = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else reason
        raise PatternError(f"is not a pattern RE2 can run ({reason}); {UNSUPPORTED}") from None
    size = int(compiled._regexp.ProgramSize())  # the wrapper's one way to ask (tests/unit pin it)
    if size > MAX_PROGRAM_SIZE:
        raise PatternError(
            f"compiles to {size} instructions (at most {MAX_PROGRAM_SIZE}); large counted repeats such as "
            ".{500} make every line slow to match"
        )
    return typing.cast(Pattern, compiled)
