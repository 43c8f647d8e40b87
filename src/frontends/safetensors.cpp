// safetensors parsing and validation (see safetensors.h).
#include "frontends/safetensors.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "core/status.h"

namespace kiln {
namespace {

using nlohmann::json;

// Known safetensors dtypes; `ok` false for those kiln does not load.
struct StDType {
  const char* name;
  DType dtype;
  bool ok;
};
constexpr StDType kStDTypes[] = {
    {"F32", DType::kF32, true},        {"F16", DType::kF16, true},
    {"BF16", DType::kBF16, true},      {"I8", DType::kI8, true},
    {"U8", DType::kU8, true},          {"I32", DType::kI32, true},
    {"I64", DType::kI64, true},        {"F8_E4M3", DType::kFP8E4M3, true},
    {"BOOL", DType::kU8, false},       {"F64", DType::kF32, false},
    {"I16", DType::kF32, false},       {"U16", DType::kF32, false},
    {"U32", DType::kF32, false},       {"U64", DType::kF32, false},
    {"F8_E5M2", DType::kF32, false},   {"F8_E8M0", DType::kF32, false},
    {"F4", DType::kF32, false},        {"F6_E2M3", DType::kF32, false},
    {"F6_E3M2", DType::kF32, false},   {"C64", DType::kF32, false},
};

std::string json_brief(const json& j) {
  std::string s = j.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto mf = MappedFile::open(path);
  const uint8_t* data = mf->data();
  size_t size = mf->size();
  return from_memory(data, size, path, std::move(mf));
}

SafetensorsFile SafetensorsFile::from_memory(const uint8_t* data, size_t size, std::string label,
                                             std::shared_ptr<const void> keepalive) {
  SafetensorsFile f;
  f.label_ = std::move(label);
  f.data_ = data;
  f.size_ = size;
  f.keepalive_ = std::move(keepalive);
  f.parse();
  return f;
}

void SafetensorsFile::parse() {
  const std::string& p = label_;
  if (size_ < 8)
    throw_error(ErrorCode::kInvalidFile, p, ": file is ", size_,
                " bytes, too small for a safetensors header (need at least 8; truncated file?)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data_[i];  // little-endian
  if (header_len > size_ - 8)
    throw_error(ErrorCode::kInvalidFile, p, ": header length ", header_len,
                " exceeds the ", size_ - 8,
                " bytes that follow it (truncated file, or not a safetensors file?)");
  if (header_len > kMaxHeaderBytes)
    throw_error(ErrorCode::kInvalidFile, p, ": header length ", header_len, " exceeds the ",
                kMaxHeaderBytes, "-byte limit (not a safetensors file?)");
  const char* hb = reinterpret_cast<const char*>(data_ + 8);
  json header;
  try {
    header = json::parse(hb, hb + header_len);
  } catch (const json::parse_error& e) {
    throw_error(ErrorCode::kInvalidFile, p, ": header is not valid JSON (byte ", e.byte,
                " of the header): ", e.what());
  } catch (const json::exception& e) {  // e.g. a number too large for any JSON type
    throw_error(ErrorCode::kInvalidFile, p, ": header is not valid JSON: ", e.what());
  }
  if (!header.is_object())
    throw_error(ErrorCode::kInvalidFile, p, ": header must be a JSON object, found ",
                header.type_name());
  tensor_data_ = data_ + 8 + header_len;
  const size_t data_bytes = size_ - 8 - size_t(header_len);

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object())
        throw_error(ErrorCode::kInvalidFile, p, ": __metadata__ must be an object, found ",
                    v.type_name());
      for (auto m = v.begin(); m != v.end(); ++m)
        if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
      continue;
    }
    auto bad = [&](const auto&... parts) {
      throw_error(ErrorCode::kInvalidFile, p, ": tensor '", name, "' ", parts...);
    };
    if (!v.is_object()) bad("entry must be an object, found ", json_brief(v));
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) bad("has no string 'dtype'");
    if (sh == v.end() || !sh->is_array()) bad("has no array 'shape'");
    if (off == v.end() || !off->is_array()) bad("has no array 'data_offsets'");

