"""GSM8K: the pinned loader and download, the prompts, and lm-eval's two filters on known cases."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agent.evals.gsm8k import (
    COT_EXEMPLARS,
    GSM8K_TEST_QUESTIONS,
    GSM8K_TEST_SHA256,
    GSM8KTask,
    fetch_gsm8k,
    flexible_extract,
    lm_eval_normalise,
    load_gsm8k,
    score_reply,
    sha256_file,
    strict_match,
)
from agent.evals.task import DataError, Reply
from contract.evals import GSM8KSettings
from contract.suite import RequestSettings
from tests.agent.evals.conftest import (
    GSM8K_FIXTURE,
    GSM8K_FIXTURE_SHA256,
    REAL_GSM8K,
    chat_response,
    scripted_server,
)

# --- loader ---


def test_fixture_loads_with_its_pin():
    items = load_gsm8k(GSM8K_FIXTURE, sha256=GSM8K_FIXTURE_SHA256)
    assert [i.target for i in items] == ["12", "1380", "9", "0.75", "-7", "1200"]
    assert [i.question_id for i in items] == [f"gsm8k-{n}" for n in range(6)]
    assert items[1].question.startswith("A bike costs $300")


def test_loader_refuses_a_file_that_is_not_the_pinned_one():
    # The fixture is not the real test split: the default pin must refuse it.
    with pytest.raises(DataError, match="expected " + GSM8K_TEST_SHA256):
        load_gsm8k(GSM8K_FIXTURE)


def test_loader_says_what_is_wrong_with_a_bad_file(tmp_path: Path):
    with pytest.raises(DataError, match="does not exist"):
        load_gsm8k(tmp_path / "missing.jsonl", sha256=None)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "no final line"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: the answer has no '#### N' line"):
        load_gsm8k(bad, sha256=None)
    bad.write_text("not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: not a GSM8K row"):
        load_gsm8k(bad, sha256=None)


def test_fetch_downloads_checks_and_keeps_the_file(tmp_path: Path):
    payload = GSM8K_FIXTURE.read_bytes()
    with scripted_server(lambda body: chat_response(), files={"test.jsonl": payload}) as server:
        url = f"{server.url}/files/test.jsonl"
        dest = fetch_gsm8k(tmp_path / "gsm8k.jsonl", url=url, sha256=GSM8K_FIXTURE_SHA256)
        assert dest.read_bytes() == payload
        # A second call finds the right file and does not download again.
        assert fetch_gsm8k(dest, url=f"{server.url}/files/gone", sha256=GSM8K_FIXTURE_SHA256)
    assert len(load_gsm8k(dest, sha256=GSM8K_FIXTURE_SHA256)) == 6


def test_fetch_refuses_altered_bytes_and_leaves_nothing(tmp_path: Path):
    payload = GSM8K_FIXTURE.read_bytes().replace(b"#### 12", b"#### 13")
    with scripted_server(lambda body: chat_response(), files={"test.jsonl": payload}) as server:
        dest = tmp_path / "gsm8k.jsonl"
        with pytest.raises(DataError, match="expected " + GSM8K_FIXTURE_SHA256):
            fetch_gsm8k(dest, url=f"{server.url}/files/test.jsonl", sha256=GSM8K_FIXTURE_SHA256)
        with pytest.raises(DataError, match="HTTP 404"):
            fetch_gsm8k(dest, url=f"{server.url}/files/missing", sha256=GSM8K_FIXTURE_SHA256)
    assert list(tmp_path.iterdir()) == []


def test_fetch_reports_an_unreachable_host(tmp_path: Path):
    with pytest.raises(DataError, match="failed"):
        fetch_gsm8k(tmp_path / "x.jsonl", url="http://127.0.0.1:9/x", sha256="0" * 64, timeout_s=2)
    assert list(tmp_path.iterdir()) == []


# --- scoring ---


def test_reference_solutions_score_full_marks():
    for item in load_gsm8k(GSM8K_FIXTURE, sha256=GSM8K_FIXTURE_SHA256):
        result = score_reply(item.answer, item.target)
        assert result.strict_match.correct, item
        assert result.flexible_extract.correct, item
        assert result.strict_match.string_match and result.flexible_extract.string_match


def test_known_wrong_answers_score_zero():
    items = load_gsm8k(GSM8K_FIXTURE, sha256=GSM8K_FIXTURE_SHA256)
    # Each reference solution against the next question's target: all distinct, all wrong.
    for item, other in zip(items, items[1:] + items[:1], strict=True):
        result = score_reply(item.answer, other.target)
        assert not result.strict_match.correct and not result.flexible_extract.correct
        assert "!=" in result.flexible_extract.reason


@pytest.mark.parametrize(
    ("reply", "flexible", "strict"),
    [
        ("So she pays $1,200.", True, False),
        ("The total is 1200.00", True, False),
        ("Each costs 3 dollars, so 400 * 3 = 1200", True, False),
        ("Working...\n#### 1,200", True, True),
        ("#### 1200.\n", True, True),
        ("#### 1200 dollars, not 1300", False, True),  # strict: first '####'; flexible: last
        ("She pays one thousand two hundred dollars.", False, False),
        ("I cannot solve this.", False, False),
        ("The answer is 1201.", False, False),
        ("#### $1,200", True, False),  # lm-eval's strict regex does not allow '$'
    ],
)
def test_formats(reply: str, flexible: bool, strict: bool):
    result = score_reply(reply, "1200")
    assert result.flexible_extract.correct is flexible, result
    assert result.strict_match.correct is strict, result


def test_reasons_say_what_happened():
    words = score_reply("The answer is twelve.", "12")
    assert words.flexible_extract.reason == "no number in the reply"
    assert words.strict_match.reason == "no '#### N' in the reply"
    assert words.flexible_extract.extracted is None
    empty = score_reply("   \n", "12")
    assert empty.flexible_extract.reason == empty.strict_match.reason == "empty reply"
    dots = score_reply("Hmm... let me think", "12")
    assert dots.flexible_extract.extracted == "..."
    assert dots.flexible_extract.reason == "'...' is not a number"
    wrong = score_reply("#### 13", "12")
    assert wrong.strict_match.reason == "13 != 12"


def test_numbers_compare_as_numbers_while_lm_evals_string_verdict_is_kept():
    result = score_reply("#### 1200.00", "1200")
    assert result.strict_match.correct and not result.strict_match.string_match
    negative = score_reply("It ends at -7 degrees.", "-7")
    assert negative.flexible_extract.correct
    assert score_reply("0.750", "0.75").flexible_extract.correct


def test_lm_eval_regexes_and_normalisation():
    assert strict_match("#### 5\n#### 6") == "5"  # take_first of the first match
    assert flexible_extract("3 apples and $4.50.") == "$4.50."  # the last match
    assert lm_eval_normalise("$4.50.") == "4.50"
    assert lm_eval_normalise("Work.\n#### 1,234") == "1234"
    assert strict_match("The answer is 8.", "lm-eval-cot-8shot") == "8"
    assert strict_match("#### 8", "lm-eval-cot-8shot") is None


# --- prompts ---


def _task(items, **settings) -> GSM8KTask:
    return GSM8KTask(GSM8KSettings(**settings), items, data_label="fixture", data_sha256=None)


def test_zero_shot_chat_asks_for_the_final_number():
    items = load_gsm8k(GSM8K_FIXTURE, sha256=GSM8K_FIXTURE_SHA256)
    prepared = _task(items).prepare(items[0])
    assert prepared.prompt is None and prepared.stop is None and prepared.tools is None
    (message,) = prepared.messages or []
    assert message["role"] == "user"
    assert message["content"].endswith(items[0].question)
    assert '"#### <number>"' in message["content"]


def test_cot_8shot_is_lm_evals_gsm8k_cot_format():
    items = load_gsm8k(GSM8K_FIXTURE, sha256=GSM8K_FIXTURE_SHA256)
    prepared = _task(items, prompt="lm-eval-cot-8shot").prepare(items[2])
    text = (prepared.messages or [])[0]["content"]
    assert text.startswith(f"Q: {COT_EXEMPLARS[0][0]}\nA: {COT_EXEMPLARS[0][1]}\n\nQ: ")
    assert text.endswith(f"\n\nQ: {items[2].question}\nA:")
    assert text.count("Q: ") == 9
    assert prepared.stop == ["Q:", "</s>", "<|im_end|>"]


def test_5shot_draws_like_lm_evals_sampler_and_can_go_to_completions():
    items = load_gsm8k(GSM8K_FIXTURE, sha256=GSM8K_FIXTURE_SHA256)
    train = items  # stands in for the train split here
    task = GSM8KTask(
        GSM8KSettings(prompt="lm-eval-5shot", request=RequestSettings(force_output="none")),
        items[:3],
        data_label="fixture",
        data_sha256=None,
        train=train,
    )
    rnd = random.Random(1234)
    for item in items[:3]:
        shots = rnd.sample(train, 5)
        expected = "".join(f"Question: {s.question}\nAnswer: {s.answer}\n\n" for s in shots)
        text = (task.prepare(item).messages or [])[0]["content"]
        assert text == f"{expected}Question: {item.question}\nAnswer:"
    completions = GSM8KTask(
        GSM8KSettings(
            prompt="lm-eval-5shot",
            request=RequestSettings(force_output="none", endpoint="completions"),
        ),
        items,
        data_label="fixture",
        data_sha256=None,
        train=train,
    )
    prepared = completions.prepare(items[0])
    assert prepared.messages is None and (prepared.prompt or "").endswith("\nAnswer:")
    assert prepared.stop == ["Question:", "</s>", "<|im_end|>"]


def test_5shot_without_a_train_split_is_a_clear_error():
    items = load_gsm8k(GSM8K_FIXTURE, sha256=GSM8K_FIXTURE_SHA256)
    with pytest.raises(DataError, match="train split"):
        _task(items, prompt="lm-eval-5shot")


def test_task_scores_with_flexible_extract_as_the_headline():
    items = load_gsm8k(GSM8K_FIXTURE, sha256=GSM8K_FIXTURE_SHA256)
    task = _task(items, limit=2)
    assert [q.index for q in task.questions()] == [0, 1]
    scored = task.score(items[1], Reply(content="That makes $1,380."))
    assert scored.correct and scored.marks == {"flexible-extract": True, "strict-match": False}
    assert scored.extracted == "1380"
    assert scored.reason.startswith("flexible-extract: 1380 = 1380; strict-match: no '#### N'")


def test_settings_refuse_forced_output_lengths():
    with pytest.raises(ValueError, match="force_output must be 'none'"):
        GSM8KSettings(request=RequestSettings())
    # From a spec, leaving force_output out means none (RequestSettings' default forces it).
    spec = GSM8KSettings.model_validate({"request": {"extra_body": {"cache_prompt": False}}})
    assert spec.request.force_output == "none" and spec.max_tokens == 2048
    assert spec.request.thinking is False and spec.request.temperature == 0.0
    with pytest.raises(ValueError, match="extra"):
        GSM8KSettings.model_validate({"max_token": 10})


# --- the real test split, where this checkout has it ---


@pytest.mark.skipif(not REAL_GSM8K.is_file(), reason="shared/data/gsm8k/test.jsonl not present")
def test_real_test_split_loads_by_its_pin_and_every_reference_scores():
    assert sha256_file(REAL_GSM8K) == GSM8K_TEST_SHA256
    items = load_gsm8k(REAL_GSM8K)
    assert len(items) == GSM8K_TEST_QUESTIONS
    strict = flexible = strings = 0
    for item in items:
        result = score_reply(item.answer, item.target)
        strict += result.strict_match.correct
        flexible += result.flexible_extract.correct
        strings += result.strict_match.string_match and result.flexible_extract.string_match
    assert strict == flexible == strings == GSM8K_TEST_QUESTIONS
