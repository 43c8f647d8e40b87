// The FP8 gate|up GEMM with SwiGLU and the down projection's E4M3 quantize in its epilogue
// (fp8_swiglu_gemm_sm90.h), CUTLASS 3 for sm_90a; compiled in the CUTLASS object library
// beside the int8 GEMM. Mainloop: the Sm90 collective builder's TMA + wgmma FP8 kernel
// (E4M3 x row-major [m, k] times E4M3 w K-major [n, k], f32 accumulators promoted out of
// the tensor cores every 4 k-blocks: the precise form, as cuBLASLt's default). Epilogue:
// no shared memory (CUTLASS's DefaultEpilogue shape behind its warp-specialized adapter):
// each thread pairs its accumulators of gate column c and up column c + 64 of the same
// 128-column group (the weights' rows are interleaved so: kFp8SwigluBlock) and stores one
// code byte per pair; both sit in the thread's own fragment of the wgmma C layout.
#include "backends/cuda/ops/fp8_swiglu_gemm_sm90_impl.h"

#include <cuda_bf16.h>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/ops/cutlass_launch.cuh"
#include "backends/cuda/ops/fp8_codes.cuh"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/detail.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"

namespace kiln::cuda::fp8_swiglu_sm90 {
namespace {

using namespace cute;

// The code of one (gate, up) accumulator pair: each rounded to bf16 after the scale (the
// bf16 [gate | up] of the unfused GEMM), SwiGLU in f32, rounded to bf16 and quantized as
// the unfused E4M3 SwiGLU pass does (elementwise.cu swiglu_fp8_kernel).
__device__ __forceinline__ uint8_t swiglu_code(float acc_g, float acc_u, float scale, float inv) {
  using T = __nv_bfloat16;
  const float g = to_f32(from_f32<T>(acc_g * scale)), u = to_f32(from_f32<T>(acc_u * scale));
  const float silu = to_f32(from_f32<T>(unary_f32<UnaryOp::kSilu>(g)));  // stored by the unfused Silu
  return fp8_code_via<T>(silu * u, inv);
}

// The epilogue: DefaultEpilogue's interface (see cutlass/epilogue/collective/
// default_epilogue.hpp), with the pairing and the code store in operator().
class SwigluCodesEpilogue {
 public:
  using EpilogueSchedule = cutlass::gemm::EpilogueDefault;
  using DispatchPolicy = EpilogueSchedule;
  using ElementC = void;
  using ElementD = uint8_t;
  using ElementAccumulator = float;
  using StrideC = cute::Stride<int64_t, cute::Int<1>, int64_t>;
  using StrideD = StrideC;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  using ThreadEpilogueOp = void;  // GemmUniversalAdapter's EpilogueOutputOp: none here
  struct SharedStorage {};
  using TensorStorage = SharedStorage;

  struct Arguments {
    uint8_t* y = nullptr;  // [m, n / 2] codes
    float scale = 1.0f;    // x_scale * w_scale
    float inv = 1.0f;      // 1 / the down projection's input scale
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    return args.y != nullptr && get<1>(problem_shape) % (2 * kFp8SwigluBlock) == 0;
  }

  CUTLASS_HOST_DEVICE
  SwigluCodesEpilogue(Params const& params, SharedStorage const& = SharedStorage()) : params_(params) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& acc,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    static_assert(size<1>(BlockShapeMNK{}) % (2 * kFp8SwigluBlock) == 0, "tile N: whole 128-column groups");
    const int M = int(get<0>(problem_shape_mnkl)), N = int(get<1>(problem_shape_mnkl));
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    // Each accumulator's (row, column) in the problem.
    Tensor c_mn = local_tile(make_identity_tensor(make_shape(M, N)), take<0, 2>(blk_shape_MNK),
                             make_coord(m_coord, n_coord));
    Tensor tc = tiled_mma.get_thread_slice(thread_idx).partition_C(c_mn);
    static_assert(decltype(size(tc))::value == decltype(size(acc))::value);
    // The wgmma C fragment: mode 0 is (2 columns, 2 row halves, N/8 column blocks) in that
    // order, so element i + 32 sits 64 columns right of element i (same row).
    static_assert(decltype(rank<0>(FrgLayout{}))::value == 3, "a wgmma accumulator fragment");
    constexpr int kV0 = decltype(size<0>(FrgLayout{}))::value;
    constexpr int kBlocks = kV0 / 4;
    static_assert(kV0 % 4 == 0 && kBlocks % 16 == 0, "whole 128-column groups per fragment");
    constexpr int kRest = decltype(size(acc))::value / kV0;
    const int ld = N / 2;
    CUTLASS_PRAGMA_UNROLL
    for (int rest = 0; rest < kRest; ++rest)
      CUTLASS_PRAGMA_UNROLL
      for (int nb = 0; nb < kBlocks; ++nb) {
        if (nb % 16 >= 8) continue;  // an up block: its gate partner stores the pair
        CUTLASS_PRAGMA_UNROLL
        for (int half = 0; half < 2; ++half) {
          const int i = rest * kV0 + nb * 4 + half * 2;  // columns c, c + 1 of one row
          const auto crd = tc(i);
          const int row = int(get<0>(crd)), col = int(get<1>(crd));
          // Rows and 128-column groups past the problem (TMA zero-filled them) store nothing.
          if (row >= M || col >= N) continue;
          const uint8_t lo = swiglu_code(acc(i), acc(i + 32), params_.scale, params_.inv);
          const uint8_t hi = swiglu_code(acc(i + 1), acc(i + 33), params_.scale, params_.inv);
          // Gate column c = 128 g + w (w < 64) is output column 64 g + w.
          const int out = col - kFp8SwigluBlock * (col / (2 * kFp8SwigluBlock));
          *reinterpret_cast<uint16_t*>(params_.y + int64_t(row) * ld + out) = uint16_t(lo | (uint16_t(hi) << 8));
        }
      }
  }

