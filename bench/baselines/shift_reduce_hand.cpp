#include "shift_reduce_hand.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <common/linear_rows.h>

#include "weight_grads.h"

#include <algorithm>
#include <numeric>
#include <optional>

// What was measured (SST train, 256 trees, batches of 32, hidden 128, tracking
// 32, one thread, OpenBLAS on a 2-core AMD EPYC; train = forward + backward +
// Adagrad step, infer = predicted transitions without autograd), in items/s:
//
//   train  infer
//     282      -  every item a row view of its step's output (select), inputs
//                 gathered with at::stack: each view's backward zero-fills a
//                 gradient of its whole source
//     360   1700  plain autograd ops; the transitions planned first and each
//                 source (embedded words, each step's composed rows) read once by
//                 one gather_rows node serving every later step; a step cats its
//                 pieces and index_selects from them
//     544   1740  + each cell ONE custom node (backward written out), the weights'
//                 gradients deferred to one GEMM per batch (per step they were a
//                 shallow GEMM plus a full-size add into the gradient)
//     606   1980  + GEMMs of round_up(m, 4) rows from a buffer with slack, one GEMV
//                 per row for m <= 2, weights transposed once per batch
//     769   2040  + the thin stack below, also with autograd (read by index_select,
//                 gradients index_add_-ed into one buffer): no planning, no pieces,
//                 two nodes per step
//
// OpenBLAS then takes about 40% of the time; most of the rest is per-op dispatch
// of the ~100 small ATen calls per step.

namespace sheaf::models {

namespace {

using Refs = std::vector<int64_t>;

// Host index vectors uploaded as one tensor (one host-to-device copy); each is a view of it.
class Pack {
 public:
  size_t add(std::span<const int64_t> v) {
    spans_.emplace_back(static_cast<int64_t>(data_.size()), static_cast<int64_t>(v.size()));
    data_.insert(data_.end(), v.begin(), v.end());
    return spans_.size() - 1;
  }
  void upload(const c10::Device& device) {
    all_ = at::tensor(data_, at::kLong);
    if (!device.is_cpu()) all_ = all_.to(device);
  }
  at::Tensor operator[](size_t i) const { return all_.narrow(0, spans_[i].first, spans_[i].second); }

 private:
  std::vector<int64_t> data_;
  std::vector<std::pair<int64_t, int64_t>> spans_;
  at::Tensor all_;
};

// The batch with its sentences sorted by length, longest first ("rows"), so
// that the sentences still parsing at step t are rows [0, active[t]).
struct Layout {
  std::vector<size_t> order;          // row -> batch index
  std::vector<int64_t> n, first;      // words of each row; ref of its first word
  std::vector<int64_t> ids;           // word ids, by ref
  std::vector<std::vector<int>> gold;  // gold transitions of each row
  std::vector<int64_t> labels;        // root labels, batch order
  std::vector<int64_t> active;        // per step
  int64_t words = 0;                  // W: refs [0, W) are words, W is the zero row
  int64_t composed = 0;               // composed refs W + 1, W + 2, ...
  int64_t zero() const { return words; }
  int64_t steps() const { return static_cast<int64_t>(active.size()); }
};

Layout layout_of(std::span<const data::Tree* const> batch) {
  Layout L;
  L.order.resize(batch.size());
  std::iota(L.order.begin(), L.order.end(), size_t{0});
  std::stable_sort(L.order.begin(), L.order.end(),
                   [&](size_t a, size_t b) { return batch[a]->num_words() > batch[b]->num_words(); });
  for (const data::Tree* t : batch) L.labels.push_back(t->label.back());
  for (size_t i : L.order) {
    const data::Tree& t = *batch[i];
    L.n.push_back(t.num_words());
    L.first.push_back(L.words);
    for (int k = 0; k < t.size(); ++k)
      if (t.is_leaf(k)) L.ids.push_back(t.word[static_cast<size_t>(k)]);
    L.words += t.num_words();
    L.composed += t.num_words() - 1;
    L.gold.push_back(gold_transitions(t));
  }
  const int64_t steps = batch.empty() ? 0 : 2 * L.n[0] - 1;
  for (int64_t t = 0; t < steps; ++t) {
    int64_t a = 0;
    while (a < static_cast<int64_t>(L.n.size()) && 2 * L.n[static_cast<size_t>(a)] - 1 > t) ++a;
    L.active.push_back(a);
  }
  return L;
}

// One batched step, on the host.
struct Step {
  int64_t active = 0;
  Refs track;       // per active row: buffer top, stack top, stack second
  Refs red;         // the rows that REDUCE, ascending
  Refs lr;          // per reducing row: left (stack second), right (stack top)
  int64_t out = 0;  // ref of the step's first composed row (in `red` order)
};

// The stacks and buffers of every sentence, as refs.
class Machine {
 public:
  explicit Machine(const Layout& L)
      : L_(L), next_(L.n.size(), 0), stacks_(L.n.size()), done_(L.n.size()), out_(L.words + 1) {}

