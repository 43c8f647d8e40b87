// GGUF parsing, validation and tensor loading (see gguf.h).
#include "frontends/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/mapped_file.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace kiln {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32

// A bounds-checked little-endian cursor; every read names what it was reading.
class Cursor {
 public:
  Cursor(const std::string& label, const uint8_t* p, size_t n) : label_(label), p_(p), n_(n) {}
  size_t pos() const { return pos_; }
  size_t left() const { return n_ - pos_; }

  void need(uint64_t bytes, const char* what) const {
    if (bytes > left())
      throw_error(ErrorCode::kInvalidFile, label_, ": truncated while reading ", what, " at byte ",
                  pos_, " (need ", bytes, " bytes, ", left(), " left)");
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    uint64_t len = read<uint64_t>(what);
    if (len > left())
      throw_error(ErrorCode::kInvalidFile, label_, ": ", what, " at byte ", pos_ - 8,
                  " claims a length of ", len, " bytes but only ", left(), " remain");
    std::string s(reinterpret_cast<const char*>(p_ + pos_), size_t(len));
    pos_ += size_t(len);
    return s;
  }
  const uint8_t* take(uint64_t bytes, const char* what) {
    need(bytes, what);
    const uint8_t* q = p_ + pos_;
    pos_ += size_t(bytes);
    return q;
  }

 private:
  const std::string& label_;
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    default: return 0;
  }
}

bool is_int(GgufType t) {
  return scalar_size(t) != 0 && t != GgufType::kF32 && t != GgufType::kF64 &&
         t != GgufType::kBool;
}

// Decodes one scalar from raw little-endian bytes into v.u / v.i / v.f.
void decode_scalar(GgufType t, const uint8_t* p, GgufValue& v) {
  auto get = [&](auto x) {
    std::memcpy(&x, p, sizeof(x));
    return x;
  };
  switch (t) {
    case GgufType::kU8: v.u = get(uint8_t{}); break;
    case GgufType::kBool: v.u = get(uint8_t{}) != 0; break;
    case GgufType::kU16: v.u = get(uint16_t{}); break;
    case GgufType::kU32: v.u = get(uint32_t{}); break;
    case GgufType::kU64: v.u = get(uint64_t{}); break;
    case GgufType::kI8: v.i = get(int8_t{}); break;
    case GgufType::kI16: v.i = get(int16_t{}); break;
    case GgufType::kI32: v.i = get(int32_t{}); break;
    case GgufType::kI64: v.i = get(int64_t{}); break;
    case GgufType::kF32: v.f = get(float{}); break;
    case GgufType::kF64: v.f = get(double{}); break;
    default: break;
  }
  switch (t) {
    case GgufType::kU8: case GgufType::kBool: case GgufType::kU16: case GgufType::kU32:
    case GgufType::kU64:
      v.i = v.u <= uint64_t(INT64_MAX) ? int64_t(v.u) : 0;
      v.f = double(v.u);
      break;
    case GgufType::kI8: case GgufType::kI16: case GgufType::kI32: case GgufType::kI64:
      v.u = v.i >= 0 ? uint64_t(v.i) : 0;
      v.f = double(v.i);
      break;
    default: break;
  }
}

