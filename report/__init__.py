"""`bench report`: the seeds' tables, plots, costs and caveats, read from a results folder.

Reporting sits at the top level beside `contract/`, whose result formats it reads, and
apart from `agent/`: it runs on the workstation (after `bench fetch` or `bench run`), needs
matplotlib, which an instance never does, and only reads what the agent wrote. From
`agent/` it borrows the code that already defines a statistic (the paired eval comparison,
the metric functions, the telemetry fold), so a number is never defined twice.

- `load`: a results folder (campaign root or one shard) read into typed records.
- `prices`: on-demand and spot prices: the AWS Price List API and spot price history when
  credentials exist, else the dated table shipped beside this module (`prices.toml`).
- `energy`: joules per output token per sweep cell, from the NVML energy counter.
- `rows`: the typed rows every table shows, the spread rule and $/M tokens arithmetic.
- `arms`, `one_request`, `sweep`, `accuracy`, `costs`, `scope`: one section's rows each
  (engine grouping; one request and drafter; sweep grids and best per level; paired
  accuracy and eval times; instance cost and $/M tokens; scope and caveats).
- `build`: `build_report`, which calls them; arithmetic only, every number traced to a
  summary.
- `slo`, `sites`, `summary`, `acceptance`, `pareto`: the SLO and each engine's highest
  level meeting it; cross-GPU rows and what to run where; the seeds' compare-and-contrast
  summary; a drafter's acceptance where recorded; the Pareto views.
- `folders`: several results folders (or a standalone sweep/probe folder) read as one.
- `tables`, `user_tables`, `site_tables`, `plots`, `render`: text tables, PNG plots,
  report.md and a self-contained report.html; `console`: the same tables on a terminal
  (`bench report`, `bench run`, `bench probe`, `bench sweep`, `bench diff`).
- `cells_csv`: cells.csv, one row per sweep cell and repeat, every metric.
- `diff`: `bench diff OLD NEW`, every shared cell and the regression gate.
- `write`: the entry point `write_report`.
"""

from __future__ import annotations
