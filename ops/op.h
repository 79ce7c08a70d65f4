// What an op descriptor is made of, and the contexts its two functions see.
//
//   struct Tanh {
//     static constexpr std::string_view name = "tanh";
//     static constexpr OpTraits traits{.arity = 1};
//     static Shape infer(const InferCtx& c);   // per-example shape; c.fail(...) on misuse
//     static at::Tensor run(RunCtx& c);        // ONE LibTorch call for the whole batch
//   };
//
// infer() runs at trace time, for every node, so a user's mistake is reported at
// the user's line. run() sees batched inputs: a per-example argument of shape S
// arrives as [n, S...]; a shared argument (a parameter) arrives as itself.
#pragma once

#include <ATen/core/Tensor.h>

#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <sheaf/core/error.h>
#include <sheaf/core/ids.h>
#include <sheaf/core/shape.h>

namespace sheaf {

class WeightGradBatcher;  // ops/weight_grad.h
class RowReads;           // ops/row_reads.h
class TransposedWeights;  // ops/weight_grad.h

struct OpTraits {
  static constexpr int kVariadic = -1;
  int arity = 1;           // number of Expr arguments, or kVariadic
  // Variadic args are a list reduced per node (sum of a list): lists of different
  // lengths batch together, so the arity is not part of the signature, and the
  // result's shape is the elements' (Trace::list_key keys it by one element).
  bool segmented = false;
  // Makes a per-example value from its payload (input, constant, lookup), even
  // though its only arguments, if any, are shared.
  bool source = false;
  // Gets a payload that is unique per (example, node ordinal within the example),
  // the same whether the example runs alone or batched (dropout masks).
  bool keyed = false;
  // When all arguments are per-example values of one shape, the planner may hand
  // them over stacked: in(0) = [n * arity, S...], node-major (RunCtx::stacked()).
  // One gather then replaces one per argument (concat of children in a tree).
  bool stackable = false;
  // Row by row: on per-example values [L, S...] the op computes each of the L
  // rows alone, so nodes whose lengths L differ share one launch over their
  // rows packed end to end ([sum of L, S...]; RunCtx::n() is then the number of
  // rows and out_shape() the shape of one row). The rows are those of the
  // per-example arguments in `row_args` of the highest rank R (the result's
  // or more): the planner packs a node when each of those has rank R and the
  // result's length, each other per-example argument has one row's shape (then
  // repeated on each row), and each shared argument has a rank below R (it
  // broadcasts over the rows) or is one of `weights`. A result of rank 1 packs
  // when R is 2 (matmul of a matrix by a vector: one element per row) or when
  // it is computed element by element (a fusible elementwise op) or across
  // rows (below) from a packed vector. run() must then be correct for any n
  // and rows of out_shape().
  bool rowwise = false;
  uint8_t weights = 0;  // bit i: argument i is a weight, applied to each row (affine's W)
  uint8_t row_args = 0xff;  // bit i: argument i may carry rows (matmul: only A)
  // On a packed vector (per-example [L] whose L elements are rows), the op
  // works across each value's elements (softmax over a sequence's scores):
  // run() then also gets segment_ids() and segment_counts(), as a row
  // reduction does, and returns the elements end to end.
  bool across_rows = false;
  // Packed, the op computes each value from all of its own rows (attention
  // over a sentence): every per-example argument then has the result's
  // length, and run() gets segment_ids() and segment_counts() with the rows.
  bool per_value = false;
  // Per value (above), argument i brings rows of its own number, which may
  // differ from the result's (attention's keys and values: Lk rows, queries
  // and the result Lq): such arguments need the result's rank and are packed
  // with their own lengths, and run() gets those lengths in own_counts()
  // (the first such argument's; the op checks at recording that the others
  // have as many).
  uint8_t own_rows = 0;
  int8_t axis_attr = -1;    // >= 0: row by row only when this attribute (an axis) is not 0
  int8_t length_attr = -1;  // >= 0: this attribute is the length (left out of the signature when packed)
  // Reduces the rows of its per-example arguments [L, S...] (all of them, or
  // along axis 0 where axis_attr says so; several arguments all of one length
  // L, all but the last vectors: a weight per row, as x in x B): nodes of
  // different lengths L share one launch. It applies when no argument is shared, the result has a lower rank
  // than the highest argument, and that rank is >= 2 or an argument is a packed
  // vector. run() then gets the rows of all the values end to end in in(i)
  // ([sum of L, S...]) and, per node, its number of rows in segment_counts()
  // (segment_ids(): each row's node); otherwise segment_counts() is empty.
  bool row_reduce = false;
  // The payload is an index into axis 0 of argument 0 (a table's row, a
  // vector's element) and inference reads it only to check that range: the
  // tracer may then reuse one inference for nodes whose payloads differ (and
  // still checks each payload against that axis).
  bool payload_index = false;
  // >= 0: run() also takes this argument as rows read where they lie
  // (RunCtx::in_place: no gathered copy) when no gradient is wanted, every other
  // argument is shared and each value is one row (a vector). Affine's x: the
  // packed product reads the rows in place.
  int8_t rows_in_place = -1;
  // Bit i: on the CPU, run() may get argument i as rows read where they lie,
  // gradients included (RunCtx::in_place(i); in(i) is then undefined), when
  // the batch is packed or row-reduced, has no shared argument (a weight's
  // product kernels take tensors) and the argument is gathered from earlier
  // batches (not a view of one). It then reads those rows without a copy and
  // adds their gradients into their sources' (ops/row_reads.h);
  // RowReads::materialize gives the tensor where it needs one.
  uint8_t reads_in_place = 0;

