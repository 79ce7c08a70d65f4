// The CPU kernels of fused elementwise programs. A batch is walked in blocks of
// whole rows (or, for long rows, one row's column chunks); each instruction runs
// over a block as a loop over rows whose inner loop over contiguous floats the
// compiler vectorises (the ops' Pointwise forms are plain float code). A
// slice's rows are read in place (a row stride); a per-row scalar is spread
// into a block buffer. A block stays in L1/L2 from one instruction to the next.
//
// Each loop is compiled three times: for AVX-512, for AVX2+FMA (chosen at run
// time by what the CPU has: core/cpu_features.h) and for the baseline x86-64
// instruction set. This file is compiled
// with -fno-trapping-math (CMakeLists.txt): nothing here reads floating-point
// exception flags, and without it the compiler will not turn the math's
// selects into vector blends.
#include <ATen/Parallel.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include <boost/hana/for_each.hpp>

// Every descriptor, so that the op list's types are complete here.
#include <sheaf/core/cpu_features.h>
#include <sheaf/ops/call.h>
#include <sheaf/ops/elementwise.h>
#include <sheaf/ops/leaf.h>
#include <sheaf/ops/linear.h>
#include <sheaf/ops/op_list.h>
#include <sheaf/ops/reduce.h>
#include <sheaf/ops/structure.h>

#include "fused.h"

namespace sheaf::fused_cpu {

namespace {

// Over a block of rows: a, b (operands) and y (result) are rows with strides.
using Fwd = void (*)(const float* a, int64_t as, const float* b, int64_t bs, float c, float* y, int64_t ys,
                     int64_t rows, int64_t cols);
// ga += g * dy/da, gb += g * dy/db (0 where the op masks: grad_a; each
// skipped when null; gb for binary ops only); g a contiguous block, ga and gb
// rows with strides: the operands' adjoints themselves where they can be
// written in place (no temporary block and no second pass to add it).
using Bwd = void (*)(const float* a, int64_t as, const float* b, int64_t bs, const float* y, int64_t ys,
                     const float* g, float c, float* ga, int64_t gas, float* gb, int64_t gbs, int64_t rows,
                     int64_t cols);

struct Kernels {
  Fwd fwd = nullptr;
  Bwd bwd = nullptr;
};

// g * dy/da, or 0 where LibTorch masks the gradient off (PointwiseInfo::cuda_mask_a).
template <class P>
[[gnu::always_inline]] inline float grad_a(float g, float a, float b, float y, float c) {
  if constexpr (requires { P::mask_a(a, b, y, c); }) return P::mask_a(a, b, y, c) ? 0.0f : g * P::da(a, b, y, c);
  else return g * P::da(a, b, y, c);
}
template <class P>
[[gnu::always_inline]] inline float grad_b(float g, float a, float b, float y, float c) {
  if constexpr (requires { P::mask_b(a, b, y, c); }) return P::mask_b(a, b, y, c) ? 0.0f : g * P::db(a, b, y, c);
  else return g * P::db(a, b, y, c);
}

#define SHEAF_FUSED_LOOPS(SUFFIX, ATTR)                                                                        \
  template <class P>                                                                                            \
  ATTR void fwd_##SUFFIX(const float* a, int64_t as, const float* b, int64_t bs, float c, float* y, int64_t ys, \
                         int64_t rows, int64_t cols) {                                                          \
    for (int64_t r = 0; r < rows; ++r) {                                                                        \
      const float* __restrict ar = a + r * as;                                                                  \
      const float* __restrict br = b + r * bs;                                                                  \
      float* __restrict yr = y + r * ys;                                                                        \
      for (int64_t i = 0; i < cols; ++i) yr[i] = P::fwd(ar[i], br[i], c);                                       \
    }                                                                                                           \
  }                                                                                                             \
  template <class P>                                                                                            \
  ATTR void bwd_##SUFFIX(const float* a, int64_t as, const float* b, int64_t bs, const float* y, int64_t ys,    \
                         const float* g, float c, float* ga, int64_t gas, float* gb, int64_t gbs, int64_t rows,  \
                         int64_t cols) {                                                                        \
    for (int64_t r = 0; r < rows; ++r) {                                                                        \
      const float* __restrict ar = a + r * as;                                                                  \
      const float* __restrict br = b + r * bs;                                                                  \
      const float* __restrict yr = y + r * ys;                                                                  \
      const float* __restrict gr = g + r * cols;                                                                \
      if (ga) {                                                                                                 \
        float* __restrict gar = ga + r * gas;                                                                   \
        for (int64_t i = 0; i < cols; ++i) gar[i] += grad_a<P>(gr[i], ar[i], br[i], yr[i], c);                 \
      }                                                                                                         \
      if (gb) {                                                                                                 \
        float* __restrict gbr = gb + r * gbs;                                                                   \
        for (int64_t i = 0; i < cols; ++i) gbr[i] += grad_b<P>(gr[i], ar[i], br[i], yr[i], c);                 \
      }                                                                                                         \
    }                                                                                                           \
  }

