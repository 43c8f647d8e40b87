// The CUTLASS 3 kernels behind int8_gemm_sm90.h, instantiated per output dtype by
// int8_gemm_sm90_{bf16,f16}.cu (compiled for sm_90a only). Mainloop: the Sm90 collective
// builder's TMA + wgmma int8 kernel (A int8 row-major [m, k], B int8 K-major [n, k],
// int32 accumulators). Epilogue: a visitor tree with one compute node over four inputs -
// the accumulators, xs (a column broadcast: the per-token scales, or with a null pointer
// the static x_scale as its default), w_scale and bias (row broadcasts; a null bias reads
// as 0, added as the CPU adds its zero bias) - then one rounding to bf16/f16 and a TMA
// store. The compute node does int8.cu's dequant_one in the same order with _rn
// intrinsics (no FMA contraction), and the activation with the same unary_f32, so the
// outputs are the cuBLASLt path's to the bit.
// The codes epilogue (Problem::code_table set) writes int8 instead: the f32 result rounded
// to the activation dtype T (as the T output is stored), then that T's bits index the
// reader's codes table (ops/unary_lut.h: int8_code(T(gelu(x)), inv) for every T bits x,
// filled by the GELU pass's own device code), whose byte is the code: the T output + the
// GELU-to-codes pass, bit for bit, with no T tensor in memory. The compute node returns
// the int8 codes itself, so the epilogue stores them with no conversion; the table's
// address is the node's argument (one table per reader scale).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/ops/cutlass_launch.cuh"
#include "backends/cuda/ops/int8_codes.cuh"
#include "backends/cuda/ops/int8_gemm_sm90_impl.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"

namespace kiln::cuda::int8_sm90 {

using namespace cute;

// y = act(float(acc) * (xs * w_scale) + bias): Sm90Compute hands every input converted
// to f32 (int32 -> f32 rounds to nearest, as float(acc) does).
template <GemvEpilogue kAct>
struct Dequant {
  template <class Frag>
  struct Fn {
    CUTLASS_DEVICE Frag operator()(Frag const& acc, Frag const& xs, Frag const& ws,
                                   Frag const& bias) const {
      Frag y;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < int(Frag::kElements); ++i) {
        const float v = __fadd_rn(__fmul_rn(acc[i], __fmul_rn(xs[i], ws[i])), bias[i]);
        if constexpr (kAct == GemvEpilogue::kGeluErf)
          y[i] = unary_f32<UnaryOp::kGeluErf>(v);
        else
          y[i] = v;
      }
      return y;
    }
  };
};

// code = table[bits of T(v)] = int8_code(T(gelu(T(v))), inv) with v as Dequant computes
// it; T is __nv_bfloat16 or __half. Sm90Compute hands the node's Arguments to the functor
// and stores its int8 result as is (an int8 -> int8 conversion is the identity).
struct CodesArguments {
  const int8_t* table = nullptr;  // [65536] the reader's codes, by T bits
};
template <typename T>
struct DequantCodes {
  template <class Frag>
  struct Fn {
    using Arguments = CodesArguments;  // one type for every Frag: Sm90Compute's Params
    template <class F>
    CUTLASS_DEVICE cutlass::Array<int8_t, F::kElements> operator()(F const& acc, F const& xs, F const& ws,
                                                                   F const& bias, Arguments const& a) const {
      const int8_t* table = a.table;
      cutlass::Array<int8_t, F::kElements> y;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < int(F::kElements); ++i) {
        const float v = __fadd_rn(__fmul_rn(acc[i], __fmul_rn(xs[i], ws[i])), bias[i]);
        const T h = from_f32<T>(v);
        y[i] = __ldg(table + *reinterpret_cast<const uint16_t*>(&h));
      }
      return y;
    }
  };
};

