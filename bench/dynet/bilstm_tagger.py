#!/usr/bin/env python3
"""DyNet's BiLSTM tagger (with and without character LSTMs), timed the way
sheaf-bench times its taggers, for a side-by-side on the same data file.

The model is the one of examples/tagger (and of DyNet's own benchmark,
dynet-benchmark's bilstm-tagger[-withchar]): word embeddings, a forward and a
backward LSTM over the sentence, an MLP (tanh) and a softmax per token; with
--chars, words seen at most once in the file are spelled by a forward and a
backward character LSTM instead (embed / 2 each). Sizes default to
sheaf-bench's: embed 128, hidden 128, MLP 32, char embed 64.

Timing, as sheaf-bench's harness: the first --sentences sentences of the file
in batches of --batch; one untimed pass, then --repeat timed passes, the median
reported as sentences/s. Train = one graph per batch holding every sentence's
loss, summed and scaled by 1/batch, forward, backward and an Adagrad step
(learning rate 0.05, no gradient clipping, as on the LibTorch side); infer =
every token's logits of the batch, computed by one dy.forward call. This is
DyNet through its Python API: the graph is built node by node from Python, as
DyNet's own Python benchmark does. With --autobatch 1 DyNet batches the graph's operations
itself (its "agenda" autobatching); 0 runs them one by one.

Prints one JSON object per measurement (--json) or a line each.
"""
import re
import sys

from common import adagrad, in_batches, parser, run_modes, start_dynet, step_on


def read_tagged(path):
    """DyNet's benchmark format: one sentence a line, word|TAG tokens (split at the last '|'),
    separated by ASCII white space as the C++ reader (examples/data/tagging.cpp) splits them."""
    sentences = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            tokens = [t for t in re.split(r"[ \t\r\n\f\v]+", line) if t]
            if not tokens:
                continue
            sentence = []
            for token in tokens:
                bar = token.rfind("|")
                if bar <= 0 or bar + 1 == len(token):
                    sys.exit(f"{path}:{number}: token '{token}' is not word|TAG")
                sentence.append((token[:bar], token[bar + 1:]))
            sentences.append(sentence)
    return sentences


def main():
    ap = parser(__doc__, "--sentences", 512)
    ap.add_argument("--data", required=True, help="word|TAG file (sheaf-bench --workload tagger --write-data FILE)")
    ap.add_argument("--chars", action="store_true", help="spell rare words with character LSTMs")
    ap.add_argument("--embed", type=int, default=128)
    ap.add_argument("--mlp", type=int, default=32)
    ap.add_argument("--char-embed", type=int, default=64)
    a = ap.parse_args()
    dy = start_dynet(a)

    corpus = read_tagged(a.data)
    counts = {}
    for s in corpus:
        for w, _ in s:
            counts[w] = counts.get(w, 0) + 1
    words = {w: i for i, w in enumerate(sorted(counts))}
    tags = {t: i for i, t in enumerate(sorted({t for s in corpus for _, t in s}))}
    # Characters are bytes, as the C++ model spells words.
    chars = {c: i for i, c in enumerate(sorted({c for w in counts for c in w.encode("utf-8")}))}
    used, _ = in_batches(corpus, a.sentences, a.batch, "sentences")
    data = [([words[w] for w, _ in s], [tags[t] for _, t in s], [counts[w] <= 1 for w, _ in s],
             [[chars[c] for c in w.encode("utf-8")] for w, _ in s]) for s in used]
    _, batches = in_batches(data, a.sentences, a.batch, "sentences")
    tokens = sum(len(s[0]) for s in data)

    m = dy.ParameterCollection()
    E = m.add_lookup_parameters((len(words), a.embed))
    fwd = dy.VanillaLSTMBuilder(1, a.embed, a.hidden, m)
    bwd = dy.VanillaLSTMBuilder(1, a.embed, a.hidden, m)
    M1 = m.add_parameters((a.mlp, 2 * a.hidden))
    m1 = m.add_parameters(a.mlp)
    M2 = m.add_parameters((len(tags), a.mlp))
    m2 = m.add_parameters(len(tags))
    if a.chars:
        C = m.add_lookup_parameters((len(chars), a.char_embed))
        cfwd = dy.VanillaLSTMBuilder(1, a.char_embed, a.embed // 2, m)
        cbwd = dy.VanillaLSTMBuilder(1, a.char_embed, a.embed // 2, m)
    trainer = adagrad(dy, m)

    def word_rep(w, rare, spelling):
        if not (a.chars and rare):
            return E[w]
        cs = [C[c] for c in spelling]
        return dy.concatenate([cfwd.initial_state().transduce(cs)[-1], cbwd.initial_state().transduce(cs[::-1])[-1]])

    def logits(sentence):
        ws, _, rare, spellings = sentence
        xs = [word_rep(w, r, sp) for w, r, sp in zip(ws, rare, spellings)]
        hf = fwd.initial_state().transduce(xs)
        hb = bwd.initial_state().transduce(xs[::-1])[::-1]
        return [M2 * dy.tanh(M1 * dy.concatenate([f, b]) + m1) + m2 for f, b in zip(hf, hb)]

    def train_step(batch):
        dy.renew_cg()
        losses = []
        for s in batch:
            losses += [dy.pickneglogsoftmax(y, t) for y, t in zip(logits(s), s[1])]
        step_on(dy, trainer, losses, len(batch))

    def infer_step(batch):
        dy.renew_cg()
        out = []
        for s in batch:
            out += logits(s)
        dy.forward(out)

    run_modes(a, "tagger-char" if a.chars else "tagger", {"train": train_step, "infer": infer_step}, batches, a.data,
              "sentences", {"tokens_per_sec": tokens / len(data)})


if __name__ == "__main__":
    main()