  constexpr bool weight(size_t i) const { return i < 8 && ((weights >> i) & 1) != 0; }
  constexpr bool row_arg(size_t i) const { return !weight(i) && (i >= 8 || ((row_args >> i) & 1) != 0); }
  constexpr bool own_rows_arg(size_t i) const { return i < 8 && ((own_rows >> i) & 1) != 0; }
  constexpr bool reads_in_place_arg(size_t i) const { return i < 8 && ((reads_in_place >> i) & 1) != 0; }
  // Whether run() reads per-node payloads (RunCtx::payload, payload_host):
  // only a source's (an id, a slot), a keyed op's (its key) or an index's.
  // The planner hands payloads only to such batches (RunCtx::payload refuses
  // the others'): a copy of every row's payload cost a scattered load a row.
  constexpr bool reads_payload() const { return source || keyed || payload_index; }
};

class InferCtx {
 public:
  InferCtx(std::span<const Shape* const> shapes, std::span<const uint8_t> shared,
           std::span<const int64_t> attrs, int64_t payload, const Site& site)
      : shapes_(shapes), shared_(shared), attrs_(attrs), payload_(payload), site_(site) {}

  size_t arity() const { return shapes_.size(); }
  const Shape& shape(size_t i) const { return *shapes_[i]; }
  bool shared(size_t i) const { return shared_[i] != 0; }
  // (Checked: a user op's infer() may ask for an attribute its call did not pass.)
  int64_t attr(size_t k) const {
    if (k >= attrs_.size()) [[unlikely]]
      fail("asks for attribute ", k, " but the call passed ", attrs_.size());
    return attrs_[k];
  }
  double attr_f(size_t k) const;
  std::span<const int64_t> attrs() const { return attrs_; }
  int64_t payload() const { return payload_; }
  const Site& site() const { return site_; }

  template <class... A>
  [[noreturn]] void fail(const A&... what) const {
    throw_user(site_, what...);
  }
  // Common checks, with messages that name the offending argument.
  void expect_rank(size_t i, int rank, std::string_view what) const;
  void expect_batched(size_t i, std::string_view what) const;
  void expect_shared(size_t i, std::string_view what) const;

