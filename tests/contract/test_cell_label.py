"""A cell's lines are found by the key its summary cell carries, never by a look-alike."""

from __future__ import annotations

from contract.results import CellResult, cell_label, in_cells, window_label


def _cell(concurrency: int, rate: float | None) -> CellResult:
    mode = "burst" if rate is None else "rate"
    return CellResult(
        shape="in64-out8",
        input_tokens=64,
        output_tokens=8,
        concurrency=concurrency,
        mode=mode,
        request_rate=rate,
        status="ok",
    )


def test_labels_name_level_or_rate() -> None:
    assert _cell(8, None).label == cell_label("in64-out8", 8, None) == "in64-out8/c8"
    assert _cell(0, 2.5).label == "in64-out8/rate2.5"
    assert _cell(8, None).window_label(3) == "in64-out8/c8/r3"
    assert window_label("in64-out8/c8", -1) == "in64-out8/c8/warmup"


def test_lines_belong_to_exactly_their_cell() -> None:
    done = {_cell(1, None).label, _cell(0, 2.0).label}
    assert in_cells("in64-out8/c1/r0", done) and in_cells("in64-out8/c1/warmup", done)
    assert in_cells("bench:in64-out8/c1", done) and in_cells("in64-out8/rate2/r1", done)
    assert not in_cells("in64-out8/c16/r0", done), "c1 is not a prefix of c16"
    assert not in_cells("in64-out8/rate20/r0", done)
    assert not in_cells("bench:in64-out8", done) and not in_cells("", done)
