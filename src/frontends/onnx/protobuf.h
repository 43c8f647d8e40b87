// A bounds-checked reader for the protobuf wire format, for the subset ONNX files use.
// Why our own instead of libprotobuf + libonnx: ONNX needs only five wire types and a
// dozen messages; a ~200-line reader adds no dependency (nor a generated-code version
// skew with Debian's libonnx), never allocates beyond the input's size, reports every
// malformed byte as a kiln::Error with its offset, and is easy to fuzz
// (fuzz/frontends_onnx_fuzz.cpp). Tested in tests/frontends/onnx_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::onnx {

enum class WireType : uint8_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

// Reads the fields of one message. Errors throw kiln::Error(kInvalidFile) naming
// `context` (the file and the message path, "model.onnx: graph.node[3]") and the byte
// offset in the file.
class ProtoReader {
 public:
  ProtoReader(const uint8_t* data, size_t size, std::string context, size_t base_offset = 0)
      : p_(data), end_(data + size), begin_(data), base_(base_offset), context_(std::move(context)) {}

  // Advances to the next field; false at the end of the message.
  bool next();
  uint32_t field() const { return field_; }
  WireType wire() const { return wire_; }
  const std::string& context() const { return context_; }

  // The current field's value; each checks the wire type.
  uint64_t read_varint();
  int64_t read_int64() { return static_cast<int64_t>(read_varint()); }
  int32_t read_int32() { return static_cast<int32_t>(read_varint()); }
  float read_float();
  double read_double();
  std::string_view read_bytes();
  std::string read_string() { return std::string(read_bytes()); }
  // A nested message; `name` extends the context ("node[3]").
  ProtoReader read_message(const std::string& name);
  // Skips the current field (any wire type).
  void skip();

  // Repeated scalars, packed (one length-delimited field) or not (one value per field).
  void read_repeated_int64(std::vector<int64_t>& out);
  void read_repeated_float(std::vector<float>& out);
  void read_repeated_double(std::vector<double>& out);

  [[noreturn]] void fail(const std::string& what) const;

 private:
  uint64_t varint_at(const uint8_t*& p) const;
  void need_wire(WireType w, const char* what) const;
  size_t offset(const uint8_t* p) const { return base_ + size_t(p - begin_); }

  const uint8_t* p_;
  const uint8_t* end_;
  const uint8_t* begin_;
  const uint8_t* field_start_ = nullptr;
  size_t base_;
  std::string context_;
  uint32_t field_ = 0;
  WireType wire_ = WireType::kVarint;
};

}  // namespace kiln::onnx