SHEAF_FUSED_LOOPS(base, )
#ifdef SHEAF_HAVE_AVX2_CLONES
SHEAF_FUSED_LOOPS(avx2, SHEAF_AVX2_TARGET)
SHEAF_FUSED_LOOPS(avx512, SHEAF_AVX512_TARGET)
#endif

// Per op code: its loops, for ops with a Pointwise form.
const std::array<Kernels, kNumOps>& table() {
  static const std::array<Kernels, kNumOps> t = [] {
    std::array<Kernels, kNumOps> k{};
    boost::hana::for_each(kOpList, [&](auto type) {
      using Op = typename decltype(type)::type;
      if constexpr (requires { typename Op::Pointwise; }) {
        using P = typename Op::Pointwise;
        Kernels& e = k[code_of<Op>];
#ifdef SHEAF_HAVE_AVX2_CLONES
        if (use_avx512()) {
          e = Kernels{&fwd_avx512<P>, &bwd_avx512<P>};
          return;
        }
        if (use_avx2()) {
          e = Kernels{&fwd_avx2<P>, &bwd_avx2<P>};
          return;
        }
#endif
        e = Kernels{&fwd_base<P>, &bwd_base<P>};
      }
    });
    return k;
  }();
  return t;
}

// A register: an external input (rows in its tensor; broadcast registers repeat
// one value along the row, !col, or one row across rows, row_stride == 0), or a
// member's value (its block lives in an output tensor or in scratch: `member`),
// either possibly through a slice (offset elements into the row).
struct Reg {
  const float* base = nullptr;  // inputs: the tensor's data (+ offset)
  const float* const* rows = nullptr;  // inputs read in place: each row's data (+ offset)
  int64_t row_stride = 0;
  bool col = true;              // false: one value per row
  int32_t input = -1;           // >= 0: an external input
  int32_t member = -1;          // >= 0: a non-slice member (its value and adjoint blocks)
  int64_t offset = 0;           // into the input's row (slices)
};

// A block: rows [row0, row0 + rows), columns [col0, col0 + cols).
struct Block {
  int64_t row0, rows, col0, cols;
  int64_t count() const { return rows * cols; }
};

// Blocks of whole rows when rows are short, else column chunks of one row.
constexpr int64_t kBlock = 2048;

template <class F>
void for_blocks(int64_t n, int64_t numel, bool parallel, F&& body) {
  if (numel <= kBlock) {
    const int64_t rows = std::max<int64_t>(1, kBlock / std::max<int64_t>(numel, 1));
    const int64_t blocks = (n + rows - 1) / rows;
    auto run = [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) body(Block{b * rows, std::min(rows, n - b * rows), 0, numel});
    };
    if (parallel) at::parallel_for(0, blocks, 1, run);
    else run(0, blocks);
    return;
  }
  const int64_t chunks = (numel + kBlock - 1) / kBlock;
  auto run = [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t row = q / chunks, col0 = (q % chunks) * kBlock;
      body(Block{row, 1, col0, std::min(kBlock, numel - col0)});
    }
  };
  if (parallel) at::parallel_for(0, n * chunks, 1, run);
  else run(0, n * chunks);
}

