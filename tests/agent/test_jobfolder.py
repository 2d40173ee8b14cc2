"""The job-folder writer: every file of a job, where the report, fetch and resume read them."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from agent.jobfolder import JobFolder, ResultWriteError
from contract.evals import AnswerRecord
from contract.jobs import JOB_FILE, SERVER_LOG_FILE, JobRecord
from contract.results import DONE_FILE, REQUESTS_FILE, SUMMARY_FILE, RequestRecord


def _record(status: str, reason: str | None = None) -> JobRecord:
    return JobRecord.model_validate(
        {
            "job_id": "arm-probe",
            "arm": "arm",
            "item": "probe",
            "status": status,
            "reason": reason,
            "started_unix_s": 1.0,
            "finished_unix_s": 2.0,
        }
    )


def _request(label: str) -> RequestRecord:
    return RequestRecord(
        request_id=label, label=label, endpoint="chat", dispatch_ns=1, send_ns=2, end_ns=3
    )


def test_asking_leaves_no_folder_and_a_record_comes_before_done(tmp_path: Path) -> None:
    folder = JobFolder(tmp_path / "jobs" / "arm-probe", create=False)
    assert not folder.is_done and folder.record() is None
    assert not folder.path.exists()

    folder.finish(_record("failed", "server exited"))
    assert folder.record() == _record("failed", "server exited")
    assert not folder.is_done  # a failed job is run again

    folder.finish(_record("ok"))
    assert folder.is_done and (folder.path / DONE_FILE).read_bytes() == b""
    on_disk = orjson.loads((folder.path / JOB_FILE).read_bytes())
    assert on_disk["status"] == "ok"
    assert sorted(p.name for p in folder.path.iterdir()) == [DONE_FILE, JOB_FILE]  # no temp left


def test_lines_append_and_a_resume_sets_aside_only_the_rejected(tmp_path: Path) -> None:
    folder = JobFolder(tmp_path)
    folder.append_requests([_request("s/c1/r1"), _request("s/c2/r1")])
    folder.append_requests([_request("s/c2/r2")])
    with (tmp_path / REQUESTS_FILE).open("ab") as handle:
        handle.write(b"{cut mid-li")

    moved = folder.set_aside(REQUESTS_FILE, lambda row: row["label"] == "s/c1/r1")

    assert moved == 3  # two of the interrupted cell, and the torn line
    kept = (tmp_path / REQUESTS_FILE).read_bytes().splitlines()
    assert [orjson.loads(line)["label"] for line in kept] == ["s/c1/r1"]
    aside = (tmp_path / "requests.interrupted.jsonl").read_bytes().splitlines()
    assert len(aside) == 3 and aside[-1] == b"{cut mid-li"
    assert folder.set_aside("absent.jsonl", lambda row: False) == 0


def test_an_eval_restarts_its_answers_and_summary(tmp_path: Path) -> None:
    folder = JobFolder(tmp_path)
    (tmp_path / SUMMARY_FILE).write_text("{}")
    (tmp_path / "answers.jsonl").write_text("an earlier attempt\n")
    folder.remove_summary()
    folder.start_answers()
    answer = AnswerRecord(
        eval="gsm8k",
        index=0,
        question_id="q0",
        reply="42",
        correct=True,
        reason="matched",
        marks={"flexible-extract": True},
        truncated=False,
    )
    folder.append_answer(answer)
    assert not (tmp_path / SUMMARY_FILE).exists()
    lines = (tmp_path / "answers.jsonl").read_bytes().splitlines()
    assert [AnswerRecord.model_validate_json(line) for line in lines] == [answer]


def test_the_server_log_is_the_jobs_own_part(tmp_path: Path) -> None:
    whole = tmp_path / "servers" / "arm.log"
    whole.parent.mkdir()
    whole.write_text("earlier job\nthis job: line 1\nthis job: line 2\n")
    folder = JobFolder(tmp_path / "job")
    folder.copy_server_log(whole, len("earlier job\n"))
    assert (folder.path / SERVER_LOG_FILE).read_text() == "this job: line 1\nthis job: line 2\n"
    assert folder.server_log_tail(1) == "this job: line 2"
    folder.copy_server_log(tmp_path / "no-such.log", 0)  # nothing to copy: not an error


def test_a_folder_that_cannot_be_written_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ResultWriteError, match="cannot create results folder"):
        JobFolder(tmp_path / "a-file" / "job")
    folder = JobFolder(tmp_path / "job")
    (folder.path / "summary.json.tmp").mkdir()  # in the way, whoever runs the test
    (folder.path / REQUESTS_FILE).mkdir()
    with pytest.raises(ResultWriteError, match=r"cannot write .*summary\.json"):
        folder.write_summary(_record("ok"))
    with pytest.raises(ResultWriteError, match=r"cannot write .*requests\.jsonl"):
        folder.append_requests([_request("x")])
