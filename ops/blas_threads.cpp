#include "blas_threads.h"

#include <ATen/Context.h>
#include <dlfcn.h>

namespace sheaf {

namespace {
// In the global scope first; then in an OpenBLAS already loaded where the
// global scope does not see it (a library opened with RTLD_LOCAL, as Python
// opens extensions).
template <class F>
F openblas(const char* name) {
  if (void* f = dlsym(RTLD_DEFAULT, name)) return reinterpret_cast<F>(f);
  for (const char* lib : {"libopenblas.so.0", "libblas.so.3"})
    if (void* h = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD)) {
      void* f = dlsym(h, name);
      dlclose(h);  // (RTLD_NOLOAD: only the reference just taken)
      if (f) return reinterpret_cast<F>(f);
    }
  return nullptr;
}

// Looked up once: the packed product asks for the thread count per product.
struct OpenBlas {
  int (*parallel)() = openblas<int (*)()>("openblas_get_parallel");  // 0 serial, 1 pthreads, 2 OpenMP
  int (*threads)() = openblas<int (*)()>("openblas_get_num_threads");
  void (*set_threads)(int) = openblas<void (*)(int)>("openblas_set_num_threads");
  char* (*config)() = openblas<char* (*)()>("openblas_get_config");
};

const OpenBlas& lib() {
  static const OpenBlas l;
  return l;
}
}  // namespace

bool blas_has_own_pool() {
  static const bool own = !at::hasMKL() && lib().parallel && lib().parallel() == 1;
  return own;
}

int blas_pool_threads() { return blas_has_own_pool() && lib().threads ? lib().threads() : 0; }

int openblas_threads() { return lib().threads ? lib().threads() : -1; }

bool set_openblas_threads(int n) {
  if (!lib().set_threads) return false;
  lib().set_threads(n);
  return true;
}

const char* openblas_config() { return lib().config ? lib().config() : nullptr; }

}  // namespace sheaf
