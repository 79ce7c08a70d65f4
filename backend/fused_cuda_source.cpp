#include "fused_cuda_source.h"

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <vector>

#include <sheaf/core/error.h>
#include <sheaf/ops/op.h>

namespace sheaf {

namespace {

// A float literal that reproduces the attribute exactly.
std::string literal(float v) {
  if (v != v) return "__int_as_float(0x7fc00000)";
  if (v == std::numeric_limits<float>::infinity()) return "__int_as_float(0x7f800000)";
  if (v == -std::numeric_limits<float>::infinity()) return "__int_as_float(0xff800000)";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";  // "3" is not a float literal: "3.0f" is
  return s + "f";
}

struct Gen {
  const FusedProgram& p;
  std::ostringstream os;
  std::vector<int> member_of_reg;  // register -> member index (-1: an input, or a slice of one)
  std::vector<int> input_of_reg;   // register -> the input a slice (or an input) reads
  std::vector<int64_t> offset_of_reg;

  std::vector<uint8_t> overlapping;  // per input: read at overlapping offsets (two threads may add to one place)

  explicit Gen(const FusedProgram& program) : p(program) {
    for (uint32_t e = 0; e < p.inputs; ++e) {
      member_of_reg.push_back(-1);
      input_of_reg.push_back(static_cast<int>(e));
      offset_of_reg.push_back(0);
    }
    int member = 0;
    for (const FusedInstr& in : p.code) {
      if (in.slice) {
        member_of_reg.push_back(member_of_reg[in.a]);
        input_of_reg.push_back(input_of_reg[in.a]);
        offset_of_reg.push_back(offset_of_reg[in.a] + in.offset);
      } else {
        member_of_reg.push_back(member++);
        input_of_reg.push_back(-1);
        offset_of_reg.push_back(0);
      }
    }
    overlapping.assign(p.inputs, 0);
    for (size_t r = 0; r < input_of_reg.size(); ++r)
      for (size_t q = 0; q < r; ++q)
        if (input_of_reg[r] >= 0 && input_of_reg[r] == input_of_reg[q] && offset_of_reg[r] != offset_of_reg[q] &&
            std::abs(offset_of_reg[r] - offset_of_reg[q]) < p.numel)
          overlapping[static_cast<size_t>(input_of_reg[r])] = 1;
  }
  bool row_broadcast(int e) const { return p.input_numel[static_cast<size_t>(e)] == 1 && p.numel > 1; }

  // The value of register r for element (i, j) of the batch.
  std::string value(uint32_t r) const {
    // (detail::cat, not string operator+: GCC 12 warns falsely on "x" + to_string)
    if (member_of_reg[r] >= 0) return detail::cat("m", member_of_reg[r]);
    const int e = input_of_reg[r];
    const auto ue = static_cast<size_t>(e);
    if (row_broadcast(e)) return detail::cat("in", e, p.input_shared[ue] ? "[0]" : "[i]");
    if (p.input_shared[ue]) return detail::cat("in", e, "[j + ", offset_of_reg[r], "]");
    return detail::cat("in", e, "[i * ", p.input_numel[ue], "LL + j + ", offset_of_reg[r], "]");
  }

  void params(bool backward) {
    os << "(long long n";
    for (uint32_t e = 0; e < p.inputs; ++e) os << ", const float* __restrict__ in" << e;
    int members = 0;
    for (const FusedInstr& in : p.code) members += in.slice ? 0 : 1;
    for (int k = 0; k < members; ++k) os << (backward ? ", const float* __restrict__ gout" : ", float* __restrict__ out") << k;
    if (backward)
      for (uint32_t e = 0; e < p.inputs; ++e) os << ", float* __restrict__ gin" << e;
    os << ")";
  }

  // Members into registers m0, m1, ... (the forward, also run by the backward).
  void members() {
    int member = 0;
    for (const FusedInstr& in : p.code) {
      if (in.slice) continue;
      const PointwiseInfo& pw = *op_info(in.op).pointwise;
      os << "    float m" << member++ << ";\n    { const float a = " << value(in.a) << ";";
      if (pw.operands == 2) os << " const float b = " << value(in.b) << ";";
      if (pw.scalar) os << " const float c = " << literal(static_cast<float>(attr_to_double(in.attr))) << ";";
      os << " m" << (member - 1) << " = " << pw.cuda_fwd << "; }\n";
    }
  }

