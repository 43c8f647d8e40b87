// A batch-1 decode step through every layer of a Llama-family decoder in one persistent
// kernel (the "decode stack"): RMSNorm -> packed q|k|v GEMV (+bias) with RoPE and the
// paged KV-cache write in its epilogue -> split-KV attention (every CTA of the next phase
// merges the splits' partials) -> o GEMV + residual -> RMSNorm -> gate|up GEMV with SwiGLU ->
// down GEMV + residual, layer after layer, then the final norm. One CTA per SM stays
// resident (a cooperative launch) and the phases meet through counters in global memory
// instead of kernel boundaries: a CTA that finished its part of a phase requests its
// first weights of the next phase before it waits, so the weight stream does not stop at
// the ~7 kernel boundaries a layer otherwise has (measured: still slower than those
// kernels on the H200, bench/RESULTS.md session 12). Every value is rounded to the
// activation dtype where the unfused kernels (GEMV, qkv_prep/decode attention, AddRMSNorm)
// round it, so the two paths differ only in summation order.
// The CUDA backend runs it for decode steps of one sequence and one token when the graph
// is a plain 16-bit Llama-family stack (cuda_decode_stack.h); tested against the unfused
// path and transformers in tests/backends/cuda/decode_stack_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "backends/cuda/ops/attention.h"
#include "core/dtype.h"

namespace kiln::cuda {

// One layer's parameters on the device. Weights in the activation dtype, row-major
// [out, in]; norm weights f32.
struct DecodeStackLayer {
  const void* w_qkv = nullptr;      // [(hq + 2 hkv) d, hidden]
  const void* b_qkv = nullptr;      // [(hq + 2 hkv) d] or null
  const void* w_o = nullptr;        // [hidden, hq d]
  const void* w_gate_up = nullptr;  // [2 inter, hidden]: gate rows, then up rows
  const void* w_down = nullptr;     // [hidden, inter]
  const float* attn_norm = nullptr;  // [hidden], the norm before q|k|v
  const float* mlp_norm = nullptr;   // [hidden], the norm before gate|up
  float attn_eps = 0.0f, mlp_eps = 0.0f;
};

struct DecodeStackShape {
  int layers = 0, hidden = 0, inter = 0, hq = 0, hkv = 0, d = 0;
};

struct DecodeStackArgs {
  DType dtype = DType::kBF16;  // bf16 or f16: activations, weights, KV cache
  DecodeStackShape shape;
  const DecodeStackLayer* layers = nullptr;  // device array of shape.layers
  float scale = 0.0f;                        // attention's softmax scale
  const float* inv_freq = nullptr;           // [d / 2] RoPE frequencies (rotary dim = d)
  const float* final_norm = nullptr;         // [hidden]
  float final_eps = 0.0f;
  const void* x = nullptr;  // [hidden]: layer 0's input (the token's embedding)
  void* out_sum = nullptr;  // [hidden]: the residual stream after the last layer
  void* out_norm = nullptr;  // [hidden]: final_norm of it
  // The step (device): the token's position and cache slot, the sequence (its ctx_len
  // counts the new token) and its block table.
  const int32_t* positions = nullptr;
  const int64_t* slot_mapping = nullptr;
  const AttnSeq* seq = nullptr;
  const int32_t* block_tables = nullptr;
  // Layer l's K (V) cache [blocks, block_size, hkv, d] at k_cache + l * kv_layer_bytes.
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  size_t kv_layer_bytes = 0;
  int block_size = 0;
  // decode_stack_scratch_bytes of device memory, zeroed once before the first launch;
  // every launch leaves its counters at zero.
  void* scratch = nullptr;
  // Optional (benchmarks): %globaltimer ns per CTA: [layers][kDecodeStackPhases][grid] when
  // it finished each phase, then the same when it saw the phase's input ready (left as
  // they were by CTAs without attention work), then [grid] when it started.
  int64_t* timeline = nullptr;
};
// The phases of a layer as the timeline lists them: q|k|v, attention, o, gate|up, down.
constexpr int kDecodeStackPhases = 5;

// Whether the kernel takes these shapes: a 16-bit dtype, hidden, inter and hq * d
// multiples of 8 whose largest is at most 24576 (the GEMV input row in shared memory),
// d a multiple of 8 up to 128, hq a multiple of hkv with a group of at most 8, and a
// CTA's share of each GEMV phase (grid CTAs) small enough for its shared memory.
bool decode_stack_supports(DType dtype, const DecodeStackShape& s, int grid, std::string* why = nullptr);
// The CTAs a launch takes on the current device (one per SM); 0 if the kernel cannot keep
// one CTA resident per SM.
int decode_stack_grid();
size_t decode_stack_scratch_bytes(const DecodeStackShape& s, int grid);
// Enqueues the whole stack on s as one cooperative launch of `grid` CTAs.
void launch_decode_stack(const DecodeStackArgs& a, int grid, cudaStream_t s);
// Launches enqueued by this process so far (graph replays not counted; tests check the
// kernel ran).
uint64_t decode_stack_launches();

}  // namespace kiln::cuda
