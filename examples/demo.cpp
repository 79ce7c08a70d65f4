// sheaf-demo: the smallest complete use of the API. An RNN classifier written
// for ONE sequence, trained on many sequences of different lengths at once.
//
//   ./build/examples/sheaf-demo
#include <ATen/ATen.h>
#include <torch/optim/adam.h>

#include <cstdio>
#include <random>
#include <string_view>

#include <sheaf/sheaf.h>

using namespace sheaf;

namespace {

struct Sequence {
  std::vector<at::Tensor> steps;  // [kIn] each
  int64_t label;
};

constexpr int64_t kIn = 16, kHidden = 32, kClasses = 3;

struct Model {
  at::Tensor W = (at::randn({kHidden, kHidden}) * 0.2).requires_grad_();
  at::Tensor U = (at::randn({kHidden, kIn}) * 0.2).requires_grad_();
  at::Tensor b = at::zeros({kHidden}).requires_grad_();
  at::Tensor V = (at::randn({kClasses, kHidden}) * 0.2).requires_grad_();
  at::Tensor c = at::zeros({kClasses}).requires_grad_();
  std::vector<at::Tensor> parameters() const { return {W, U, b, V, c}; }

  // Per-example code: an ordinary loop over this sequence's own length.
  Expr loss(Graph& g, const Sequence& s) const {
    Expr h = g.zeros({kHidden});
    for (const at::Tensor& x : s.steps) h = dsl::tanh(dsl::affine(W, h, b) + dsl::matmul(U, g.input(x)));
    return dsl::pick_neg_log_softmax(dsl::affine(V, h, c), s.label);
  }
};

// The label is which third of the input dimensions has the largest total: learnable.
std::vector<Sequence> make_data(int n, std::mt19937& rng) {
  std::vector<Sequence> data;
  for (int i = 0; i < n; ++i) {
    Sequence s;
    const int len = 2 + static_cast<int>(rng() % 14);
    at::Tensor total = at::zeros({kIn});
    for (int t = 0; t < len; ++t) {
      s.steps.push_back(at::randn({kIn}));
      total += s.steps.back();
    }
    s.label = total.view({kClasses + 1, -1}).sum(1).narrow(0, 0, kClasses).argmax().item<int64_t>();
    data.push_back(std::move(s));
  }
  return data;
}

}  // namespace

int main(int argc, char** argv) {
  // No options: anything given (a --help too) gets the usage, not the demo
  // run as if it had been understood.
  if (argc > 1) {
    std::fprintf(stderr, "usage: %s (no options: trains a small RNN classifier with Sheaf and prints its losses)\n",
                 argv[0]);
    return std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h" ? 0 : 2;
  }
  at::manual_seed(0);
  std::mt19937 rng(0);
  std::printf("%s\n", runtime_info().c_str());
  Model model;
  const std::vector<Sequence> data = make_data(256, rng);
  torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(0.01));

  // The guarantee behind it all: batched == one at a time (values and gradients).
  CheckReport check = check_batched(8, [&](Graph& g, int i) { return model.loss(g, data[static_cast<size_t>(i)]); },
                                    {.params = model.parameters()});
  std::printf("checker on 8 sequences: %s (max |diff| %.2g over %zu values; %zu launches batched vs %zu alone)\n",
              check.ok ? "batched == alone" : check.message.c_str(), check.max_abs_diff, check.values_compared,
              check.batched_launches, check.alone_launches);

  Graph g;
  for (int epoch = 0; epoch < 5; ++epoch) {
    double total = 0;
    for (size_t start = 0; start < data.size(); start += 64) {
      g.clear();
      std::vector<Expr> losses;
      for (size_t i = start; i < start + 64; ++i) {
        auto scope = g.example(static_cast<int>(i - start));
        losses.push_back(model.loss(g, data[i]));
      }
      Expr loss = dsl::mean(losses);
      g.forward(loss);  // batched execution happens here
      opt.zero_grad();
      loss.value().backward();
      opt.step();
      total += loss.item();
    }
    std::printf("epoch %d: mean loss %.4f\n", epoch, total / 4);
  }
  std::printf("last batch of 64 sequences: %s\n", g.stats().str().c_str());
  return check.ok ? 0 : 1;
}
