// Internal to the CUDA backend's attention: the warp decode kernel, for batch decode
// steps over a 16-bit cache (head dims 64/128, GQA group <= 8, one query row a sequence).
// A warp takes one whole (sequence, KV head): its keys stream through the warp's own
// cp.async ring of ST tiles, and the warp writes the normalized output itself. No CTA
// barrier, no merge of partials, no split. Why: at batch 64-256 with short contexts the
// cluster kernel (attention_decode.cuh) runs thousands of 4-warp CTAs of 2-3 tiles a
// warp, and each CTA's fixed chain (sequence -> block table -> copies, q and its RoPE,
// the merge of 4 warps through shared memory) outweighs its keys: its time follows its
// CTA count (bench/RESULTS.md, session 25). Here that chain is paid once per (sequence,
// KV head) and overlaps the other warps' copies, and the grid of batch x KV heads warps
// runs in one or two waves. A tile's arithmetic is the cluster kernel's (m16n8k16 MMAs
// with the group's q heads as the A rows, the same online softmax, RoPE and rounding);
// only the order differs (one warp walks every tile; there, four warps take every fourth
// and merge), so outputs differ by rounding (bf16: ~1e-3). launch_attention_decode_cluster
// takes this kernel when the plan says so (AttentionPlan::decode_warp: batch decode,
// attention_plan_decode_cluster). Measured in bench/cuda_decode_attention_bench.cpp;
// tested in tests/backends/cuda/attention_test.cpp against the CPU backend.
#pragma once

#include "backends/cuda/ops/attention_decode.cuh"

namespace kiln::cuda {
namespace {

constexpr int kDwWarps = 4, kDwThreads = kDwWarps * 32;

// A warp's shared-memory region (bytes) for head dim D and ST stages: the stages (16-bit
// K then V tiles of KT keys, rows padded to LD elements), the q rows [8][LD], the new
// K/V rows [2][D]. With ST >= 2 the q rows borrow stage 1 (kQAlias): they are needed only
// until the warp holds them as MMA fragments, so tile 0's copies go out before the
// dependent-launch wait and tiles 1.. after the fragments; that leaves CTAs small enough
// for 3 an SM at head dim 128 and 2 stages (~70 KB), 2 otherwise.
template <int D, int ST>
struct DwLayout {
  static constexpr int KT = D == 64 ? 32 : 16;
  static constexpr int LD = D + 8;
  static constexpr int kTile = KT * LD * 2;
  static constexpr int kStage = 2 * kTile;
  static constexpr bool kQAlias = ST >= 2;
  static_assert(kDecMaxGroup * LD * 2 <= kStage, "the q rows fit a stage");
  static constexpr int kQOff = kQAlias ? kStage : ST * kStage;
  static constexpr int kNewOff = kQAlias ? ST * kStage : kQOff + kDecMaxGroup * LD * 2;
  static constexpr int kWarp = kNewOff + 2 * D * 2;
  static constexpr int kBytes = kDwWarps * kWarp;
  static_assert(kStage % 16 == 0 && kQOff % 16 == 0 && kNewOff % 16 == 0 && kWarp % 16 == 0);
};

template <typename T, int D, int ST>
__global__ void __launch_bounds__(kDwThreads) attention_decode_warp_kernel(const DecParams<T> p, int items) {
  using L = DwLayout<D, ST>;
  constexpr int KT = L::KT, LD = L::LD, KC = D / 16, DT = D / 8;
  constexpr int CPR = D * 2 / 16;  // 16-byte chunks per cache row
  constexpr unsigned kFull = 0xffffffffu;
  static_assert(D == 64 || D == 128);
  static_assert(KT * CPR % 32 == 0, "copy loops are warp-uniform");
  extern __shared__ __align__(16) unsigned char smem[];

  if (p.early_trigger) pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int item = int(blockIdx.x) * kDwWarps + warp;
  if (item >= items) {
    pdl_trigger();
    return;  // no barrier below: a warp past the grid's items just leaves
  }
  const int seq = item / p.hkv, kvh = item % p.hkv, group = p.hq / p.hkv;
  unsigned char* wbase = smem + warp * L::kWarp;
  T* q_s = reinterpret_cast<T*>(wbase + L::kQOff);
  T* new_t = reinterpret_cast<T*>(wbase + L::kNewOff);
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);

