#!/usr/bin/env python3
"""DyNet's version of examples/shift_reduce (a SPINN-style shift-reduce
encoder over SST trees), timed the way sheaf-bench --workload shift_reduce
times its systems, for a side-by-side on the same trees.

The model: a buffer of words (h = E[word], c = 0) and a stack; at every step a
tracking LSTM (size --tracking) reads [buffer top; stack top; stack second;
tracking h] and a linear layer scores SHIFT and REDUCE; REDUCE composes the
two top items with a Tree-LSTM cell that also reads the tracking state; after
2n - 1 steps the stack's item is classified into 5 labels.

Training follows the gold transitions (one graph per batch with every
sentence's transition losses and sentiment loss, summed and scaled by 1/batch;
forward, backward, Adagrad 0.05 without clipping). Inference follows the model's own
predictions. Per-sentence code cannot batch a decision that waits for a value,
so this runs the batch's sentences in lockstep, as a DyNet user must write it
to let autobatching see them together: each step builds every unfinished
sentence's tracking step and scores, calls dy.forward on all the scores once,
reads them, and moves each sentence on (Sheaf: one coroutine per sentence,
co_await on its scores).
"""
from common import adagrad, in_batches, load_sst, parser, run_modes, start_dynet, step_on

SHIFT, REDUCE = 0, 1


def post_order(tree, out):
    """(word or None, label) per node, children first: a leaf is a SHIFT, a node a REDUCE."""
    if len(tree) == 2:
        out.append((tree[1], tree[0]))
    else:
        post_order(tree[1], out)
        post_order(tree[2], out)
        out.append((None, tree[0]))
    return out


def choose(shift_score, reduce_score, stack_size, buffer_left):
    if stack_size < 2:
        return SHIFT
    if buffer_left == 0:
        return REDUCE
    return REDUCE if reduce_score > shift_score else SHIFT


def main():
    ap = parser(__doc__, "--trees", 512)
    ap.add_argument("--data", required=True, help="SST train file (PTB brackets) or its directory")
    ap.add_argument("--tracking", type=int, default=32)
    a = ap.parse_args()
    trees, vocab, path = load_sst(a.data)
    used, _ = in_batches(trees, a.trees, a.batch, "trees")
    # Per tree: word ids (buffer order), gold transitions, root label.
    data = []
    for t in used:
        nodes = post_order(t, [])
        data.append(([vocab[w] for w, _ in nodes if w is not None], [SHIFT if w is not None else REDUCE for w, _ in nodes],
                     t[0]))
    _, batches = in_batches(data, a.trees, a.batch, "trees")
    dy = start_dynet(a)

    h, k = a.hidden, a.tracking
    m = dy.ParameterCollection()
    E = m.add_lookup_parameters((len(vocab), h))
    T = m.add_parameters((4 * k, 3 * h + k))
    t_b = m.add_parameters(4 * k)
    A = m.add_parameters((2, k))
    a_b = m.add_parameters(2)
    U = m.add_parameters((5 * h, 2 * h + k))
    u_b = m.add_parameters(5 * h)
    V = m.add_parameters((5, h))
    v_b = m.add_parameters(5)
    trainer = adagrad(dy, m)

    def chunk(x, i, size):
        return dy.pick_range(x, i * size, (i + 1) * size)

    class Parse:
        """One sentence's buffer, stack and tracking state."""

        def __init__(self, words):
            self.buffer = [(E[w], dy.zeros(h)) for w in words]
            self.none = dy.zeros(h)
            self.stack = []
            self.next = 0
            self.track = (dy.zeros(k), dy.zeros(k))
            self.scores = None

        def top(self, i):
            return self.stack[-1 - i][0] if len(self.stack) > i else self.none

        def track_step(self):
            x = dy.concatenate([self.buffer[self.next][0] if self.next < len(self.buffer) else self.none,
                                self.top(0), self.top(1), self.track[0]])
            g = dy.affine_transform([t_b, T, x])
            c = dy.cmult(dy.logistic(chunk(g, 1, k)), self.track[1]) + \
                dy.cmult(dy.logistic(chunk(g, 0, k)), dy.tanh(chunk(g, 3, k)))
            self.track = (dy.cmult(dy.logistic(chunk(g, 2, k)), dy.tanh(c)), c)
            self.scores = dy.affine_transform([a_b, A, self.track[0]])
            return self.scores

        def act(self, action):
            if action == SHIFT:
                self.stack.append(self.buffer[self.next])
                self.next += 1
                return
            rh, rc = self.stack.pop()
            lh, lc = self.stack.pop()
            g = dy.affine_transform([u_b, U, dy.concatenate([lh, rh, self.track[0]])])
            c = dy.cmult(dy.tanh(chunk(g, 0, h)), dy.logistic(chunk(g, 1, h))) + \
                dy.cmult(dy.logistic(chunk(g, 2, h)), lc) + dy.cmult(dy.logistic(chunk(g, 3, h)), rc)
            self.stack.append((dy.cmult(dy.logistic(chunk(g, 4, h)), dy.tanh(c)), c))

        def logits(self):
            return dy.affine_transform([v_b, V, self.stack[-1][0]])

    def train_step(batch):
        dy.renew_cg()
        losses = []
        for words, gold, label in batch:
            p = Parse(words)
            for action in gold:
                losses.append(dy.pickneglogsoftmax(p.track_step(), action))
                p.act(action)
            losses.append(dy.pickneglogsoftmax(p.logits(), label))
        step_on(dy, trainer, losses, len(batch))

    def infer_step(batch):
        dy.renew_cg()
        parses = [(Parse(words), 2 * len(words) - 1) for words, _, _ in batch]
        for step in range(max(n for _, n in parses)):
            active = [p for p, n in parses if step < n]
            dy.forward([p.track_step() for p in active])
            for p in active:
                s = p.scores.vec_value()
                p.act(choose(s[SHIFT], s[REDUCE], len(p.stack), len(p.buffer) - p.next))
        dy.forward([p.logits() for p, _ in parses])

    run_modes(a, "shift_reduce", {"train": train_step, "infer": infer_step}, batches, path, "trees")


if __name__ == "__main__":
    main()
