"""BFCL simple (Python): the questions, possible answers and AST checker of the `bfcl-eval` package.

Owns the bridge to bfcl-eval. Nothing is rewritten: the questions and possible answers are
loaded with the package's own loaders, the tools and the prompt-mode system prompt are made
by its own helpers, replies are decoded as its OpenAI handler decodes them, and every answer
is judged by its `ast_checker`, in the order its eval runner applies them (decode, format
check, checker).

bfcl-eval pins ~30 heavy packages (numpy 1.26.4, vendor SDKs, vLLM extras), none of which the
checker needs. It is installed with `pip install --no-deps`; what the parts we use really
import is small:

- third-party: `filelock` (bfcl_eval.utils) and `tenacity` (bfcl_eval.model_handler.utils);
- `bfcl_eval.constants.model_config` (imported by the checker only to read one flag per model,
  `underscore_to_dot`, but importing every vendor SDK to build its table) is replaced, before
  the first bfcl_eval import, by a two-entry table for our two modes;
- the Java and JavaScript call parsers (tree-sitter, pinned to an old binary release) are
  replaced by stubs that refuse: simple_python never parses Java or JavaScript.

bfcl_eval creates `result/`, `score/` and `.file_locks/` under BFCL_PROJECT_ROOT when imported;
we point that at a scratch folder so nothing lands in site-packages.
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
import json
import logging
import os
import sys
import tempfile
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.evals.task import DataError, Prepared, Question, Reply, Scored
from contract.evals import (
    BFCL_EVAL_VERSION,
    BFCLMode,
    BFCLScore,
    BFCLSettings,
    EvalName,
)

__all__ = [
    "BFCLItem",
    "BFCLTask",
    "OfficialBFCL",
    "checker_model_name",
    "official",
]

log = logging.getLogger(__name__)

INSTALL_HINT = (
    f"pip install --no-deps bfcl-eval=={BFCL_EVAL_VERSION} && pip install 'tenacity>=8.5' "
    "'filelock>=3.20'"
)
# The checker looks a model up by name to learn whether tool names had '.' replaced by '_'
# (OpenAI-style tools allow only ^[a-zA-Z0-9_-]{1,64}$). One name per mode; no '_' in them,
# since the checker maps '_' to '/' before the lookup.
_CHECKER_MODEL = {"tools": "bench-native-tools", "prompt": "bench-prompt"}
_UNDERSCORE_TO_DOT = {"bench-native-tools": True, "bench-prompt": False}


def checker_model_name(mode: BFCLMode) -> str:
    return _CHECKER_MODEL[mode]


@dataclass(frozen=True)
class _CheckerModelConfig:
    """The one field of bfcl_eval's ModelConfig that ast_checker reads."""

    underscore_to_dot: bool


def _refuse(*_args: object, **_kwargs: object) -> object:
    raise NotImplementedError("Java/JavaScript calls are not parsed here (simple_python only)")


def _install_shims() -> None:
    registry_name = "bfcl_eval.constants.model_config"
    registry = sys.modules.get(registry_name)
    if registry is None:
        registry = types.ModuleType(registry_name)
        registry.__doc__ = "bench: the checker's model table, our two modes only"
        # Ignored below: a stand-in module built here: ModuleType has no attributes declared.
        registry.MODEL_CONFIG_MAPPING = {}  # type: ignore[attr-defined]
        sys.modules[registry_name] = registry
    # Also right when the real table is loaded (a full install): it is a plain dict.
    for name, flag in _UNDERSCORE_TO_DOT.items():
        registry.MODEL_CONFIG_MAPPING.setdefault(name, _CheckerModelConfig(flag))
    for module_name, function in (
        ("bfcl_eval.model_handler.parser.java_parser", "parse_java_function_call"),
        ("bfcl_eval.model_handler.parser.js_parser", "parse_javascript_function_call"),
    ):
        if module_name not in sys.modules:
            stub = types.ModuleType(module_name)
            setattr(stub, function, _refuse)
            sys.modules[module_name] = stub


