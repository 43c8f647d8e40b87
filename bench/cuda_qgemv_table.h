// The quantized GEMV kernels' table of cuda_gemv_bench (`cuda_gemv_bench qgemv [filter]`),
// in its own file: see cuda_qgemv_table.cpp.
#pragma once

namespace kiln::cuda::bench {

// Prints the old / mma / dp4a q4 and q8 GEMVs at 1, 2, 4, 8 rows for the shapes whose name
// contains `filter`, against `copy_gbs` (the run's device-to-device copy rate).
void qgemv_kernels_table(const char* filter, double copy_gbs);

}  // namespace kiln::cuda::bench
