// The quantized GEMV kernels' table of cuda_gemv_bench (`cuda_gemv_bench qgemv [filter]`),
// in its own file: see cuda_qgemv_table.cpp.
#pragma once

namespace kiln::cuda::bench {

// Prints the old / mma / dp4a q4 and q8 GEMVs at 1, 2, 4, 8 rows for the shapes whose name
// contains `filter`, against `copy_gbs` (the run's device-to-device copy rate).
void qgemv_kernels_table(const char* filter, double copy_gbs);
// `cuda_gemv_bench qprologue [filter]`: the dp4a GEMV with and without x's rounding
// (QGemvDp4aTuning::skip_x) at 1, 2 and 4 rows, timed in a CUDA graph with PDL, next to the
// bf16 GEMV; each variant that rounds x checked first.
void qgemv_prologue_table(const char* filter, double copy_gbs);

}  // namespace kiln::cuda::bench
