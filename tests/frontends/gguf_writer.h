// A minimal GGUF writer for tests: metadata of every type, tensors with raw bytes,
// and knobs to produce broken files (wrong counts, lengths, types, offsets).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace kiln::test {

class GgufWriter {
 public:
  uint32_t version = 3;
  uint64_t alignment = 32;

  template <typename T>
  static void put(std::string& s, T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  static void put_str(std::string& s, const std::string& v) {
    put<uint64_t>(s, v.size());
    s += v;
  }

  // Raw key/value: `value` holds the encoded value (type tag excluded).
  void kv_raw(const std::string& key, uint32_t type, const std::string& value) {
    put_str(kv_, key);
    put<uint32_t>(kv_, type);
    kv_ += value;
    ++n_kv_;
  }
  template <typename T>
  void kv(const std::string& key, uint32_t type, T v) {
    std::string s;
    put<T>(s, v);
    kv_raw(key, type, s);
  }
  void kv_u32(const std::string& k, uint32_t v) { kv(k, 4, v); }
  void kv_f32(const std::string& k, float v) { kv(k, 6, v); }
  void kv_string(const std::string& k, const std::string& v) {
    std::string s;
    put_str(s, v);
    kv_raw(k, 8, s);
  }
  void kv_strings(const std::string& k, const std::vector<std::string>& v) {
    std::string s;
    put<uint32_t>(s, 8);
    put<uint64_t>(s, v.size());
    for (const auto& x : v) put_str(s, x);
    kv_raw(k, 9, s);
  }
  template <typename T>
  void kv_array(const std::string& k, uint32_t elem_type, const std::vector<T>& v) {
    std::string s;
    put<uint32_t>(s, elem_type);
    put<uint64_t>(s, v.size());
    for (const auto& x : v) put<T>(s, x);
    kv_raw(k, 9, s);
  }

  // ne innermost-first, as GGUF stores it; data must be the tensor's exact bytes.
  void tensor(const std::string& name, uint32_t type, std::vector<uint64_t> ne,
              const std::string& data) {
    tensors_.push_back({name, type, std::move(ne), data});
  }

  std::string bytes() const {
    std::string s;
    put<uint32_t>(s, 0x46554747);
    put<uint32_t>(s, version);
    put<uint64_t>(s, tensors_.size());
    put<uint64_t>(s, n_kv_);
    s += kv_;
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      put_str(s, t.name);
      put<uint32_t>(s, uint32_t(t.ne.size()));
      for (auto n : t.ne) put<uint64_t>(s, n);
      put<uint32_t>(s, t.type);
      put<uint64_t>(s, offset);
      offsets.push_back(offset);
      offset = (offset + t.data.size() + alignment - 1) / alignment * alignment;
    }
    s.resize((s.size() + alignment - 1) / alignment * alignment, '\0');
    const size_t base = s.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      s.resize(base + offsets[i], '\0');
      s += tensors_[i].data;
    }
    return s;
  }

 private:
  struct T {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    std::string data;
  };
  std::string kv_;
  uint64_t n_kv_ = 0;
  std::vector<T> tensors_;
};

// One Q4_K super-block (block_q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins,
// 128 bytes of codes) packed as ggml's quantize_row_q4_K_ref packs it, from 256 codes
// 0..15, eight scales sc and mins m 0..63, and the f16 bits of d and dmin. Its elements
// are d * sc[e / 32] * codes[e] - dmin * m[e / 32].
inline std::string q4_k_block(uint16_t d, uint16_t dmin, const uint8_t sc[8], const uint8_t m[8],
                              const uint8_t codes[256]) {
  std::string b(144, '\0');
  std::memcpy(b.data(), &d, 2);
  std::memcpy(b.data() + 2, &dmin, 2);
  auto* scales = reinterpret_cast<uint8_t*>(b.data() + 4);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      scales[j] = sc[j];
      scales[j + 4] = m[j];
    } else {
      scales[j + 4] = uint8_t((sc[j] & 0xf) | ((m[j] & 0xf) << 4));
      scales[j - 4] |= uint8_t((sc[j] >> 4) << 6);
      scales[j] |= uint8_t((m[j] >> 4) << 6);
    }
  }
  auto* qs = reinterpret_cast<uint8_t*>(b.data() + 16);
  for (int j = 0; j < 256; j += 64, qs += 32)
    for (int l = 0; l < 32; ++l) qs[l] = uint8_t(codes[j + l] | (codes[j + l + 32] << 4));
  return b;
}

}  // namespace kiln::test
