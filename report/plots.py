"""PNG plots of the report, drawn with matplotlib's object API (no pyplot global state, no
display needed).

Readable in print as on screen: every arm has its own marker and line style as well as its
colour (colour-blind-safe palette), axes are labelled with units, and the concurrency axis is
log 2 with the measured levels as ticks. Plots show what the tables show; nothing new is
computed here except thinning the telemetry series to at most a few thousand points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import cycle
from pathlib import Path
from typing import Any, Literal

from report.load import ResultsError

try:
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
except ImportError as exc:  # the `plots` extra is not installed
    raise ResultsError(
        "bench report draws its plots with matplotlib: pip install 'llm-serving-bench[plots]'"
    ) from exc

from contract.telemetry_samples import GpuSample, HostSample, read_telemetry_csv
from report.load import ShardResults
from report.pareto import pareto_plots
from report.rate import rate_plots
from report.rows import Report, SweepGrid
from report.server import server_samples

__all__ = ["Plot", "draw_all"]

# Okabe-Ito: distinguishable with the common colour-vision deficiencies and in greyscale
# together with the markers and dashes below.
_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
# No "x": it marks an infeasible or failed cell.
_MARKERS = ("o", "s", "^", "D", "v", "P", "*", "h")
_DASHES: tuple[Literal["-", "--", "-.", ":"], ...] = ("-", "--", "-.", ":")
_MAX_POINTS = 4000
_DPI = 130


@dataclass(frozen=True)
class Plot:
    key: str
    title: str
    path: Path
    caption: str


def _styles(labels: Sequence[str]) -> dict[str, dict[str, Any]]:
    # Any: matplotlib types each style keyword apart (a Literal for the line style).
    colours, markers, dashes = cycle(_COLOURS), cycle(_MARKERS), cycle(_DASHES)
    return {
        label: {"color": next(colours), "marker": next(markers), "linestyle": next(dashes)}
        for label in labels
    }


def _figure(height: float = 4.2) -> Figure:
    fig = Figure(figsize=(7.5, height), dpi=_DPI, layout="constrained")
    return fig


def _log2_axis(ax, levels: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(list(levels)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("requests at once (log 2)")
    ax.grid(True, which="major", alpha=0.3)


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, format="png", dpi=_DPI, facecolor="white")
    return path


def _measured(grid: SweepGrid) -> bool:
    """A shape with no figure at all gets no plot (its table says why)."""
    return any(c.ranked for c in grid.cells.values())


def throughput_plot(report: Report, out: Path) -> list[Plot]:
    plots = []
    styles = _styles(report.arms)
    for grid in report.sweeps:
        if not _measured(grid):
            continue
        fig = _figure()
        ax = fig.add_subplot()
        missing = False
        for label in grid.arms:
            ok = [grid.cells[(label, n)] for n in grid.levels if grid.cells[(label, n)].ranked]
            if ok:
                style = styles[label]
                ax.errorbar(
                    [c.concurrency for c in ok],
                    [c.tok_s or 0.0 for c in ok],
                    yerr=[
                        [(c.tok_s or 0) - (c.spread.low if c.spread else c.tok_s or 0) for c in ok],
                        [
                            (c.spread.high if c.spread else c.tok_s or 0) - (c.tok_s or 0)
                            for c in ok
                        ],
                    ],
                    label=label,
                    capsize=3,
                    linewidth=1.8,
                    markersize=6,
                    **style,
                )
            off = [
                grid.cells[(label, n)]
                for n in grid.levels
                if grid.cells[(label, n)].status in ("infeasible", "failed", "partial")
            ]
            if off:
                missing = True
                ax.scatter(
                    [c.concurrency for c in off],
                    [0] * len(off),
                    marker="x",
                    s=60,
                    color=styles[label]["color"],
                    zorder=5,
                    clip_on=False,
                )
        _log2_axis(ax, grid.levels)
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_ylabel("aggregate output tokens/s")
        ax.set_title(f"Aggregate output tok/s vs requests, {grid.shape}")
        ax.legend(fontsize=8, loc="best")
        path = _save(fig, out / f"throughput-{grid.shape}.png")
        absent = [
            label
            for label in grid.arms
            if not any(grid.cells[(label, n)].ranked for n in grid.levels)
        ]
        plots.append(
            Plot(
                key=f"throughput-{grid.shape}",
                title=f"Aggregate throughput, {grid.shape}",
                path=path,
                caption="Median of the repeats, bars min–max"
                + ("; x on the axis: an infeasible, failed or partial cell" if missing else "")
                + (f"; no figure at any level, not drawn: {', '.join(absent)}" if absent else "")
                + ".",
            )
        )
    return plots


def ttft_plot(report: Report, out: Path) -> list[Plot]:
    plots = []
    styles = _styles(report.arms)
    for grid in report.sweeps:
        if not _measured(grid):
            continue
        fig = _figure()
        ax = fig.add_subplot()
        drawn = False
        for label in grid.arms:
            cells = [grid.cells[(label, n)] for n in grid.levels]
            p50 = [(c.concurrency, c.ttft_p50_ms) for c in cells if c.ttft_p50_ms]
            p99 = [(c.concurrency, c.ttft_p99_ms) for c in cells if c.ttft_p99_ms]
            style = styles[label]
            if p50:
                drawn = True
                ax.plot(
                    *zip(*p50, strict=True),
                    label=f"{label} p50",
                    color=style["color"],
                    marker=style["marker"],
                    linestyle="-",
                    linewidth=1.8,
                )
            if p99:
                ax.plot(
                    *zip(*p99, strict=True),
                    label=f"{label} p99",
                    color=style["color"],
                    marker=style["marker"],
                    linestyle="--",
                    linewidth=1.2,
                    markerfacecolor="none",
                )
        _log2_axis(ax, grid.levels)
        if drawn:
            ax.set_yscale("log")
        ax.set_ylabel("time to first token, ms (log)")
        ax.set_title(f"TTFT p50 (solid) and p99 (dashed) vs requests, {grid.shape}")
        ax.legend(fontsize=8, loc="best", ncols=2)
        path = _save(fig, out / f"ttft-{grid.shape}.png")
        plots.append(
            Plot(
                key=f"ttft-{grid.shape}",
                title=f"Time to first token, {grid.shape}",
                path=path,
                caption="Per cell: the median over repeats of each window's p50 and p99.",
            )
        )
    return plots


def _thin(values: list, limit: int = _MAX_POINTS) -> list:
    step = max(1, len(values) // limit)
    return values[::step]


def _minutes(unix_s: float, start: float) -> float:
    return (unix_s - start) / 60.0


def _overlay_server(top, bottom, shard: ShardResults, start: float) -> bool:
    """The server's queue (requests waiting) over the top panel and its KV-cache use over the
    bottom one, dashed on right-hand axes, where the server's metrics were recorded."""
    samples = _thin(server_samples(shard))
    xs = [_minutes(s.time_unix_s, start) for s in samples]
    waiting = [(x, s.waiting) for x, s in zip(xs, samples, strict=True) if s.waiting is not None]
    kv = [(x, s.kv_pct) for x, s in zip(xs, samples, strict=True) if s.kv_pct is not None]
    for ax, points, colour, name, top_of in (
        (top, waiting, _COLOURS[3], "server: requests waiting", None),
        (bottom, kv, _COLOURS[4], "server: KV-cache use, %", 100.0),
    ):
        if not points:
            continue
        right = ax.twinx()
        right.plot(*zip(*points, strict=True), color=colour, linewidth=1, linestyle="--")
        right.set_ylabel(name, color=colour)
        peak = max(1.0, *(v for _, v in points))
        # The same head room as the left axis above the top panel, for the job names.
        right.set_ylim(0, (top_of or peak) * (1.6 if ax is top else 1.05))
    return bool(waiting or kv)


