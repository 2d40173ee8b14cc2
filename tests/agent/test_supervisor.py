"""The engine supervisor against real processes: a real llama-server on the tiny model,
a server that dies during start-up, one that never gets healthy, one that ignores SIGTERM,
a port already taken, and secrets that must not reach the logs."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from pathlib import Path

import httpx
import orjson
import psutil
import pytest

from agent.supervisor import (
    EngineServer,
    EngineStartError,
    free_port,
    port_in_use,
    redact_env,
)
from engines.builds.llamacpp import LlamaCppBuild
from engines.models.tiny_gguf import expected_token_count
from tests.fixtures.llama_server import llama_server_argv

# A server that answers every GET with 503: up, never healthy.
UNHEALTHY_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(503); self.end_headers(); self.wfile.write(b"loading")
    def log_message(self, *a):
        pass
print("listening", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

# Ignores SIGTERM and has a child that does too: only SIGKILL to the group ends both.
STUBBORN_GROUP = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
print("child", child.pid, flush=True)
time.sleep(60)
"""


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                pids.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return pids


def test_free_port_and_port_in_use() -> None:
    port = free_port()
    assert not port_in_use(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert port_in_use(port)
    assert not port_in_use(port)


@pytest.mark.slow
def test_llama_server_serves_and_stops_clean(
    llama_server_build: LlamaCppBuild, tiny_gguf_path: Path, tmp_path: Path
) -> None:
    port = free_port()
    argv = llama_server_argv(llama_server_build.binary, tiny_gguf_path, port, parallel=2, ctx=4096)
    base = f"http://127.0.0.1:{port}"
    with EngineServer("llama.cpp", argv, log_path=tmp_path / "server.log", port=port) as srv:
        health_s = srv.wait_healthy(f"{base}/health", timeout_s=60)
        assert srv.health_s == health_s and 0 < health_s < 60
        pgid = srv.pgid
        assert pgid is not None and _group_pids(pgid)

        text = "Record 000001. Hello, world!"
        tokens = httpx.post(f"{base}/tokenize", json={"content": text}, timeout=10).json()["tokens"]
        assert len(tokens) == expected_token_count(text)

        body = {
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 32,
            "stream": True,
            "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": False},
        }
        usage = None
        content = ""
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    event = orjson.loads(line[6:])
                    usage = event.get("usage") or usage
                    for choice in event.get("choices", []):
                        content += choice.get("delta", {}).get("content") or ""
        assert usage is not None and usage["completion_tokens"] == 32
        assert len(content) == 32
        assert f"listening on {base}" in srv.log_tail(200)  # the server's output is captured

        rc = srv.stop(grace_s=10)
        assert rc is not None
    assert not port_in_use(port)
    assert _group_pids(pgid) == []


def test_exit_during_start_up_names_engine_and_log_tail(tmp_path: Path) -> None:
    script = (
        "import sys; print('loading model...'); print('error: unknown flag --bogus'); sys.exit(2)"
    )
    srv = EngineServer("fake-engine", [sys.executable, "-c", script], log_path=tmp_path / "s.log")
    with srv, pytest.raises(EngineStartError) as err:
        srv.wait_healthy(f"http://127.0.0.1:{free_port()}/health", timeout_s=30)
    e = err.value
    assert e.engine == "fake-engine"
    assert "exited with code 2" in str(e)
    assert str(e).startswith("fake-engine: ")
    assert "error: unknown flag --bogus" in e.log_tail
    assert "error: unknown flag --bogus" in str(e)


def test_never_healthy_times_out_within_deadline(tmp_path: Path) -> None:
    port = free_port()
    srv = EngineServer(
        "slow-engine",
        [sys.executable, "-c", UNHEALTHY_SERVER, str(port)],
        log_path=tmp_path / "s.log",
        port=port,
    )
    t0 = time.monotonic()
    with srv, pytest.raises(EngineStartError) as err:
        srv.wait_healthy(f"http://127.0.0.1:{port}/health", timeout_s=2.0)
    elapsed = time.monotonic() - t0
    assert 2.0 <= elapsed < 3.5, elapsed
    assert "not healthy" in str(err.value) and "HTTP 503" in str(err.value)
    assert "listening" in err.value.log_tail
    assert srv.health_s is None
    assert not port_in_use(port)