 private:
  std::span<const Shape* const> shapes_;
  std::span<const uint8_t> shared_;
  std::span<const int64_t> attrs_;
  int64_t payload_;
  const Site& site_;
};

// Everything one batched launch sees; the executor fills it in.
struct LaunchArgs {
  int64_t n = 0;
  size_t arity = 0;       // the op's arguments (RunCtx::in() may hold fewer: stacked, segmented)
  bool stacked = false;
  std::span<const at::Tensor> inputs;
  std::span<const uint8_t> shared;
  std::span<const int64_t> attrs;
  const Shape* out_shape = nullptr;
  bool packed = false;  // OpTraits::rowwise: n rows of out_shape, the nodes' values end to end
  std::span<const int64_t> payload_host;
  const at::Tensor* index = nullptr;  // the round's indices on the device
  int64_t payload_off = -1;  // < 0: no payloads (OpTraits::reads_payload)
  int64_t segments_off = 0, segments_len = 0;
  std::span<const int64_t> segment_counts;
  std::span<const int64_t> own_counts;  // OpTraits::own_rows: rows per value of those arguments
  const std::vector<at::Tensor>* user_tensors = nullptr;
  at::TensorOptions options;
  uint64_t seed = 0;
  bool train = true;
  WeightGradBatcher* weight_grads = nullptr;  // the round's (ops/weight_grad.h); null: plain autograd
  TransposedWeights* transposed = nullptr;    // the graph's (ops/weight_grad.h); null: none
  // Per argument (or empty): rows where they lie (OpTraits::rows_in_place,
  // reads_in_place; inputs[] holds none for it), or null.
  std::span<const RowReads* const> in_place;
};

class RunCtx {
 public:
  explicit RunCtx(const LaunchArgs& a) : a_(a) {}
  int64_t n() const { return a_.n; }
  // A packed batch (OpTraits::rowwise): in(i) and the result are [rows, ...]
  // of the values' rows end to end; n() rows, out_shape() one row's shape.
  bool packed() const { return a_.packed; }
  // The batched tensor's axis for per-example axis `axis` (an attribute,
  // normalised when recorded or negative): axis + 1, or packed, the axis itself.
  int64_t tensor_axis(int64_t axis) const;
  size_t arity() const { return a_.arity; }
  // The arguments arrive stacked in in(0) (see OpTraits::stackable).
  bool stacked() const { return a_.stacked; }
  // Batched [n, S...] or, for a shared argument, the shared tensor itself.
  const at::Tensor& in(size_t i) const { return a_.inputs[i]; }
  // Argument i as rows read where they lie (OpTraits::rows_in_place,
  // reads_in_place; in(i) is then undefined), or null.
  const RowReads* in_place(size_t i) const { return i < a_.in_place.size() ? a_.in_place[i] : nullptr; }
  bool shared(size_t i) const { return a_.shared[i] != 0; }
  // Argument i as [n, S...] even when shared (an expand view, no copy).
  at::Tensor batched(size_t i) const;
  // For elementwise ops: argument i with shape [n, 1, ..., S] so that it broadcasts
  // against a per-example result of rank `rank` (scalars and shared values included).
  at::Tensor aligned(size_t i, int rank) const;
  // (Checked: a user op's run() may ask for an attribute its call did not
  // pass; the launch's error names the op and its examples.)
  int64_t attr(size_t k) const {
    if (k >= a_.attrs.size()) [[unlikely]]
      missing_attr(k);
    return a_.attrs[k];
  }
  double attr_f(size_t k) const;
  const Shape& out_shape() const { return *a_.out_shape; }
  // Per-node payloads (ids, labels, keys): host copy and device tensor [n] (int64).
  // (Only for ops that say so: OpTraits::reads_payload.)
  std::span<const int64_t> payload_host() const {
    expect_payload();
    return a_.payload_host;
  }
  at::Tensor payload() const {
    expect_payload();
    return a_.index->narrow(0, a_.payload_off, a_.n);
  }
  // For segmented ops: in(0) holds every list element, [total, S...]; segment ids
  // [total] say which node each belongs to, counts [n] how many each node has.
  at::Tensor segment_ids() const { return a_.index->narrow(0, a_.segments_off, a_.segments_len); }
  std::span<const int64_t> segment_counts() const { return a_.segment_counts; }
  // Packed per value with OpTraits::own_rows: how many rows each value's own-row
  // arguments have (their rows end to end in in(i)); empty otherwise.
  std::span<const int64_t> own_counts() const { return a_.own_counts; }
  // User tensors referenced by payloads (op::Input).
  const at::Tensor& user_tensor(int64_t i) const { return (*a_.user_tensors)[static_cast<size_t>(i)]; }
  const at::TensorOptions& options() const { return a_.options; }  // float on the graph's device
  uint64_t seed() const { return a_.seed; }
  bool train() const { return a_.train; }
  WeightGradBatcher* weight_grads() const { return a_.weight_grads; }
  TransposedWeights* transposed() const { return a_.transposed; }