@dataclass(frozen=True)
class OfficialBFCL:
    """The parts of bfcl-eval we call, imported once."""

    version: str
    ast_checker: Any
    convert_to_tool: Any
    system_prompt_pre_processing_chat_model: Any
    default_decode_ast_prompting: Any
    is_function_calling_format_output: Any
    load_dataset_entry: Any
    load_ground_truth_entry: Any
    gorilla_to_openapi: dict[str, str]
    language_python: Any
    return_format_python: Any
    model_style_openai: Any


_OFFICIAL: OfficialBFCL | None = None


def official() -> OfficialBFCL:
    """Import bfcl-eval's checker and helpers (once), or raise DataError saying how to install."""
    global _OFFICIAL
    if _OFFICIAL is not None:
        return _OFFICIAL
    try:
        version = importlib.metadata.version("bfcl-eval")
    except importlib.metadata.PackageNotFoundError as exc:
        raise DataError(f"BFCL needs the bfcl-eval package: {INSTALL_HINT}") from exc
    if version != BFCL_EVAL_VERSION:
        log.warning("bfcl-eval %s installed; results are pinned to %s", version, BFCL_EVAL_VERSION)
    # bfcl_eval makes result/score/lock folders under this at import; keep them out of the venv.
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path(tempfile.gettempdir()) / "bench-bfcl-eval"))
    _install_shims()
    try:
        checker = importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
        enums = importlib.import_module("bfcl_eval.constants.enums")
        mappings = importlib.import_module("bfcl_eval.constants.type_mappings")
        handler_utils = importlib.import_module("bfcl_eval.model_handler.utils")
        utils = importlib.import_module("bfcl_eval.utils")
    except ImportError as exc:
        raise DataError(f"bfcl-eval cannot be imported ({exc}); {INSTALL_HINT}") from exc
    _OFFICIAL = OfficialBFCL(
        version=version,
        ast_checker=checker.ast_checker,
        convert_to_tool=handler_utils.convert_to_tool,
        system_prompt_pre_processing_chat_model=(
            handler_utils.system_prompt_pre_processing_chat_model
        ),
        default_decode_ast_prompting=handler_utils.default_decode_ast_prompting,
        is_function_calling_format_output=utils.is_function_calling_format_output,
        load_dataset_entry=utils.load_dataset_entry,
        load_ground_truth_entry=utils.load_ground_truth_entry,
        gorilla_to_openapi=mappings.GORILLA_TO_OPENAPI,
        language_python=enums.Language.PYTHON,
        return_format_python=enums.ReturnFormat.PYTHON,
        model_style_openai=enums.ModelStyle.OPENAI_COMPLETIONS,
    )
    return _OFFICIAL


@dataclass(frozen=True, slots=True)
class BFCLItem(Question):
    messages: tuple[dict[str, Any], ...]
    functions: tuple[dict[str, Any], ...]  # with the Python hint: what the model is shown
    checker_functions: tuple[dict[str, Any], ...]  # without it: what the checker reads
    ground_truth: tuple[dict[str, Any], ...]


def load_bfcl(category: str = "simple_python") -> list[BFCLItem]:
    """The category's questions and possible answers, through bfcl-eval's own loaders."""
    bfcl = official()
    # The model sees functions with the language hint; the checker reads them without it,
    # exactly as bfcl's generation and evaluation steps load them.
    shown = bfcl.load_dataset_entry(category, include_prereq=False)
    plain = bfcl.load_dataset_entry(
        category, include_prereq=False, include_language_specific_hint=False
    )
    answers = {
        entry["id"]: entry["ground_truth"] for entry in bfcl.load_ground_truth_entry(category)
    }
    plain_by_id = {entry["id"]: entry for entry in plain}
    items = []
    for index, entry in enumerate(shown):
        entry_id = entry["id"]
        if entry_id not in answers or entry_id not in plain_by_id:
            raise DataError(f"bfcl-eval {category}: no possible answer for {entry_id}")
        if len(entry["question"]) != 1:
            raise DataError(f"bfcl-eval {category}: {entry_id} is not a single-turn question")
        items.append(
            BFCLItem(
                index=index,
                question_id=entry_id,
                messages=tuple(entry["question"][0]),
                functions=tuple(entry["function"]),
                checker_functions=tuple(plain_by_id[entry_id]["function"]),
                ground_truth=tuple(answers[entry_id]),
            )
        )
    if not items:
        raise DataError(f"bfcl-eval has no questions for {category}")
    return items