  void loop_head() {
    os << "{\n  const long long total = n * " << p.numel << "LL;\n"
       << "  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;\n"
       << "       t += (long long)blockDim.x * gridDim.x) {\n"
       << "    const long long i = t / " << p.numel << "LL, j = t % " << p.numel << "LL;\n";
  }

  void forward(std::string_view name) {
    os << "extern \"C\" __global__ void " << name << "_fwd";
    params(false);
    loop_head();
    members();
    int member = 0;
    for (const FusedInstr& in : p.code)
      if (!in.slice) {
        os << "    if (out" << member << ") out" << member << "[t] = m" << member << ";\n";
        ++member;
      }
    os << "  }\n}\n";
  }

  // g times a partial, or 0 where the op's mask holds (PointwiseInfo::cuda_mask_a).
  static std::string grad(std::string_view partial, std::string_view mask) {
    if (mask.empty()) return detail::cat("g * (", partial, ")");
    return detail::cat("((", mask, ") ? 0.f : g * (", partial, "))");
  }

  // Adds `expr` (a gradient contribution) to register r's adjoint.
  void add_to(uint32_t r, const std::string& expr) {
    if (member_of_reg[r] >= 0) {
      os << "      g" << member_of_reg[r] << " += " << expr << ";\n";
      return;
    }
    const int e = input_of_reg[r];
    const auto ue = static_cast<size_t>(e);
    const std::string gin = detail::cat("gin", e);
    std::string at;
    bool atomic = p.input_shared[ue] != 0 || overlapping[ue] != 0;
    if (row_broadcast(e)) {
      at = detail::cat(gin, p.input_shared[ue] ? " + 0" : " + i");
      atomic = true;
    } else if (p.input_shared[ue]) {
      at = detail::cat(gin, " + j + ", offset_of_reg[r]);
    } else {
      at = detail::cat(gin, " + i * ", p.input_numel[ue], "LL + j + ", offset_of_reg[r]);
    }
    if (atomic) os << "      if (" << gin << ") atomicAdd(" << at << ", " << expr << ");\n";
    else os << "      if (" << gin << ") *(" << at << ") += " << expr << ";\n";
  }

  void backward(std::string_view name) {
    os << "extern \"C\" __global__ void " << name << "_bwd";
    params(true);
    loop_head();
    members();
    int members_n = 0;
    for (const FusedInstr& in : p.code) members_n += in.slice ? 0 : 1;
    for (int k = 0; k < members_n; ++k) os << "    float g" << k << " = gout" << k << " ? gout" << k << "[t] : 0.f;\n";
    int member = members_n;
    for (size_t q = p.code.size(); q-- > 0;) {
      const FusedInstr& in = p.code[q];
      if (in.slice) continue;
      --member;
      const PointwiseInfo& pw = *op_info(in.op).pointwise;
      if (!pw.differentiable) continue;
      os << "    { const float a = " << value(in.a) << ";";
      if (pw.operands == 2) os << " const float b = " << value(in.b) << ";";
      if (pw.scalar) os << " const float c = " << literal(static_cast<float>(attr_to_double(in.attr))) << ";";
      os << " const float y = m" << member << ", g = g" << member << ";\n";
      os << "      (void)a; (void)y;\n";
      add_to(in.a, grad(pw.cuda_da, pw.cuda_mask_a));
      if (pw.operands == 2) add_to(in.b, grad(pw.cuda_db, pw.cuda_mask_b));
      os << "    }\n";
    }
    os << "  }\n}\n";
  }
};

}  // namespace

std::string fused_cuda_source(const FusedProgram& program, std::string_view name) {
  Gen g(program);
  g.os << "// Generated by sheaf for " << program.str() << "\n";
  g.forward(name);
  g.backward(name);
  return g.os.str();
}

}  // namespace sheaf
