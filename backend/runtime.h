// The LibTorch runtime under the library: threads and BLAS. Debian's LibTorch
// uses whatever BLAS the system selects, and OpenBLAS keeps its own thread
// pool that at::set_num_threads does not reach, so both are set here.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace sheaf {

// Sets LibTorch's intra-op threads and, when OpenBLAS is loaded, its threads.
void set_threads(int n);

// One line: LibTorch version, BLAS in use (e.g. "OpenBLAS 0.3.21 ... MAX_THREADS=64"),
// LibTorch threads, BLAS threads, CUDA availability.
std::string runtime_info();

// The device a graph runs on, with its index: "cuda" means the current CUDA
// device, and tensors there report "cuda:0". Throws UserError for a device this
// LibTorch cannot use.
c10::Device concrete_device(c10::Device device);

// Waits until the device has finished the work queued so far (nothing on the
// CPU). For timing: CUDA launches return before their kernels run.
void synchronize(c10::Device device);

}  // namespace sheaf