struct CfgPingpong128 {
  using Tile = Shape<_128, _128, _128>;
  using Cluster = Shape<_2, _1, _1>;
  using Schedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
};
struct CfgCooperative128 {
  using Tile = Shape<_128, _128, _128>;
  using Cluster = Shape<_1, _1, _1>;
  using Schedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct CfgCooperative128x192 {
  using Tile = Shape<_128, _192, _128>;
  using Cluster = Shape<_1, _1, _1>;
  using Schedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct CfgPingpong64 {
  using Tile = Shape<_64, _128, _128>;
  using Cluster = Shape<_1, _1, _1>;
  using Schedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
};

// CodeT void: ElementD out; else (the codes epilogue, kAct kGeluErf) int8 codes of
// activations in CodeT (__nv_bfloat16 / __half).
template <class ElementD, class Cfg, GemvEpilogue kAct, class CodeT = void>
struct Kernel {
  static constexpr bool kCodes = !std::is_void_v<CodeT>;
  using Tile = typename Cfg::Tile;
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  static constexpr int kAlignAB = 16;  // int8: 16 bytes, TMA's stride unit

  using XScale = cutlass::epilogue::fusion::Sm90ColBroadcast<0, Tile, float>;
  using RowVec = cutlass::epilogue::fusion::Sm90RowBroadcast<0, Tile, float>;
  template <class Frag>
  using Fn = std::conditional_t<kCodes, typename DequantCodes<std::conditional_t<kCodes, CodeT, __half>>::template Fn<Frag>,
                                typename Dequant<kAct>::template Fn<Frag>>;
  using Compute = cutlass::epilogue::fusion::Sm90Compute<Fn, ElementD, float,
                                                         cutlass::FloatRoundStyle::round_to_nearest>;
  using Evt =
      cutlass::epilogue::fusion::Sm90EVT<Compute, cutlass::epilogue::fusion::Sm90AccFetch, XScale, RowVec, RowVec>;

  // The codes epilogue of a ping-pong kernel in 64 x 128 subtiles (CUTLASS's pick for int8
  // out is 64 x 64): twice the table lookups in flight a thread and half the subtile
  // barriers. FFN up 3072x768 at 4096 rows, H100: 25.5-26.0 us against 27.8-28.3
  // (64 x 32: 28.8-29.0).
  static constexpr bool kPingpong =
      std::is_same_v<typename Cfg::Schedule, cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using EpiTile = std::conditional_t<kCodes && kPingpong, Shape<_64, _128>,
                                     cutlass::epilogue::collective::EpilogueTileAuto>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, typename Cfg::Cluster,
      EpiTile, int32_t, float, void,
      cutlass::layout::RowMajor, kAlignD, ElementD, cutlass::layout::RowMajor, kAlignD,
      typename Cfg::EpilogueSchedule, Evt>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, int8_t, cutlass::layout::RowMajor,
      kAlignAB, int8_t, cutlass::layout::ColumnMajor, kAlignAB, int32_t, Tile,
      typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      typename Cfg::Schedule>::CollectiveOp;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static typename Gemm::Arguments arguments(const Problem& p) {
    using StrideA = typename GemmKernel::StrideA;
    using StrideB = typename GemmKernel::StrideB;
    using StrideD = typename GemmKernel::StrideD;
    const StrideA sa = make_stride(int64_t(p.k), Int<1>{}, int64_t(p.m) * p.k);
    const StrideB sb = make_stride(int64_t(p.k), Int<1>{}, int64_t(p.n) * p.k);
    const StrideD sd = make_stride(int64_t(p.n), Int<1>{}, int64_t(p.m) * p.n);
    typename Evt::Arguments evt;
    if constexpr (kCodes)
      evt = {{},                                // accumulators
             {p.e.row_scale, p.e.x_scale, {}},  // xs: per token, else the static scale
             {p.e.w_scale, 0.0f, {}},           // w_scale[j]
             {p.e.bias, 0.0f, {}},              // bias[j], 0 without one
             {p.code_table}};                   // the compute node: the reader's codes table
    else
      evt = {{}, {p.e.row_scale, p.e.x_scale, {}}, {p.e.w_scale, 0.0f, {}}, {p.e.bias, 0.0f, {}}, {}};
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {p.m, p.n, p.k, 1},
                                  {p.x, sa, p.w, sb},
                                  {evt, nullptr, sd, static_cast<ElementD*>(p.y), sd}};
    args.hw_info.sm_count = p.sm_count;
    return args;
  }

  static std::string check(const Problem& p) { return cutlass_check<Gemm>(arguments(p)); }
  static size_t workspace(const Problem& p) { return Gemm::get_workspace_size(arguments(p)); }
  static void run(const Problem& p, void* workspace, cudaStream_t s) {
    cutlass_launch<Gemm>(arguments(p), workspace, s, "cuda int8 gemm (sm90)");
  }
};

// f(Kernel<...>{}) for the runtime configuration, activation and output: ElementD, or
// the codes epilogue of activations in CodeT when `codes`.
template <class ElementD, class CodeT, class F>
auto dispatch(Int8GemmConfig c, GemvEpilogue act, bool codes, F&& f) {
  KILN_THROW_IF(act != GemvEpilogue::kNone && act != GemvEpilogue::kGeluErf, kInternal,
                "cuda int8 gemm (sm90): activation ", int(act), " is not compiled");
  KILN_THROW_IF(codes && act != GemvEpilogue::kGeluErf, kInternal,
                "cuda int8 gemm (sm90): the codes epilogue is compiled for gelu_erf only");
  auto with_cfg = [&]<class Cfg>() {
    if (codes) return f(Kernel<int8_t, Cfg, GemvEpilogue::kGeluErf, CodeT>{});
    return act == GemvEpilogue::kGeluErf ? f(Kernel<ElementD, Cfg, GemvEpilogue::kGeluErf>{})
                                         : f(Kernel<ElementD, Cfg, GemvEpilogue::kNone>{});
  };
  switch (c) {
    case Int8GemmConfig::kCooperative128x128:
      return with_cfg.template operator()<CfgCooperative128>();
    case Int8GemmConfig::kPingpong64x128:
      return with_cfg.template operator()<CfgPingpong64>();
    case Int8GemmConfig::kCooperative128x192:
      return with_cfg.template operator()<CfgCooperative128x192>();
    case Int8GemmConfig::kPingpong128x128:
      break;
  }
  return with_cfg.template operator()<CfgPingpong128>();
}

// CUTLASS's element type and the CUDA native type of each output dtype.
template <DType kOut>
struct ElementOf;
template <>
struct ElementOf<DType::kBF16> {
  using type = cutlass::bfloat16_t;
  using native = __nv_bfloat16;
};
template <>
struct ElementOf<DType::kF16> {
  using type = cutlass::half_t;
  using native = __half;
};

template <DType kOut>
std::string Ops<kOut>::check(Int8GemmConfig c, const Problem& p) {
  using E = ElementOf<kOut>;
  return dispatch<typename E::type, typename E::native>(c, p.e.act, p.code_table != nullptr,
                                                        [&](auto k) { return decltype(k)::check(p); });
}
template <DType kOut>
size_t Ops<kOut>::workspace(Int8GemmConfig c, const Problem& p) {
  using E = ElementOf<kOut>;
  return dispatch<typename E::type, typename E::native>(c, p.e.act, p.code_table != nullptr,
                                                        [&](auto k) { return decltype(k)::workspace(p); });
}
template <DType kOut>
void Ops<kOut>::run(Int8GemmConfig c, const Problem& p, void* workspace, cudaStream_t s) {
  using E = ElementOf<kOut>;
  dispatch<typename E::type, typename E::native>(c, p.e.act, p.code_table != nullptr, [&](auto k) {
    decltype(k)::run(p, workspace, s);
    return 0;
  });
}

}  // namespace kiln::cuda::int8_sm90