  Step begin(int64_t t) const {
    Step s;
    s.active = L_.active[static_cast<size_t>(t)];
    s.track.resize(static_cast<size_t>(3 * s.active));
    for (size_t j = 0; j < static_cast<size_t>(s.active); ++j) {
      const Refs& st = stacks_[j];
      s.track[3 * j] = next_[j] < L_.n[j] ? L_.first[j] + next_[j] : L_.zero();
      s.track[3 * j + 1] = !st.empty() ? st.back() : L_.zero();
      s.track[3 * j + 2] = st.size() > 1 ? st[st.size() - 2] : L_.zero();
    }
    return s;
  }
  size_t stack_size(size_t j) const { return stacks_[j].size(); }
  size_t buffer_left(size_t j) const { return static_cast<size_t>(L_.n[j] - next_[j]); }

  void finish(Step& s, std::span<const int> actions) {
    s.out = out_;
    for (size_t j = 0; j < static_cast<size_t>(s.active); ++j) {
      Refs& st = stacks_[j];
      done_[j].push_back(actions[j]);
      if (actions[j] == kShift) {
        if (buffer_left(j) == 0) throw InternalError("HandShiftReduce: SHIFT with an empty buffer");
        st.push_back(L_.first[j] + next_[j]++);
        continue;
      }
      if (st.size() < 2) throw InternalError("HandShiftReduce: REDUCE with fewer than two stack items");
      s.red.push_back(static_cast<int64_t>(j));
      s.lr.push_back(st[st.size() - 2]);
      s.lr.push_back(st.back());
      st.resize(st.size() - 2);
      st.push_back(out_++);
    }
  }

  Refs roots() const {  // batch order
    Refs r(stacks_.size());
    for (size_t j = 0; j < stacks_.size(); ++j) r[L_.order[j]] = stacks_[j].back();
    return r;
  }
  std::vector<std::vector<int>> transitions() const {  // batch order
    std::vector<std::vector<int>> r(done_.size());
    for (size_t j = 0; j < done_.size(); ++j) r[L_.order[j]] = done_[j];
    return r;
  }

