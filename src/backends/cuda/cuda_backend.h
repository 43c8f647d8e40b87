// The CUDA backend (built when the CUDA toolkit is found; KILN_HAVE_CUDA): kernels under
// ops/, cuBLASLt GEMMs, a paged KV pool in the activation dtype. CompileOptions.weight_dtype
// picks the activation/weight dtype on the device: "bf16" (the GPU default to ask for),
// "f16", "f32" (true f32 math, cuBLASLt without TF32: a precise reference mode),
// "q8"/"q4" (weight-only quantized Linears, bf16 activations; a Linear's `precision`
// attribute q8/q4 also quantizes it under any activation dtype), or "fp8" (bf16
// activations; Linears with attr quant="fp8" run E4M3 x E4M3, cuda_fp8_linear.h).
// Tested in tests/backends/cuda/ (op conformance vs the CPU backend, model goldens).
#pragma once

#include <memory>

#include "backends/backend.h"

namespace kiln {

// On CUDA device `device` (an index among the visible devices).
std::unique_ptr<Backend> create_cuda_backend(int device = 0);
// CUDA devices usable by this process; 0 without a driver or device. Never throws.
int cuda_device_count();

}  // namespace kiln
