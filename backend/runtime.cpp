#include "runtime.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/version.h>

#include <sstream>

namespace sheaf {

namespace {
// Looked up at run time: OpenBLAS is one possible BLAS among several.
template <class F>
F openblas(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}
}  // namespace

void set_threads(int n) {
  at::set_num_threads(n);
  if (auto f = openblas<void (*)(int)>("openblas_set_num_threads")) f(n);
}

std::string runtime_info() {
  std::ostringstream os;
  os << "LibTorch " << TORCH_VERSION << ", ";
  if (auto config = openblas<char* (*)()>("openblas_get_config")) {
    os << "BLAS " << config();
    if (auto threads = openblas<int (*)()>("openblas_get_num_threads")) os << " (" << threads() << " BLAS threads)";
  } else {
    os << "BLAS: not OpenBLAS (reference BLAS is ~40x slower; install libopenblas0-pthread)";
  }
  os << ", " << at::get_num_threads() << " LibTorch threads, CUDA " << (at::hasCUDA() ? "available" : "not available");
  return os.str();
}

}  // namespace sheaf