 private:
  const Layout& L_;
  std::vector<int64_t> next_;
  std::vector<Refs> stacks_;
  std::vector<std::vector<int>> done_;
  int64_t out_;
};

// Every step of a batch whose transitions are known in advance.
struct Plan {
  std::vector<Step> steps;
  Refs roots;  // batch order
  std::vector<std::vector<int>> transitions;
};

Plan plan_following(const Layout& L, const std::vector<std::vector<int>>& actions /* per row */) {
  Machine m(L);
  Plan p;
  std::vector<int> a;
  for (int64_t t = 0; t < L.steps(); ++t) {
    Step s = m.begin(t);
    a.resize(static_cast<size_t>(s.active));
    for (size_t j = 0; j < a.size(); ++j) a[j] = actions[j][static_cast<size_t>(t)];
    m.finish(s, a);
    p.steps.push_back(std::move(s));
  }
  p.roots = m.roots();
  p.transitions = m.transitions();
  return p;
}

// ---------------------------------------------------------------------------
// Products with the weights used at every step.

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// OpenBLAS (ZEN kernels) on a few rows: a GEMM of m rows costs about as much as
// one of m rounded up to a multiple of 4 (composition, 3 rows: 80 us, 4 rows:
// 41 us), and for 1 or 2 rows one GEMV per row is faster still. So the steps'
// inputs live in one buffer with 3 rows of slack, and a product of m rows reads
// round_up(m, 4) of them and drops the extra outputs.
int64_t gemm_rows(int64_t m) { return (m + 3) / 4 * 4; }

// A weight and bias used at every step of a run, the rows of every step's input
// (X) and, with autograd, of the gradient of its gates (G). The gradients of the
// weight and bias are G^T X and sum(G), from one node that runs after every
// step's backward (each step's node takes its output, `token`, as an input):
// per-step weight gradients would cost, per step, a GEMM only a few rows deep
// and a full-size add into the weight's gradient.
struct StepWeights {
  StepWeights(const at::Tensor& weight, const at::Tensor& bias, int64_t rows, bool autograd);

  // Writes the next rows of X: [a, b] side by side; returns their offset.
  int64_t write(const at::Tensor& a, const at::Tensor& b) {
    const int64_t m = a.size(0), off = used;
    used += m;
    at::Tensor x = X.narrow(0, off, m);
    std::vector<at::Tensor> parts{a, b};
    at::cat_out(x, parts, 1);
    return off;
  }
  at::Tensor forward(int64_t off, int64_t m) const {  // X[off:off+m] w^T + b
    if (m <= 2) {
      at::Tensor y = at::empty({m, w.size(0)}, w.options());
      for (int64_t i = 0; i < m; ++i) {
        at::Tensor row = y.select(0, i);
        at::addmv_out(row, b, w, X.select(0, off + i));
      }
      return y;
    }
    return at::addmm(b, X.narrow(0, off, gemm_rows(m)), wt).narrow(0, 0, m);
  }
  void save(AutogradContext* ctx, int64_t off) const {  // what the step's backward needs (nodes outlive the run)
    ctx->saved_data["w"] = w;
    ctx->saved_data["wt"] = wt;
    ctx->saved_data["G"] = G;
    ctx->saved_data["off"] = off;
  }

