// Tensor storage (see tensor.h).
#include "core/tensor.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

namespace kiln {

void* aligned_alloc_bytes(size_t bytes) {
  size_t rounded = (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  if (rounded == 0) rounded = kTensorAlignment;
  void* p = std::aligned_alloc(kTensorAlignment, rounded);
  if (!p) throw_error(ErrorCode::kOutOfMemory, "host allocation of ", bytes, " bytes failed");
  return p;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

namespace {

// Tensors of this size and more get their own anonymous mapping: the kernel hands out zeroed
// pages, so there is no memset pass (a 16 GB weight set was zeroed by one thread, page
// fault by page fault, before the loader's threads wrote it), and transparent huge pages are
// asked for, so filling it takes ~500x fewer page faults. Smaller ones come from malloc.
constexpr size_t kMapBytes = size_t(4) << 20;

void* map_zeroed(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw_error(ErrorCode::kOutOfMemory, "host allocation of ", bytes, " bytes failed (mmap)");
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without THP the mapping works as is
#endif
  return p;
}

}  // namespace

std::shared_ptr<uint8_t[]> host_buffer(size_t bytes) {
  if (bytes >= kMapBytes) {
    auto* p = static_cast<uint8_t*>(map_zeroed(bytes));
    return std::shared_ptr<uint8_t[]>(p, [bytes](uint8_t* q) { munmap(q, bytes); });
  }
  return std::shared_ptr<uint8_t[]>(static_cast<uint8_t*>(aligned_alloc_bytes(bytes)),
                                    [](uint8_t* q) { std::free(q); });
}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  for (auto d : shape_) KILN_CHECK(d >= 0, "negative dim in ", shape_str());
  const size_t bytes = nbytes();
  if (bytes >= kMapBytes) {
    void* p = map_zeroed(bytes);
    data_ = p;
    owner_ = std::shared_ptr<const void>(p, [bytes](const void* q) { munmap(const_cast<void*>(q), bytes); });
    return;
  }
  void* p = aligned_alloc_bytes(bytes);
  std::memset(p, 0, bytes);
  data_ = p;
  owner_ = std::shared_ptr<const void>(p, [](const void* q) { std::free(const_cast<void*>(q)); });
}

Tensor Tensor::view(void* data, DType dtype, std::vector<int64_t> shape,
                    std::shared_ptr<const void> keepalive) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.owner_ = std::move(keepalive);
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

Tensor Tensor::reshape(std::vector<int64_t> shape) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  KILN_CHECK(t.numel() == numel(), "reshape ", shape_str(), " -> ", t.shape_str());
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  KILN_CHECK(rank() >= 1 && begin >= 0 && begin <= end && end <= shape_[0], "slice_rows ", begin,
             ":", end, " of ", shape_str());
  Tensor t = *this;
  size_t row_bytes = shape_[0] ? nbytes() / size_t(shape_[0]) : 0;
  t.data_ = static_cast<char*>(data_) + size_t(begin) * row_bytes;
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::to(DType to) const {
  Tensor t(to, shape_);
  dtype_convert(data_, dtype_, t.data_, to, size_t(numel()));
  return t;
}

std::string Tensor::shape_str() const { return shape_to_string(shape_); }

}  // namespace kiln
