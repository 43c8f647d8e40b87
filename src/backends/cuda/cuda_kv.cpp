// The CUDA backend's paged KV cache (cuda_ops.h's CudaKv): device blocks of K and V per
// layer in the activation dtype or as int8/fp8 codes with their scales and key shift,
// block copies, host reads of keys, and swapping blocks to and from pinned host memory.
#include <algorithm>
#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_ops.h"
#include "core/status.h"

namespace kiln::cuda {

namespace {

KvCode kv_code_of(KvDType t) {
  switch (t) {
    case KvDType::kInt8: return KvCode::kInt8;
    case KvDType::kFp8: return KvCode::kFp8;
    case KvDType::kAuto: break;
  }
  return KvCode::kNone;
}

}  // namespace

CudaKv::CudaKv(const KvLayout& layout, DType act, std::shared_ptr<CudaContext> cx)
    : layout_(layout), dtype_(act), code_(kv_code_of(layout.dtype)), cx_(std::move(cx)) {
  kv_check_k_shift(layout_);
  cx_->make_current();
  elem_bytes_ = code_ == KvCode::kNone ? dtype_size(act) : 1;
  const size_t bytes = std::max<size_t>(size_t(layout_.num_layers) * layer_bytes(), 1);
  k_ = DeviceBuffer(bytes);
  v_ = DeviceBuffer(bytes);
  KILN_CUDA_CHECK(cudaMemsetAsync(k_.get(), 0, bytes, cx_->stream));
  KILN_CUDA_CHECK(cudaMemsetAsync(v_.get(), 0, bytes, cx_->stream));
  if (code_ != KvCode::kNone) {
    const size_t sbytes = std::max<size_t>(size_t(layout_.num_layers) * layer_scale_bytes(), 1);
    k_scale_ = DeviceBuffer(sbytes);
    v_scale_ = DeviceBuffer(sbytes);
    KILN_CUDA_CHECK(cudaMemsetAsync(k_scale_.get(), 0, sbytes, cx_->stream));
    KILN_CUDA_CHECK(cudaMemsetAsync(v_scale_.get(), 0, sbytes, cx_->stream));
    if (layout_.k_shift_of(0)) {
      const size_t bytes_shift = layout_.k_shift->size() * sizeof(float);
      k_shift_ = DeviceBuffer(bytes_shift);
      KILN_CUDA_CHECK(cudaMemcpy(k_shift_.get(), layout_.k_shift->data(), bytes_shift, cudaMemcpyHostToDevice));
    }
  }
}

void CudaKv::read_keys(int64_t layer, std::span<const int64_t> slots, float* out) const {
  kv_check_read_keys(layout_, layer, slots);
  cx_->make_current();
  const int64_t row = layout_.num_kv_heads * layout_.head_dim;
  int64_t top = 0;
  for (int64_t s : slots) top = std::max(top, s + 1);
  // The layer's rows up to the highest slot asked for, then gathered and widened here.
  std::vector<uint8_t> host(size_t(top * row) * elem_bytes_);
  if (!host.empty())
    KILN_CUDA_CHECK(cudaMemcpyAsync(host.data(), k(layer), host.size(), cudaMemcpyDeviceToHost, cx_->stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(cx_->stream));
  for (size_t i = 0; i < slots.size(); ++i)
    dtype_convert(host.data() + size_t(slots[i] * row) * elem_bytes_, dtype_, out + int64_t(i) * row, DType::kF32,
                  size_t(row));
}

size_t CudaKv::block_bytes_of(const KvLayout& layout, DType act) {
  if (!kv_dtype_quantized(layout.dtype)) return layout.block_bytes(dtype_size(act));
  const int64_t scales = 2 * layout.num_layers * layout.block_size * layout.num_kv_heads;
  return layout.block_bytes(1) + size_t(scales) * 4;
}

CudaKv::~CudaKv() {
  // Queued swaps may still read or write the pinned slots.
  (void)cudaSetDevice(cx_->device);
  if (host_.get()) cudaStreamSynchronize(cx_->stream);
}

void CudaKv::copy_block(int32_t src, int32_t dst) {
  KILN_THROW_IF(src < 0 || dst < 0 || src >= layout_.num_blocks || dst >= layout_.num_blocks, kOutOfRange,
                "KV copy_block ", src, " -> ", dst, " outside [0, ", layout_.num_blocks, ")");
  cx_->make_current();
  auto copy = [&](void* base, size_t bb) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(base) + size_t(dst) * bb,
                                    static_cast<char*>(base) + size_t(src) * bb, bb, cudaMemcpyDeviceToDevice,
                                    cx_->stream));
  };
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    copy(k(l), layer_block_bytes());
    copy(v(l), layer_block_bytes());
    if (code_ != KvCode::kNone) {
      copy(k_scales(l), layer_block_scale_bytes());
      copy(v_scales(l), layer_block_scale_bytes());
    }
  }
}