  // Before the dependent-launch wait (as in the cluster kernel): the step's tables and
  // the cache's earlier rows; the new token's row (position ctx - 1) is never copied.
  const AttnSeq sq = p.seqs[seq];
  const int ctx = sq.ctx_len, newpos = ctx - 1;
  const int32_t* bt = p.block_tables + sq.bt_offset;
  const int ntiles = (ctx + KT - 1) / KT;
  // Lane j's key of tile i: its row's element offset in the cache (-1: none, past the
  // context or the new token's row), so the copy loop needs no division or product.
  auto tile_row = [&](int i) -> int64_t {
    const int pos = i * KT + lane;
    if (i >= ntiles || lane >= KT || pos >= newpos) return -1;
    const int blk = __ldg(bt + pos / p.block_size);
    return (int64_t(blk) * p.block_size + pos % p.block_size) * p.kv_row + int64_t(kvh) * D;
  };
  auto issue = [&](int i, int64_t row) {
    if (i < ntiles) {
      unsigned char* st = wbase + (i % ST) * L::kStage;
#pragma unroll
      for (int e = lane; e < KT * CPR; e += 32) {
        const int j = e / CPR, c = e % CPR;
        const int64_t r = __shfl_sync(kFull, row, j);
        const bool in = r >= 0;
        const int64_t off = in ? r + c * 8 : 0;
        cp_async16(st + j * LD * 2 + c * 16, kc + off, in);
        cp_async16(st + L::kTile + j * LD * 2 + c * 16, vc + off, in);
      }
    }
    cp_async_commit();  // always a group: "all but the newest ST - 1" is tile i's
  };
  const bool rope = p.inv_freq != nullptr;
  const int qpos = rope ? p.positions[sq.q_start] : 0;
  constexpr int kEarly = L::kQAlias ? 1 : ST;  // tiles issued before the wait
#pragma unroll
  for (int i = 0; i < kEarly; ++i) issue(i, tile_row(i));
  // Lane rows of the tiles issued after the fragments (kQAlias), looked up meanwhile.
  [[maybe_unused]] int64_t row_late[ST > 1 ? ST - 1 : 1];
#pragma unroll
  for (int i = kEarly; i < ST; ++i) row_late[i - 1] = tile_row(i);
  int64_t row_next = tile_row(ST);

  pdl_wait();  // the previous kernel's q and new K/V rows are visible
  // q rows (group x D) and the new K and V rows, 16-byte vectors, then RoPE in place.
  constexpr int VPR = D / 8;  // vectors per row
  for (int e = lane; e < (group + 2) * VPR; e += 32) {
    const int r = e / VPR, c = (e % VPR) * 8;
    if (r < group) {
      *reinterpret_cast<uint4*>(&q_s[r * LD + c]) = *reinterpret_cast<const uint4*>(
          p.q + int64_t(sq.q_start) * p.q_stride + int64_t(kvh * group + r) * D + c);
    } else {
      const int which = r - group;
      *reinterpret_cast<uint4*>(&new_t[which * D + c]) = *reinterpret_cast<const uint4*>(
          (which ? p.v_new : p.k_new) + int64_t(sq.q_start) * p.new_stride + int64_t(kvh) * D + c);
    }
  }
  for (int e = lane; e < (kDecMaxGroup - group) * VPR; e += 32) {  // rows >= group: zero A rows
    const int r = group + e / VPR, c = (e % VPR) * 8;
    *reinterpret_cast<uint4*>(&q_s[r * LD + c]) = make_uint4(0, 0, 0, 0);
  }
  __syncwarp();
  if (rope) {
    dec_rope_rows(q_s, LD, new_t, group, true, p.rot, qpos, p.inv_freq, lane, 32);
    __syncwarp();
  }
  {
    const int64_t slot = p.slots[sq.q_start];
    if (slot >= 0 && lane < 2 * CPR) {
      const int which = lane / CPR, c = (lane % CPR) * 8;
      T* dst = (which ? static_cast<T*>(p.v_cache) : static_cast<T*>(p.k_cache)) + slot * p.kv_row +
               int64_t(kvh) * D + c;
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(&new_t[which * D + c]);
    }
  }

