// The hand-batched shift-reduce parser computes what the eager per-sentence
// parser computes: transitions, logits and loss (gold and predicted, with and
// without autograd, which take different paths), and in gold mode the gradients
// of every parameter.
#include <c10/core/GradMode.h>
#include <baselines/shift_reduce_hand.h>
#include <shift_reduce/model.h>

#include "../support.h"

using namespace sheaf;
using models::HandShiftReduce;
using models::ShiftReduce;

namespace {

std::vector<data::Tree> trees(int n, uint64_t seed) {
  return data::synthetic_trees({.count = n, .min_words = 1, .max_words = 12, .vocab_size = 30, .seed = seed});
}

ShiftReduce model(uint64_t seed) { return ShiftReduce({.vocab = 30, .hidden = 8, .tracking = 4}, seed); }

std::vector<const data::Tree*> pointers(const std::vector<data::Tree>& ts) {
  std::vector<const data::Tree*> out;
  for (const data::Tree& t : ts) out.push_back(&t);
  return out;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  return a.numel() == 0 ? 0.0 : (a.detach().cpu() - b.detach().cpu()).abs().max().item<double>();
}

std::vector<at::Tensor> grads(const ShiftReduce& m) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : m.parameters()) {
    at::Tensor g = p.grad();
    out.push_back(!g.defined() ? at::zeros_like(p).cpu() : (g.is_sparse() ? g.to_dense() : g).cpu().clone());
  }
  return out;
}

void zero_grads(ShiftReduce& m) {
  for (at::Tensor& p : m.parameters()) p.mutable_grad() = at::Tensor();
}

// Checks the hand-batched run against parse_eager, sentence by sentence.
void check_against_eager(const ShiftReduce& m, const std::vector<data::Tree>& ts, bool predict, bool with_grad) {
  std::optional<c10::NoGradGuard> no_grad;
  if (!with_grad) no_grad.emplace();
  const std::vector<const data::Tree*> batch = pointers(ts);
  HandShiftReduce::Result r = HandShiftReduce(m).run(batch, predict);
  REQUIRE(r.transitions.size() == ts.size());
  REQUIRE(r.logits.sizes() == at::IntArrayRef({static_cast<int64_t>(ts.size()), ShiftReduce::kClasses}));
  CHECK(r.loss.requires_grad() == with_grad);
  double loss = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    ShiftReduce::EagerResult e = m.parse_eager(ts[i], predict);
    INFO("sentence " << i << " of " << ts[i].num_words() << " words");
    CHECK(r.transitions[i] == e.transitions);
    CHECK(max_diff(r.logits[static_cast<int64_t>(i)], e.logits) < 1e-4);
    loss += e.loss.item<double>();
  }
  CHECK(std::abs(r.loss.item<double>() - loss) < 1e-4 * std::max(1.0, std::abs(loss)));
}

}  // namespace

TEST_CASE("hand-batched shift-reduce equals the eager parse", "[examples][shift_reduce][hand]") {
  const int n = GENERATE(1, 2, 7, 24);
  const bool predict = GENERATE(false, true);
  const bool with_grad = GENERATE(false, true);
  INFO("batch " << n << (predict ? " predicted" : " gold") << (with_grad ? " with grad" : " without grad"));
  const std::vector<data::Tree> ts = trees(n, 11 + static_cast<uint64_t>(n));
  check_against_eager(model(5), ts, predict, with_grad);
}

TEST_CASE("hand-batched shift-reduce: gradients equal the eager parse's", "[examples][shift_reduce][hand]") {
  const int n = GENERATE(1, 3, 16);
  const bool predict = GENERATE(false, true);
  INFO("batch " << n << (predict ? " predicted" : " gold"));
  const std::vector<data::Tree> ts = trees(n, 21 + static_cast<uint64_t>(n));
  ShiftReduce m = model(6);

  HandShiftReduce::Result r = HandShiftReduce(m).run(pointers(ts), predict);
  r.loss.backward();
  const std::vector<at::Tensor> hand = grads(m);
  zero_grads(m);
  at::Tensor total;
  for (const data::Tree& t : ts) {
    at::Tensor l = m.parse_eager(t, predict).loss;
    total = total.defined() ? total + l : l;
  }
  total.backward();
  const std::vector<at::Tensor> eager = grads(m);
  REQUIRE(m.E.grad().is_sparse());  // the embedding gradient stays sparse
  const char* names[] = {"E", "T", "t", "A", "a", "U", "u", "V", "v"};
  for (size_t i = 0; i < hand.size(); ++i) {
    INFO("gradient of " << names[i]);
    CHECK(max_diff(hand[i], eager[i]) < 1e-4);
  }
}

TEST_CASE("hand-batched shift-reduce: backward twice with retain_graph", "[examples][shift_reduce][hand]") {
  const std::vector<data::Tree> ts = trees(6, 51);
  ShiftReduce m = model(12);
  HandShiftReduce::Result r = HandShiftReduce(m).run(pointers(ts), false);
  r.loss.backward({}, /*retain_graph=*/true);
  const std::vector<at::Tensor> once = grads(m);
  r.loss.backward();
  const std::vector<at::Tensor> twice = grads(m);
  for (size_t i = 0; i < once.size(); ++i) CHECK(max_diff(twice[i], 2 * once[i]) < 1e-4);
}

TEST_CASE("hand-batched shift-reduce: sentences of any order and length, repeated", "[examples][shift_reduce][hand]") {
  // One-word sentences (a single SHIFT), equal lengths, a sentence twice, longest last.
  std::vector<data::Tree> ts = trees(40, 31);
  std::vector<data::Tree> picked{data::parse_tree("(1 w7)"), data::parse_tree("(4 w3)")};
  data::synthetic_vocab(30).assign_ids(picked);
  for (const data::Tree& t : ts)
    if (t.num_words() == 5) picked.push_back(t);
  picked.push_back(ts[0]);
  picked.push_back(ts[0]);
  std::sort(ts.begin(), ts.end(), [](const data::Tree& a, const data::Tree& b) { return a.num_words() < b.num_words(); });
  picked.push_back(ts.back());
  const ShiftReduce m = model(8);
  for (bool predict : {false, true})
    for (bool with_grad : {false, true}) check_against_eager(m, picked, predict, with_grad);
}

TEST_CASE("hand-batched shift-reduce: an empty batch", "[examples][shift_reduce][hand]") {
  const ShiftReduce m = model(9);
  HandShiftReduce::Result r = HandShiftReduce(m).run({}, true);
  CHECK(r.transitions.empty());
  CHECK(r.logits.size(0) == 0);
  CHECK(r.loss.item<double>() == 0.0);
}

TEST_CASE("hand-batched shift-reduce on CUDA", "[examples][shift_reduce][hand][cuda]") {
  SHEAF_SKIP_WITHOUT_CUDA();
  const std::vector<data::Tree> ts = trees(9, 41);
  ShiftReduce m = model(10);
  std::vector<HandShiftReduce::Result> cpu;
  for (bool predict : {false, true}) cpu.push_back(HandShiftReduce(m).run(pointers(ts), predict));
  m.to(c10::Device(c10::kCUDA));
  for (bool predict : {false, true}) {
    HandShiftReduce::Result r = HandShiftReduce(m).run(pointers(ts), predict);
    CHECK(r.transitions == cpu[predict].transitions);
    CHECK(max_diff(r.logits, cpu[predict].logits) < 1e-4);
    CHECK(max_diff(r.loss, cpu[predict].loss) < 1e-4);
  }
}
