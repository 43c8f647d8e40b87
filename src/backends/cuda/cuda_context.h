// Device-side resources shared by a CUDA backend, its compiled graphs and KV pools: the
// device, one stream, the cuBLASLt GEMM (handle, workspace, tactic cache), and RAII
// device/pinned buffers that grow (the only allocations; steady-state steps make none).
// Internal to src/backends/cuda; exercised by every test in tests/backends/cuda/.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/ops/gemm.h"
#include "core/log.h"

namespace kiln::cuda {

// Device memory from cudaMalloc. grow() keeps nothing: callers grow before writing.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { grow(bytes, nullptr); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  void* get() const { return p_; }
  size_t size() const { return bytes_; }
  // Ensures at least `bytes`; the old memory may still be in use by queued work on
  // `stream`, so that stream is drained before it is freed. A buffer that grows again
  // takes at least 1.5x its old size: buffers sized by the step (staging, attention
  // workspaces) would otherwise grow by a few KB at a time, each a synchronizing free +
  // malloc and a new address for every CUDA graph that captured the old one (a server's
  // warm-up saw ~240 of them).
  void grow(size_t bytes, cudaStream_t stream) {
    if (bytes <= bytes_) return;
    if (p_) {
      if (stream) KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
      log_debug("cuda: a device buffer regrown from ", bytes_, " to ", bytes, " bytes (a synchronizing free + malloc)");
      bytes = std::max(bytes, bytes_ + bytes_ / 2);
      release();
    }
    const size_t rounded = (bytes + 65535) / 65536 * 65536;
    KILN_CUDA_CHECK(cudaMalloc(&p_, rounded));
    bytes_ = rounded;
  }

 private:
  void release() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory (async copies need it to overlap and to be truly async).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (p_) cudaFreeHost(p_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get() const { return p_; }
  size_t size() const { return bytes_; }
  // Callers reset or grow only when no copy from/to the buffer is pending.
  void reset() {
    if (p_) cudaFreeHost(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  void grow(size_t bytes) {
    if (bytes <= bytes_) return;
    reset();
    const size_t rounded = (bytes + 65535) / 65536 * 65536;
    KILN_CUDA_CHECK(cudaMallocHost(&p_, rounded));
    bytes_ = rounded;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

struct CudaContext {
  int device = 0;
  int num_sms = 0;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Gemm> gemm;
  // Device tables built once while compiling graphs and kept for the context's life (the
  // activation lookup tables of cuda_gelu_lut.h), by a key their maker chooses; the map's
  // nodes never move, so compiled graphs hold their addresses.
  std::mutex tables_mu;
  std::map<uint64_t, DeviceBuffer> tables;

  // Makes `device` current on the calling thread, then creates the stream and cuBLASLt
  // handle there. Every entry point of the backend (compile, run, KV pool calls) makes
  // it current again: tensor-parallel ranks run on threads of their own.
  explicit CudaContext(int device);
  void make_current() const { KILN_CUDA_CHECK(cudaSetDevice(device)); }
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;
};

}  // namespace kiln::cuda