def telemetry_plot(shard: ShardResults, out: Path, *, several: bool) -> Plot | None:
    """GPU power and memory over the run (host CPU and engine RSS when no GPU was sampled),
    each job shaded and named, with the server's queue and KV-cache use where recorded."""
    path = shard.telemetry_path
    if path is None:
        return None
    gpu: dict[int, list[GpuSample]] = {}
    host: list[HostSample] = []
    try:
        for sample in read_telemetry_csv(path):
            if isinstance(sample, GpuSample):
                gpu.setdefault(sample.gpu_index, []).append(sample)
            else:
                host.append(sample)
    except ValueError:
        return None  # a telemetry.csv of another layout: no plot rather than no report
    start = shard.manifest.started_unix_s
    fig = _figure(height=5.2)
    top, bottom = fig.subplots(2, 1, sharex=True)
    if gpu:
        for index, samples in sorted(gpu.items()):
            samples = _thin(samples)
            colour = _COLOURS[index % len(_COLOURS)]
            xs = [_minutes(s.time_unix_s, start) for s in samples]
            power = [
                (x, s.power_w) for x, s in zip(xs, samples, strict=True) if s.power_w is not None
            ]
            memory = [
                (x, s.mem_used_mib)
                for x, s in zip(xs, samples, strict=True)
                if s.mem_used_mib is not None
            ]
            if power:
                top.plot(*zip(*power, strict=True), color=colour, linewidth=1, label=f"GPU {index}")
            if memory:
                bottom.plot(*zip(*memory, strict=True), color=colour, linewidth=1.2)
        top.set_ylabel("GPU power, W")
        bottom.set_ylabel("GPU memory used, MiB")
        what = "GPU power and memory"
    else:
        host = _thin(host)
        cpu = [(_minutes(s.time_unix_s, start), s.cpu_pct) for s in host if s.cpu_pct is not None]
        rss = [
            (_minutes(s.time_unix_s, start), s.engine_rss_mib)
            for s in host
            if s.engine_rss_mib is not None
        ]
        if cpu:
            top.plot(*zip(*cpu, strict=True), color=_COLOURS[0], linewidth=1)
        if rss:
            bottom.plot(*zip(*rss, strict=True), color=_COLOURS[1], linewidth=1.2)
        top.set_ylabel("host CPU, %")
        bottom.set_ylabel("engine RSS, MiB")
        what = "no GPU sampled: host CPU and engine memory"
    jobs = sorted((r for a in shard.arms for r in a.jobs.values()), key=lambda r: r.started_unix_s)
    for i, record in enumerate(jobs):
        x0 = _minutes(record.started_unix_s, start)
        x1 = _minutes(record.finished_unix_s, start)
        for ax in (top, bottom):
            ax.axvspan(x0, x1, color="#999999" if i % 2 else "#cccccc", alpha=0.35, lw=0)
        top.annotate(
            record.job_id + (" (failed)" if record.status == "failed" else ""),
            xy=((x0 + x1) / 2, 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=7,
            ha="center",
            va="top",
            bbox={"facecolor": "white", "alpha": 0.7, "linewidth": 0, "pad": 1},
        )
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    # Head room above the power trace for the job names.
    top.set_ylim(0, top.get_ylim()[1] * 1.6)
    overlaid = _overlay_server(top, bottom, shard, start)
    bottom.set_xlabel("minutes since the shard started")
    title = f"{what} over the run"
    if several:
        title += f", shard {shard.name}"
    top.set_title(title)
    if gpu and len(gpu) > 1:
        top.legend(fontsize=8)
    file = out / (f"telemetry-{shard.name}.png" if several else "telemetry.png")
    _save(fig, file)
    started = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return Plot(
        key=f"telemetry-{shard.name}",
        title=f"Telemetry over the run, shard {shard.name}",
        path=file,
        caption=f"{what}; shaded: each job, named; from {started}."
        + (
            " Dashed, right-hand axes: the server's own requests waiting (top) and KV-cache "
            "use (bottom), polled from its /metrics."
            if overlaid
            else ""
        ),
    )


def server_plot(shard: ShardResults, out: Path, *, several: bool) -> Plot | None:
    """The engine's own view where it was recorded: requests waiting and running in its
    queue (top) and KV-cache use (bottom) over the run, each job shaded and named."""
    samples = server_samples(shard)
    if not samples:
        return None
    start = shard.manifest.started_unix_s
    fig = _figure(height=5.2)
    top, bottom = fig.subplots(2, 1, sharex=True)
    xs = [_minutes(s.time_unix_s, start) for s in samples]
    for values, name, colour in (
        ([s.waiting for s in samples], "waiting", _COLOURS[1]),
        ([s.running for s in samples], "running", _COLOURS[0]),
    ):
        points = [(x, v) for x, v in zip(xs, values, strict=True) if v is not None]
        if points:
            top.plot(*zip(*points, strict=True), color=colour, linewidth=1.2, label=name)
    kv = [(x, s.kv_pct) for x, s in zip(xs, samples, strict=True) if s.kv_pct is not None]
    if kv:
        bottom.plot(*zip(*kv, strict=True), color=_COLOURS[2], linewidth=1.2)
    jobs = sorted((r for a in shard.arms for r in a.jobs.values()), key=lambda r: r.started_unix_s)
    for i, record in enumerate(jobs):
        x0 = _minutes(record.started_unix_s, start)
        x1 = _minutes(record.finished_unix_s, start)
        for ax in (top, bottom):
            ax.axvspan(x0, x1, color="#999999" if i % 2 else "#cccccc", alpha=0.35, lw=0)
        top.annotate(
            record.job_id,
            xy=((x0 + x1) / 2, 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=7,
            ha="center",
            va="top",
        )
    top.set_ylabel("requests in the server")
    bottom.set_ylabel("KV-cache use, %")
    bottom.set_xlabel("minutes since the shard started")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    top.set_ylim(0, top.get_ylim()[1] * 1.6)
    top.legend(fontsize=8, loc="upper left")
    title = "Server queue and KV-cache use over the run"
    top.set_title(title + (f", shard {shard.name}" if several else ""))
    file = out / (f"server-{shard.name}.png" if several else "server.png")
    _save(fig, file)
    return Plot(
        key=f"server-{shard.name}",
        title=f"Server view, shard {shard.name}",
        path=file,
        caption="The engine's own metrics, polled during each job: requests waiting in its "
        "queue and running (top), KV-cache use (bottom); shaded: each job, named.",
    )


def eval_time_plot(report: Report, out: Path) -> Plot | None:
    rows = [r for r in report.eval_times if r.drafted_s is not None and r.plain_s is not None]
    if not rows:
        return None
    fig = _figure(height=3.6)
    ax = fig.add_subplot()
    xs = list(range(len(rows)))
    width = 0.38
    ax.bar(
        [x - width / 2 for x in xs],
        [r.plain_s or 0.0 for r in rows],
        width,
        label="no drafter",
        color=_COLOURS[0],
    )
    ax.bar(
        [x + width / 2 for x in xs],
        [r.drafted_s or 0.0 for r in rows],
        width,
        label="with drafter",
        color=_COLOURS[1],
        hatch="//",
    )
    ax.set_xticks(xs, [r.engine for r in rows])
    ax.set_ylabel("time to finish GSM8K, s")
    ax.set_title("GSM8K time with and without a drafter")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    path = _save(fig, out / "gsm8k-time.png")
    return Plot(
        key="gsm8k-time",
        title="GSM8K time with and without a drafter",
        path=path,
        caption="Complete runs; the fastest drafter arm of each engine.",
    )


def draw_all(report: Report, out: Path) -> list[Plot]:
    """Every plot the results allow, written as PNG into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    plots = throughput_plot(report, out) + ttft_plot(report, out)
    shards = report.results.shards
    for shard in shards:
        plot = telemetry_plot(shard, out, several=len(shards) > 1)
        if plot:
            plots.append(plot)
        view = server_plot(shard, out, several=len(shards) > 1)
        if view:
            plots.append(view)
    plots += [Plot(*drawn) for drawn in pareto_plots(report, out)]
    plots += [Plot(*drawn) for drawn in rate_plots(report.rates, out)]
    extra = eval_time_plot(report, out)
    if extra:
        plots.append(extra)
    return plots
