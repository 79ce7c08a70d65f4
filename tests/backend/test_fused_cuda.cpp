// The CUDA side of fusion: the generated kernels' source compiles with the
// toolkit's NVRTC (where CMake found one: no GPU needed), and on a GPU fused
// programs give the CPU's values and gradients.
#include <sheaf/backend/fused.h>
#include <sheaf/backend/fused_cuda_source.h>
#include <sheaf/backend/row_copies.h>
#include <sheaf/ops/op.h>
#include <sheaf/ops/op_list.h>

#ifdef SHEAF_TEST_NVRTC
#include <nvrtc.h>
#endif

#include "../support.h"

using namespace sheaf;
using Catch::Contains;

namespace {

// Programs covering every pointwise op, slices, and every kind of broadcast.
std::vector<FusedProgram> programs() {
  std::vector<FusedProgram> out;
  auto op = [](FusedProgram& p, OpCode code, uint32_t a, uint32_t b = 0, double c = 0.0) {
    FusedInstr in;
    in.op = code;
    in.a = a;
    in.b = b;
    in.attr = attr_of(c);
    p.code.push_back(in);
    return p.inputs + static_cast<uint32_t>(p.code.size()) - 1;
  };
  {  // a Tree-LSTM cell: slices of gates [5h], two cell inputs
    FusedProgram p;
    p.inputs = 3, p.input_numel = {40, 8, 8}, p.input_shared = {0, 0, 0}, p.numel = 8, p.shape = Shape{8};
    std::vector<uint32_t> g;
    for (int k = 0; k < 5; ++k) {
      FusedInstr in;
      in.op = code_of<op::Slice>, in.a = 0, in.slice = true, in.offset = 8 * k;
      p.code.push_back(in);
      g.push_back(p.inputs + static_cast<uint32_t>(p.code.size()) - 1);
    }
    const uint32_t i = op(p, code_of<op::Sigmoid>, g[1]), f = op(p, code_of<op::Sigmoid>, g[2]);
    const uint32_t c = op(p, code_of<op::Add>, op(p, code_of<op::Mul>, op(p, code_of<op::Tanh>, g[0]), i),
                          op(p, code_of<op::Mul>, f, 1));
    op(p, code_of<op::Mul>, op(p, code_of<op::Sigmoid>, g[4]), op(p, code_of<op::Tanh>, op(p, code_of<op::Add>, c, 2)));
    p.hash = 1;
    out.push_back(p);
  }
  {  // every other op, with a per-row scalar, a shared row and a shared scalar
    FusedProgram p;
    p.inputs = 4, p.input_numel = {6, 1, 6, 1}, p.input_shared = {0, 0, 1, 1}, p.numel = 6, p.shape = Shape{2, 3};
    uint32_t x = op(p, code_of<op::Sub>, 0, 1);
    x = op(p, code_of<op::Div>, x, op(p, code_of<op::AddScalar>, op(p, code_of<op::Exp>, 2), 0, 1.5));
    x = op(p, code_of<op::MulScalar>, op(p, code_of<op::Relu>, x), 0, -0.25);
    x = op(p, code_of<op::RDivScalar>, op(p, code_of<op::AddScalar>, op(p, code_of<op::Neg>, x), 0, 3.0), 0, 2.0);
    x = op(p, code_of<op::Log>, op(p, code_of<op::AddScalar>, op(p, code_of<op::Mul>, x, 3), 0, 4.0));
    op(p, code_of<op::Add>, op(p, code_of<op::Greater>, x, 1),
       op(p, code_of<op::Mul>, op(p, code_of<op::GreaterScalar>, x, 0, 0.1), op(p, code_of<op::LessScalar>, x, 0, 2.0)));
    p.hash = 2;
    out.push_back(p);
  }
  {  // abs, sqrt, softplus, log_sigmoid, maximum and minimum, with a shared operand
    FusedProgram p;
    p.inputs = 2, p.input_numel = {4, 4}, p.input_shared = {0, 1}, p.numel = 4, p.shape = Shape{4};
    uint32_t x = op(p, code_of<op::Sqrt>, op(p, code_of<op::AddScalar>, op(p, code_of<op::Abs>, 0), 0, 0.1));
    x = op(p, code_of<op::Maximum>, op(p, code_of<op::Softplus>, x), op(p, code_of<op::LogSigmoid>, 1));
    op(p, code_of<op::Minimum>, x, 1);
    p.hash = 3;
    out.push_back(p);
  }
  {  // gelu and pow (two inputs: the checks above read input 1)
    FusedProgram p;
    p.inputs = 2, p.input_numel = {4, 4}, p.input_shared = {0, 0}, p.numel = 4, p.shape = Shape{4};
    op(p, code_of<op::Mul>, op(p, code_of<op::PowScalar>, op(p, code_of<op::Gelu>, 0), 0, 1.5), 1);
    p.hash = 4;
    out.push_back(p);
  }
  return out;
}

}  // namespace

