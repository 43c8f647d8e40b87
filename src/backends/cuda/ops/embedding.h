// Token embedding lookup on the device: out[i] = table[ids[i]]. Ids are bounds-checked
// on the host before upload (a bad id is a kiln::Error there). Tested in ops_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace kiln::cuda {

void launch_embedding(DType t, const void* table, const int32_t* ids, int64_t n, int64_t dim,
                      void* out, cudaStream_t s);

}  // namespace kiln::cuda
