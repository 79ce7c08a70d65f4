// Leaves: values that enter the graph from the user.
#pragma once

#include <ATen/ops/cat.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/full.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/stack.h>

#include <stdexcept>
#include <vector>

#include "common.h"

namespace sheaf::op {

// attrs: rank, dims...; payload: index of the user's tensor. Batched by stacking (one copy, as a user would).
struct Input {
  static constexpr std::string_view name = "input";
  static constexpr OpTraits traits{.arity = 0, .source = true};
  static Shape infer(const InferCtx& c) { return shape_from_attrs(c, 0); }
  static at::Tensor run(RunCtx& c) {
    std::vector<at::Tensor> xs;
    xs.reserve(static_cast<size_t>(c.n()));
    for (int64_t slot : c.payload_host()) {
      xs.push_back(c.user_tensor(slot));
      // Read at forward, not when recorded: a buffer resized since then.
      if (!std::ranges::equal(xs.back().sizes(), c.out_shape().dims()))
        throw RowError(static_cast<int64_t>(xs.size()) - 1,
                       detail::cat("an input tensor's sizes changed after it was recorded: recorded as ",
                                   c.out_shape().str(), ", now ", xs.back().sizes(),
                                   " (inputs are read at forward(); record the new tensor instead)"));
    }
    at::Tensor x = at::stack(xs);
    // Host data to a GPU: through pinned memory, without waiting for the stream.
    if (c.options().device().is_cuda() && x.is_cpu()) return x.to(at::kFloat).pin_memory().to(c.options(), true);
    return x.to(c.options());
  }
};

// attrs: value, rank, dims...
struct Constant {
  static constexpr std::string_view name = "constant";
  static constexpr OpTraits traits{.arity = 0, .source = true};
  static Shape infer(const InferCtx& c) { return shape_from_attrs(c, 1); }
  static at::Tensor run(RunCtx& c) {
    return at::full(batched_sizes(c.n(), c.out_shape()), c.attr_f(0), c.options());
  }
};

// payload: index of the user's tensor. Computed when recorded; never launched.
struct Param {
  static constexpr std::string_view name = "param";
  static constexpr OpTraits traits{.arity = 0};
  static Shape infer(const InferCtx& c) { return shape_from_attrs(c, 0); }
  static at::Tensor run(RunCtx&);
};

// Both lookups read argument 0 as a shared table and attr 0 as "sparse gradient".
inline const Shape& check_table(const InferCtx& c) {
  c.expect_shared(0, "the table");
  const Shape& t = c.shape(0);
  if (t.rank() < 1) c.fail("the table must have rank >= 1, got ", t.str());
  if (c.attr(0) != 0 && t.rank() != 2) c.fail("a sparse gradient needs a 2-D table [rows, dim], got ", t.str());
  return t;
}

// args: the shared table [rows, ...]; payload: the row id; attr: sparse gradient.
// A 2-D table is one embedding (sparse gradient optional); another rank, one
// index_select along the rows.
struct Lookup {
  static constexpr std::string_view name = "lookup";
  static constexpr OpTraits traits{.arity = 1, .source = true, .payload_index = true};
  static Shape infer(const InferCtx& c) {
    const Shape& t = check_table(c);
    if (c.payload() < 0 || c.payload() >= t[0])
      c.fail("id ", c.payload(), " is out of range for a table of ", t[0], " rows");
    Shape s;
    for (int i = 1; i < t.rank(); ++i) s.push(t[i]);
    return s;
  }
  static at::Tensor run(RunCtx& c) {
    if (c.in(0).dim() != 2) return c.in(0).index_select(0, c.payload());
    return at::embedding(c.in(0), c.payload(), /*padding_idx=*/-1, /*scale_grad_by_freq=*/false,
                         /*sparse=*/c.attr(0) != 0);
  }
};

// args: the shared table [rows, ...]; payload: the user tensor that holds the
// ids (int64, on the CPU); attrs: sparse gradient, number of ids. The result is
// [ids, ...]: one embedding (or index_select) for the whole batch's ids.
struct LookupList {
  static constexpr std::string_view name = "lookup";
  static constexpr OpTraits traits{.arity = 1, .source = true, .rowwise = true, .weights = 1, .length_attr = 1};
  static Shape infer(const InferCtx& c) {
    const Shape& t = check_table(c);
    Shape s;
    s.push(c.attr(1));
    for (int i = 1; i < t.rank(); ++i) s.push(t[i]);
    return s;
  }
  static at::Tensor run(RunCtx& c) {
    std::vector<at::Tensor> rows;
    rows.reserve(static_cast<size_t>(c.n()));
    for (int64_t slot : c.payload_host()) rows.push_back(c.user_tensor(slot));
    // [n, count], or packed (lists of different lengths) all ids end to end.
    const at::Tensor ids = (c.packed() ? at::cat(rows) : at::stack(rows)).to(c.in(0).device());
    if (c.in(0).dim() == 2)
      return at::embedding(c.in(0), ids, /*padding_idx=*/-1, /*scale_grad_by_freq=*/false, /*sparse=*/c.attr(0) != 0);
    std::vector<int64_t> sizes(ids.sizes().begin(), ids.sizes().end());
    for (int64_t d = 1; d < c.in(0).dim(); ++d) sizes.push_back(c.in(0).size(d));
    return c.in(0).index_select(0, ids.reshape({-1})).view(sizes);
  }
};
// Row i of a shared table at an index computed in the graph (a scalar holding
// a whole number: a decoder's own prediction fed back as its next input).
// args: the table, the index; attr: sparse gradient. The gradient flows to the
// table only; the index is checked when the batch runs (checked_indices).
struct LookupAt {
  static constexpr std::string_view name = "lookup";
  static constexpr OpTraits traits{.arity = 2};
  static Shape infer(const InferCtx& c) {
    const Shape& t = check_table(c);
    if (c.shape(1).rank() != 0) c.fail("the id must be a scalar, got shape ", c.shape(1).str());
    Shape s;
    for (int i = 1; i < t.rank(); ++i) s.push(t[i]);
    return s;
  }
  static at::Tensor run(RunCtx& c) {
    // A shared batch (the index shared too) gets the table as [1, rows, ...]:
    // one row, a dense gradient (a sparse one would not pass back through the
    // batch axis).
    const at::Tensor table = c.shared(0) ? c.in(0) : c.in(0).select(0, 0);
    const at::Tensor ids = checked_indices(c, 1, table.size(0), "a table of", "rows");
    if (table.dim() != 2) return table.index_select(0, ids);
    const bool sparse = c.attr(0) != 0 && c.shared(0);
    return at::embedding(table, ids, /*padding_idx=*/-1, /*scale_grad_by_freq=*/false, sparse);
  }
};

struct Placeholder {
  static constexpr std::string_view name = "placeholder";
  static constexpr OpTraits traits{.arity = 0, .source = true};
  static Shape infer(const InferCtx&) { return Shape{}; }  // replaced by the loop state's / branch's shape
  static at::Tensor run(RunCtx&);
};

}  // namespace sheaf::op
