"""Pick the sweep's best setting for the DFlash K=15 step at batch 1 (>= 3% under the default's mean), as env lines."""
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
b1 = [r for r in rows if r["batch"] == 1]
auto = [r["step_ms"] for r in b1 if r["value"] == "SPECSERVE_FUSED_NORM=auto"]
base = sum(auto) / max(1, len(auto))
best = min(b1, key=lambda r: r["step_ms"], default=None)
for r in rows:
    print(f"# {r['value']:55} b{r['batch']} {r['step_ms']:.3f} ms", file=sys.stderr)
if best and auto and best["step_ms"] < 0.97 * base and best["value"] != "SPECSERVE_FUSED_NORM=auto":
    print(" ".join(best["value"].split(";")))
    print(f"# best {best['value']} {best['step_ms']} vs default {base:.3f}", file=sys.stderr)