  uint32_t qa[KC][2];
#pragma unroll
  for (int k = 0; k < KC; ++k) {
    qa[k][0] = *reinterpret_cast<const uint32_t*>(&q_s[g * LD + k * 16 + 2 * t]);
    qa[k][1] = *reinterpret_cast<const uint32_t*>(&q_s[g * LD + k * 16 + 8 + 2 * t]);
  }
  if constexpr (L::kQAlias) {
    __syncwarp();  // every lane holds its fragments: stage 1 is free for its tile
#pragma unroll
    for (int i = 1; i < ST; ++i) issue(i, row_late[i - 1]);
  }
  float o[DT][4], m = -INFINITY, l = 0.0f;
#pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

  for (int i = 0; i < ntiles; ++i) {
    cp_async_wait<ST - 1>();
    __syncwarp();
    const int t0 = i * KT;
    unsigned char* st = wbase + (i % ST) * L::kStage;
    if (newpos >= t0 && newpos < t0 + KT) {  // the new token's row, from shared memory
      const int jn = newpos - t0;
      if (lane < 2 * CPR) {
        const int which = lane / CPR, c = (lane % CPR) * 16;
        *reinterpret_cast<uint4*>(st + which * L::kTile + jn * LD * 2 + c) =
            *reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned char*>(new_t + which * D) + c);
      }
      __syncwarp();
    }
    const T* ks = reinterpret_cast<const T*>(st);
    const T* vs = reinterpret_cast<const T*>(st + L::kTile);
    dec_tile_attend<T, D, KT, LD>(ks, vs, qa, t0, ctx, p.scale_log2, p.softcap_in, p.softcap_out, o, m, l);
    __syncwarp();  // every lane is done with this stage before it is refilled
    issue(i + ST, row_next);
    row_next = tile_row(i + ST + 1);
  }
  cp_async_wait<0>();
  pdl_trigger();  // the keys and values are read

  l += __shfl_xor_sync(kFull, l, 1);
  l += __shfl_xor_sync(kFull, l, 2);
  if (g < group) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    T* out = p.out + (int64_t(sq.q_start) * p.hq + int64_t(kvh) * group + g) * D;
#pragma unroll
    for (int i = 0; i < DT; ++i)
      *reinterpret_cast<uint32_t*>(out + i * 8 + 2 * t) = pack2<T>(o[i][0] * inv, o[i][1] * inv);
  }
}

template <typename T, int D, int ST>
auto decode_warp_kernel_ready() {
  return smem_kernel_ready<attention_decode_warp_kernel<T, D, ST>, DwLayout<D, ST>::kBytes>();
}

template <typename T, int D, int ST>
void launch_decode_warp_staged(const AttentionArgs& a, cudaStream_t s) {
  auto* kernel = decode_warp_kernel_ready<T, D, ST>();
  const DecParams<T> p = dec_params_of<T, D>(a);  // splits: 1 by the plan
  const int items = int(a.num_seqs * a.hkv);
  const dim3 grid(unsigned((items + kDwWarps - 1) / kDwWarps));
  launch_k(kernel, grid, dim3(kDwThreads), size_t(DwLayout<D, ST>::kBytes), s, p, items);
  KILN_CUDA_CHECK_LAUNCH();
}

template <typename T, int D>
void launch_decode_warp_typed(const AttentionArgs& a, int stages, cudaStream_t s) {
  if (stages == 1)
    launch_decode_warp_staged<T, D, 1>(a, s);
  else if (stages == 2)
    launch_decode_warp_staged<T, D, 2>(a, s);
  else
    launch_decode_warp_staged<T, D, 3>(a, s);
}

void launch_decode_warp(const AttentionArgs& a, int stages, cudaStream_t s) {
  if (a.dtype == DType::kBF16) {
    if (a.d == 64)
      launch_decode_warp_typed<__nv_bfloat16, 64>(a, stages, s);
    else
      launch_decode_warp_typed<__nv_bfloat16, 128>(a, stages, s);
  } else {
    if (a.d == 64)
      launch_decode_warp_typed<__half, 64>(a, stages, s);
    else
      launch_decode_warp_typed<__half, 128>(a, stages, s);
  }
}

}  // namespace
}  // namespace kiln::cuda