// Per-thread scratch, reused across blocks and batches.
float* scratch(size_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < floats) buf.resize(floats);
  return buf.data();
}

// (On the stack for the usual small programs: a launch made several vectors,
// and a block two more, before any float was computed.)
using Regs = c10::SmallVector<Reg, 16>;

Regs registers(const FusedProgram& p, std::span<const FusedInput> inputs) {
  Regs regs;
  for (uint32_t e = 0; e < p.inputs; ++e) {
    Reg r;
    if (inputs[e].rows) r.rows = inputs[e].rows->data().data();
    else r.base = inputs[e].tensor.data_ptr<float>();
    r.row_stride = p.input_shared[e] ? 0 : p.input_numel[e];
    r.col = !(p.input_numel[e] == 1 && p.numel > 1);
    r.input = static_cast<int32_t>(e);
    regs.push_back(r);
  }
  int32_t member = 0;
  for (const FusedInstr& in : p.code) {
    Reg r;
    if (in.slice) {
      r = regs[in.a];
      if (r.base) r.base += in.offset;
      r.offset += in.offset;
    } else {
      r.member = member++;
    }
    regs.push_back(r);
  }
  return regs;
}

// Where each member's block is: in its output tensor (kept members, forward) or
// in a scratch block of `count` floats.
struct MemberBlocks {
  MemberBlocks(int members, int64_t row_stride)
      : ptr(static_cast<size_t>(members)), stride(static_cast<size_t>(members), row_stride) {}
  c10::SmallVector<float*, 8> ptr;
  c10::SmallVector<int64_t, 8> stride;
};

// A register's rows over a block: a pointer and a row stride. A value per row
// (a broadcast scalar) is spread into `buf` first, and rows read in place are
// copied there (the block stays in L1: cheaper than a gathered tensor).
struct Rows {
  const float* p;
  int64_t stride;
};
Rows rows_of(const Reg& r, const Block& b, const MemberBlocks& m, float* buf) {
  if (r.member >= 0) return {m.ptr[static_cast<size_t>(r.member)], m.stride[static_cast<size_t>(r.member)]};
  if (r.rows) {
    const float* const* rows = r.rows + b.row0;
    for (int64_t i = 0; i < b.rows; ++i) {
      const float* src = rows[i] + r.offset;
      if (r.col) std::memcpy(buf + i * b.cols, src + b.col0, static_cast<size_t>(b.cols) * sizeof(float));
      else std::fill_n(buf + i * b.cols, b.cols, src[0]);
    }
    return {buf, b.cols};
  }
  const float* first = r.base + b.row0 * r.row_stride;
  if (r.col) return {first + b.col0, r.row_stride};
  for (int64_t i = 0; i < b.rows; ++i) std::fill_n(buf + i * b.cols, b.cols, first[i * r.row_stride]);
  return {buf, b.cols};
}

float attr_of_instr(const FusedInstr& in) { return static_cast<float>(attr_to_double(in.attr)); }

// Runs the program's instructions over one block, members into `m`.
void run_block(const FusedProgram& p, const Regs& regs, const Block& b, const MemberBlocks& m,
               float* buf) {
  const auto& kernels = table();
  for (size_t k = 0; k < p.code.size(); ++k) {
    const FusedInstr& in = p.code[k];
    if (in.slice) continue;
    const Rows a = rows_of(regs[in.a], b, m, buf);
    // A unary op's second operand is never read: no copy of it.
    const Rows bb = op_info(in.op).pointwise->operands == 2 ? rows_of(regs[in.b], b, m, buf + b.count()) : a;
    const auto member = static_cast<size_t>(regs[p.inputs + k].member);
    kernels[in.op].fwd(a.p, a.stride, bb.p, bb.stride, attr_of_instr(in), m.ptr[member], m.stride[member], b.rows,
                       b.cols);
  }
}