TEST_CASE("fused CUDA source: one forward and one backward kernel per program", "[fusion][cuda-source]") {
  for (const FusedProgram& p : programs()) {
    const std::string src = fused_cuda_source(p, "k");
    CHECK_THAT(src, Contains("extern \"C\" __global__ void k_fwd(") && Contains("extern \"C\" __global__ void k_bwd("));
    if (p.input_numel[1] == 1) CHECK_THAT(src, Contains("atomicAdd"));  // broadcast gradients are reduced
  }
}

#ifdef SHEAF_TEST_NVRTC
namespace {
void check_compiles(const std::string& src) {
  nvrtcProgram prog = nullptr;
  REQUIRE(nvrtcCreateProgram(&prog, src.c_str(), "k.cu", 0, nullptr, nullptr) == NVRTC_SUCCESS);
  const char* opts[] = {"--gpu-architecture=compute_80", "--std=c++17", "-default-device"};
  const nvrtcResult rc = nvrtcCompileProgram(prog, 3, opts);
  size_t size = 0;
  nvrtcGetProgramLogSize(prog, &size);
  std::string log(size, '\0');
  nvrtcGetProgramLog(prog, log.data());
  INFO(log << "\n" << src);
  CHECK(rc == NVRTC_SUCCESS);
  size_t ptx = 0;
  nvrtcGetPTXSize(prog, &ptx);
  CHECK(ptx > 0);
  nvrtcDestroyProgram(&prog);
}
}  // namespace

TEST_CASE("fused CUDA source compiles with NVRTC (no GPU needed)", "[fusion][cuda-source]") {
  for (const FusedProgram& p : programs()) check_compiles(fused_cuda_source(p, "k"));
}

TEST_CASE("the row gathers' CUDA source compiles with NVRTC (no GPU needed)", "[gather][cuda-source]") {
  check_compiles(row_copies_cuda_source());
}
#endif

TEST_CASE("CUDA: fused programs give the CPU's values and gradients", "[fusion][cuda]") {
  SHEAF_SKIP_WITHOUT_CUDA();
  std::string why;
  WARN("fused CUDA kernels: " << (fused_cuda::available(&why) ? "available" : why));  // printed: says which path ran
  const c10::Device cuda(c10::kCUDA);
  for (const FusedProgram& prog : programs()) {
    auto p = std::make_shared<FusedProgram>(prog);
    const int64_t n = 37;
    std::vector<at::Tensor> cpu, gpu;
    for (uint32_t e = 0; e < p->inputs; ++e) {
      std::vector<int64_t> sizes{n, p->input_numel[e]};
      if (p->input_shared[e]) sizes = {p->input_numel[e]};
      at::Tensor x = at::rand(sizes) + 0.5;
      cpu.push_back(x.clone().requires_grad_());
      gpu.push_back(x.to(cuda).requires_grad_());
    }
    const std::vector<at::Tensor> yc = run_fused(p, cpu, n), yg = run_fused(p, gpu, n);
    at::Tensor lc = at::zeros({}), lg = at::zeros({}, cuda);
    for (size_t k = 0; k < yc.size(); ++k) {
      CHECK(at::allclose(yc[k], yg[k].cpu(), 1e-4, 1e-5));
      lc = lc + (yc[k] * (k + 1.0)).sum();
      lg = lg + (yg[k] * (k + 1.0)).sum();
    }
    lc.backward();
    lg.backward();
    for (size_t e = 0; e < cpu.size(); ++e) CHECK(at::allclose(cpu[e].grad(), gpu[e].grad().cpu(), 1e-4, 1e-4));
  }
}