GgufValue read_value(Cursor& c, GgufType type, const std::string& label, const std::string& key,
                     int depth) {
  GgufValue v;
  v.type = type;
  if (size_t n = scalar_size(type)) {
    decode_scalar(type, c.take(n, "a metadata value"), v);
    return v;
  }
  if (type == GgufType::kString) {
    v.str = c.read_string("a metadata string");
    return v;
  }
  if (type != GgufType::kArray)
    throw_error(ErrorCode::kInvalidFile, label, ": metadata key '", key, "' has unknown type ",
                uint32_t(type), " (expected 0..12)");
  if (depth >= GgufFile::kMaxArrayNesting)
    throw_error(ErrorCode::kInvalidFile, label, ": metadata key '", key, "' nests arrays deeper than ",
                GgufFile::kMaxArrayNesting, " levels");
  v.elem_type = GgufType(c.read<uint32_t>("an array element type"));
  v.count = c.read<uint64_t>("an array length");
  // The smallest encoding of one element bounds the count before anything is reserved.
  size_t min_elem = scalar_size(v.elem_type);
  if (v.elem_type == GgufType::kString) min_elem = 8;
  else if (v.elem_type == GgufType::kArray) min_elem = 12;
  else if (min_elem == 0)
    throw_error(ErrorCode::kInvalidFile, label, ": metadata array '", key,
                "' has unknown element type ", uint32_t(v.elem_type), " (expected 0..12)");
  if (v.count > c.left() / min_elem)
    throw_error(ErrorCode::kInvalidFile, label, ": metadata array '", key, "' claims ", v.count,
                " elements of ", gguf_type_name(v.elem_type), " but only ", c.left(),
                " bytes remain in the file");
  if (scalar_size(v.elem_type)) {
    const uint8_t* p = c.take(v.count * min_elem, "array data");
    v.raw.assign(p, p + v.count * min_elem);
  } else if (v.elem_type == GgufType::kString) {
    v.strs.reserve(size_t(v.count));
    for (uint64_t k = 0; k < v.count; ++k) v.strs.push_back(c.read_string("an array string"));
  } else {
    v.items.reserve(size_t(v.count));
    for (uint64_t k = 0; k < v.count; ++k)
      v.items.push_back(read_value(c, GgufType::kArray, label, key, depth + 1));
  }
  return v;
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  static const char* const kNames[] = {"u8",  "i8",     "u16",   "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  return uint32_t(t) <= 12 ? kNames[uint32_t(t)] : "unknown";
}

GgufFile GgufFile::open(const std::string& path) {
  auto mf = MappedFile::open(path);
  const uint8_t* data = mf->data();
  size_t size = mf->size();
  return from_memory(data, size, path, std::move(mf));
}

GgufFile GgufFile::from_memory(const uint8_t* data, size_t size, std::string label,
                               std::shared_ptr<const void> keepalive) {
  GgufFile f;
  f.label_ = std::move(label);
  f.data_ = data;
  f.size_ = size;
  f.keepalive_ = std::move(keepalive);
  f.parse();
  return f;
}

void GgufFile::parse() {
  const std::string& p = label_;
  Cursor c(p, data_, size_);
  if (size_ < 4 || c.read<uint32_t>("magic") != kGgufMagic)
    throw_error(ErrorCode::kInvalidFile, p, ": not a GGUF file (expected magic 'GGUF' at byte 0)");
  version_ = c.read<uint32_t>("version");
  if (version_ == 1)
    throw_error(ErrorCode::kUnsupported, p,
                ": GGUF version 1 is obsolete; re-convert the model with a current llama.cpp");
  if (version_ != 2 && version_ != 3)
    throw_error(ErrorCode::kInvalidFile, p, ": GGUF version ", version_,
                " is not one kiln reads (expected 2 or 3)");
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // A key/value takes at least 13 bytes (length, type, one byte); a tensor info 24.
  if (n_kv > c.left() / 13)
    throw_error(ErrorCode::kInvalidFile, p, ": header claims ", n_kv,
                " metadata entries but the file has room for at most ", c.left() / 13);
  if (n_tensors > c.left() / 24)
    throw_error(ErrorCode::kInvalidFile, p, ": header claims ", n_tensors,
                " tensors but the file has room for at most ", c.left() / 24);

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.read_string("a metadata key");
    GgufType type = GgufType(c.read<uint32_t>("a metadata type"));
    GgufValue v = read_value(c, type, p, key, 0);
    if (!kv_.emplace(key, std::move(v)).second)
      throw_error(ErrorCode::kInvalidFile, p, ": metadata key '", key, "' appears twice");
  }
  if (has_key("general.alignment")) {
    const GgufValue& a = kv_.at("general.alignment");
    if (!is_int(a.type) || a.u == 0 || (a.u & (a.u - 1)) != 0 || a.u > (1u << 20))
      throw_error(ErrorCode::kInvalidFile, p, ": general.alignment must be a power of two up to ",
                  1u << 20, ", found ", a.u);
    alignment_ = a.u;
  }

  tensors_.reserve(size_t(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    t.name = c.read_string("a tensor name");
    auto bad = [&](const auto&... parts) {
      throw_error(ErrorCode::kInvalidFile, p, ": tensor '", t.name, "' ", parts...);
    };
    const uint32_t n_dims = c.read<uint32_t>("a tensor's dimension count");
    if (n_dims > uint32_t(kMaxDims)) bad("has ", n_dims, " dimensions (at most ", kMaxDims, ")");
    // numel and the product of the non-zero dims must both fit (see safetensors.cpp).
    uint64_t numel = 1, nonzero = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = c.read<uint64_t>("a tensor dimension");
      if (ne > uint64_t(INT64_MAX) || __builtin_mul_overflow(numel, ne, &numel) ||
          __builtin_mul_overflow(nonzero, ne ? ne : 1, &nonzero) || nonzero > uint64_t(INT64_MAX))
        bad("has dimensions whose element count overflows");
      t.ne.push_back(int64_t(ne));
    }
    t.shape.assign(t.ne.rbegin(), t.ne.rend());
    t.numel = int64_t(numel);
    t.type = c.read<uint32_t>("a tensor type");
    t.offset = c.read<uint64_t>("a tensor offset");
    const GgmlTypeTraits* tr = ggml_type_traits(t.type);
    if (!tr)
      throw_error(ErrorCode::kUnsupported, p, ": tensor '", t.name, "' has ggml type ", t.type,
                  ", which kiln does not know (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
                  "Q5_1, Q8_0, Q2_K..Q8_K, integer types)");
    if (!t.ne.empty() && t.ne[0] % tr->block_size != 0)
      bad("has a row of ", t.ne[0], " elements, not a multiple of the ", tr->name, " block size ",
          tr->block_size);
    if (t.ne.empty() && tr->block_size != 1) bad("is a scalar of block type ", tr->name);
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(numel / uint64_t(tr->block_size), uint64_t(tr->type_size), &bytes))
      bad("has a byte size that overflows");
    t.nbytes = size_t(bytes);
    if (t.offset % alignment_ != 0)
      bad("offset ", t.offset, " is not a multiple of the alignment ", alignment_);
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) bad("appears twice");
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t start = (uint64_t(c.pos()) + alignment_ - 1) / alignment_ * alignment_;
  const uint64_t data_bytes = start <= size_ ? size_ - start : 0;
  if (!tensors_.empty() && start > size_)
    throw_error(ErrorCode::kInvalidFile, p, ": the data section would start at byte ", start,
                " past the end of the ", size_, "-byte file (truncated file?)");
  data_section_ = data_ + std::min<uint64_t>(start, size_);
  for (const auto& t : tensors_) {
    if (t.offset > data_bytes || t.nbytes > data_bytes - t.offset)
      throw_error(ErrorCode::kInvalidFile, p, ": tensor '", t.name, "' (", ggml_type_name(t.type),
                  ", ne ", shape_to_string(t.ne), ") needs bytes [", t.offset, ", ",
                  t.offset + t.nbytes, ") of the data section, which holds ", data_bytes,
                  " (truncated file?)");
  }
}