 private:
  Params params_;
};

// Wider tiles (128x256 cooperative, 64x256 ping-pong) measured 2-2.5x slower on the H200:
// the FP8 mainloop's promotion keeps a second set of accumulators in registers.
struct CfgCooperative128x128 {
  using Tile = Shape<_128, _128, _128>;
  using Cluster = Shape<_1, _1, _1>;
  using Schedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
};
struct CfgCooperative128x128Cluster2 {
  using Tile = Shape<_128, _128, _128>;
  using Cluster = Shape<_2, _1, _1>;
  using Schedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
};
struct CfgPingpong64x128 {
  using Tile = Shape<_64, _128, _128>;
  using Cluster = Shape<_1, _1, _1>;
  using Schedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
};

template <class Cfg>
struct Kernel {
  using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<SwigluCodesEpilogue>;
  using E4m3 = cutlass::float_e4m3_t;
  static constexpr int kAlign = 16;  // elements (bytes) per TMA row unit
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E4m3, cutlass::layout::RowMajor, kAlign, E4m3,
      cutlass::layout::ColumnMajor, kAlign, float, typename Cfg::Tile, typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAuto, typename Cfg::Schedule>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static typename Gemm::Arguments arguments(const Problem& p) {
    using StrideA = typename GemmKernel::StrideA;
    using StrideB = typename GemmKernel::StrideB;
    const StrideA sa = make_stride(int64_t(p.k), Int<1>{}, int64_t(p.m) * p.k);
    const StrideB sb = make_stride(int64_t(p.k), Int<1>{}, int64_t(p.n) * p.k);
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {p.m, p.n, p.k, 1},
                                  {reinterpret_cast<const E4m3*>(p.x), sa, reinterpret_cast<const E4m3*>(p.w), sb},
                                  {p.y, p.scale, p.inv}};
    args.hw_info.sm_count = p.sm_count;
    return args;
  }
  static std::string check(const Problem& p) { return cutlass_check<Gemm>(arguments(p)); }
  static size_t workspace(const Problem& p) { return Gemm::get_workspace_size(arguments(p)); }
  static void run(const Problem& p, void* workspace, cudaStream_t s) {
    cutlass_launch<Gemm>(arguments(p), workspace, s, "cuda fp8 swiglu gemm (sm90)");
  }
};

template <class F>
auto dispatch(Fp8SwigluConfig c, F&& f) {
  switch (c) {
    case Fp8SwigluConfig::kCooperative128x128Cluster2:
      return f(Kernel<CfgCooperative128x128Cluster2>{});
    case Fp8SwigluConfig::kPingpong64x128:
      return f(Kernel<CfgPingpong64x128>{});
    case Fp8SwigluConfig::kCooperative128x128:
      break;
  }
  return f(Kernel<CfgCooperative128x128>{});
}

}  // namespace

std::string check(Fp8SwigluConfig c, const Problem& p) {
  return dispatch(c, [&](auto k) { return decltype(k)::check(p); });
}
size_t workspace(Fp8SwigluConfig c, const Problem& p) {
  return dispatch(c, [&](auto k) { return decltype(k)::workspace(p); });
}
void run(Fp8SwigluConfig c, const Problem& p, void* ws, cudaStream_t s) {
  dispatch(c, [&](auto k) {
    decltype(k)::run(p, ws, s);
    return 0;
  });
}

}  // namespace kiln::cuda::fp8_swiglu_sm90
