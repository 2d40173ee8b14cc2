"""Supervision of one engine server process, whatever the engine.

This module owns the life of a server process: start it in its own process group with its
output captured in a log file, tell when it answers health checks (and how long that took),
and stop it so that nothing of it is left: SIGTERM to the group, SIGKILL after a grace
period, then a check that the group is gone and its port is free. Health counts only when
the process just started owns the listening socket: an older server on the same port
(another engine, another user) is never taken for it. Engine specifics (argv,
health URL, ports, build ids) live in the engine recipes, not here.

Secrets: environment values whose names contain TOKEN, SECRET or KEY are never logged;
they are masked wherever this module writes or returns text (argv, env, log tails).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx
import psutil

from contract.errors import BenchError

log = logging.getLogger(__name__)

HEALTH_POLL_S = 0.5
SECRET_MARKERS = ("TOKEN", "SECRET", "KEY")
MASK = "***"
LOG_TAIL_LINES = 40
# After SIGKILL the kernel closes the listening socket promptly; this only absorbs the
# few milliseconds between the group's exit and the socket's release.
PORT_RELEASE_S = 5.0


class EngineError(BenchError, RuntimeError):
    """An engine server failed; `engine` names it and `log_tail` holds its last lines."""

    def __init__(self, engine: str, reason: str, log_tail: str = "", log_path: Path | None = None):
        self.engine = engine
        self.reason = reason
        self.log_tail = log_tail
        self.log_path = log_path
        msg = f"{engine}: {reason}"
        if log_tail:
            where = f" of {log_path}" if log_path else ""
            msg += f"\n--- last lines{where} ---\n{log_tail}"
        super().__init__(msg)


class EngineStartError(EngineError):
    """The server exited during start-up, never became healthy, or could not be started."""


class EngineStopError(EngineError):
    """The server's process group or its port outlived stop()."""


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of env that is safe to log: secret-named values masked."""
    return {k: (MASK if is_secret_name(k) else v) for k, v in env.items()}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True if a server could not bind (host, port) now.

    Binds with SO_REUSEADDR, as servers do, so that connections lingering in TIME_WAIT
    after a stop do not count as "in use".
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def choose_port(preferred: int, host: str = "127.0.0.1") -> int:
    """`preferred` (the recipe's port) when nothing holds it, else a free one."""
    return free_port(host) if port_in_use(preferred, host) else preferred


def _group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of a process group."""
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc)
    return members


class EngineServer:
    """One engine server process: start, wait until healthy, stop; a context manager.

    `with EngineServer(...) as srv:` starts it; leaving the block stops it, also on error.
    """

    def __init__(
        self,
        engine: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        inherit_env: bool = True,
        port: int | None = None,
        host: str = "127.0.0.1",
        cwd: Path | None = None,
    ) -> None:
        if not argv:
            raise ValueError(f"{engine}: empty argv")
        self.engine = engine
        self.argv = [str(a) for a in argv]
        self.env = dict(env or {})
        self.inherit_env = inherit_env
        self.port = port
        self.host = host
        self.cwd = cwd
        self.log_path = Path(log_path)
        self.health_s: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pgid: int | None = None
        self._t_start: float | None = None
        self._log_offset = 0
        # (pid, create time) of this server's processes seen listening on its port: at stop,
        # a port held by anyone else (another engine started since) is not this one's leak.
        self._listeners: set[tuple[int, float]] = set()
        self._secret_values = [
            v for k, v in self._full_env().items() if is_secret_name(k) and len(v) >= 4
        ]

    # -- helpers ---------------------------------------------------------------------

    def _full_env(self) -> dict[str, str]:
        base = dict(os.environ) if self.inherit_env else {}
        base.update(self.env)
        return base

    def _mask(self, text: str) -> str:
        for value in self._secret_values:
            text = text.replace(value, MASK)
        return text

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def pgid(self) -> int | None:
        return self._pgid

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def uptime_s(self) -> float | None:
        return None if self._t_start is None else time.monotonic() - self._t_start

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        """The last n lines this run wrote to its log (secrets masked)."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_offset)
                data = f.read()
        except OSError:
            return ""
        lines = data.decode("utf-8", errors="replace").splitlines()
        return self._mask("\n".join(lines[-n:]))

    def owns_port(self) -> bool:
        """Whether a live process of this server's group listens on its port (True if no port)."""
        if self.port is None or self._pgid is None:
            return True
        for proc in _group_members(self._pgid):
            with contextlib.suppress(psutil.Error):
                for conn in proc.net_connections(kind="inet"):
                    if (
                        conn.status == psutil.CONN_LISTEN
                        and conn.laddr
                        and conn.laddr.port == self.port
                    ):
                        self._listeners.add((proc.pid, proc.create_time()))
        return bool(self._listeners)

    def _still_listening(self) -> bool:
        """Whether the port is held by this server (any process it listened from, alive)."""
        if self.port is None or not port_in_use(self.port, self.host):
            return False
        if not self._listeners:
            # It never listened (it died starting, or lost the port to another process):
            # with its group gone, whoever holds the port now is not this server.
            return False
        for pid, created in self._listeners:
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).create_time() == created:
                    return True
        log.info("%s: port %s is now held by another process", self.engine, self.port)
        return False

    def _start_error(self, reason: str) -> EngineStartError:
        return EngineStartError(self.engine, reason, self.log_tail(), self.log_path)

    # -- life cycle ------------------------------------------------------------------

    def start(self) -> EngineServer:
        if self._proc is not None:
            raise RuntimeError(f"{self.engine}: already started")
        if self.port is not None and port_in_use(self.port, self.host):
            raise EngineStartError(
                self.engine, f"port {self.port} on {self.host} is already in use"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("%s: starting: %s", self.engine, self._mask(shlex.join(self.argv)))
        if self.env:
            log.info("%s: env overrides: %s", self.engine, redact_env(self.env))
        # Appended, not truncated: a restart keeps the earlier run's lines for the record;
        # log_tail reads from this run's offset only.
        with self.log_path.open("ab") as logf:
            self._log_offset = logf.tell()
            self._t_start = time.monotonic()
            try:
                self._proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    env=self._full_env(),
                    cwd=self.cwd,
                    start_new_session=True,  # own process group: stop() can kill it whole
                )
            except OSError as e:
                raise EngineStartError(self.engine, f"cannot start {self.argv[0]}: {e}") from e
        self._pgid = self._proc.pid  # a new session's leader is its group's leader
        log.info("%s: pid %d, log %s", self.engine, self._proc.pid, self.log_path)
        return self

    def wait_healthy(self, url: str, timeout_s: float) -> float:
        """Poll GET url every 0.5 s until it answers 200; return and record health_s.

        health_s counts from start(). An answer counts only while this process group owns
        the listening socket (see `owns_port`). Raises EngineStartError if the process exits
        first or timeout_s passes (measured from this call), with the log's last lines.
        """
        if self._proc is None or self._t_start is None:
            raise RuntimeError(f"{self.engine}: wait_healthy before start")
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        with httpx.Client(timeout=httpx.Timeout(2.0), trust_env=False) as client:
            while True:
                rc = self._proc.poll()
                if rc is not None:
                    raise self._start_error(f"exited with code {rc} during start-up ({last})")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._start_error(
                        f"not healthy at {url} within {timeout_s:.1f}s (last: {last})"
                    )
                try:
                    resp = client.get(url, timeout=min(2.0, max(0.1, remaining)))
                    if resp.status_code != 200:
                        last = f"HTTP {resp.status_code}"
                    elif not self.owns_port():
                        last = f"HTTP 200 from another process holding port {self.port}"
                    else:
                        self.health_s = time.monotonic() - self._t_start
                        log.info("%s: healthy after %.2fs", self.engine, self.health_s)
                        return self.health_s
                except httpx.HTTPError as e:
                    last = f"{type(e).__name__}"
                time.sleep(min(HEALTH_POLL_S, max(0.0, deadline - time.monotonic())))

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the group, SIGKILL it after grace_s, then check group and port are gone.

        Returns the leader's exit code (None if never started). Idempotent.
        """
        proc, pgid = self._proc, self._pgid
        if proc is None or pgid is None:
            return None
        if proc.poll() is None or _group_members(pgid):
            log.info("%s: stopping (SIGTERM to group %d)", self.engine, pgid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning(
                    "%s: still running after %.1fs; SIGKILL to group %d", self.engine, grace_s, pgid
                )
            # Children may outlive the leader (or ignore SIGTERM): kill what is left.
            if proc.poll() is None or _group_members(pgid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired as e:
                    raise EngineStopError(self.engine, f"pid {proc.pid} survived SIGKILL") from e
        rc = proc.returncode
        deadline = time.monotonic() + PORT_RELEASE_S
        while True:
            left = _group_members(pgid)
            port_busy = self._still_listening()
            if not left and not port_busy:
                break
            if time.monotonic() > deadline:
                what = [f"processes {[p.pid for p in left]} of group {pgid} remain"] if left else []
                if port_busy:
                    what.append(f"port {self.port} is still in use")
                raise EngineStopError(self.engine, "; ".join(what) + " after stop")
            time.sleep(0.05)
        log.info("%s: stopped (exit code %s)", self.engine, rc)
        return rc

    def __enter__(self) -> EngineServer:
        if self._proc is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        except EngineStopError:
            if exc is None:
                raise
            # Don't hide the error that ended the block; the stop failure goes to the log.
            log.exception("%s: stop failed while handling another error", self.engine)
