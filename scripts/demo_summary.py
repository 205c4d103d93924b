"""Print the loss and the balance report of `make demo`.

  demo_summary.py REPORT.json [TRAIN.log]

Loss: from the trainer's final JSON line in TRAIN.log (rank 0 prints the logged step losses),
the mean of the first k against the last k steps.

Predicted: the plan's per-rank costs for mmfeed and the baselines (cost model, same samples).
Measured: the step times the trainer ranks reported as feedback (slowest mp rank per dp rank).
"""
import json
import statistics
import sys


def train_losses(log_path: str) -> list[float]:
    """The step losses of the trainer's summary line (the last JSON object with "losses")."""
    losses: list[float] = []
    with open(log_path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("{") and '"losses"' in line:
                losses = json.loads(line)["losses"]
    return losses


def print_loss(losses: list[float], k: int = 10) -> None:
    if len(losses) < 2:
        print("loss: fewer than 2 logged steps")
        return
    k = min(k, len(losses) // 2)
    first, last = statistics.mean(losses[:k]), statistics.mean(losses[-k:])
    print(f"loss over {len(losses)} logged steps: mean of the first {k} {first:.3f}, of the last {k} {last:.3f} "
          f"({(last - first) / first:+.1%})")


def main(path: str, log_path: str | None = None) -> None:
    if log_path:
        print_loss(train_losses(log_path))
        print()
    r = json.load(open(path))
    live = r.get("live") or {}
    print(f"plan: {r['samples']} samples in {r['steps']} steps x {r['dp']} dp ranks x {r['micro_batches']} micro-batches, "
          f"placement {r['placement']}, {r['quarantined']} quarantined, {r['dropped']} dropped at the tail")
    print(f"\n{'strategy':>16} {'imb p50':>9} {'imb p99':>9} {'padding eff':>12} {'epoch time vs mmfeed':>21}")
    mm = r["strategies"]["mmfeed"]["step_cost_sum"]
    for name in ("mmfeed", "random", "length_grouped"):
        s = r["strategies"][name]
        print(f"{name:>16} {s['imbalance_p50']:9.3f} {s['imbalance_p99']:9.3f} {s['padding_efficiency']:12.3f} "
              f"{s['step_cost_sum'] / mm:20.3f}x")
    steps = [s for s in live.get("steps", []) if any(s["measured_seconds"])]
    if steps:
        wall = [max(s["measured_seconds"]) for s in steps]
        imb = [max(s["measured_seconds"]) / statistics.mean(s["measured_seconds"]) for s in steps if min(s["measured_seconds"]) > 0]
        wait = [w for s in steps for w in s["data_wait_seconds"]]
        print(f"\nmeasured over {len(steps)} trained steps (trainer feedback):")
        print(f"  step time (slowest rank): mean {statistics.mean(wall) * 1e3:.0f} ms, max {max(wall) * 1e3:.0f} ms")
        if imb:
            print(f"  measured imbalance (slowest / mean rank compute): median {statistics.median(imb):.3f}")
        print(f"  data wait per rank-step: mean {statistics.mean(wait) * 1e3:.1f} ms")
    cal = live.get("calibration")
    if cal:
        fit = cal.get("fit") or {}
        prior = cal.get("prior") or {}
        print(f"  cost model fitted to {live.get('observations')} observations: R² {fit.get('r2', float('nan')):.3f}, "
              f"mean relative error {fit.get('mean_rel_err', float('nan')):.3f} "
              f"(the analytic prior, best scaled: {prior.get('mean_rel_err', float('nan')):.3f})")
    else:
        print(f"  cost model: analytic ({live.get('observations', 0)} observations so far)")
    q = live.get("quarantined") or {}
    if q:
        print("\nquarantined: " + ", ".join(f"{k} {v}" for k, v in sorted(q.items())))
    t = live.get("throughput") or {}
    if t:
        print(f"service: {t['samples']} samples, {t['bytes'] / 1e6:.0f} MB published, "
              f"{t['samples_per_second']:.0f} samples/s")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