  at::Tensor w, wt, b;  // detached; wt = w^T, contiguous
  at::Tensor X, G, token;
  int64_t used = 0;
};

// A step's view of its StepWeights in backward.
struct SavedWeights {
  explicit SavedWeights(AutogradContext* ctx)
      : w(ctx->saved_data["w"].toTensor()),
        wt(ctx->saved_data["wt"].toTensor()),
        G(ctx->saved_data["G"].toTensor()),
        off(ctx->saved_data["off"].toInt()) {}
  at::Tensor rows(int64_t m) const { return G.narrow(0, off, m); }  // to write the gate gradients into
  at::Tensor input_grad(int64_t m) const {                            // G[off:off+m] w
    if (m <= 2) {
      at::Tensor y = at::empty({m, w.size(1)}, w.options());
      for (int64_t i = 0; i < m; ++i) {
        at::Tensor row = y.select(0, i);
        at::mv_out(row, wt, G.select(0, off + i));
      }
      return y;
    }
    return at::mm(G.narrow(0, off, gemm_rows(m)), w).narrow(0, 0, m);
  }
  at::Tensor w, wt, G;
  int64_t off;
};

StepWeights::StepWeights(const at::Tensor& weight, const at::Tensor& bias, int64_t rows, bool autograd)
    : w(weight.detach()), wt(w.t().contiguous()), b(bias.detach()) {
  const at::TensorOptions opts = w.options().requires_grad(false);
  X = at::empty({rows + 3, w.size(1)}, opts);  // the slack rows only feed outputs that are dropped
  if (!autograd) return;
  G = at::zeros({rows + 3, w.size(0)}, opts);
  token = DeferredWeightGrads::apply(weight, bias, X.narrow(0, 0, rows), G.narrow(0, 0, rows));
}

// ---------------------------------------------------------------------------
// The thin stack: h and c of every word (refs [0, W)), the zero row (W) and
// every composed item, written in place as the items are made. With autograd,
// dH and dC hold the gradients of its rows: a step's backward adds the gradients
// of the rows it read (index_add_), and the node that wrote rows takes their
// gradient out (and zeroes it). For that to see every reader's gradient, nodes
// that read the stack take its current `token` as an input and nodes that write
// it return the next one: backward then runs every reader of a row before its
// writer.
struct Memory {
  Memory(const ShiftReduce& m, const Layout& L, const at::Tensor& ids, bool autograd);
  at::Tensor H, C, dH, dC, token;
  int64_t words;
};

struct EmbedFn : torch::autograd::Function<EmbedFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& emb, Memory* mem) {
    mem->H.narrow(0, 0, mem->words).copy_(emb);
    ctx->saved_data["dH"] = mem->dH;
    ctx->saved_data["dC"] = mem->dC;
    ctx->saved_data["words"] = mem->words;
    return at::zeros({}, emb.options());
  }
  static variable_list backward(AutogradContext* ctx, variable_list) {
    const at::Tensor dH = ctx->saved_data["dH"].toTensor(), dC = ctx->saved_data["dC"].toTensor();
    const int64_t words = ctx->saved_data["words"].toInt();
    at::Tensor g = dH.narrow(0, 0, words).clone();
    dH.narrow(0, 0, words + 1).zero_();  // the words and the zero row
    dC.narrow(0, 0, words + 1).zero_();
    return {g, at::Tensor()};
  }
};

Memory::Memory(const ShiftReduce& m, const Layout& L, const at::Tensor& ids, bool autograd) : words(L.words) {
  const at::TensorOptions opts = m.E.options().requires_grad(false);
  const int64_t rows = L.words + 1 + L.composed, h = m.options().hidden;
  H = at::empty({rows, h}, opts);
  H.narrow(0, L.words, 1).zero_();
  C = at::empty({rows, h}, opts);
  C.narrow(0, 0, L.words + 1).zero_();
  if (!autograd) {
    at::Tensor w = H.narrow(0, 0, L.words);
    at::index_select_out(w, m.E, 0, ids);
    return;
  }
  dH = at::zeros({rows, h}, opts);
  dC = at::zeros({rows, h}, opts);
  token = EmbedFn::apply(at::embedding(m.E, ids, -1, false, m.options().sparse_embedding_grad), this);
}

// ---------------------------------------------------------------------------
// The cells, forward. Both write their inputs into their StepWeights' X and keep
// what their backward needs.
//
// Tracking LSTM: x = [buffer top; stack top; stack second; tracking h] [B, 3h + k],
//   gates (i, f, o, u) = T x + t, c = f * c' + i * u, h = o * tanh(c).
// Composition: x = [left h; right h; tracking h] [r, 2h + k],
//   gates (a, i, fl, fr, o) = U x + u, c = a * i + fl * lc + fr * rc, h = o * tanh(c).
// (sigmoid for i, f, o, fl, fr; tanh for u, a.)

struct TrackStep {
  at::Tensor h, c;                 // [B, k]
  at::Tensor act, c_prev, tanh_c;  // for backward: activated gates, c' [B, k], tanh(c)
  int64_t off;                     // rows in X
};

