"""`--out` reused: refused, resumed or overwritten as asked, never mixed (real `bench`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contract.results import ProbeSummary, RequestRecord, SweepSummary
from refserver.harness import ReferenceServer, reference_server

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH = str(Path(sys.executable).with_name("bench"))
FLAGS = ["--shapes", "64/8", "--levels", "1,2", "--repeats", "1", "--no-warmup"]


@pytest.fixture(scope="module")
def server() -> Iterator[ReferenceServer]:
    with reference_server(ttft_ms=2, itl_ms=1) as srv:
        yield srv


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BENCH, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200"},
        check=False,
    )


def request_ids(out: Path, name: str = "requests.jsonl") -> list[str]:
    lines = (out / name).read_text().splitlines()
    return [RequestRecord.model_validate_json(line).request_id for line in lines]


def stopped_when(
    ready: Callable[[], bool], sig: signal.Signals, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run `bench ARGS`; send `sig` as soon as `ready()` holds (a crash, or Ctrl-C)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200"}
    with subprocess.Popen(
        [BENCH, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # Ctrl-C as at a terminal: a shell's background job (`.ci/run &`) passes SIGINT on
        # ignored, and Python then never turns it into KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as run:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and run.poll() is None and not ready():
            time.sleep(0.02)
        run.send_signal(sig)
        _, stderr = run.communicate(timeout=60)
    return subprocess.CompletedProcess(run.args, run.returncode, "", stderr)


def lines_on_disk(out: Path) -> int:
    return len(request_ids(out)) if (out / "requests.jsonl").exists() else 0


def export_labels(out: Path, infix: str = "") -> list[str]:
    path = out / f"vllm_bench_serve.{infix}jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["label"] for line in lines if line.strip()]


def test_a_folder_with_results_is_refused_with_one_line(server: ReferenceServer, tmp_path: Path):
    out = tmp_path / "s"
    assert bench("sweep", server.url, *FLAGS, "--out", str(out)).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for command in (["sweep", *FLAGS], ["probe", "--repeats", "1"]):
        result = bench(command[0], server.url, *command[1:], "--out", str(out))
        assert result.returncode == 2
        assert result.stderr.strip().count("\n") == 0
        assert "already holds results" in result.stderr and "--resume" in result.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_overwrite_moves_the_old_run_aside_and_never_deletes(
    server: ReferenceServer, tmp_path: Path
):
    out = tmp_path / "s"
    assert bench("sweep", server.url, *FLAGS, "--out", str(out)).returncode == 0
    old = request_ids(out)
    result = bench("sweep", server.url, *FLAGS, "--out", str(out), "--overwrite")
    assert result.returncode == 0, result.stderr
    (aside,) = tmp_path.glob("s.replaced-*")
    assert request_ids(aside) == old
    new = request_ids(out)
    assert len(new) == len(set(new)) == len(old)


def test_resume_finishes_an_interrupted_sweep_without_mixing(
    server: ReferenceServer, tmp_path: Path
):
    out = tmp_path / "s"
    assert bench("sweep", server.url, *FLAGS, "--out", str(out)).returncode == 0
    # What a crash while the second cell was measured leaves: its records on disk, the
    # summary written after the first cell only.
    summary = json.loads((out / "summary.json").read_text())
    first_cell = summary["cells"][0]
    summary.update(cells=[first_cell], finished_unix_s=None)
    (out / "summary.json").write_text(json.dumps(summary))
    first_ids = [i for i in request_ids(out) if i.startswith("in64-out8/c1/")]
    interrupted = [i for i in request_ids(out) if i.startswith("in64-out8/c2/")]

    other = bench("sweep", server.url, *FLAGS[:-1], "--out", str(out), "--resume")
    assert other.returncode == 2 and "other settings" in other.stderr

    result = bench("sweep", server.url, *FLAGS, "--out", str(out), "--resume")
    assert result.returncode == 0, result.stderr
    done = SweepSummary.model_validate_json((out / "summary.json").read_text())
    assert done.finished_unix_s is not None
    assert [(c.concurrency, c.status) for c in done.cells] == [(1, "ok"), (2, "ok")]
    assert done.cells[0] == SweepSummary.model_validate(summary).cells[0], "kept as it was"
    ids = request_ids(out)
    assert len(ids) == len(set(ids)), "no request twice"
    assert [i for i in ids if i.startswith("in64-out8/c1/")] == first_ids
    assert request_ids(out, "requests.interrupted.jsonl") == interrupted

    finished = (out / "summary.json").read_bytes()
    again = bench("sweep", server.url, *FLAGS, "--out", str(out), "--resume")
    assert again.returncode == 0 and "already complete" in again.stdout
    assert (out / "summary.json").read_bytes() == finished and request_ids(out) == ids


RATE_FLAGS = ["--mode", "rate", "--rates", "8,16", "--window-s", "1.5", "--warmup-s", "0"]
RATE_FLAGS += ["--shapes", "64/8", "--repeats", "2"]


def test_a_rate_sweep_killed_in_its_second_cell_resumes_without_mixing(
    server: ReferenceServer, tmp_path: Path
):
    out = tmp_path / "rate"
    # Killed once the second cell's first window is on disk (its export line is written
    # last) and its second window runs: a crash mid-cell.
    stopped_when(
        lambda: "bench:in64-out8/rate16" in export_labels(out),
        signal.SIGKILL,
        *["sweep", server.url, *RATE_FLAGS, "--out", str(out)],
    )
    first = SweepSummary.model_validate_json((out / "summary.json").read_text())
    assert [c.request_rate for c in first.cells] == [8.0] and first.finished_unix_s is None
    kept = [i for i in request_ids(out) if i.startswith("in64-out8/rate8/")]
    interrupted = [i for i in request_ids(out) if i.startswith("in64-out8/rate16/")]
    assert kept and interrupted

    result = bench("sweep", server.url, *RATE_FLAGS, "--out", str(out), "--resume")
    assert result.returncode == 0, result.stderr
    assert "set aside" in result.stdout
    done = SweepSummary.model_validate_json((out / "summary.json").read_text())
    assert done.finished_unix_s is not None
    assert [(c.request_rate, c.status) for c in done.cells] == [(8.0, "ok"), (16.0, "ok")]
    assert done.cells[0] == first.cells[0], "the finished cell is kept as it was"
    ids = request_ids(out)
    assert len(ids) == len(set(ids)), "no request twice"
    assert [i for i in ids if i.startswith("in64-out8/rate8/")] == kept
    assert request_ids(out, "requests.interrupted.jsonl") == interrupted
    exported = export_labels(out)
    assert exported == ["bench:in64-out8/rate8"] * 2 + ["bench:in64-out8/rate16"] * 2
    assert export_labels(out, "interrupted.") == ["bench:in64-out8/rate16"]


def test_an_interrupted_probe_resumes_with_what_it_had_finished(tmp_path: Path):
    out = tmp_path / "p"
    flags = ["--output-tokens", "16", "--repeats", "2", "--at-once", "3", "--out", str(out)]
    # About 1 s a request, so after the third line at least 9 s of the probe are left: a
    # loaded host's late Ctrl-C still lands mid-probe.
    with reference_server(ttft_ms=5, itl_ms=60) as slow:

        def three_on_disk() -> bool:  # then Ctrl-C, as a user stops a probe
            return lines_on_disk(out) >= 3

        probe = stopped_when(three_on_disk, signal.SIGINT, "probe", slow.url, *flags)
        assert probe.returncode == 130, probe.stderr
        assert "interrupted; results written so far are kept" in probe.stderr
        first = ProbeSummary.model_validate_json((out / "summary.json").read_text())
        assert first.finished_unix_s is None
        kept = (out / "requests.jsonl").read_text().splitlines()
        assert 3 <= len(kept) < 12

        other = bench("probe", slow.url, *flags[:-2], "--repeats", "1", "--out", str(out))
        assert other.returncode == 2 and "already holds results" in other.stderr
        result = bench("probe", slow.url, *flags, "--resume")
        assert result.returncode == 0, result.stderr
        assert f"resuming: {len(kept)} of 15 request(s) kept" in result.stdout
        done = ProbeSummary.model_validate_json((out / "summary.json").read_text())
        assert done.finished_unix_s is not None and done.started_unix_s == first.started_unix_s
        assert done.requests_failed == 0 and [p.repeats_ok for p in done.prompts] == [2] * 6
        lines = (out / "requests.jsonl").read_text().splitlines()
        assert lines[: len(kept)] == kept, "the finished requests are kept as they were"
        ids = request_ids(out)
        assert len(ids) == len(set(ids)) == 15, "every request once"

        again = bench("probe", slow.url, *flags, "--resume")
    assert again.returncode == 0 and "already complete" in again.stdout
    assert (out / "requests.jsonl").read_text().splitlines() == lines


def test_a_sweep_killed_in_its_first_cell_resumes(tmp_path: Path):
    out = tmp_path / "s"
    flags = ["--shapes", "64/16", "--levels", "1,2", "--repeats", "3", "--out", str(out)]
    with reference_server(ttft_ms=5, itl_ms=25) as slow:
        stopped_when(lambda: lines_on_disk(out) > 0, signal.SIGKILL, "sweep", slow.url, *flags)
        first = SweepSummary.model_validate_json((out / "summary.json").read_text())
        assert first.cells == [] and first.finished_unix_s is None, "written once calibrated"
        interrupted = request_ids(out)
        result = bench("sweep", slow.url, *flags, "--resume")
    assert result.returncode == 0, result.stderr
    done = SweepSummary.model_validate_json((out / "summary.json").read_text())
    assert [(c.concurrency, c.status) for c in done.cells] == [(1, "ok"), (2, "ok")]
    assert done.started_unix_s == first.started_unix_s
    ids = request_ids(out)
    assert len(ids) == len(set(ids)) == 12, "each request of the sweep once"
    assert request_ids(out, "requests.interrupted.jsonl") == interrupted


def test_resume_needs_results(server: ReferenceServer, tmp_path: Path):
    result = bench("sweep", server.url, *FLAGS, "--out", str(tmp_path / "none"), "--resume")
    assert result.returncode == 2 and "holds no results" in result.stderr


def test_resume_of_a_run_stopped_before_its_summary_says_so(
    server: ReferenceServer, tmp_path: Path
):
    out = tmp_path / "p"
    out.mkdir()
    (out / "requests.jsonl").write_text("{}\n")
    result = bench("probe", server.url, "--out", str(out), "--resume")
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "holds requests but no summary" in result.stderr and "--overwrite" in result.stderr


@pytest.mark.parametrize("shapes", ["64/0", "", "abc"])
def test_bad_shapes_are_one_line(server: ReferenceServer, tmp_path: Path, shapes: str):
    result = bench("sweep", server.url, "--shapes", shapes, "--out", str(tmp_path / "x"))
    assert result.returncode == 2
    assert result.stderr.startswith("bench sweep: --shapes") and "http" not in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert not (tmp_path / "x").exists()


def test_a_gpu_spec_is_refused_up_front_on_a_host_without_one(tmp_path: Path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    spec = REPO_ROOT / "agent" / "campaigns" / "t4-six-engines.toml"
    result = bench("run", str(spec), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]  # after the GPU probe's log line
    assert last.startswith("bench run: ") and "need an NVIDIA GPU" in last and "vllm" in last
    assert not (tmp_path / "out").exists()


def test_a_401_hints_at_the_api_key(server: ReferenceServer, tmp_path: Path):
    from tests.fixtures.fault_proxy import fault_proxy

    with fault_proxy(server.port, mode="unauthorized") as proxy:
        result = bench("sweep", proxy.url, *FLAGS, "--out", str(tmp_path / "x"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "HTTP 401" in result.stderr and "BENCH_API_KEY" in result.stderr
    assert not (tmp_path / "x").exists()


RUN_SPEC = """
name = "outdir-test"
end_action = "stay"
[model]
name = "tiny"
sources = { llamacpp = "generated:tiny-llama" }
[[shards]]
name = "here"
instance_type = "local"
arms = ["llama"]
[suite.probe]
output_tokens = 8
repeats = 1
at_once = 2
[suite.sweep]
shapes = ["64/16"]
levels = [1]
repeats = 1
"""


@pytest.mark.slow
def test_bench_run_refuses_resumes_with_a_merged_manifest_and_overwrites(
    tmp_path: Path, llama_server_build
):
    from contract.jobs import Manifest

    spec = tmp_path / "spec.toml"
    spec.write_text(RUN_SPEC)
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "BENCH_CACHE_DIR": str(tmp_path / "cache"),
        "LLAMA_SERVER_BIN": str(llama_server_build.binary),
        "COLUMNS": "200",
    }

    def run(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [BENCH, "run", str(spec), "--out", str(out), *flags],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            check=False,
        )

    first = run()
    assert first.returncode == 0, first.stderr[-2000:]
    shard = out / "outdir-test" / "here"
    before = Manifest.model_validate_json((shard / "manifest.json").read_text())
    log = (shard / "agent.log").read_text()
    assert "START job llama-probe" in log and "END job llama-sweep: ok" in log
    assert before.engines and before.engines[0].port is not None

    refused = run()
    assert refused.returncode == 2 and "already holds results" in refused.stderr
    assert Manifest.model_validate_json((shard / "manifest.json").read_text()) == before

    resumed = run("--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    merged = Manifest.model_validate_json((shard / "manifest.json").read_text())
    assert merged.started_unix_s == before.started_unix_s
    assert merged.finished_unix_s is not None and merged.finished_unix_s > before.started_unix_s
    assert merged.engines == before.engines, "nothing served again: the earlier build is kept"
    assert len(merged.runs) == 2 and merged.runs[1].jobs_run == []
    assert merged.jobs_ok == ["llama-probe", "llama-sweep"]

    assert run("--overwrite").returncode == 0
    (aside,) = (out / "outdir-test").glob("here.replaced-*")
    assert Manifest.model_validate_json((aside / "manifest.json").read_text()) == merged