std::vector<std::string> GgufFile::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : kv_) out.push_back(k);
  return out;
}

const GgufValue& GgufFile::value(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end())
    throw_error(ErrorCode::kNotFound, label_, ": no metadata key '", key, "'");
  return it->second;
}

namespace {
[[noreturn]] void wrong_type(const std::string& label, const std::string& key, const char* want,
                             const GgufValue& v) {
  std::string found = gguf_type_name(v.type);
  if (v.type == GgufType::kArray) found += std::string(" of ") + gguf_type_name(v.elem_type);
  throw_error(ErrorCode::kInvalidFile, label, ": metadata key '", key, "' should be ", want,
              ", found ", found);
}
}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::kString) wrong_type(label_, key, "a string", v);
  return v.str;
}

uint32_t GgufFile::get_u32(const std::string& key) const {
  const GgufValue& v = value(key);
  if (!is_int(v.type) || v.i < 0 || v.u > UINT32_MAX || (v.u == 0 && v.i != 0))
    wrong_type(label_, key, "an integer in [0, 2^32)", v);
  return uint32_t(v.u);
}

int64_t GgufFile::get_i64(const std::string& key) const {
  const GgufValue& v = value(key);
  if (!is_int(v.type) || (v.type == GgufType::kU64 && v.u > uint64_t(INT64_MAX)))
    wrong_type(label_, key, "an integer", v);
  return v.i;
}

