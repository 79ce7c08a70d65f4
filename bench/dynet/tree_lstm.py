#!/usr/bin/env python3
"""DyNet's binary Tree-LSTM on SST, timed the way sheaf-bench --workload
treelstm times its systems, for a side-by-side on the same trees.

The model of examples/tree_lstm (and of DyNet's own benchmark, treenn with a
Tree-LSTM): a leaf's h is its word's embedding (size --hidden) and its c zero;
an internal node's gates are one affine map of [h_left; h_right] (5 h rows:
u, i, f_left, f_right, o), c = tanh(u) sigmoid(i) + sigmoid(f_l) c_l +
sigmoid(f_r) c_r, h = sigmoid(o) tanh(c); a softmax over 5 sentiment labels at
EVERY node (as DyNet's benchmark) for training, at the root for inference.

Trees: SST's PTB-bracketed train file; the vocabulary is every word of the
file, the timed trees its first --trees, in batches of --batch. Train = one
graph per batch holding every tree's node losses, summed and scaled by
1/batch, forward, backward, an Adagrad step (0.05, no clipping); infer = the
root logits of the batch through one dy.forward. --autobatch 1 lets DyNet
batch the graph. DyNet through its Python API, as DyNet's Python benchmark.
"""
import argparse
import sys

from timing import report, sentences_per_sec


def parse_tree(line, number, path):
    """(label word) leaves, (label left right) nodes -> nested tuples (label, word) or (label, left, right).
    A word runs to its ')' and may hold spaces (SST has "8 1\\/2")."""
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="SST train file (PTB brackets) or its directory")
    ap.add_argument("--trees", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--modes", default="train,infer")
    ap.add_argument("--autobatch", type=int, default=1)
    ap.add_argument("--mem", type=int, default=512, help="DyNet's memory pool, MB")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    import os
    path = os.path.join(a.data, "train.txt") if os.path.isdir(a.data) else a.data
    with open(path, encoding="utf-8") as f:
        trees = [parse_tree(line, n, path) for n, line in enumerate(f, 1) if line.strip()]
    vocab = {w: i for i, w in enumerate(sorted({w for t in trees for w in words_of(t, [])}))}
    used = trees[:a.trees - a.trees % a.batch]
    if len(used) < a.batch:
        sys.exit("fewer trees than one batch")
    batches = [used[i:i + a.batch] for i in range(0, len(used), a.batch)]

    import dynet_config
    dynet_config.set(mem=a.mem, autobatch=a.autobatch, random_seed=1)
    import dynet as dy

    h = a.hidden
    m = dy.ParameterCollection()
    E = m.add_lookup_parameters((len(vocab), h))
    U = m.add_parameters((5 * h, 2 * h))
    b = m.add_parameters(5 * h)
    V = m.add_parameters((5, h))
    v = m.add_parameters(5)
    trainer = dy.AdagradTrainer(m, 0.05)
    trainer.set_clip_threshold(0)  # DyNet clips at 5 by default: a norm pass the LibTorch side does not make

    def node(t, losses):
        if len(t) == 2:
            hv, c = E[vocab[t[1]]], dy.zeros(h)
        else:
            hl, cl = node(t[1], losses)
            hr, cr = node(t[2], losses)
            g = dy.affine_transform([b, U, dy.concatenate([hl, hr])])
            c = (dy.cmult(dy.tanh(dy.pick_range(g, 0, h)), dy.logistic(dy.pick_range(g, h, 2 * h))) +
                 dy.cmult(dy.logistic(dy.pick_range(g, 2 * h, 3 * h)), cl) +
                 dy.cmult(dy.logistic(dy.pick_range(g, 3 * h, 4 * h)), cr))
            hv = dy.cmult(dy.logistic(dy.pick_range(g, 4 * h, 5 * h)), dy.tanh(c))
        if losses is not None:
            losses.append(dy.pickneglogsoftmax(dy.affine_transform([v, V, hv]), t[0]))
        return hv, c

    def train_step(batch):
        dy.renew_cg()
        losses = []
        for t in batch:
            node(t, losses)
        loss = dy.esum(losses) * (1.0 / len(batch))
        loss.forward()
        loss.backward()
        trainer.update()

    def infer_step(batch):
        dy.renew_cg()
        dy.forward([dy.affine_transform([v, V, node(t, None)[0]]) for t in batch])

    system = "dynet:autobatch" if a.autobatch else "dynet:unbatched"
    for mode in a.modes.split(","):
        tps, runs = sentences_per_sec(batches, train_step if mode == "train" else infer_step, a.repeat)
        report({"workload": "treelstm", "system": system, "mode": mode, "device": "cpu", "hidden": h,
                "batch": a.batch, "trees": len(used), "threads": 1, "repeat": a.repeat, "trees_per_sec": tps,
                "runs": runs, "dynet_version": "dyNET38 2.2", "data": path}, a.json, "trees")


if __name__ == "__main__":
    main()
