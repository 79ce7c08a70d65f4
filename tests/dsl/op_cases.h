// The op table shared by the CPU and CUDA checks: one step per op (or op form),
// chained per example so that lengths differ within a batch.
#pragma once

#include <functional>
#include <vector>

#include "../support.h"

namespace sheaf::test::ops {


constexpr int64_t kD = 8;
constexpr int64_t kVocab = 11;

// Parameters and per-example data on the device under test.
struct Params {
  explicit Params(c10::Device d = c10::kCPU) : device(d) {}
  c10::Device device;
  at::Tensor W = on(param({kD, kD}, 1)), b = on(param({kD}, 2)), U = on(param({kD, 2 * kD}, 3)),
             E = on(param({kVocab, kD}, 4)), v = on(param({kD}, 5)), E3 = on(param({3, 2, kD}, 6)),
             Wh = on(param({kD, kD / 4}, 7));  // an LSTM's W_hh (hidden kD / 4; W is its W_ih)
  std::vector<at::Tensor> all() const { return {W, b, U, E, v, E3, Wh}; }
  at::Tensor data(std::vector<int64_t> shape, int example, int salt = 0) const {
    return test::data(std::move(shape), example, salt).to(device);
  }

 private:
  at::Tensor on(const at::Tensor& t) const { return t.detach().to(device).requires_grad_(); }
};

// One step of an example's chain: maps a [kD] value to a [kD] value using the op
// under test. Examples apply it 1 + i % 3 times, so lengths differ in a batch.
using Step = std::function<Expr(Graph&, Expr h, int example, const Params& p)>;

struct OpCase {
  const char* op;
  Step step;
};

inline const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> table = {
      {"input", [](Graph& g, Expr h, int i, const Params& p) { return h + g.input(p.data({kD}, i, 7)); }},
      {"constant", [](Graph& g, Expr h, int, const Params&) { return h * g.constant({kD}, 0.5); }},
      {"param", [](Graph& g, Expr h, int, const Params& p) { return h * g.param(p.v); }},
      {"lookup", [](Graph& g, Expr h, int i, const Params& p) { return h + g.lookup(p.E, (3 * i + 1) % kVocab); }},
      {"lookup sparse", [](Graph& g, Expr h, int i, const Params& p) { return h + g.lookup(p.E, i % kVocab, true); }},
      {"lookup rank 1 and 3",
       [](Graph& g, Expr h, int i, const Params& p) {
         const Expr row = g.lookup(p.E3, i % 3);  // [2, kD]
         return h * g.lookup(p.v, i % kD) + dsl::sum(row);
       }},
      {"lookup list",
       [](Graph& g, Expr h, int i, const Params& p) {
         const Expr rows = g.lookup(p.E, {i % kVocab, (i + 3) % kVocab, (2 * i + 1) % kVocab});  // [3, kD]
         return h * dsl::sum_dim(rows, 0);
       }},
      {"lookup list sparse, rank 3",
       [](Graph& g, Expr h, int i, const Params& p) {
         const std::vector<int64_t> ids{(i + 1) % kVocab, i % kVocab};
         const Expr rows = g.lookup(p.E, ids, true);        // [2, kD]
         const Expr blocks = g.lookup(p.E3, {i % 3, 2, 0});  // [3, 2, kD]
         return h + dsl::sum_dim(rows, 0) + dsl::sum_dim(dsl::sum_dim(blocks, 0), 0);
       }},
      {"add", [](Graph& g, Expr h, int i, const Params& p) { return h + g.input(p.data({kD}, i, 1)); }},
      {"add shared", [](Graph&, Expr h, int, const Params& p) { return h + p.v; }},
      {"sub", [](Graph& g, Expr h, int i, const Params& p) { return g.input(p.data({kD}, i, 2)) - h; }},
      {"mul", [](Graph&, Expr h, int, const Params&) { return h * dsl::tanh(h); }},
      {"mul scalar-expr", [](Graph&, Expr h, int, const Params&) { return h * dsl::sum(h); }},
      {"div", [](Graph&, Expr h, int, const Params&) { return h / (dsl::exp(h) + 1.0); }},
      {"add_scalar", [](Graph&, Expr h, int, const Params&) { return (h + 0.25) - 0.5; }},
      {"mul_scalar", [](Graph&, Expr h, int, const Params&) { return 0.5 * h / 2.0; }},
      {"rdiv_scalar", [](Graph&, Expr h, int, const Params&) { return 1.0 / (dsl::exp(h) + 1.0); }},
      {"neg", [](Graph&, Expr h, int, const Params&) { return -h + (1.0 - h); }},
      {"greater", [](Graph& g, Expr h, int i, const Params& p) { return h * (h > g.input(p.data({kD}, i, 3))); }},
      {"greater/less scalar", [](Graph&, Expr h, int, const Params&) { return h * (h > 0.1) + h * (h < -0.1); }},
      {"sum/mean of one element (a reshape); greater than a per-example scalar (broadcast)",
       [](Graph&, Expr h, int, const Params&) {
         const Expr one = dsl::stack({dsl::sum(dsl::tanh(h))});  // [1]
         return h * (h > dsl::mean(one) * 0.1) + h * dsl::sum(one);
       }},
      {"tanh", [](Graph&, Expr h, int, const Params&) { return dsl::tanh(h); }},
      {"sigmoid", [](Graph&, Expr h, int, const Params&) { return dsl::sigmoid(h); }},
      {"relu", [](Graph&, Expr h, int, const Params&) { return dsl::relu(h) - 0.5; }},
      {"exp/log", [](Graph&, Expr h, int, const Params&) { return dsl::log(dsl::exp(h) + 1.0); }},
      {"abs/sqrt", [](Graph&, Expr h, int, const Params&) { return dsl::sqrt(dsl::abs(h) + 0.1) - dsl::abs(h * 0.5); }},
      {"softplus/log_sigmoid",
       [](Graph&, Expr h, int, const Params&) { return dsl::softplus(h * 30.0) * 0.05 + dsl::log_sigmoid(h * 40.0) * 0.05; }},
      {"gelu", [](Graph&, Expr h, int, const Params&) { return dsl::gelu(h * 2.0) - 0.25; }},
      {"pow_scalar",
       [](Graph&, Expr h, int, const Params&) {
         return dsl::pow(dsl::abs(h) + 0.5, 1.5) * 0.3 + dsl::pow(dsl::tanh(h), 3.0) + dsl::pow(h, 2.0) * 0.1 +
                dsl::pow(h, 0.0);
       }},
      {"maximum/minimum",
       [](Graph& g, Expr h, int i, const Params& p) {
         const Expr y = g.input(p.data({kD}, i, 10));
         return dsl::maximum(h, y) - dsl::minimum(h, p.v) + dsl::maximum(h, h) * 0.5;  // a tie: half each way
       }},
      {"broadcasting (a row on a matrix, a column, a shared row)",
       [](Graph& g, Expr h, int i, const Params& p) {
         const Expr m = dsl::reshape(h, {2, kD / 2});                      // [2, 4]
         const Expr col = g.input(p.data({2, 1}, i, 11));                  // [2, 1]
         const Expr row = dsl::slice(h, 0, kD / 2);                         // [4]
         const Expr x = (m + row) * col - dsl::maximum(col, row) / (dsl::abs(row) + 1.0);  // [2, 4] each
         const Expr y = dsl::reshape(x, {kD}) * p.v + g.input(p.data({1}, i, 12));           // [8] * shared [8] + [1]
         return y - dsl::reshape(m * dsl::slice(g.param(p.v), 0, kD / 2), {kD});     // a shared [4] on a [2, 4]
       }},
      {"argmax, pick at a computed index",
       [](Graph& g, Expr h, int, const Params& p) {
         const Expr rows = dsl::argmax(dsl::reshape(h, {2, kD / 2}));  // [2], positions in each row
         return h * dsl::pick(dsl::tanh(h), dsl::argmax(h)) + dsl::sum(rows) * 0.1 +
                dsl::pick(h, dsl::argmax(g.param(p.v)));  // a shared index
       }},
      {"lookup at a computed index (dense, sparse, rank 3, a shared index)",
       [](Graph& g, Expr h, int, const Params& p) {
         const Expr three = dsl::stack({dsl::sum(h), dsl::sum(dsl::tanh(h)), dsl::pick(h, 0)});  // [3]
         const Expr block = dsl::lookup(p.E3, dsl::argmax(three));                             // [2, kD]
         return dsl::lookup(p.E, dsl::argmax(h)) + dsl::lookup(p.E, dsl::argmax(dsl::tanh(h)), true) * h +
                dsl::sum(block) * 0.1 + dsl::lookup(p.E, dsl::argmax(g.param(p.v))) +
                dsl::lookup(p.E, dsl::argmax(g.param(p.v) * 2.0), true);  // a shared batch, sparse asked
       }},
      {"affine shared W", [](Graph&, Expr h, int, const Params& p) { return dsl::affine(p.W, h, p.b); }},
      {"affine per-example W",
       [](Graph& g, Expr h, int i, const Params& p) { return dsl::affine(g.input(p.data({kD, kD}, i, 4)), h, p.b); }},
      {"affine per-example b",
       [](Graph& g, Expr h, int i, const Params& p) { return dsl::affine(p.W, h, g.input(p.data({kD}, i, 5))); }},
      // The bias computed in the graph (an LSTM step's input projection): its
      // gradient comes from the product's own node.
      {"affine per-example b with a gradient",
       [](Graph&, Expr h, int, const Params& p) { return dsl::affine(p.W, h, dsl::tanh(h) * 0.5); }},
      {"affine [t, in]",
       [](Graph& g, Expr h, int i, const Params& p) {
         return h * dsl::sum(dsl::affine(p.W, g.input(p.data({3, kD}, i, 8)), p.b)) + h;
       }},
      {"matmul shared A", [](Graph&, Expr h, int, const Params& p) { return dsl::matmul(p.W, h); }},
      {"matmul A B",
       [](Graph& g, Expr h, int i, const Params& p) {
         return h * dsl::mean(dsl::matmul(p.W, g.input(p.data({kD, 3}, i, 9))));
       }},
      {"matmul per-example A",
       [](Graph& g, Expr h, int i, const Params& p) { return dsl::matmul(g.input(p.data({kD, kD}, i, 6)), h); }},
      {"matmul computed A (attention scores and context)",  // both operands need gradients; k = 11: vector loop and tail
       [](Graph& g, Expr h, int i, const Params& p) {
         const Expr v = dsl::concat({h, g.input(p.data({3}, i, 10))});                     // [11]
         const Expr H = dsl::stack({v, dsl::tanh(v), dsl::sigmoid(v) * v});                // [3, 11]
         const Expr context = dsl::matmul(dsl::transpose(H), dsl::softmax(dsl::matmul(H, v)));  // [11]
         return h * dsl::sum(context);
       }},
      {"attention (2 heads, lengths 1-3: packed)",
       [](Graph&, Expr h, int i, const Params& p) {
         // Bounded rows: steps chain, and attention of growing values is ill-conditioned in float32.
         std::vector<Expr> rows{dsl::tanh(h)};
         for (int r = 0; r < i % 3; ++r) rows.push_back(dsl::tanh(rows.back() * 1.5));
         const Expr X = dsl::stack(rows);                                           // [1 + i % 3, kD]
         const Expr Q = dsl::affine(p.W, X, p.b), V = dsl::sigmoid(X);
         return h * 0.5 + dsl::sum_dim(dsl::attention(Q, X * 0.5, V, 2), 0) * 0.3 +
                dsl::sum_dim(dsl::attention(X, X, Q, 1), 0) * 0.2;
       }},
      {"row (lengths 1-3: one launch; from the end and the start; of a packed vector)",
       [](Graph&, Expr h, int i, const Params& p) {
         std::vector<Expr> rows{dsl::tanh(h)};
         for (int r = 0; r < i % 3; ++r) rows.push_back(dsl::tanh(rows.back() * 1.5));
         const Expr X = dsl::tanh(dsl::affine(p.W, dsl::stack(rows), p.b));  // [1 + i % 3, kD]
         const Expr scores = dsl::matmul(X, dsl::tanh(h));                     // [1 + i % 3], a packed vector
         return dsl::row(X, -1) * 0.5 + dsl::row(X, 0) * 0.25 + h * dsl::tanh(dsl::row(scores, -1)) * 0.5;
       }},
      {"attention of other lengths (keys and values)",
       [](Graph& g, Expr h, int i, const Params& p) {
         const Expr K = dsl::tanh(g.input(p.data({2 + i % 2, kD}, i, 11)));
         return dsl::sum_dim(dsl::attention(dsl::stack({h, h * 0.5}), K, K, 4), 0);
       }},
      {"attention, queries and keys of different lengths (packed), scale given",
       [](Graph& g, Expr h, int i, const Params& p) {
         std::vector<Expr> rows{dsl::tanh(h)};
         for (int r = 0; r < i % 3; ++r) rows.push_back(dsl::tanh(rows.back() * 1.5));
         const Expr Q = dsl::stack(rows);                                            // [1 + i % 3, kD]
         const Expr K = dsl::tanh(g.input(p.data({1 + (i + 1) % 4, kD}, i, 12)));   // [1 + (i + 1) % 4, kD]
         return dsl::sum_dim(dsl::attention(Q, K, dsl::sigmoid(K), 2, 0.7), 0);
       }},
      {"attention over values of very different lengths (on the CPU: one loop over the rows as they lie)",
       [](Graph& g, Expr h, int i, const Params& p) {
         const int64_t len = i % 2 == 0 ? 2 + i % 3 : 60 + i;  // short and long, in turn
         const Expr K = dsl::tanh(g.input(p.data({len, kD}, i, 13)));
         const Expr Q = dsl::tanh(dsl::affine(p.W, K, p.b) + h);
         return h * 0.5 + dsl::sum_dim(dsl::attention(Q, K, dsl::sigmoid(K), 2), 0) * (0.5 / static_cast<double>(len));
       }},
      {"lstm (lengths 1-3: packed; forward and reverse)",
       [](Graph&, Expr h, int i, const Params& p) {
         std::vector<Expr> rows{dsl::tanh(h)};
         for (int r = 0; r < i % 3; ++r) rows.push_back(dsl::tanh(rows.back() * 1.5));
         const Expr X = dsl::stack(rows);  // [1 + i % 3, kD]
         const Expr f = dsl::lstm(X, p.W, p.Wh, p.b), r = dsl::lstm(X * 0.5, p.W, p.Wh, p.b, true);  // [L, kD / 4]
         return h * 0.5 + h * dsl::sum(f) * 0.3 + dsl::tanh(h) * dsl::sum(r) * 0.2;
       }},
      {"lstm from a given state (lengths 1-3: packed)",
       [](Graph&, Expr h, int i, const Params& p) {
         std::vector<Expr> rows{dsl::tanh(h)};
         for (int r = 0; r < i % 3; ++r) rows.push_back(dsl::sigmoid(rows.back()));
         const Expr h0 = dsl::tanh(dsl::slice(h, 0, kD / 4));  // [kD / 4], computed per example
         return h * 0.5 + h * dsl::sum(dsl::lstm(dsl::stack(rows), p.W, p.Wh, p.b, h0)) * 0.3;
       }},
      {"lstm from a shared state (a learned start; lengths 1-3: packed)",
       [](Graph& g, Expr h, int i, const Params& p) {
         std::vector<Expr> rows{dsl::tanh(h)};
         for (int r = 0; r < i % 3; ++r) rows.push_back(dsl::sigmoid(rows.back()));
         const Expr h0 = dsl::tanh(dsl::slice(g.param(p.v), 0, kD / 4));  // [kD / 4], shared
         return h * 0.5 + h * dsl::sum(dsl::lstm(dsl::stack(rows), p.W, p.Wh, p.b, h0)) * 0.3;
       }},
      {"lstm of sequences of one length (by shape)",
       [](Graph&, Expr h, int, const Params& p) {
         const Expr X = dsl::stack({h, dsl::tanh(h), dsl::sigmoid(h)});
         const Expr both = dsl::concat({dsl::lstm(X, p.W, p.Wh, p.b, true), dsl::lstm(X, p.W, p.Wh, p.b)}, 1);  // [3, 4]
         return h * 0.5 + dsl::tanh(h) * dsl::sum(dsl::sum_dim(both, 0) * dsl::slice(h, 0, 4)) * 0.3;
       }},
      {"pick_neg_log_softmax of rows", [](Graph&, Expr h, int i, const Params&) {
         const std::vector<int64_t> labels{i % 4, (i + 3) % 4};
         return h * dsl::pick_neg_log_softmax(dsl::reshape(h, {2, kD / 2}), labels);
       }},
      {"concat", [](Graph&, Expr h, int, const Params& p) { return dsl::affine(p.U, dsl::concat({h, dsl::tanh(h)}), p.b); }},
      {"slice", [](Graph&, Expr h, int, const Params&) {
         return dsl::concat({dsl::slice(h, kD / 2, kD), dsl::slice(h, 0, kD / 2)});
       }},
      {"chunk", [](Graph&, Expr h, int, const Params&) {
         auto parts = dsl::chunk(h, 4);
         return dsl::concat({parts[3], parts[2] * parts[1], dsl::sigmoid(parts[0]), parts[1]});
       }},
      {"reshape/transpose", [](Graph&, Expr h, int, const Params&) {
         return dsl::reshape(dsl::tanh(dsl::transpose(dsl::reshape(h, {2, -1}))), {kD});  // [2, 4] -> [4, 2] -> [8]
       }},
      {"matmul of per-example matrices", [](Graph&, Expr h, int, const Params&) {
         const Expr m = dsl::reshape(h, {2, kD / 2});
         const Expr gram = dsl::matmul(dsl::transpose(m), m);  // [4, 4]
         return dsl::concat({dsl::sum_dim(gram, 0), dsl::slice(h, 0, kD / 2)});
       }},
      {"stack (all per-example: one stacked input)", [](Graph&, Expr h, int, const Params&) {
         return dsl::sum_dim(dsl::stack({h, dsl::tanh(h), h * 0.5}), 0);
       }},
      {"stack on the last axis, with a shared value", [](Graph& g, Expr h, int, const Params& p) {
         return dsl::max_dim(dsl::stack({h, g.param(p.v)}, -1), 1);  // [8, 2] -> [8]
       }},
      {"mean_dim/min_dim/logsumexp_dim", [](Graph&, Expr h, int, const Params& p) {
         const Expr m = dsl::stack({h, dsl::sigmoid(h), p.v * 1.0 + h});  // [3, 8]
         return dsl::mean_dim(m, 0) + dsl::min_dim(m, 0) * 0.5 - dsl::logsumexp_dim(m, -2) * 0.25;
       }},
      {"dot", [](Graph&, Expr h, int, const Params& p) { return h * dsl::dot(h, p.v) + dsl::dot(p.v, dsl::tanh(h)); }},
      {"layer_norm", [](Graph&, Expr h, int, const Params& p) { return dsl::layer_norm(h, p.v, p.b); }},
      {"sum/mean", [](Graph&, Expr h, int, const Params&) { return h * dsl::sum(h) + dsl::mean(h); }},
      {"sum list", [](Graph&, Expr h, int i, const Params&) {
         std::vector<Expr> xs{h};
         for (int k = 0; k < i % 4; ++k) xs.push_back(dsl::tanh(xs.back()));
         return dsl::sum(xs);
       }},
      {"mean list", [](Graph&, Expr h, int i, const Params&) {
         std::vector<Expr> xs{h};
         for (int k = 0; k < i % 3; ++k) xs.push_back(dsl::sigmoid(xs.back()));
         return dsl::mean(xs);
       }},
      {"softmax", [](Graph&, Expr h, int, const Params&) { return dsl::softmax(h) * 4.0; }},
      {"log_softmax", [](Graph&, Expr h, int, const Params&) { return dsl::log_softmax(h); }},
      {"pick", [](Graph&, Expr h, int i, const Params&) { return h * dsl::pick(h, i % kD); }},
      {"pick_neg_log_softmax",
       [](Graph&, Expr h, int i, const Params&) { return h * dsl::pick_neg_log_softmax(h, (i + 3) % kD); }},
      {"dropout", [](Graph&, Expr h, int, const Params& p) { return dsl::dropout(h, 0.3); }},
  };
  return table;
}

inline Expr chain(Graph& g, int i, const Params& p, const Step& step) {
  Expr h = dsl::tanh(dsl::affine(p.W, g.input(p.data({kD}, i)), p.b));
  for (int k = 0; k < 1 + i % 3; ++k) h = step(g, h, i, p);
  return h;
}

}  // namespace sheaf::test::ops