void CudaKv::host_reserve(int32_t num_blocks) {
  KILN_THROW_IF(num_blocks < 0, kInvalidArgument, "KV host swap space of ", num_blocks, " blocks");
  cx_->make_current();
  KILN_CUDA_CHECK(cudaStreamSynchronize(cx_->stream));  // no queued swap may use the old space
  host_.reset();
  host_blocks_ = 0;
  if (num_blocks == 0) return;
  host_.grow(size_t(num_blocks) * block_bytes());
  host_blocks_ = num_blocks;
}

void CudaKv::swap_out(std::span<const KvSwapCopy> copies) { swap(copies, true); }
void CudaKv::swap_in(std::span<const KvSwapCopy> copies) { swap(copies, false); }

// A host slot is [layer][K, V][block] (then the same for the scales): K of every layer
// is a 2D copy of num_layers rows of one block, `layer_bytes` apart on the device and
// two blocks apart on the host.
void CudaKv::swap(std::span<const KvSwapCopy> copies, bool out) {
  cx_->make_current();
  const size_t rows = size_t(layout_.num_layers);
  const cudaStream_t s = cx_->stream;
  // K and V parts of one block (bb bytes per layer, layers `pitch` apart on the device)
  // between the device and the host at h.
  auto move = [&](char* h, char* dk, char* dv, size_t bb, size_t pitch) {
    if (out) {
      KILN_CUDA_CHECK(cudaMemcpy2DAsync(h, 2 * bb, dk, pitch, bb, rows, cudaMemcpyDeviceToHost, s));
      KILN_CUDA_CHECK(cudaMemcpy2DAsync(h + bb, 2 * bb, dv, pitch, bb, rows, cudaMemcpyDeviceToHost, s));
    } else {
      KILN_CUDA_CHECK(cudaMemcpy2DAsync(dk, pitch, h, 2 * bb, bb, rows, cudaMemcpyHostToDevice, s));
      KILN_CUDA_CHECK(cudaMemcpy2DAsync(dv, pitch, h + bb, 2 * bb, bb, rows, cudaMemcpyHostToDevice, s));
    }
  };
  for (const KvSwapCopy& c : copies) {
    KILN_THROW_IF(c.block < 0 || c.block >= layout_.num_blocks || c.host < 0 || c.host >= host_blocks_,
                  kOutOfRange, "KV swap of block ", c.block, " <-> host slot ", c.host, " outside [0, ",
                  layout_.num_blocks, ") x [0, ", host_blocks_, ")");
    char* h = static_cast<char*>(host_.get()) + size_t(c.host) * block_bytes();
    const size_t bb = layer_block_bytes();
    move(h, static_cast<char*>(k(0)) + size_t(c.block) * bb, static_cast<char*>(v(0)) + size_t(c.block) * bb, bb,
         layer_bytes());
    if (code_ != KvCode::kNone) {
      const size_t sb = layer_block_scale_bytes();
      move(h + 2 * rows * bb, reinterpret_cast<char*>(k_scales(0)) + size_t(c.block) * sb,
           reinterpret_cast<char*>(v_scales(0)) + size_t(c.block) * sb, sb, layer_scale_bytes());
    }
  }
}

}  // namespace kiln::cuda