 private:
  void expect_payload() const {
    SHEAF_ASSERT(a_.payload_off >= 0, "an op read payloads without OpTraits::reads_payload: its batch has none");
  }
  [[noreturn, gnu::noinline]] void missing_attr(size_t k) const;
  const LaunchArgs& a_;
};

// The fused form of an elementwise op: a descriptor with a nested `Pointwise`
// struct can be fused with its neighbours into one kernel (scheduler/fusion.h).
// Elementwise, y = fwd(a, b, c), with a and b its operands (b unused by unary
// ops) and c its scalar attribute; da and db are the partial derivatives dy/da
// and dy/db, given y. The CPU kernels instantiate the struct's static functions
// (plain float code: ops/pointwise_math.h); the CUDA kernels paste the
// expressions below (over floats a, b, c, y).
//
//   struct Pointwise {
//     static constexpr PointwiseInfo info{.cuda_fwd = "tanhf(a)", .cuda_da = "1.f - y * y"};
//     static float fwd(float a, float b, float c) { return pw::tanh(a); }
//     static float da(float a, float b, float y, float c) { return 1.0f - y * y; }
//     static float db(float a, float b, float y, float c) { return 0.0f; }
//   };
//
// and, where LibTorch masks a gradient off, static bool mask_a(a, b, y, c)
// (and mask_b) beside PointwiseInfo::cuda_mask_a (cuda_mask_b).
struct PointwiseInfo {
  int operands = 1;            // tensor operands: 1 or 2
  bool scalar = false;         // reads attribute 0 (a double) as c
  bool differentiable = true;  // comparisons are not
  // Worth a fused kernel of its own on the CPU, with nothing to fuse it with:
  // LibTorch's CPU loop is several times slower than the polynomial
  // (ops/pointwise_math.h). On this project's CPU, tanh took 2.2-2.7 ns an
  // element in LibTorch 1.13 and 2.15, against about 0.5 here.
  bool alone_on_cpu = false;
  std::string_view cuda_fwd = {}, cuda_da = {}, cuda_db = {};
  // Where LibTorch's backward masks an operand's gradient off (a select, not
  // a product: relu's where y <= 0, maximum's and minimum's other operand,
  // pow's at exponent 0), a condition over a, b, c, y: the gradient there is
  // 0 even where the incoming one is infinite or NaN (g * 0 would be NaN).
  // The struct's mask_a / mask_b are the same conditions on the CPU; an op
  // has both forms or neither (PointwiseOp checks).
  std::string_view cuda_mask_a = {}, cuda_mask_b = {};
};

// The runtime view of one descriptor, built from kOpList in ops/table.cpp.
struct OpInfo {
  std::string_view name;
  OpTraits traits;
  Shape (*infer)(const InferCtx&);
  at::Tensor (*run)(RunCtx&);
  const PointwiseInfo* pointwise = nullptr;  // fusible elementwise ops only
};

namespace detail {
// The built-in ops' descriptors (ops/table.cpp), read in line by op_info: it
// runs several times for every node recorded.
extern const std::span<const OpInfo> g_builtin_ops;
const OpInfo& user_op_info(OpCode code);  // past the built-in ones: users' ops
}  // namespace detail
inline const OpInfo& op_info(OpCode code) {
  return code < detail::g_builtin_ops.size() ? detail::g_builtin_ops[code] : detail::user_op_info(code);
}
std::string_view op_name(OpCode code);
// OpTraits::reads_payload, and true for users' ops (ops/user_op.h: their
// run() may read it).
inline bool reads_payload(OpCode code) {
  return code >= detail::g_builtin_ops.size() || detail::g_builtin_ops[code].traits.reads_payload();
}

// What every descriptor must have (ops/table.cpp checks the built-in ones,
// ops/user_op.h the user's).
template <class Op>
concept OpDescriptor = requires(const InferCtx& ic, RunCtx& rc) {
  { Op::name } -> std::convertible_to<std::string_view>;
  { Op::traits } -> std::convertible_to<OpTraits>;
  { Op::infer(ic) } -> std::same_as<Shape>;     // shape inference (user errors at trace time)
  { Op::run(rc) } -> std::same_as<at::Tensor>;  // the batched LibTorch call
};

// Adds an op at run time (ops/user_op.h wraps it): its code follows the
// built-in ones. The name must be new (a UserError otherwise); `info.name`
// must outlive the program (a string literal). At most kMaxUserOps.
inline constexpr size_t kMaxUserOps = 1024;
OpCode register_op(const OpInfo& info);
// Whether `code` names an op (built in, or registered): dsl::call checks a user's code with it.
bool op_known(OpCode code);

// Whether a batched result has the sizes its nodes' shape says: [rows,
// shape...], or, packed (`packed`), [rows, shape without its first axis...].
bool fits_shape(const at::Tensor& out, int64_t rows, const Shape& shape, bool packed);
// For a user op (code past the built-in ones) whose run() returned sizes that
// do not fit, or a dtype other than float32: a UserError naming the op and
// `site` (the user's to fix, not an internal error). Built-in ops return
// without a check.
void check_user_op_output(OpCode op, const Site& site, const at::Tensor& out, int64_t rows, const Shape& shape,
                          bool packed);

// Attributes are int64 slots; doubles are stored bit for bit.
int64_t attr_of(double v);
double attr_to_double(int64_t a);

}  // namespace sheaf