int members_of(const FusedProgram& p) {
  int m = 0;
  for (const FusedInstr& in : p.code) m += in.slice ? 0 : 1;
  return m;
}

}  // namespace

const char* isa() { return use_avx512() ? "avx512" : use_avx2() ? "avx2+fma" : "baseline"; }

void forward(const FusedProgram& p, std::span<const FusedInput> inputs, std::span<const at::Tensor> outputs,
             int64_t n) {
  const Regs regs = registers(p, inputs);
  const int members = members_of(p);
  const bool parallel = at::get_num_threads() > 1 && n * p.numel >= 4 * kBlock;
  for_blocks(n, p.numel, parallel, [&](const Block& b) {
    const int64_t count = b.count();
    float* values = scratch((static_cast<size_t>(members) + 2) * count);
    MemberBlocks m(members, 0);
    for (int k = 0; k < members; ++k) {
      if (outputs[k].defined()) {
        m.ptr[k] = outputs[k].data_ptr<float>() + b.row0 * p.numel + b.col0;
        m.stride[k] = p.numel;
      } else {
        m.ptr[k] = values + k * count;
        m.stride[k] = b.cols;
      }
    }
    run_block(p, regs, b, m, values + members * count);
  });
}

void backward(const FusedProgram& p, std::span<const FusedInput> inputs, std::span<const at::Tensor> grads_out,
              std::span<at::Tensor> grads_in, std::span<float* const* const> grad_rows, int64_t n) {
  const Regs regs = registers(p, inputs);
  const auto& kernels = table();
  const int members = members_of(p);
  std::vector<float*> g_in(p.inputs, nullptr);
  bool shared_grad = false;
  for (uint32_t e = 0; e < p.inputs; ++e)
    if (grads_in[e].defined()) {
      g_in[e] = grads_in[e].data_ptr<float>();
      shared_grad = shared_grad || p.input_shared[e];
    }
  std::vector<const float*> g_out;
  for (const at::Tensor& g : grads_out) g_out.push_back(g.defined() ? g.data_ptr<float>() : nullptr);
  // Rows of a shared input's gradient gather contributions of every row, and
  // two rows read in place may be the same source row: serial then.
  for (float* const* rows : grad_rows) shared_grad = shared_grad || rows != nullptr;
  // Long rows are cut into column chunks that run in parallel: an input read
  // at two offsets (two slices, or a slice and itself) may get one gradient
  // element from two chunks at once: serial then.
  if (p.numel > kBlock) {
    std::vector<uint32_t> slices(p.inputs, 0);
    std::vector<uint8_t> whole(p.inputs, 0);
    for (const FusedInstr& in : p.code) {
      if (in.slice) {
        if (in.a < p.inputs) ++slices[in.a];
        continue;
      }
      for (uint32_t r : {in.a, in.b})
        if (r < p.inputs) whole[r] = 1;
    }
    for (uint32_t e = 0; e < p.inputs; ++e) shared_grad = shared_grad || slices[e] + whole[e] > 1;
  }
  const bool parallel = !shared_grad && at::get_num_threads() > 1 && n * p.numel >= 4 * kBlock;

  for_blocks(n, p.numel, parallel, [&](const Block& b) {
    const int64_t count = b.count();
    // Members' values (recomputed: cheaper than saving and reading them back),
    // their adjoints, and four operand blocks.
    float* values = scratch((2 * static_cast<size_t>(members) + 4) * count);
    float* adj = values + members * count;
    float* buf = adj + members * count;
    float* fa = buf + 2 * count;
    float* fb = buf + 3 * count;
    MemberBlocks m(members, b.cols);
    for (int k = 0; k < members; ++k) m.ptr[k] = values + k * count;
    run_block(p, regs, b, m, buf);
    for (int k = 0; k < members; ++k) {
      float* dst = adj + k * count;
      if (g_out[k] == nullptr) std::fill_n(dst, count, 0.0f);
      else for (int64_t i = 0; i < b.rows; ++i)
        std::memcpy(dst + i * b.cols, g_out[k] + (b.row0 + i) * p.numel + b.col0, b.cols * sizeof(float));
    }
    // Where register r's adjoint can take += in place over this block (a
    // member's adjoint block; a tensor input's gradient rows): pointer and row
    // stride; null where it cannot (rows read in place, a per-row scalar) or
    // where no gradient is wanted (then `wanted` says so).
    auto direct = [&](const Reg& r, bool& wanted) -> std::pair<float*, int64_t> {
      wanted = true;
      if (r.member >= 0) return {adj + r.member * count, b.cols};
      const auto e = static_cast<size_t>(r.input);
      float* const* g_rows = grad_rows.empty() ? nullptr : grad_rows[e];
      if (g_rows) return {nullptr, 0};
      float* g = g_in[e];
      if (g == nullptr) {
        wanted = false;
        return {nullptr, 0};
      }
      if (!r.col) return {nullptr, 0};
      const int64_t stride = p.input_shared[e] ? 0 : p.input_numel[e];
      return {g + b.row0 * stride + r.offset + b.col0, stride};
    };
    // Adds a block-shaped contribution into register r's adjoint.
    auto accumulate = [&](const Reg& r, const float* d) {
      if (r.member >= 0) {
        float* dst = adj + r.member * count;
        for (int64_t i = 0; i < count; ++i) dst[i] += d[i];
        return;
      }
      const auto e = static_cast<size_t>(r.input);
      float* g = g_in[e];
      float* const* g_rows = grad_rows.empty() ? nullptr : grad_rows[e];
      if (g == nullptr && g_rows == nullptr) return;
      const int64_t stride = p.input_shared[e] ? 0 : p.input_numel[e];
      for (int64_t i = 0; i < b.rows; ++i) {
        const float* src = d + i * b.cols;
        float* row = g_rows ? g_rows[b.row0 + i] : g + (b.row0 + i) * stride;
        if (row == nullptr) continue;  // a source that needs no gradient
        if (!r.col) {
          float sum = 0;
          for (int64_t j = 0; j < b.cols; ++j) sum += src[j];
          row[0] += sum;
        } else {
          float* at = row + r.offset + b.col0;
          for (int64_t j = 0; j < b.cols; ++j) at[j] += src[j];
        }
      }
    };
    for (size_t k = p.code.size(); k-- > 0;) {
      const FusedInstr& in = p.code[k];
      if (in.slice) continue;  // its value's gradient reached its operand through the members that read it
      const OpInfo& info = op_info(in.op);
      if (!info.pointwise->differentiable) continue;
      const int member = regs[p.inputs + k].member;
      const bool binary = info.pointwise->operands == 2;
      const Rows a = rows_of(regs[in.a], b, m, buf);
      const Rows bb = binary ? rows_of(regs[in.b], b, m, buf + count) : a;
      // Each operand's adjoint in place where it can be; else a zeroed block
      // added in afterwards. Both operands one register (x * x): b's goes
      // through the block, so the two never write one place at once.
      bool want_a = false, want_b = false;
      auto [ga, gas] = direct(regs[in.a], want_a);
      auto [gb, gbs] = binary ? direct(regs[in.b], want_b) : std::pair<float*, int64_t>{nullptr, 0};
      if (binary && in.a == in.b) gb = nullptr;
      const bool temp_a = want_a && ga == nullptr, temp_b = binary && want_b && gb == nullptr;
      auto through = [&](float* block, float*& g, int64_t& stride) {  // a zeroed block, added in afterwards
        std::fill_n(block, count, 0.0f);
        g = block;
        stride = b.cols;
      };
      if (temp_a) through(fa, ga, gas);
      if (temp_b) through(fb, gb, gbs);
      if (ga || gb)
        kernels[in.op].bwd(a.p, a.stride, bb.p, bb.stride, m.ptr[member], b.cols, adj + member * count,
                           attr_of_instr(in), ga, gas, gb, gbs, b.rows, b.cols);
      if (temp_a) accumulate(regs[in.a], fa);
      if (temp_b) accumulate(regs[in.b], fb);
    }
  });
}

}  // namespace sheaf::fused_cpu
