// A dense, contiguous, row-major tensor on the host: owning (64-byte aligned buffer,
// shared) or a view into memory someone else owns (an mmap'd file, an arena).
// Tested in tests/core/tensor_test.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/status.h"

namespace kiln {

constexpr size_t kTensorAlignment = 64;

// Aligned host allocation; frees with std::free.
void* aligned_alloc_bytes(size_t bytes);
// A 64-byte aligned host buffer of `bytes` (contents unspecified), freed with its last
// owner; 4 MiB and larger ones are mappings of their own with transparent huge pages asked
// for, as large Tensors are (packed CPU weights: fewer page faults at load).
std::shared_ptr<uint8_t[]> host_buffer(size_t bytes);

class Tensor {
 public:
  Tensor() = default;
  // Allocates an owning tensor (zero-filled; 4 MiB and larger: its own page-aligned
  // anonymous mapping with transparent huge pages asked for).
  Tensor(DType dtype, std::vector<int64_t> shape);
  // A non-owning view; `keepalive` (optional) is held to keep the memory valid.
  static Tensor view(void* data, DType dtype, std::vector<int64_t> shape,
                     std::shared_ptr<const void> keepalive = nullptr);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : size_t(i)]; }
  int rank() const { return int(shape_.size()); }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool empty() const { return data_ == nullptr; }

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T> T* data_as() { return static_cast<T*>(data_); }
  template <typename T> const T* data_as() const { return static_cast<const T*>(data_); }

  // Same memory, new shape with the same element count.
  Tensor reshape(std::vector<int64_t> shape) const;
  // Rows [begin, end) of the leading dimension, as a view sharing the buffer.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // A deep copy converted to `to`.
  Tensor to(DType to) const;
  Tensor clone() const { return to(dtype_); }
  std::string shape_str() const;
  // Whatever keeps the memory alive (the buffer of an owning tensor, a view's keepalive);
  // null for a view of memory someone else guarantees.
  const std::shared_ptr<const void>& owner() const { return owner_; }

 private:
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  void* data_ = nullptr;
  std::shared_ptr<const void> owner_;
};

std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace kiln