def test_stop_kills_a_group_that_ignores_sigterm(tmp_path: Path) -> None:
    srv = EngineServer(
        "stubborn", [sys.executable, "-c", STUBBORN_GROUP], log_path=tmp_path / "s.log"
    )
    srv.start()
    pgid = srv.pgid
    assert pgid is not None
    deadline = time.monotonic() + 10
    while len(_group_pids(pgid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_group_pids(pgid)) == 2
    t0 = time.monotonic()
    rc = srv.stop(grace_s=0.5)
    assert rc == -9
    assert time.monotonic() - t0 < 5
    assert _group_pids(pgid) == []
    assert srv.stop() == -9  # idempotent


def test_port_in_use_refuses_to_start(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        srv = EngineServer(
            "busy", [sys.executable, "-c", "pass"], log_path=tmp_path / "s.log", port=port
        )
        with pytest.raises(EngineStartError, match=f"busy: port {port} .* in use"):
            srv.start()
        assert srv.pid is None


def test_secrets_never_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    secret = "hf_s3cr3tvalue0123456789"
    env = {"HF_TOKEN": secret, "AWS_SECRET_ACCESS_KEY": secret + "x", "MODE": "plain"}
    script = "import os, sys; print('token is', os.environ['HF_TOKEN'], flush=True); sys.exit(1)"
    caplog.set_level(logging.DEBUG, logger="agent.supervisor")
    srv = EngineServer(
        "leaky", [sys.executable, "-c", script], env=env, log_path=tmp_path / "s.log"
    )
    with srv, pytest.raises(EngineStartError) as err:
        srv.wait_healthy(f"http://127.0.0.1:{free_port()}/health", timeout_s=30)
    assert secret not in str(err.value)
    assert "token is ***" in err.value.log_tail
    assert secret not in caplog.text
    assert "plain" in caplog.text  # non-secret env and argv are logged
    assert redact_env(env) == {"HF_TOKEN": "***", "AWS_SECRET_ACCESS_KEY": "***", "MODE": "plain"}


# A server that answers every GET with 200: healthy as soon as it listens.
HEALTHY_SERVER = UNHEALTHY_SERVER.replace("send_response(503)", "send_response(200)")


def test_health_answered_by_another_process_does_not_count(tmp_path: Path) -> None:
    """A server already on the health URL (another engine, another user) is never taken for
    the process just started: that one must own the listening socket."""
    other_port = free_port()
    with EngineServer(
        "other", [sys.executable, "-c", HEALTHY_SERVER, str(other_port)],
        log_path=tmp_path / "other.log", port=other_port,
    ) as other:  # fmt: skip
        other.wait_healthy(f"http://127.0.0.1:{other_port}/health", 30)
        ours = EngineServer(
            "ours", [sys.executable, "-c", "import time; time.sleep(60)"],
            log_path=tmp_path / "ours.log", port=free_port(),
        )  # fmt: skip
        with ours, pytest.raises(EngineStartError, match="another process holding port"):
            ours.wait_healthy(f"http://127.0.0.1:{other_port}/health", 2)


def test_a_port_taken_by_someone_else_after_stop_is_not_a_leak(tmp_path: Path) -> None:
    port = free_port()
    server = EngineServer(
        "ours", [sys.executable, "-c", HEALTHY_SERVER, str(port)],
        log_path=tmp_path / "ours.log", port=port,
    ).start()  # fmt: skip
    server.wait_healthy(f"http://127.0.0.1:{port}/health", 30)
    assert server.owns_port()
    assert server.pgid is not None
    os.killpg(server.pgid, 9)
    deadline = time.monotonic() + 10
    while port_in_use(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    # Another engine takes the port the moment it is free: stop() must not blame this one.
    with socket.create_server(("127.0.0.1", port)):
        assert server.stop(grace_s=1) == -9


def test_a_server_that_lost_its_port_at_start_up_reports_that_not_a_leak(tmp_path: Path) -> None:
    """Another process binds the port while the engine loads: the engine exits, and stop()
    does not blame it for the port it never held."""
    port = free_port()
    server = EngineServer(
        "ours", [sys.executable, "-c", "import time, sys; time.sleep(0.5); sys.exit(1)"],
        log_path=tmp_path / "ours.log", port=port,
    ).start()  # fmt: skip
    with socket.create_server(("127.0.0.1", port)):
        with pytest.raises(EngineStartError, match="exited with code 1"):
            server.wait_healthy(f"http://127.0.0.1:{port}/health", 30)
        assert server.stop(grace_s=1) == 1