    const std::string dname = dt->get<std::string>();
    const StDType* known = nullptr;
    for (const auto& d : kStDTypes)
      if (dname == d.name) known = &d;
    if (!known)
      bad("has unknown dtype '", dname,
          "' (expected one of F32, F16, BF16, I8, U8, I32, I64, F8_E4M3)");
    if (!known->ok)
      throw_error(ErrorCode::kUnsupported, p, ": tensor '", name, "' has dtype ", dname,
                  ", which kiln does not load (supported: F32, F16, BF16, I8, U8, I32, I64, "
                  "F8_E4M3)");

    Entry e;
    e.info.dtype = known->dtype;
    // numel, and the product of the non-zero dims, which must not overflow either: a
    // shape like [0, 2^40, 2^40] holds nothing yet breaks anyone who multiplies it out.
    uint64_t numel = 1, nonzero = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_integer() || (d.is_number_integer() && !d.is_number_unsigned() &&
                                     d.get<int64_t>() < 0))
        bad("shape ", json_brief(*sh), " must hold non-negative integers");
      uint64_t n = d.get<uint64_t>();
      if (n > uint64_t(INT64_MAX) || __builtin_mul_overflow(numel, n, &numel) ||
          __builtin_mul_overflow(nonzero, n ? n : 1, &nonzero) || nonzero > uint64_t(INT64_MAX))
        bad("shape ", json_brief(*sh), " has an element count that overflows");
      e.info.shape.push_back(int64_t(n));
    }
    uint64_t need = 0;
    if (__builtin_mul_overflow(numel, uint64_t(dtype_size(e.info.dtype)), &need))
      bad("shape ", json_brief(*sh), " has a byte size that overflows");
    if (off->size() != 2 || !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      bad("data_offsets ", json_brief(*off), " must be two non-negative integers [begin, end]");
    uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (begin > end)
      bad("data_offsets [", begin, ", ", end, "] have begin after end");
    if (end > data_bytes)
      bad("data_offsets [", begin, ", ", end, "] need ", end,
          " bytes but the file's data section holds ", data_bytes, " (truncated file?)");
    if (end - begin != need)
      bad("data_offsets [", begin, ", ", end, "] span ", end - begin, " bytes but dtype ", dname,
          " and shape ", shape_to_string(e.info.shape), " need ", need, " bytes");
    e.info.nbytes = size_t(need);
    e.offset = size_t(begin);
    entries_.emplace(name, std::move(e));
    names_.push_back(name);
  }
  // nlohmann::json objects iterate in key order, so names_ is already sorted.
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end())
    throw_error(ErrorCode::kNotFound, label_, ": no tensor named '", name, "' (the file has ",
                entries_.size(), " tensors)");
  return it->second;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  return entry(name).info;
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const Entry& e = entry(name);
  // const_cast: Tensor has no const view; the mapping is PROT_READ, so a write faults.
  return Tensor::view(const_cast<uint8_t*>(tensor_data_ + e.offset), e.info.dtype, e.info.shape,
                      keepalive_);
}

Tensor SafetensorsFile::tensor_copy(const std::string& name, DType want) const {
  const Entry& e = entry(name);
  Tensor out(want, e.info.shape);
  const uint8_t* src = tensor_data_ + e.offset;
  if (want == e.info.dtype) {
    std::memcpy(out.data(), src, e.info.nbytes);
  } else {
    // dtype_convert reads through typed pointers; stage unaligned data into an aligned
    // buffer first so the conversion never does a misaligned load.
    Tensor staged(e.info.dtype, e.info.shape);
    std::memcpy(staged.data(), src, e.info.nbytes);
    dtype_convert(staged.data(), e.info.dtype, out.data(), want, size_t(out.numel()));
  }
  return out;
}

}  // namespace kiln
