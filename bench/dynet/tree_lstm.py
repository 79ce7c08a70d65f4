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
from common import adagrad, in_batches, load_sst, parser, run_modes, start_dynet, step_on


def main():
    ap = parser(__doc__, "--trees", 1024)
    ap.add_argument("--data", required=True, help="SST train file (PTB brackets) or its directory")
    a = ap.parse_args()
    trees, vocab, path = load_sst(a.data)
    _, batches = in_batches(trees, a.trees, a.batch, "trees")
    dy = start_dynet(a)

    h = a.hidden
    m = dy.ParameterCollection()
    E = m.add_lookup_parameters((len(vocab), h))
    U = m.add_parameters((5 * h, 2 * h))
    b = m.add_parameters(5 * h)
    V = m.add_parameters((5, h))
    v = m.add_parameters(5)
    trainer = adagrad(dy, m)

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
        step_on(dy, trainer, losses, len(batch))

    def infer_step(batch):
        dy.renew_cg()
        dy.forward([dy.affine_transform([v, V, node(t, None)[0]]) for t in batch])

    run_modes(a, "treelstm", {"train": train_step, "infer": infer_step}, batches, path, "trees")


if __name__ == "__main__":
    main()
