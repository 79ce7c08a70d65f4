// The LibTorch runtime under the library: threads and BLAS. Debian's LibTorch
// uses whatever BLAS the system selects, and OpenBLAS keeps its own thread
// pool that at::set_num_threads does not reach, so both are set here.
#pragma once

#include <string>

namespace sheaf {

// Sets LibTorch's intra-op threads and, when OpenBLAS is loaded, its threads.
void set_threads(int n);

// One line: LibTorch version, BLAS in use (e.g. "OpenBLAS 0.3.21 ... MAX_THREADS=64"),
// LibTorch threads, BLAS threads, CUDA availability.
std::string runtime_info();

}  // namespace sheaf
