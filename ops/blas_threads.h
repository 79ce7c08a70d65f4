// The BLAS under LibTorch, as far as its threads go. Debian's LibTorch calls
// whatever BLAS the system selects; OpenBLAS's pthread build keeps a thread
// pool of its own beside LibTorch's (which at::set_num_threads does not
// reach), and the packed product (ops/packed_gemm.h) runs on LibTorch's. Found
// at run time: OpenBLAS is one possible BLAS among several.
#pragma once

namespace sheaf {

// Whether LibTorch's products run in an OpenBLAS with a thread pool of its own
// (its pthread build), not where LibTorch has MKL, whatever other BLAS the
// program loads. Asked once.
bool blas_has_own_pool();

// The threads of that pool; 0 where the BLAS has none of its own.
int blas_pool_threads();

// OpenBLAS's thread count, where it is OpenBLAS: -1 where it is not.
int openblas_threads();
// Sets it; false where the BLAS is not OpenBLAS.
bool set_openblas_threads(int n);
// openblas_get_config()'s line, or nullptr where the BLAS is not OpenBLAS.
const char* openblas_config();

}  // namespace sheaf
