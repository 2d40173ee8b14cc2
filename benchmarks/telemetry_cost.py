"""CPU cost of the telemetry sampler and of the server /metrics poller, per minute.

Runs the sampler (host rows through psutil; GPU rows too where NVML finds a GPU) and the
/metrics poller (every 0.5 s, against a local page in vLLM's format) side by side and
prints each one's thread CPU time per minute of wall time.

Run: `python -m benchmarks.telemetry_cost [--seconds 60]`.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from agent.telemetry import TelemetrySampler
from agent.telemetry.server_metrics import ServerMetricsPoller

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "tests" / "agent" / "data" / "metrics" / "vllm-after.txt").read_bytes()


class _Page(BaseHTTPRequestHandler):
    def log_message(self, *_args: object) -> None:
        return

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    csv_path = Path(tempfile.mkdtemp()) / "telemetry.csv"
    with TelemetrySampler(csv_path) as sampler, ServerMetricsPoller(url) as poller:
        sampler.set_job("cost")
        time.sleep(args.seconds)
        sampler.set_job(None)
        poller_cpu_s = poller.cpu_s
    stats = sampler.stats()
    per_min = 60.0 / args.seconds
    print(f"sampler: {stats.cpu_s_per_min:.3f} CPU-s per minute")
    print(
        f"/metrics poller every 0.5 s: {poller_cpu_s * per_min:.3f} CPU-s per minute "
        f"({poller.readings} readings in {args.seconds:g} s)"
    )
    server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
