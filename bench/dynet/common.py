"""What the DyNet scripts share: options, DyNet's start-up, SST trees, and
timing as sheaf-bench's harness times (one untimed pass over the batches,
then `repeat` timed passes, the median)."""
import argparse
import json
import os
import statistics
import sys
import time


def parser(doc, items_flag, items_default):
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(items_flag, type=int, default=items_default, help="the first N examples are timed")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--modes", default="train,infer")
    ap.add_argument("--autobatch", type=int, default=1, help="DyNet's autobatching: 0 off, 1 agenda (its fastest here)")
    ap.add_argument("--mem", type=int, default=512, help="DyNet's memory pool, MB (2048 was no faster)")
    ap.add_argument("--json", action="store_true")
    return ap


def start_dynet(a):
    import dynet_config
    dynet_config.set(mem=a.mem, autobatch=a.autobatch, random_seed=1)
    import dynet as dy
    return dy


def adagrad(dy, model):
    trainer = dy.AdagradTrainer(model, 0.05)
    trainer.set_clip_threshold(0)  # DyNet clips at 5 by default: a norm pass the LibTorch side does not make
    return trainer


def step_on(dy, trainer, losses, batch_size):
    """The batch's summed loss scaled by 1/batch (as sheaf-bench's step), forward, backward, update."""
    loss = dy.esum(losses) * (1.0 / batch_size)
    loss.forward()
    loss.backward()
    trainer.update()


def in_batches(examples, n, batch, what):
    used = examples[:n - n % batch]
    if len(used) < batch:
        sys.exit(f"fewer {what} than one batch")
    return used, [used[i:i + batch] for i in range(0, len(used), batch)]


def parse_tree(line, number, path):
    """SST's PTB brackets: (label word) leaves, (label left right) nodes -> nested tuples
    (label, word) or (label, left, right). A word runs to its ')' and may hold spaces
    (SST has "8 1\\/2")."""
    pos = 0

    def skip():
        nonlocal pos
        while pos < len(line) and line[pos].isspace():
            pos += 1

    def node():
        nonlocal pos
        skip()
        if pos >= len(line) or line[pos] != "(":
            sys.exit(f"{path}:{number}:{pos + 1}: expected '('")
        pos += 1
        skip()
        start = pos
        while pos < len(line) and line[pos].isdigit():
            pos += 1
        if start == pos:
            sys.exit(f"{path}:{number}:{pos + 1}: expected a label")
        label = int(line[start:pos])
        skip()
        children = None
        if pos < len(line) and line[pos] == "(":
            children = (node(), node())
            skip()
        else:
            start = pos
            while pos < len(line) and line[pos] != ")":
                pos += 1
            word = line[start:pos].strip()
            if not word:
                sys.exit(f"{path}:{number}:{pos + 1}: a leaf without a word")
        if pos >= len(line) or line[pos] != ")":
            sys.exit(f"{path}:{number}:{pos + 1}: expected ')'")
        pos += 1
        return (label, *children) if children else (label, word)

    return node()


def words_of(tree, out):
    if len(tree) == 2:
        out.append(tree[1])
    else:
        words_of(tree[1], out)
        words_of(tree[2], out)
    return out


def load_sst(data):
    """SST's train trees (a file, or a directory with train.txt), their path, and a
    vocabulary of every word in them (as sheaf-bench builds it)."""
    path = os.path.join(data, "train.txt") if os.path.isdir(data) else data
    with open(path, encoding="utf-8") as f:
        trees = [parse_tree(line, n, path) for n, line in enumerate(f, 1) if line.strip()]
    vocab = {w: i for i, w in enumerate(sorted({w for t in trees for w in words_of(t, [])}))}
    return trees, vocab, path


def items_per_sec(batches, step, repeat):
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


def run_modes(a, workload, steps, batches, data, unit, per_item=None):
    """Times steps[mode] for each of --modes; one JSON object (or line) per mode.
    per_item: {"tokens_per_sec": tokens per example} and the like."""
    system = "dynet:autobatch" if a.autobatch else "dynet:unbatched"
    items = sum(len(b) for b in batches)
    for mode in a.modes.split(","):
        tps, runs = items_per_sec(batches, steps[mode], a.repeat)
        row = {"workload": workload, "system": system, "mode": mode, "device": "cpu", "hidden": a.hidden,
               "batch": a.batch, "trees": items, "threads": 1, "repeat": a.repeat, "trees_per_sec": tps,
               "runs": runs, "dynet_version": "dyNET38 2.2", "data": data}
        for key, per in (per_item or {}).items():
            row[key] = tps * per
        if a.json:
            print(json.dumps(row), flush=True)
        else:
            extra = "".join(f", {row[k]:.0f} {k}" for k in (per_item or {}))
            print(f"{workload} {mode} h={a.hidden} {system}: {tps:.1f} {unit}/s{extra}", flush=True)