def _jsonable(decoded: Any) -> Any:
    # Prompt-mode decoding evaluates Python literals (tuples, sets, odd constants); the record
    # keeps what JSON can say and the repr of the rest.
    return json.loads(json.dumps(decoded, default=repr))


def _fail(reason: str, error_type: str, decoded: Any = None) -> Scored:
    decoded = _jsonable(decoded) if decoded is not None else None
    return Scored(
        extracted=json.dumps(decoded) if decoded is not None else None,
        correct=False,
        reason=f"{error_type}: {reason}",
        marks={"ast": False},
        bfcl=BFCLScore(decoded=decoded, error_type=error_type, errors=[reason]),
    )


class BFCLTask:
    """BFCL simple, asked natively (OpenAI tools) or in BFCL's prompt format."""

    name: EvalName = "bfcl_simple"
    headline = "ast"
    mark_names = ("ast",)

    def __init__(self, settings: BFCLSettings, items: Sequence[BFCLItem] | None = None) -> None:
        self.settings = settings
        self._bfcl = official()
        loaded = list(items) if items is not None else load_bfcl(settings.category)
        self._items = loaded[: settings.limit] if settings.limit else loaded
        self.prompt_label = settings.mode
        self.data_label = f"bfcl-eval {self._bfcl.version} {settings.category}"
        self.data_sha256 = None
        self.checker_label = (
            f"bfcl-eval {self._bfcl.version} ast_checker "
            f"(model {checker_model_name(settings.mode)!r}, "
            f"underscore_to_dot={_UNDERSCORE_TO_DOT[checker_model_name(settings.mode)]})"
        )

    def questions(self) -> Sequence[BFCLItem]:
        return self._items

    def prepare(self, question: BFCLItem) -> Prepared:
        messages = copy.deepcopy(list(question.messages))
        functions = copy.deepcopy(list(question.functions))
        if self.settings.mode == "tools":
            tools = self._bfcl.convert_to_tool(
                functions, self._bfcl.gorilla_to_openapi, self._bfcl.model_style_openai
            )
            return Prepared(messages=messages, tools=tools)
        messages = self._bfcl.system_prompt_pre_processing_chat_model(
            messages, functions, question.question_id
        )
        return Prepared(messages=messages)

    def decode(self, reply: Reply) -> list[dict[str, Any]]:
        """The reply as bfcl's OpenAI handler decodes it; raises where bfcl's decoder fails."""
        if self.settings.mode == "tools":
            if not reply.tool_calls:
                # bfcl's handler falls back to the text content, which its FC decoder cannot
                # read: the same outcome, said plainly.
                raise ValueError("the reply has no tool call")
            return [{call.name: json.loads(call.arguments)} for call in reply.tool_calls]
        return self._bfcl.default_decode_ast_prompting(
            reply.content, self._bfcl.return_format_python
        )

    def score(self, question: BFCLItem, reply: Reply) -> Scored:
        try:
            decoded = self.decode(reply)
        except Exception as exc:  # bfcl's runner catches every decoder failure the same way
            return _fail(
                f"Invalid syntax. Failed to decode AST. {exc}", "ast_decoder:decoder_failed"
            )
        if not self._bfcl.is_function_calling_format_output(decoded):
            return _fail(
                "Did not output in the specified format.",
                "ast_decoder:decoder_wrong_output_format",
            )
        try:
            result = self._bfcl.ast_checker(
                copy.deepcopy(list(question.checker_functions)),
                decoded,
                copy.deepcopy(list(question.ground_truth)),
                self._bfcl.language_python,
                self.settings.category,
                checker_model_name(self.settings.mode),
            )
        except Exception as exc:  # a checker crash on odd input is a wrong answer, not a stop
            log.warning("bfcl checker raised on %s: %r", question.question_id, exc)
            return _fail(f"checker raised {exc!r}", "checker:exception", decoded)
        if result.get("valid"):
            kept = _jsonable(decoded)
            return Scored(
                extracted=json.dumps(kept),
                correct=True,
                reason="valid call",
                marks={"ast": True},
                bfcl=BFCLScore(decoded=kept),
            )
        errors = [str(e) for e in result.get("error", [])]
        error_type = str(result.get("error_type", "unknown"))
        return _fail("; ".join(errors) or error_type, error_type, decoded)
