"""Model references resolved as the runner does, hub files downloaded from a local fake hub.

huggingface_hub itself downloads (in the resolver's child process) from
tests/fixtures/slow_hub.py through `HF_ENDPOINT`: a file arrives with the token sent and
never in an argument list; a missing file is one clear line; a spot notice or SIGTERM
during a long download ends it within seconds and leaves no process behind; the next
attempt (a relaunched shard) completes it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import pytest

from agent.models import ModelResolveError, resolve_model
from tests.fixtures.slow_hub import SlowHub, slow_hub

REPO = "org/tiny-GGUF"
FILE = "tiny-Q4_0.gguf"
TOKEN = "hf_modelsTEST0123456789"


@pytest.fixture
def hub_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


def _file_gets(hub: SlowHub) -> list[str]:
    return [at for method, at, _ in hub.requests if method == "GET" and "/resolve/" in at]


def _children(besides: frozenset[int] = frozenset()) -> list[psutil.Process]:
    """This process's live children, other than `besides` (other tests' session servers)."""
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if p.pid not in besides and p.status() != psutil.STATUS_ZOMBIE
    ]


def test_a_hub_file_is_downloaded_with_the_token(
    hub_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    content = b"GGUF" + bytes(range(256)) * 40
    with slow_hub(REPO, FILE, content, token=TOKEN) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        path = resolve_model(f"{REPO}:{FILE}", tmp_path / "models", {"HF_TOKEN": TOKEN})
        assert Path(path).read_bytes() == content
        asked = [ok for _, at, ok in hub.requests if "/resolve/" in at]
        assert asked and all(asked)
        # Cached: a second resolve asks the hub for metadata only, downloads nothing.
        gets = len(_file_gets(hub))
        assert resolve_model(f"{REPO}:{FILE}", tmp_path / "models", {"HF_TOKEN": TOKEN}) == path
        assert len(_file_gets(hub)) == gets


def test_a_missing_file_or_token_is_one_line(
    hub_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with slow_hub(REPO, FILE, b"GGUF", token=TOKEN) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(ModelResolveError) as missing:
            resolve_model(f"{REPO}:other.gguf", tmp_path / "models", {"HF_TOKEN": TOKEN})
        with pytest.raises(ModelResolveError) as no_token:
            resolve_model(f"{REPO}:{FILE}", tmp_path / "models", {})
    for error in (missing.value, no_token.value):
        assert str(error).startswith(f"{REPO}:") and "download failed: " in str(error)
        assert "\n" not in str(error) and TOKEN not in str(error)


def test_a_stop_during_a_long_download_ends_it_promptly_and_a_retry_completes(
    hub_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4 MiB at 64 KiB every 0.2 s: about 13 s to download whole.
    content = bytes(range(256)) * (16 * 1024)
    stop = threading.Event()
    earlier = frozenset(p.pid for p in _children())
    with slow_hub(REPO, FILE, content, chunk_bytes=64 * 1024, delay_s=0.2) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        errors: list[BaseException] = []

        def resolve() -> None:
            try:
                resolve_model(f"{REPO}:{FILE}", tmp_path / "models", {}, should_stop=stop.is_set)
            except BaseException as exc:  # collected for the main thread
                errors.append(exc)

        worker = threading.Thread(target=resolve)
        worker.start()
        assert hub.get_started.wait(60), "the download never started"
        time.sleep(1.0)  # some chunks in
        stop.set()
        stopped_at = time.monotonic()
        worker.join(timeout=30)
        assert not worker.is_alive()
        assert time.monotonic() - stopped_at < 5, "the stop was not prompt"
        assert len(errors) == 1 and isinstance(errors[0], ModelResolveError)
        assert "download interrupted" in str(errors[0])
        assert not _children(besides=earlier)
        assert len(_file_gets(hub)) == 1, "the stopped download was not retried"

        # The relaunched shard asks again and gets the whole file, whatever was left behind.
        hub.delay_s = 0.0
        path = resolve_model(f"{REPO}:{FILE}", tmp_path / "models", {})
        assert Path(path).read_bytes() == content