float GgufFile::get_f32(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type == GgufType::kString || v.type == GgufType::kArray || v.type == GgufType::kBool)
    wrong_type(label_, key, "a number", v);
  return float(v.f);
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::kBool) wrong_type(label_, key, "a bool", v);
  return v.u != 0;
}

uint64_t GgufFile::get_array_size(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::kArray) wrong_type(label_, key, "an array", v);
  return v.count;
}

std::vector<std::string> GgufFile::get_array_strings(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::kArray || v.elem_type != GgufType::kString)
    wrong_type(label_, key, "an array of string", v);
  return v.strs;
}

std::vector<int32_t> GgufFile::get_array_i32(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::kArray || !is_int(v.elem_type))
    wrong_type(label_, key, "an array of integers", v);
  const size_t es = scalar_size(v.elem_type);
  std::vector<int32_t> out(size_t(v.count));
  for (size_t k = 0; k < out.size(); ++k) {
    GgufValue e;
    decode_scalar(v.elem_type, v.raw.data() + k * es, e);
    const bool is_signed = e.i < 0 || v.elem_type == GgufType::kI64 ||
                           v.elem_type == GgufType::kI32 || v.elem_type == GgufType::kI16 ||
                           v.elem_type == GgufType::kI8;
    const int64_t x = is_signed ? e.i : (e.u > uint64_t(INT32_MAX) ? INT64_MAX : int64_t(e.u));
    if (x < INT32_MIN || x > INT32_MAX)
      throw_error(ErrorCode::kInvalidFile, label_, ": metadata array '", key, "' element ", k,
                  " does not fit in i32");
    out[k] = int32_t(x);
  }
  return out;
}

std::vector<float> GgufFile::get_array_f32(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::kArray || scalar_size(v.elem_type) == 0 ||
      v.elem_type == GgufType::kBool)
    wrong_type(label_, key, "an array of numbers", v);
  const size_t es = scalar_size(v.elem_type);
  std::vector<float> out(size_t(v.count));
  for (size_t k = 0; k < out.size(); ++k) {
    GgufValue e;
    decode_scalar(v.elem_type, v.raw.data() + k * es, e);
    out[k] = float(e.f);
  }
  return out;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor_info(const std::string& name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (!t)
    throw_error(ErrorCode::kNotFound, label_, ": no tensor named '", name, "' (the file has ",
                tensors_.size(), " tensors)");
  return *t;
}

DType GgufFile::natural_dtype(uint32_t ggml_type) {
  if (ggml_type == uint32_t(GgmlType::kF16)) return DType::kF16;
  if (ggml_type == uint32_t(GgmlType::kBF16)) return DType::kBF16;
  return DType::kF32;
}

Tensor GgufFile::load(const std::string& name, DType want) const {
  const GgufTensorInfo& t = tensor_info(name);
  const GgmlTypeTraits* tr = ggml_type_traits(t.type);
  const uint8_t* src = tensor_data(t);
  const DType natural = natural_dtype(t.type);
  if (natural != DType::kF32 || t.type == uint32_t(GgmlType::kF32)) {
    Tensor out(want, t.shape);
    if (want == natural) {
      std::memcpy(out.data(), src, t.nbytes);
    } else {
      Tensor staged(natural, t.shape);  // aligned copy first: src may be unaligned
      std::memcpy(staged.data(), src, t.nbytes);
      dtype_convert(staged.data(), natural, out.data(), want, size_t(t.numel));
    }
    return out;
  }
  Tensor f32(DType::kF32, t.shape);
  const int64_t row = t.ne.empty() ? 1 : t.ne[0];
  const int64_t rows = row ? t.numel / row : 0;
  const size_t row_bytes = size_t(row / tr->block_size) * tr->type_size;
  float* dst = f32.data_as<float>();
  // Rows dequantize independently; big tensors (embeddings) take long enough to split.
  auto body = [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) tr->to_f32(src + size_t(r) * row_bytes, dst + r * row, row);
  };
  if (t.numel >= (1 << 18)) ThreadPool::global().parallel_for(rows, body, 16);
  else body(0, rows, 0);
  return want == DType::kF32 ? f32 : f32.to(want);
}

}  // namespace kiln
