"""The root of every expected failure: `BenchError`.

An expected failure is one the user or the environment causes and can act on (a bad spec or
flag, a server that does not answer, a missing stack, a full disk): its message is one line
naming what is wrong, and `bench` prints it and exits with status 2. Each room's error
classes derive from it (keeping their builtin base, so existing `except ValueError` and
`except OSError` still catch them). Any other exception is a bug: `bench` shows its
traceback and says so.
"""

from __future__ import annotations

__all__ = ["BenchError"]


class BenchError(Exception):
    """An expected failure with a one-line message for the user."""
