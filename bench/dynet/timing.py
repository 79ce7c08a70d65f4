"""Timing shared by the DyNet scripts: as sheaf-bench's harness times (one
untimed pass over the batches, then `repeat` timed passes, the median)."""
import json
import statistics
import time


def sentences_per_sec(batches, step, repeat):
    for b in batches:  # untimed pass
        step(b)
    runs = []
    items = sum(len(b) for b in batches)
    for _ in range(repeat):
        t0 = time.perf_counter()
        for b in batches:
            step(b)
        runs.append(items / (time.perf_counter() - t0))
    return statistics.median(runs), runs


def report(row, as_json, unit="items"):
    if as_json:
        print(json.dumps(row), flush=True)
    else:
        extra = f", {row['tokens_per_sec']:.0f} tokens/s" if "tokens_per_sec" in row else ""
        print(f"{row['workload']} {row['mode']} h={row['hidden']} {row['system']}: {row['trees_per_sec']:.1f} {unit}/s{extra}",
              flush=True)
