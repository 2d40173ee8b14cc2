"""BFCL simple through bfcl-eval's own data, helpers and AST checker, installed with --no-deps.

bfcl-eval must be installed (`pip install --no-deps bfcl-eval==<pin>`, see agent/evals/bfcl.py);
these tests fail, not skip, without it, so a missing install step shows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from agent.evals.bfcl import BFCLItem, BFCLTask, checker_model_name, load_bfcl, official
from agent.evals.task import Reply
from contract.evals import BFCL_EVAL_VERSION, BFCLSettings, ToolCall

_SKIP = object()


def _pick(allowed: list[Any]) -> Any:
    """The first allowed value of a possible answer ('' = may be left out)."""
    for value in allowed:
        if value != "":
            return _materialise(value)
    return _SKIP


def _materialise(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for key, allowed in value.items():
            chosen = _pick(allowed) if isinstance(allowed, list) else allowed
            if chosen is not _SKIP:
                out[key] = chosen
        return out
    if isinstance(value, list):
        return [_materialise(v) for v in value]
    return value


def reference_call(item: BFCLItem) -> tuple[str, dict[str, Any]]:
    """A call built from the possible answer itself: what a perfect model would send."""
    ((name, params),) = item.ground_truth[0].items()
    args = {}
    for key, allowed in params.items():
        chosen = _pick(allowed)
        if chosen is not _SKIP:
            args[key] = chosen
    return name, args


def tool_reply(name: str, arguments: str | dict[str, Any]) -> Reply:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return Reply(tool_calls=[ToolCall(name=name, arguments=text)], finish_reason="tool_calls")


def prompt_reply(name: str, args: dict[str, Any]) -> Reply:
    return Reply(content=f"[{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})]")


@pytest.fixture(scope="module")
def items() -> list[BFCLItem]:
    return load_bfcl()


@pytest.fixture(scope="module")
def tools_task(items: list[BFCLItem]) -> BFCLTask:
    return BFCLTask(BFCLSettings(), items)


@pytest.fixture(scope="module")
def prompt_task(items: list[BFCLItem]) -> BFCLTask:
    return BFCLTask(BFCLSettings(mode="prompt"), items)


def _by_id(items: list[BFCLItem], qid: str) -> BFCLItem:
    return next(i for i in items if i.question_id == qid)


# --- the package and its import footprint ---


def test_pinned_bfcl_eval_is_installed_and_its_checker_is_the_one_used():
    bfcl = official()
    assert bfcl.version == BFCL_EVAL_VERSION
    assert bfcl.ast_checker.__module__ == "bfcl_eval.eval_checker.ast_eval.ast_checker"
    assert "site-packages" in sys.modules[bfcl.ast_checker.__module__].__file__


def test_the_checker_imports_only_filelock_and_tenacity_beyond_the_stdlib():
    # A fresh interpreter: what does importing bfcl-eval's checker and helpers pull in?
    code = (
        "import sys, json\n"
        "import agent.evals.bfcl as b\n"
        "before = {m.split('.')[0] for m in sys.modules}\n"
        "b.official()\n"
        "after = {m.split('.')[0] for m in sys.modules}\n"
        "print(json.dumps(sorted(after - before - set(sys.stdlib_module_names))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    added = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert added <= {"bfcl_eval", "filelock", "tenacity"}, added
    assert "bfcl_eval" in added
    heavy = {"numpy", "pandas", "openai", "anthropic", "tree_sitter", "torch", "mistralai"}
    assert not added & heavy


def test_questions_and_possible_answers_come_from_the_package(items: list[BFCLItem]):
    assert len(items) == 400
    assert items[0].question_id == "simple_python_0"
    assert [i.index for i in items] == list(range(400))
    first = items[0]
    assert first.messages[0]["role"] == "user"
    # The model is shown the language hint; the checker reads the plain description.
    assert first.functions[0]["description"].endswith(
        "Note that the provided function is in Python 3 syntax."
    )
    assert "Python 3 syntax" not in first.checker_functions[0]["description"]
    assert first.ground_truth == (
        {"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}},
    )


# --- requests ---


def test_native_tools_follow_bfcls_openai_conversion(tools_task: BFCLTask, items: list[BFCLItem]):
    item = _by_id(items, "simple_python_2")  # math.hypot
    prepared = tools_task.prepare(item)
    assert prepared.messages == list(item.messages)
    (tool,) = prepared.tools or []
    function = tool["function"]
    assert tool["type"] == "function"
    assert function["name"] == "math_hypot"  # '.' -> '_': OpenAI names allow no dots
    assert function["parameters"]["type"] == "object"  # Gorilla 'dict' -> OpenAPI 'object'
    floats = [
        p
        for i in items
        for p in (tools_task.prepare(i).tools or [])[0]["function"]["parameters"][
            "properties"
        ].values()
        if p.get("format") == "float"
    ]
    assert floats and all(p["type"] == "number" for p in floats)  # Gorilla 'float' -> 'number'
    assert item.functions[0]["name"] == "math.hypot"  # the data itself is left as it was


def test_prompt_mode_puts_bfcls_system_prompt_first(prompt_task: BFCLTask, items: list[BFCLItem]):
    prepared = prompt_task.prepare(items[0])
    assert prepared.tools is None
    system, user = prepared.messages or []
    assert system["role"] == "system"
    assert system["content"].startswith("You are an expert in composing functions.")
    assert "[func_name1(params_name1=params_value1" in system["content"]
    assert '"name": "calculate_triangle_area"' in system["content"]
    assert user == items[0].messages[0]


# --- scoring through the official checker ---


def test_reference_calls_score_full_marks_in_both_modes(
    tools_task: BFCLTask, prompt_task: BFCLTask, items: list[BFCLItem]
):
    for item in items:
        name, args = reference_call(item)
        native = tools_task.score(item, tool_reply(name.replace(".", "_"), args))
        assert native.correct, (item.question_id, native.reason)
        text = prompt_task.score(item, prompt_reply(name, args))
        assert text.correct, (item.question_id, text.reason)
        assert native.marks == {"ast": True} and native.reason == "valid call"


@pytest.mark.parametrize(
    ("reply", "error_type", "reason_part"),
    [
        (
            tool_reply("calculate_triangle_area", {"base": 10, "height": 6}),
            "value_error:others",
            "Invalid value for parameter 'height'",
        ),
        (
            tool_reply("calculate_triangle_area", {"base": 10}),
            "simple_function_checker:missing_required",
            "Missing required parameter: 'height'",
        ),
        (
            tool_reply("calculate_triangle_area", {"base": 10, "height": 5, "colour": "red"}),
            "simple_function_checker:unexpected_param",
            "Unexpected parameter: 'colour'",
        ),
        (
            tool_reply("calculate_triangle_area", {"base": "10", "height": 5}),
            "type_error:simple",
            "Incorrect type for parameter 'base'",
        ),
        (
            tool_reply("calculate_triangle_area", {"base": 10, "height": 5, "unit": "cm"}),
            "value_error:string",
            "Invalid value for parameter 'unit'",
        ),
        (
            tool_reply("get_weather", {"city": "Paris"}),
            "simple_function_checker:wrong_func_name",
            "Function name 'calculate_triangle_area' not found",
        ),
        (
            tool_reply("calculate_triangle_area", '{"base": 10, "height"'),
            "ast_decoder:decoder_failed",
            "Failed to decode AST",
        ),
        (
            tool_reply("calculate_triangle_area", "base=10, height=5"),
            "ast_decoder:decoder_failed",
            "Failed to decode AST",
        ),
        (
            Reply(content="The area is 25 square units."),
            "ast_decoder:decoder_failed",
            "the reply has no tool call",
        ),
        (Reply(content=""), "ast_decoder:decoder_failed", "the reply has no tool call"),
        (
            Reply(
                tool_calls=[
                    ToolCall(name="calculate_triangle_area", arguments='{"base": 10, "height": 5}')
                ]
                * 2
            ),
            "simple_function_checker:wrong_count",
            "Wrong number of functions.",
        ),
    ],
)
def test_wrong_native_calls_are_wrong_with_the_checkers_reason(
    tools_task: BFCLTask, items: list[BFCLItem], reply: Reply, error_type: str, reason_part: str
):
    scored = tools_task.score(items[0], reply)
    assert not scored.correct and scored.marks == {"ast": False}
    assert scored.bfcl is not None and scored.bfcl.error_type == error_type, scored
    assert reason_part in scored.reason
    assert scored.reason.startswith(error_type)


def test_int_is_accepted_where_a_float_is_expected(tools_task: BFCLTask, items: list[BFCLItem]):
    # The checker's Python rule: int is promoted to float.
    float_items = [
        i
        for i in items
        if any(
            p.get("type") == "float"
            for p in i.checker_functions[0]["parameters"]["properties"].values()
        )
    ]
    item = float_items[0]
    name, args = reference_call(item)
    params = item.checker_functions[0]["parameters"]["properties"]
    ints = {
        k: int(v) if params[k].get("type") == "float" and float(v).is_integer() else v
        for k, v in args.items()
    }
    assert tools_task.score(item, tool_reply(name.replace(".", "_"), ints)).correct


@pytest.mark.parametrize(
    ("content", "error_type"),
    [
        ("", "simple_function_checker:wrong_count"),  # decodes to no call at all
        ("I would call the area function.", "ast_decoder:decoder_failed"),
        ("[calculate_triangle_area(base=10, height=", "ast_decoder:decoder_failed"),  # cut off
        ("[area_of_triangle(base=10, height=5)]", "simple_function_checker:wrong_func_name"),
        ('{"name": "calculate_triangle_area"}', "ast_decoder:decoder_failed"),
        ("[1, 2]", "ast_decoder:decoder_failed"),
    ],
)
def test_wrong_prompt_replies_are_wrong_with_a_reason(
    prompt_task: BFCLTask, items: list[BFCLItem], content: str, error_type: str
):
    scored = prompt_task.score(items[0], Reply(content=content))
    assert not scored.correct
    assert scored.bfcl is not None and scored.bfcl.error_type == error_type, scored.reason


def test_dotted_names_follow_each_modes_convention(
    tools_task: BFCLTask, prompt_task: BFCLTask, items: list[BFCLItem]
):
    item = _by_id(items, "simple_python_2")
    name, args = reference_call(item)
    assert name == "math.hypot"
    assert tools_task.score(item, tool_reply("math_hypot", args)).correct
    # Native mode promised names with '_': the dotted name is not the tool the model was given.
    assert not tools_task.score(item, tool_reply("math.hypot", args)).correct
    assert prompt_task.score(item, prompt_reply("math.hypot", args)).correct
    assert not prompt_task.score(item, prompt_reply("math_hypot", args)).correct
    assert checker_model_name("tools") != checker_model_name("prompt")
