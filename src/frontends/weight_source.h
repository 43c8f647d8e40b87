// WeightSource: the one interface model builders load weights through, whatever the
// file format (single safetensors, sharded HF checkpoint, GGUF). Names are always
// HuggingFace names. Tested in tests/frontends/safetensors_test.cpp and gguf_test.cpp.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/weight_quant.h"

namespace kiln {

struct TensorInfo {
  DType dtype = DType::kF32;   // what load(name, dtype) returns without conversion
  std::vector<int64_t> shape;  // PyTorch order (outermost first)
  size_t nbytes = 0;           // numel * dtype_size(dtype)
  std::string storage;         // the on-disk encoding when it differs ("Q4_1"), else ""
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual std::vector<std::string> names() const = 0;  // sorted
  virtual bool has(const std::string& name) const = 0;
  // Throws kiln::Error (kNotFound) naming the source when the tensor is absent.
  virtual TensorInfo info(const std::string& name) const = 0;
  // An owned, 64-byte aligned tensor converted (or dequantized) to `want`.
  virtual Tensor load(const std::string& name, DType want) const = 0;
  // For error messages: "safetensors 'dir/model.safetensors'".
  virtual std::string describe() const = 0;
  // A zero-copy, read-only view of the tensor in its stored dtype, holding the file's
  // mapping alive, when its bytes are usable as they lie (unquantized, not permuted or
  // transposed on the way, aligned for the dtype); else nullopt (use load).
  virtual std::optional<Tensor> view(const std::string& /*name*/) const { return std::nullopt; }

  // Weights already quantized in the file: with keep_quantized(f) set (--weight-dtype
  // q8/q4), model builders load Linear weights through load_quantized first.
  // load_quantized gives a u8 [n, quant_image_row_bytes(f, k)] image (core/weight_quant.h)
  // holding the file's own codes when the stored type maps onto f (GGUF Q8_0 / Q5_0 -> q8,
  // Q4_0 / Q4_1 -> q4 exactly, Q4_K -> q4 with f16-rounded scales), else nullopt and the
  // weight loads as f32 as before.
  void keep_quantized(std::optional<QuantFormat> f) { keep_quantized_ = f; }
  std::optional<QuantFormat> kept_quantized() const { return keep_quantized_; }
  // The image's rows are the matrix's rows as the file stores them: for a tensor the file
  // holds transposed from its HF layout (stored_transposed) those are the HF tensor's columns,
  // i.e. a Linear's [out, in] rows where HF keeps [in, out] (GPT-2's Conv1D).
  virtual std::optional<Tensor> load_quantized(const std::string& /*name*/, QuantFormat /*f*/) const {
    return std::nullopt;
  }
  // The file stores this tensor as the transpose of its HF layout (GGUF's GPT-2 Conv1D
  // weights: [out, in] in the file, [in, out] under the HF name; load() transposes them).
  virtual bool stored_transposed(const std::string& /*name*/) const { return false; }
  // --weight-dtype auto: every Linear weight the file stores in a format kiln keeps
  // (native_quant) loads as its own codes in that format, each in its own; the others as
  // f32.
  void keep_native(bool on) { keep_native_ = on; }
  bool keeps_native() const { return keep_native_; }
  // Linear weights and lookup tables the file stores as bf16 / f16 load in that dtype
  // instead of f32 (load_declared_weights), so a 16-bit checkpoint is not held at twice
  // its size while the backend packs or uploads it. Every consumer must then read the
  // weight's dtype (the backends convert; see ModelOptions::lean_host_weights).
  void keep_16bit(bool on) { keep_16bit_ = on; }
  bool keeps_16bit() const { return keep_16bit_; }
  // The format a weight stored in the file maps onto (GGUF Q8_0 / Q5_0 -> q8, Q4_0 / Q4_1 / Q4_K
  // -> q4, Q5_1 / Q2_K / Q3_K / Q5_K / Q6_K -> q8 requantized), else nullopt.
  virtual std::optional<QuantFormat> native_quant(const std::string& /*name*/) const { return std::nullopt; }
  // The format `name` loads in under keep_quantized / keep_native, if any.
  std::optional<QuantFormat> keep_format_for(const std::string& name) const {
    if (keep_quantized_) return keep_quantized_;
    return keep_native_ ? native_quant(name) : std::nullopt;
  }

 private:
  std::optional<QuantFormat> keep_quantized_;
  bool keep_native_ = false;
  bool keep_16bit_ = false;
};

// A single .safetensors file.
std::unique_ptr<WeightSource> open_safetensors_source(const std::string& path);
// A sharded HF checkpoint through its model.safetensors.index.json: every shard must
// exist and hold every tensor the index maps to it.
std::unique_ptr<WeightSource> open_sharded_safetensors_source(const std::string& index_path);

}  // namespace kiln
