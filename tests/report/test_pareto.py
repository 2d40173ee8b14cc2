"""The Pareto plots of the two-GPU report: the frontier cells named in each caption against a
brute-force frontier computed here from the hand-made sweep's choices (aggregate tok/s = the
cell's median, per-user decode = median / level, $/M = price / (3600 x median) x 1e6)."""

from __future__ import annotations

import pytest

from report.pareto import frontier, pareto_points
from report.write import Written
from tests.report.handmade import PARTIAL, SWEEP, T4_SWEEP
from tests.report.test_handmade import G6_PRICE, T4_PRICE

PNG = b"\x89PNG\r\n\x1a\n"


def _cells(shape: str) -> list[tuple[str, int, float, float, float]]:
    """(label, level, aggregate, per-user, $/M) of every complete cell."""
    out = []
    sources = [(f"{a}@l4", SWEEP[a], G6_PRICE) for a in SWEEP] + [("llama@t4", T4_SWEEP, T4_PRICE)]
    for label, per_shape, price in sources:
        for level, median in zip((1, 8, 64), per_shape[shape], strict=True):
            if median is None or (label.replace("@t4", "@t4spot"), shape, level) == PARTIAL:
                continue
            out.append((label, level, median, median / level, price / (3600 * median) * 1e6))
    return out


def _brute(
    cells: list[tuple[str, int, float, float, float]], by_cost: bool
) -> set[tuple[str, int]]:
    def better(a: tuple[float, float], b: tuple[float, float]) -> bool:
        return a[0] >= b[0] and a[1] >= b[1] and a != b

    key = (lambda c: (-c[4], c[3])) if by_cost else (lambda c: (c[2], c[3]))
    return {
        (c[0], c[1]) for c in cells if not any(better(key(o), key(c)) for o in cells if o is not c)
    }


@pytest.mark.parametrize("shape", ["in512-out128", "in128-out512"])
def test_pareto_frontiers_match_a_brute_force_one(multi_report: Written, shape: str):
    report = multi_report.report
    points = pareto_points(report, shape)
    cells = _cells(shape)
    assert {(p.label, p.level) for p in points} == {(c[0], c[1]) for c in cells}
    for p in points:
        c = next(c for c in cells if (c[0], c[1]) == (p.label, p.level))
        assert p.aggregate_tok_s == pytest.approx(c[2], rel=1e-6)
        assert p.user_tok_s == pytest.approx(c[3], rel=1e-6)
        assert p.usd_per_m == pytest.approx(c[4], rel=1e-6)
    for by_cost, key in ((False, "pareto-user"), (True, "pareto-cost")):
        expected = _brute(cells, by_cost)
        assert {(p.label, p.level) for p in frontier(points, by_cost=by_cost)} == expected
        plot = next(p for p in multi_report.plots if p.key == f"{key}-{shape}")
        assert plot.path.read_bytes().startswith(PNG)
        named = plot.caption.split("Frontier (dotted): ", 1)[1]
        for label, level in expected:
            assert f"{label} at {level}" in named
