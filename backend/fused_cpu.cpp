// The CPU kernels of fused elementwise programs. A batch is walked in blocks of
// whole rows (or, for long rows, one row's column chunks); each instruction runs
// over a block as a loop over rows whose inner loop over contiguous floats the
// compiler vectorises (the ops' Pointwise forms are plain float code). A
// slice's rows are read in place (a row stride); a per-row scalar is spread
// into a block buffer. A block stays in L1/L2 from one instruction to the next.
//
// Each loop is compiled twice: for AVX2+FMA (chosen at run time when the CPU
// has them) and for the baseline x86-64 instruction set. This file is compiled
// with -fno-trapping-math (CMakeLists.txt): nothing here reads floating-point
// exception flags, and without it the compiler will not turn the math's
// selects into vector blends.
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include <boost/hana/for_each.hpp>

// Every descriptor, so that the op list's types are complete here.
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
// ga = g * dy/da, gb = g * dy/db (gb null for unary ops); g, ga, gb contiguous blocks.
using Bwd = void (*)(const float* a, int64_t as, const float* b, int64_t bs, const float* y, int64_t ys,
                     const float* g, float c, float* ga, float* gb, int64_t rows, int64_t cols);

struct Kernels {
  Fwd fwd = nullptr;
  Bwd bwd = nullptr;
};

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
                         const float* g, float c, float* ga, float* gb, int64_t rows, int64_t cols) {           \
    for (int64_t r = 0; r < rows; ++r) {                                                                        \
      const float* __restrict ar = a + r * as;                                                                  \
      const float* __restrict br = b + r * bs;                                                                  \
      const float* __restrict yr = y + r * ys;                                                                  \
      const float* __restrict gr = g + r * cols;                                                                \
      float* __restrict gar = ga + r * cols;                                                                    \
      for (int64_t i = 0; i < cols; ++i) gar[i] = gr[i] * P::da(ar[i], br[i], yr[i], c);                       \
      if (gb) {                                                                                                 \
        float* __restrict gbr = gb + r * cols;                                                                  \
        for (int64_t i = 0; i < cols; ++i) gbr[i] = gr[i] * P::db(ar[i], br[i], yr[i], c);                     \
      }                                                                                                         \
    }                                                                                                           \
  }

SHEAF_FUSED_LOOPS(base, )
#if defined(__x86_64__) && defined(__GNUC__)
SHEAF_FUSED_LOOPS(avx2, __attribute__((target("avx2,fma"))))
#define SHEAF_HAVE_AVX2_LOOPS 1
#endif

