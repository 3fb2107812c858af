"""Median tokens/s per configuration over the interleaved runs of run.sh, before vs after (python summary.py)."""

import json
import statistics
from pathlib import Path

here = Path(__file__).parent
runs: dict[tuple[str, str, int], list[float]] = {}
for f in sorted(here.glob("throughput-*.json")):
    name = f.stem.split("-")[1]
    for r in json.loads(f.read_text())["rows"]:
        cfg = "plain" if r["spec"] == "none" else f"{r['spec']} K={r['k']}"
        runs.setdefault((name, cfg, r["batch"]), []).append(r["tokens_per_s"])
print(f"{'config':12} {'batch':>5} {'before (runs)':>30} {'after (runs)':>30} {'median ratio':>12}")
for cfg, b in sorted({(c, b) for _, c, b in runs}):
    bef, aft = runs.get(("before", cfg, b), []), runs.get(("after", cfg, b), [])
    ratio = statistics.median(aft) / statistics.median(bef) if bef and aft else float("nan")
    fmt = lambda v: f"{statistics.median(v):.1f} ({' '.join(f'{x:.1f}' for x in v)})"  # noqa: E731
    print(f"{cfg:12} {b:>5} {fmt(bef):>30} {fmt(aft):>30} {ratio:>11.2f}x")
