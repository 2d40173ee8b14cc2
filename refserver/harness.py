"""The server as a child process, for tests and benchmarks: `reference_server(**options)`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from refserver.truth import GroundTruthRequest, Pace

_REPO_ROOT = Path(__file__).resolve().parents[1]
_SERVER_OPTIONS = {
    "ttft_ms",
    "itl_ms",
    "tokens_per_chunk",
    "usage_mode",
    "reasoning_tokens",
    "role_chunk",
    "finish_on_last_token",
    "flat_batch",
    "fault_after",
    "stall_s",
    "model",
    "max_model_len",
    "log",
    "gt_max_chunks",
    "cpu",
    "log_level",
}


class ReferenceServer:
    """A reference server running in a child process; see ``reference_server()``."""

    def __init__(self, startup_timeout_s: float = 20.0, **options: Any) -> None:
        unknown = sorted(set(options) - _SERVER_OPTIONS)
        if unknown:
            raise TypeError(f"unknown reference server options {unknown}")
        Pace(
            **{k: v for k, v in options.items() if k in {f.name for f in dataclasses.fields(Pace)}}
        )
        argv = [sys.executable, "-m", "refserver", "--port", "0"]
        argv.append("--exit-on-stdin-eof")
        for key, value in options.items():
            flag = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                if value:
                    argv.append(flag)
            elif value is not None:
                argv += [flag, str(value)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        self._proc = subprocess.Popen(
            argv,
            cwd=_REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,
            text=True,
        )
        self.port = self._await_ready(startup_timeout_s)
        self.url = f"http://127.0.0.1:{self.port}"

    def _await_ready(self, timeout_s: float) -> int:
        import selectors

        assert self._proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    continue
                line = self._proc.stdout.readline()
                if not line:
                    break
                if line.startswith("READY "):
                    return int(line.split()[1])
        self.stop()
        raise RuntimeError(f"reference server did not report READY within {timeout_s} s")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _request(self, method: str, path: str) -> bytes:
        req = urllib.request.Request(
            self.url + path, method=method, data=b"" if method == "POST" else None
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.read()

    def ground_truth(self) -> list[GroundTruthRequest]:
        """Every finished completion request since the last reset, in finishing order."""
        return [
            GroundTruthRequest.from_json(d)
            for d in json.loads(self._request("GET", "/ground_truth"))
        ]

    def reset(self) -> None:
        self._request("POST", "/ground_truth/reset")

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout_s)
        for pipe in (self._proc.stdout, self._proc.stdin):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def __enter__(self) -> ReferenceServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def reference_server(**options: Any) -> Iterator[ReferenceServer]:
    """Run a reference server for the ``with`` block.

    Options are the pace fields (``ttft_ms``, ``itl_ms``, ``tokens_per_chunk``,
    ``usage_mode``, ``reasoning_tokens``, ``role_chunk``, ``finish_on_last_token``,
    ``fault_after``, ``stall_s``) and ``model``, ``max_model_len``, ``log``,
    ``gt_max_chunks``, ``cpu``, ``log_level``.
    """
    srv = ReferenceServer(**options)
    try:
        yield srv
    finally:
        srv.stop()