bool use_avx2() {
#ifdef SHEAF_HAVE_AVX2_LOOPS
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

// Per op code: its loops, for ops with a Pointwise form.
const std::array<Kernels, kNumOps>& table() {
  static const std::array<Kernels, kNumOps> t = [] {
    std::array<Kernels, kNumOps> k{};
    boost::hana::for_each(kOpList, [&](auto type) {
      using Op = typename decltype(type)::type;
      if constexpr (requires { typename Op::Pointwise; }) {
        using P = typename Op::Pointwise;
        Kernels& e = k[code_of<Op>];
#ifdef SHEAF_HAVE_AVX2_LOOPS
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

// A register: where its row r, element j lives. Broadcast registers repeat one
// value along the row (col == 0) or one row across rows (row_stride == 0).
struct Reg {
  const float* base = nullptr;
  int64_t row_stride = 0;
  bool col = true;  // false: one value per row
  // Gradients: the input this register reads (slices: through the alias) and its offset.
  int32_t input = -1;   // >= 0: an external input; -1: a member
  int32_t member = -1;  // >= 0: a member register (its adjoint block)
  int64_t offset = 0;
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

// A register's rows over a block: a pointer and a row stride. A value per row
// (a broadcast scalar) is spread into `buf` first.
struct Rows {
  const float* p;
  int64_t stride;
};
Rows rows_of(const Reg& r, const Block& b, float* buf) {
  const float* first = r.base + b.row0 * r.row_stride;
  if (r.col) return {first + b.col0, r.row_stride};
  for (int64_t i = 0; i < b.rows; ++i) std::fill_n(buf + i * b.cols, b.cols, first[i * r.row_stride]);
  return {buf, b.cols};
}

// Per-thread scratch, reused across blocks and batches.
float* scratch(size_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < floats) buf.resize(floats);
  return buf.data();
}

// Registers of the program over these tensors (outputs: the non-slice members).
std::vector<Reg> registers(const FusedProgram& p, std::span<const at::Tensor> inputs,
                           std::span<const at::Tensor> outputs) {
  std::vector<Reg> regs;
  for (uint32_t e = 0; e < p.inputs; ++e) {
    Reg r;
    r.base = inputs[e].data_ptr<float>();
    r.row_stride = p.input_shared[e] ? 0 : p.input_numel[e];
    r.col = !(p.input_numel[e] == 1 && p.numel > 1);
    r.input = static_cast<int32_t>(e);
    regs.push_back(r);
  }
  size_t next = 0;
  int32_t member = 0;
  for (const FusedInstr& in : p.code) {
    Reg r;
    if (in.slice) {
      r = regs[in.a];
      r.base += in.offset;
      r.offset += in.offset;
    } else {
      r.base = outputs[next++].data_ptr<float>();
      r.row_stride = p.numel;
      r.member = member++;
    }
    regs.push_back(r);
  }
  return regs;
}

float attr_of_instr(const FusedInstr& in) { return static_cast<float>(attr_to_double(in.attr)); }

}  // namespace

const char* isa() { return use_avx2() ? "avx2+fma" : "baseline"; }

void forward(const FusedProgram& p, std::span<const at::Tensor> inputs, std::span<const at::Tensor> outputs,
             int64_t n) {
  const std::vector<Reg> regs = registers(p, inputs, outputs);
  const auto& kernels = table();
  const bool parallel = at::get_num_threads() > 1 && n * p.numel >= 4 * kBlock;
  for_blocks(n, p.numel, parallel, [&](const Block& b) {
    float* buf = scratch(2 * static_cast<size_t>(b.count()));
    for (size_t k = 0; k < p.code.size(); ++k) {
      const FusedInstr& in = p.code[k];
      if (in.slice) continue;
      const Rows a = rows_of(regs[in.a], b, buf);
      const Rows bb = rows_of(regs[in.b], b, buf + b.count());
      float* y = const_cast<float*>(regs[p.inputs + k].base) + b.row0 * p.numel + b.col0;
      kernels[in.op].fwd(a.p, a.stride, bb.p, bb.stride, attr_of_instr(in), y, p.numel, b.rows, b.cols);
    }
  });
}

void backward(const FusedProgram& p, std::span<const at::Tensor> inputs, std::span<const at::Tensor> outputs,
              std::span<const at::Tensor> grads_out, std::span<at::Tensor> grads_in, int64_t n) {
  const std::vector<Reg> regs = registers(p, inputs, outputs);
  const auto& kernels = table();
  std::vector<float*> g_in(p.inputs, nullptr);
  bool shared_grad = false;
  for (uint32_t e = 0; e < p.inputs; ++e)
    if (grads_in[e].defined()) {
      g_in[e] = grads_in[e].data_ptr<float>();
      shared_grad = shared_grad || p.input_shared[e];
    }
  std::vector<const float*> g_out;
  for (const at::Tensor& g : grads_out) g_out.push_back(g.defined() ? g.data_ptr<float>() : nullptr);
  const int members = static_cast<int>(outputs.size());
  // Rows of a shared input's gradient gather contributions of every row: serial then.
  const bool parallel = !shared_grad && at::get_num_threads() > 1 && n * p.numel >= 4 * kBlock;

  for_blocks(n, p.numel, parallel, [&](const Block& b) {
    const int64_t count = b.count();
    float* adj = scratch((static_cast<size_t>(members) + 4) * count);
    float* buf = adj + members * count;
    float* fa = buf + 2 * count;
    float* fb = buf + 3 * count;
    for (int m = 0; m < members; ++m) {
      float* dst = adj + m * count;
      if (g_out[m] == nullptr) std::fill_n(dst, count, 0.0f);
      else for (int64_t i = 0; i < b.rows; ++i)
        std::memcpy(dst + i * b.cols, g_out[m] + (b.row0 + i) * p.numel + b.col0, b.cols * sizeof(float));
    }
    // Adds a block-shaped contribution into register r's adjoint.
    auto accumulate = [&](const Reg& r, const float* d) {
      if (r.member >= 0) {
        float* dst = adj + r.member * count;
        for (int64_t i = 0; i < count; ++i) dst[i] += d[i];
        return;
      }
      float* g = g_in[static_cast<size_t>(r.input)];
      if (g == nullptr) return;
      const auto e = static_cast<size_t>(r.input);
      const int64_t stride = p.input_shared[e] ? 0 : p.input_numel[e];
      for (int64_t i = 0; i < b.rows; ++i) {
        const float* src = d + i * b.cols;
        float* row = g + (b.row0 + i) * stride;
        if (!r.col) {
          float s = 0;
          for (int64_t j = 0; j < b.cols; ++j) s += src[j];
          row[0] += s;
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
      const Reg& yr = regs[p.inputs + k];
      const float* g = adj + yr.member * count;
      const float* y = yr.base + b.row0 * p.numel + b.col0;
      const Rows a = rows_of(regs[in.a], b, buf);
      const Rows bb = rows_of(regs[in.b], b, buf + count);
      const bool binary = info.pointwise->operands == 2;
      kernels[in.op].bwd(a.p, a.stride, bb.p, bb.stride, y, p.numel, g, attr_of_instr(in), fa,
                         binary ? fb : nullptr, b.rows, b.cols);
      accumulate(regs[in.a], fa);
      if (binary) accumulate(regs[in.b], fb);
    }
  });
}

}  // namespace sheaf::fused_cpu
