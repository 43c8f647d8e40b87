// The CUDA backend's device copies of a graph's weights (cuda_ops.h's DeviceWeights):
// uploaded once per (value, dtype), GGUF weight images dequantized or kept as q8/q4 codes
// in the layout of the GEMV that reads them.
#include <algorithm>
#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_ops.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "core/weight_quant.h"

namespace kiln::cuda {

const void* DeviceWeights::get(const ir::Graph& g, ir::ValueId v, DType dtype) {
  if (v == ir::kNoValue) return nullptr;
  auto& buf = bufs_[{v, dtype}];
  if (!buf.get()) {
    const Tensor& t = g.weight(v);
    upload(buf, v, t.dtype() == dtype ? t : t.to(dtype));
  }
  return buf.get();
}

void DeviceWeights::upload(DeviceBuffer& buf, ir::ValueId v, const Tensor& host) {
  buf = DeviceBuffer(std::max<size_t>(host.nbytes(), 1));
  KILN_CUDA_CHECK(cudaMemcpy(buf.get(), host.data(), host.nbytes(), cudaMemcpyHostToDevice));
  bytes_ += host.nbytes();
  by_value_[v] += host.nbytes();
}

const void* DeviceWeights::get_dequantized(const ir::Graph& g, ir::ValueId v, DType dtype, int64_t image_k,
                                           QuantFormat image_f) {
  auto& buf = bufs_[{v, dtype}];
  if (buf.get()) return buf.get();
  const Tensor& t = g.weight(v);
  const size_t row_bytes = quant_image_row_bytes(image_f, image_k);
  KILN_THROW_IF(t.dtype() != DType::kU8 || t.rank() != 2 || image_k % kQuantGroup != 0 || size_t(t.dim(1)) != row_bytes,
                kInvalidArgument, "cuda: ", quant_format_name(image_f), " table image %", g.value(v).name, " ",
                dtype_name(t.dtype()), t.shape_str(), " does not fit K=", image_k);
  const int64_t n = t.dim(0);
  Tensor host(dtype, {n, image_k});
  const size_t es = dtype_size(dtype);
  ThreadPool::global().parallel_for(n, [&](int64_t r0, int64_t r1, int) {
    std::vector<float> row(static_cast<size_t>(image_k));
    for (int64_t r = r0; r < r1; ++r) {
      dequantize_image_row(t.data_as<uint8_t>() + size_t(r) * row_bytes, image_k, image_f, row.data());
      dtype_convert(row.data(), DType::kF32, static_cast<uint8_t*>(host.data()) + size_t(r * image_k) * es, dtype, size_t(image_k));
    }
  });
  upload(buf, v, host);
  return buf.get();
}

const QuantWeightView& DeviceWeights::get_quant(const ir::Graph& g, ir::ValueId v, QuantFormat f, QuantLayout layout,
                                                int64_t image_k, QuantFormat image_f) {
  auto& [buf, view] = quant_[{v, f, layout}];
  if (buf.get()) return view;
  const Tensor& t = g.weight(v);
  KILN_THROW_IF(t.rank() != 2, kInvalidArgument, "cuda: quantized weight %", g.value(v).name, " must be 2-D, got ",
                t.shape_str());
  QuantizedRows rows;
  if (image_k > 0) {
    KILN_THROW_IF(t.dtype() != DType::kU8 || size_t(t.dim(1)) != quant_image_row_bytes(image_f, image_k),
                  kInvalidArgument, "cuda: ", quant_format_name(image_f), " weight image %", g.value(v).name, " ",
                  dtype_name(t.dtype()), t.shape_str(), " does not fit K=", image_k);
    rows = quant_rows_from_image(t.data_as<uint8_t>(), t.dim(0), image_k, image_f);
    if (image_f != f) {  // another format asked for: expand the file's values, quantize again
      std::vector<float> wf(size_t(rows.n * rows.k));
      dequantize_rows(rows, 0, rows.n, wf.data());
      rows = quantize_rows(wf.data(), rows.n, rows.k, f);
    }
  } else {
    Tensor wf = t.dtype() == DType::kF32 ? t : t.to(DType::kF32);
    rows = quantize_rows(wf.data_as<float>(), t.dim(0), t.dim(1), f);
  }
  const QuantImage img = quant_image(rows, layout);
  buf = DeviceBuffer(img.bytes.size());
  KILN_CUDA_CHECK(cudaMemcpy(buf.get(), img.bytes.data(), img.bytes.size(), cudaMemcpyHostToDevice));
  bytes_ += img.bytes.size();
  by_value_[v] += img.bytes.size();
  view = img.view_at(buf.get());
  return view;
}

}  // namespace kiln::cuda