// refs: [3B] rows of the stack; h_prev, c_prev: the previous step's rows (the first B go on).
TrackStep track_forward(Memory& mem, StepWeights& W, const at::Tensor& refs, const at::Tensor& h_prev,
                        const at::Tensor& c_prev) {
  const int64_t B = refs.size(0) / 3, k = c_prev.size(1);
  TrackStep s;
  s.c_prev = c_prev.size(0) == B ? c_prev : c_prev.narrow(0, 0, B);
  s.off = W.write(mem.H.index_select(0, refs).view({B, -1}), h_prev.size(0) == B ? h_prev : h_prev.narrow(0, 0, B));
  s.act = W.forward(s.off, B);
  s.act.narrow(1, 0, 3 * k).sigmoid_();
  s.act.narrow(1, 3 * k, k).tanh_();
  s.c = at::addcmul(s.act.narrow(1, k, k) * s.c_prev, s.act.narrow(1, 0, k), s.act.narrow(1, 3 * k, k));
  s.tanh_c = at::tanh(s.c);
  s.h = s.act.narrow(1, 2 * k, k) * s.tanh_c;
  return s;
}

struct CompStep {
  at::Tensor act, cc, tanh_c;  // for backward: activated gates, [lc rc] [r, 2h], tanh(c)
  int64_t off;
};

// lr: [2r] rows of the children (left, right per item); red: the rows of th that
// REDUCE; out: where the r new items go in the stack.
CompStep comp_forward(Memory& mem, StepWeights& W, const at::Tensor& lr, const at::Tensor& red, int64_t out,
                      const at::Tensor& th) {
  const int64_t r = red.size(0), h = mem.H.size(1);
  CompStep s;
  s.off = W.write(mem.H.index_select(0, lr).view({r, 2 * h}), r == th.size(0) ? th : th.index_select(0, red));
  s.cc = mem.C.index_select(0, lr).view({r, 2 * h});
  s.act = W.forward(s.off, r);
  s.act.narrow(1, 0, h).tanh_();
  s.act.narrow(1, h, 4 * h).sigmoid_();
  const at::Tensor prod = (s.act.narrow(1, 2 * h, 2 * h) * s.cc).view({r, 2, h});  // fl * lc, fr * rc
  at::Tensor c = mem.C.narrow(0, out, r), hn = mem.H.narrow(0, out, r);
  at::add_out(c, prod.select(1, 0), prod.select(1, 1)).addcmul_(s.act.narrow(1, 0, h), s.act.narrow(1, h, h));
  s.tanh_c = at::tanh(c);
  at::mul_out(hn, s.act.narrow(1, 4 * h, h), s.tanh_c);
  return s;
}

// ---------------------------------------------------------------------------
// With autograd: each cell is ONE node per step, backward written out.

struct TrackArgs {
  Memory* mem;
  StepWeights* W;
  at::Tensor refs;
};

