"""Token ids to streamed text for one request: incremental decoding and stop strings.

Decoding is incremental in the way TGI and vLLM do it: decode a short window of recent
ids and emit only what the new id added, and nothing while the text ends in an
unfinished UTF-8 sequence (the replacement character), so multi-byte characters split
over tokens arrive whole. Text that could be the start of a stop string is held back
until it is known not to be one, so a stop string is never streamed; it is cut from the
output (or kept, with `include_stop_str_in_output`).
"""

from __future__ import annotations

from typing import cast

from transformers import PreTrainedTokenizerBase

REPLACEMENT = "\ufffd"


class TextStream:
    """The text of one request's generated ids, delivered as deltas."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        stop: tuple[str, ...] = (),
        include_stop: bool = False,
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.include_stop = include_stop
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._prefix_offset = 0
        self._read_offset = 0
        self._emitted = 0
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self.stopped_by: str | None = None
        # The Rust tokenizer's own decode, when transformers' wrapper would add nothing
        # (no space clean-up): the wrapper's argument checks cost tens of microseconds a
        # call, twice a token, which at 64 streams is a good part of a decode step.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        cleans = getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self._backend_decode = backend.decode if backend is not None and not cleans else None

    def _decode(self, ids: list[int]) -> str:
        if self._backend_decode is not None:
            return self._backend_decode(ids, skip_special_tokens=self.skip_special_tokens)
        # One id list in, one string out: the stub's `list[str]` covers a batch of lists.
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens))

    def _new_text(self, final: bool) -> str:
        prefix = self._decode(self.ids[self._prefix_offset : self._read_offset])
        full = self._decode(self.ids[self._prefix_offset :])
        if len(full) > len(prefix) and (final or not full.endswith(REPLACEMENT)):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.ids)
            return full[len(prefix) :]
        return ""

    def add(self, token_id: int, *, check_stop: bool = True) -> str:
        """Take one generated id; return the text that may be sent now. After a stop
        string is found, `stopped_by` names it and the text ends at (or after) it."""
        self.ids.append(token_id)
        new = self._new_text(final=False)
        if not new:
            return ""
        search_from = max(0, len(self.text) - self._hold)
        self.text += new
        if check_stop and self.stop:
            hit = self._find_stop(search_from)
            if hit is not None:
                index, stop = hit
                self.stopped_by = stop
                self.text = self.text[: index + len(stop) if self.include_stop else index]
                return self._take(len(self.text))
        return self._take(len(self.text) - self._hold)

    def finish(self) -> str:
        """Everything not yet sent: held-back text and an unfinished character."""
        if self.stopped_by is None:
            self.text += self._new_text(final=True)
        return self._take(len(self.text))

    def _find_stop(self, search_from: int) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self.stop:
            index = self.text.find(stop, search_from)
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        return best

    def _take(self, upto: int) -> str:
        if upto <= self._emitted:
            return ""
        delta = self.text[self._emitted : upto]
        self._emitted = upto
        return delta
