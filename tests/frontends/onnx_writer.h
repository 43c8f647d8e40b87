// A minimal ONNX (protobuf wire format) writer for hand-made test models: valid ones,
// deliberately broken ones, and ones with custom-domain ops for plugin tests. Field
// numbers are onnx.proto's. Used by tests/frontends/onnx_test.cpp and
// tests/plugins/plugin_test.cpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace kiln::test::onnxw {

inline std::string varint(uint64_t v) {
  std::string s;
  do {
    uint8_t b = v & 0x7f;
    v >>= 7;
    s.push_back(char(b | (v ? 0x80 : 0)));
  } while (v);
  return s;
}
inline std::string key(uint32_t field, int wire) { return varint(uint64_t(field) << 3 | uint64_t(wire)); }
inline std::string bytes(uint32_t field, const std::string& b) { return key(field, 2) + varint(b.size()) + b; }
inline std::string num(uint32_t field, uint64_t v) { return key(field, 0) + varint(v); }
inline std::string fixed32(uint32_t field, float f) {
  std::string s(4, '\0');
  std::memcpy(s.data(), &f, 4);
  return key(field, 5) + s;
}

// ValueInfoProto of a tensor; a negative dim is the symbolic dim "n".
inline std::string value_info(const std::string& name, int32_t elem, std::vector<int64_t> dims) {
  std::string shape;
  for (int64_t d : dims) shape += bytes(1, d < 0 ? bytes(2, "n") : num(1, uint64_t(d)));
  std::string tensor_type = num(1, uint64_t(elem)) + bytes(2, shape);
  return bytes(1, name) + bytes(2, bytes(1, tensor_type));
}
// NodeProto; `extra` holds further fields (domain = field 7, attributes = field 5).
inline std::string node(const std::string& op, std::vector<std::string> in, std::vector<std::string> out,
                        const std::string& name, const std::string& extra = "") {
  std::string s;
  for (auto& i : in) s += bytes(1, i);
  for (auto& o : out) s += bytes(2, o);
  return s + bytes(3, name) + bytes(4, op) + extra;
}
inline std::string tensor(const std::string& name, int32_t dtype, std::vector<int64_t> dims, const std::string& raw) {
  std::string s;
  for (int64_t d : dims) s += num(1, uint64_t(d));
  return s + num(2, uint64_t(dtype)) + bytes(8, name) + bytes(9, raw);
}
inline std::string f32s(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// AttributeProto wrapped as a NodeProto field (5), by ONNX attribute type.
inline std::string attr_float(const std::string& name, float f) {
  return bytes(5, bytes(1, name) + num(20, 1) + fixed32(2, f));
}
inline std::string attr_int(const std::string& name, int64_t i) {
  return bytes(5, bytes(1, name) + num(20, 2) + num(3, uint64_t(i)));
}
inline std::string attr_string(const std::string& name, const std::string& s) {
  return bytes(5, bytes(1, name) + num(20, 3) + bytes(4, s));
}
inline std::string attr_floats(const std::string& name, const std::vector<float>& v) {
  std::string s = bytes(1, name) + num(20, 6);
  for (float f : v) s += fixed32(7, f);
  return bytes(5, s);
}
inline std::string attr_ints(const std::string& name, const std::vector<int64_t>& v) {
  std::string s = bytes(1, name) + num(20, 7);
  for (int64_t i : v) s += num(8, uint64_t(i));
  return bytes(5, s);
}
inline std::string attr_tensor(const std::string& name, const std::string& tensor_proto) {
  return bytes(5, bytes(1, name) + num(20, 4) + bytes(5, tensor_proto));
}

// OperatorSetIdProto as a ModelProto field (8).
inline std::string opset_import(const std::string& domain, int64_t version) {
  return bytes(8, bytes(1, domain) + num(2, uint64_t(version)));
}

}  // namespace kiln::test::onnxw