// (h' [B', k], c' [B', k]) -> (h, c) [B, k], B <= B'.
struct TrackFn : torch::autograd::Function<TrackFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h_prev, const at::Tensor& c_prev,
                               const at::Tensor& /*stack token*/, const at::Tensor& /*weights token*/, TrackArgs a) {
    TrackStep s = track_forward(*a.mem, *a.W, a.refs, h_prev, c_prev);
    ctx->set_materialize_grads(false);
    a.W->save(ctx, s.off);
    ctx->saved_data["dH"] = a.mem->dH;
    ctx->saved_data["refs"] = a.refs;
    ctx->saved_data["act"] = s.act;
    ctx->saved_data["c_prev"] = s.c_prev;
    ctx->saved_data["tanh_c"] = s.tanh_c;
    ctx->saved_data["prev_rows"] = h_prev.size(0);
    return {s.h, s.c};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor &dh = grads[0], &dc = grads[1];
    if (!dh.defined() && !dc.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const SavedWeights W(ctx);
    const at::Tensor act = ctx->saved_data["act"].toTensor(), c_prev = ctx->saved_data["c_prev"].toTensor();
    const at::Tensor tanh_c = ctx->saved_data["tanh_c"].toTensor();
    const int64_t B = act.size(0), k = c_prev.size(1), items = W.w.size(1) - k;
    const at::Tensor i = act.narrow(1, 0, k), f = act.narrow(1, k, k), o = act.narrow(1, 2 * k, k), u = act.narrow(1, 3 * k, k);
    at::Tensor dct = dh.defined() ? at::tanh_backward(dh * o, tanh_c) : dc;  // dL/dc
    if (dh.defined() && dc.defined()) dct.add_(dc);
    at::Tensor ds = at::empty({B, 3 * k}, act.options());  // dL/d(i, f, o)
    at::Tensor di = ds.narrow(1, 0, k), df = ds.narrow(1, k, k), dout = ds.narrow(1, 2 * k, k);
    at::mul_out(di, dct, u);
    at::mul_out(df, dct, c_prev);
    if (dh.defined()) at::mul_out(dout, dh, tanh_c);
    else dout.zero_();
    const at::Tensor G = W.rows(B);
    at::Tensor gs = G.narrow(1, 0, 3 * k), gu = G.narrow(1, 3 * k, k);
    at::sigmoid_backward_out(gs, ds, act.narrow(1, 0, 3 * k));
    at::tanh_backward_out(gu, dct * i, u);
    const at::Tensor dx = W.input_grad(B);
    ctx->saved_data["dH"].toTensor().index_add_(0, ctx->saved_data["refs"].toTensor(),
                                                dx.narrow(1, 0, items).reshape({3 * B, items / 3}));
    at::Tensor dh_prev = dx.narrow(1, items, k), dc_prev = dct * f;
    const int64_t prev = ctx->saved_data["prev_rows"].toInt();
    if (prev > B) {  // rows of sentences that stopped: no gradient
      dh_prev = at::constant_pad_nd(dh_prev, {0, 0, 0, prev - B});
      dc_prev = at::constant_pad_nd(dc_prev, {0, 0, 0, prev - B});
    }
    return {dh_prev, dc_prev, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct CompArgs {
  Memory* mem;
  StepWeights* W;
  at::Tensor lr, red;
  int64_t out;
};

// th [B, k] -> the next stack token; the new items go into the stack.
struct CompFn : torch::autograd::Function<CompFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& th, const at::Tensor& /*stack token*/,
                            const at::Tensor& /*weights token*/, CompArgs a) {
    CompStep s = comp_forward(*a.mem, *a.W, a.lr, a.red, a.out, th);
    a.W->save(ctx, s.off);
    ctx->saved_data["dH"] = a.mem->dH;
    ctx->saved_data["dC"] = a.mem->dC;
    ctx->saved_data["lr"] = a.lr;
    ctx->saved_data["red"] = a.red;
    ctx->saved_data["out"] = a.out;
    ctx->saved_data["rows"] = th.size(0);
    ctx->saved_data["act"] = s.act;
    ctx->saved_data["cc"] = s.cc;
    ctx->saved_data["tanh_c"] = s.tanh_c;
    return at::zeros({}, th.options());
  }
  static variable_list backward(AutogradContext* ctx, variable_list) {
    const SavedWeights W(ctx);
    const at::Tensor dH = ctx->saved_data["dH"].toTensor(), dC = ctx->saved_data["dC"].toTensor();
    const at::Tensor lr = ctx->saved_data["lr"].toTensor(), red = ctx->saved_data["red"].toTensor();
    const at::Tensor act = ctx->saved_data["act"].toTensor(), cc = ctx->saved_data["cc"].toTensor();
    const at::Tensor tanh_c = ctx->saved_data["tanh_c"].toTensor();
    const int64_t out = ctx->saved_data["out"].toInt(), rows = ctx->saved_data["rows"].toInt();
    const int64_t r = act.size(0), h = tanh_c.size(1), k = W.w.size(1) - 2 * h;
    // The gradients of the new items: every reader has added to them by now.
    const at::Tensor dh = dH.narrow(0, out, r).clone(), dc = dC.narrow(0, out, r).clone();
    dH.narrow(0, out, r).zero_();
    dC.narrow(0, out, r).zero_();
    const at::Tensor a = act.narrow(1, 0, h), i = act.narrow(1, h, h), flr = act.narrow(1, 2 * h, 2 * h);
    const at::Tensor dct = at::tanh_backward(dh * act.narrow(1, 4 * h, h), tanh_c).add_(dc);  // dL/dc
    at::Tensor ds = at::empty({r, 4 * h}, act.options());  // dL/d(i, fl, fr, o)
    at::Tensor di = ds.narrow(1, 0, h), dflr = ds.narrow(1, h, 2 * h).view({r, 2, h}), dout = ds.narrow(1, 3 * h, h);
    at::mul_out(di, dct, a);
    at::mul_out(dflr, cc.view({r, 2, h}), dct.unsqueeze(1));
    at::mul_out(dout, dh, tanh_c);
    const at::Tensor G = W.rows(r);
    at::Tensor ga = G.narrow(1, 0, h), gs = G.narrow(1, h, 4 * h);
    at::tanh_backward_out(ga, dct * i, a);
    at::sigmoid_backward_out(gs, ds, act.narrow(1, h, 4 * h));
    const at::Tensor dx = W.input_grad(r);
    dH.index_add_(0, lr, dx.narrow(1, 0, 2 * h).reshape({2 * r, h}));
    dC.index_add_(0, lr, (flr.view({r, 2, h}) * dct.unsqueeze(1)).view({2 * r, h}));
    at::Tensor dtrack = dx.narrow(1, 2 * h, k);
    if (r < rows) dtrack = at::zeros({rows, k}, dtrack.options()).index_add_(0, red, dtrack);
    return {dtrack, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The roots' h [B, h], read from the stack.
struct RootsFn : torch::autograd::Function<RootsFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& /*stack token*/, Memory* mem,
                            const at::Tensor& refs) {
    ctx->saved_data["dH"] = mem->dH;
    ctx->saved_data["refs"] = refs;
    return mem->H.index_select(0, refs);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (grads[0].defined())
      ctx->saved_data["dH"].toTensor().index_add_(0, ctx->saved_data["refs"].toTensor(), grads[0]);
    return {at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// ---------------------------------------------------------------------------
// The step loop. `given`: the transitions are known (gold); null: predict them
// online (one device-to-host copy of the scores per step).
HandShiftReduce::Result execute(const ShiftReduce& m, const Layout& L, const at::Tensor& ids, const Plan* given,
                                bool predict, bool autograd) {
  const int64_t k = m.options().tracking;
  const c10::Device device = m.E.device();
  const at::TensorOptions opts = m.E.options().requires_grad(false);
  const auto steps = static_cast<size_t>(L.steps());
  Memory mem(m, L, ids, autograd);
  StepWeights track(m.T, m.t, std::accumulate(L.active.begin(), L.active.end(), int64_t{0}), autograd);
  StepWeights comp(m.U, m.u, L.composed, autograd);

  struct Indices {
    at::Tensor track, red, lr;
  };
  std::vector<Indices> idx(steps);
  std::optional<Machine> machine;
  Plan online;
  std::vector<int64_t> targets;  // gold transitions, in the order of the tracking rows
  at::Tensor targets_d, roots_d;
  if (given) {
    Pack pack;
    std::vector<std::array<size_t, 3>> ids3;
    for (size_t t = 0; t < steps; ++t) {
      const Step& s = given->steps[t];
      ids3.push_back({pack.add(s.track), pack.add(s.red), pack.add(s.lr)});
      if (!predict)
        for (size_t j = 0; j < static_cast<size_t>(s.active); ++j) targets.push_back(L.gold[j][t]);
    }
    const size_t roots_id = pack.add(given->roots), targets_id = pack.add(targets);
    pack.upload(device);
    for (size_t t = 0; t < steps; ++t) idx[t] = {pack[ids3[t][0]], pack[ids3[t][1]], pack[ids3[t][2]]};
    roots_d = pack[roots_id];
    targets_d = pack[targets_id];
  } else {
    machine.emplace(L);
    online.steps.reserve(steps);
    online.steps.push_back(machine->begin(0));
    Pack pack;
    pack.add(online.steps[0].track);
    pack.upload(device);
    idx[0].track = pack[0];
  }

  at::Tensor th = at::zeros({L.active[0], k}, opts), tc = th;
  std::vector<at::Tensor> ths;  // gold: every step's tracking states, for the transition losses
  std::vector<int> actions;
  for (size_t t = 0; t < steps; ++t) {
    const Step& s = given ? given->steps[t] : online.steps[t];
    const int64_t B = s.active;
    if (autograd) {
      variable_list o = TrackFn::apply(th, tc, mem.token, track.token, TrackArgs{&mem, &track, idx[t].track});
      th = o[0];
      tc = o[1];
    } else {
      TrackStep o = track_forward(mem, track, idx[t].track, th, tc);
      th = o.h;
      tc = o.c;
    }

    if (!given) {
      // The step's one device-to-host copy: every active sentence's scores.
      c10::NoGradGuard no_grad;
      const at::Tensor scores = linear_rows(th, m.A, m.a).to(at::kCPU).contiguous();
      const float* p = scores.data_ptr<float>();
      actions.resize(static_cast<size_t>(B));
      for (size_t j = 0; j < actions.size(); ++j)
        actions[j] = choose_transition(p[2 * j + kShift], p[2 * j + kReduce], machine->stack_size(j), machine->buffer_left(j));
      machine->finish(online.steps[t], actions);
      Pack pack;
      pack.add(s.red);
      pack.add(s.lr);
      if (t + 1 < steps) {
        online.steps.push_back(machine->begin(static_cast<int64_t>(t + 1)));
        pack.add(online.steps.back().track);
      }
      pack.upload(device);
      idx[t].red = pack[0];
      idx[t].lr = pack[1];
      if (t + 1 < steps) idx[t + 1].track = pack[2];
    } else if (!predict) {
      ths.push_back(th);
    }

    if (s.red.empty()) continue;
    if (autograd) mem.token = CompFn::apply(th, mem.token, comp.token, CompArgs{&mem, &comp, idx[t].lr, idx[t].red, s.out});
    else comp_forward(mem, comp, idx[t].lr, idx[t].red, s.out, th);
  }

  HandShiftReduce::Result result;
  if (!given) {
    online.roots = machine->roots();
    online.transitions = machine->transitions();
    Pack pack;
    pack.add(online.roots);
    pack.upload(device);
    roots_d = pack[0];
  }
  const Plan& plan = given ? *given : online;
  const at::Tensor roots = autograd ? RootsFn::apply(mem.token, &mem, roots_d) : mem.H.index_select(0, roots_d);
  result.logits = linear_rows(roots, m.V, m.v);
  const at::Tensor labels = at::tensor(L.labels, at::kLong).to(device);
  result.loss = at::nll_loss(at::log_softmax(result.logits, 1), labels, {}, at::Reduction::Sum);
  if (given && !predict) {
    const at::Tensor scores = linear_rows(at::cat(ths), m.A, m.a);
    result.loss = result.loss + at::nll_loss(at::log_softmax(scores, 1), targets_d, {}, at::Reduction::Sum);
  }
  result.transitions = plan.transitions;
  return result;
}

}  // namespace

HandShiftReduce::Result HandShiftReduce::run(std::span<const data::Tree* const> batch, bool predict) const {
  const at::TensorOptions opts = m_.E.options().requires_grad(false);
  if (batch.empty()) return {at::zeros({}, opts), at::zeros({0, ShiftReduce::kClasses}, opts), {}};
  const Layout L = layout_of(batch);
  const at::Tensor ids = at::tensor(L.ids, at::kLong).to(m_.E.device());
  bool autograd = false;
  if (at::GradMode::is_enabled())
    for (const at::Tensor& p : m_.parameters()) autograd = autograd || p.requires_grad();
  if (predict) return execute(m_, L, ids, nullptr, true, autograd);
  const Plan plan = plan_following(L, L.gold);
  return execute(m_, L, ids, &plan, false, autograd);
}

}  // namespace sheaf::models
