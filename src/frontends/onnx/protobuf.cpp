// Protobuf wire-format reader (see protobuf.h).
#include "frontends/onnx/protobuf.h"

#include <cstring>

#include "core/status.h"

namespace kiln::onnx {

void ProtoReader::fail(const std::string& what) const {
  size_t at = offset(field_start_ ? field_start_ : p_);
  throw_error(ErrorCode::kInvalidFile, context_, ": ", what, " (field ", field_, " at byte ", at,
              "; the file is truncated or not an ONNX model)");
}

uint64_t ProtoReader::varint_at(const uint8_t*& p) const {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (p >= end_) fail("truncated varint");
    uint8_t b = *p++;
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  fail("varint longer than 10 bytes");
}

bool ProtoReader::next() {
  if (p_ >= end_) return false;
  field_start_ = p_;
  uint64_t key = varint_at(p_);
  uint64_t wire = key & 7, field = key >> 3;
  if (field == 0 || field > 0x1fffffff) fail(str_cat("invalid field number ", field));
  field_ = uint32_t(field);
  if (wire != 0 && wire != 1 && wire != 2 && wire != 5)
    fail(str_cat("unsupported wire type ", wire, " (groups are not used by ONNX)"));
  wire_ = WireType(wire);
  return true;
}

void ProtoReader::need_wire(WireType w, const char* what) const {
  static const char* names[] = {"varint", "fixed64", "length-delimited", "?", "?", "fixed32"};
  if (wire_ != w)
    fail(str_cat("wrong wire type for ", what, ": expected ", names[int(w)], ", found ", names[int(wire_)]));
}

uint64_t ProtoReader::read_varint() {
  need_wire(WireType::kVarint, "an integer");
  return varint_at(p_);
}

float ProtoReader::read_float() {
  need_wire(WireType::kFixed32, "a float");
  if (end_ - p_ < 4) fail("truncated float");
  float f;
  std::memcpy(&f, p_, 4);
  p_ += 4;
  return f;
}

double ProtoReader::read_double() {
  need_wire(WireType::kFixed64, "a double");
  if (end_ - p_ < 8) fail("truncated double");
  double d;
  std::memcpy(&d, p_, 8);
  p_ += 8;
  return d;
}

std::string_view ProtoReader::read_bytes() {
  need_wire(WireType::kBytes, "a string/bytes/message");
  uint64_t n = varint_at(p_);
  if (n > uint64_t(end_ - p_))
    fail(str_cat("length ", n, " runs past the end of the enclosing message (", end_ - p_, " bytes left)"));
  std::string_view v(reinterpret_cast<const char*>(p_), size_t(n));
  p_ += n;
  return v;
}

ProtoReader ProtoReader::read_message(const std::string& name) {
  std::string_view b = read_bytes();
  const auto* d = reinterpret_cast<const uint8_t*>(b.data());
  return ProtoReader(d, b.size(), context_ + "." + name, offset(d));
}

void ProtoReader::skip() {
  switch (wire_) {
    case WireType::kVarint: varint_at(p_); break;
    case WireType::kFixed64:
      if (end_ - p_ < 8) fail("truncated fixed64");
      p_ += 8;
      break;
    case WireType::kFixed32:
      if (end_ - p_ < 4) fail("truncated fixed32");
      p_ += 4;
      break;
    case WireType::kBytes: read_bytes(); break;
  }
}

void ProtoReader::read_repeated_int64(std::vector<int64_t>& out) {
  if (wire_ != WireType::kBytes) {
    out.push_back(read_int64());
    return;
  }
  std::string_view b = read_bytes();
  ProtoReader sub(reinterpret_cast<const uint8_t*>(b.data()), b.size(), context_,
                  offset(reinterpret_cast<const uint8_t*>(b.data())));
  sub.field_ = field_;
  const uint8_t* p = sub.p_;
  while (p < sub.end_) out.push_back(int64_t(sub.varint_at(p)));
}

template <typename T>
static void read_packed_fixed(ProtoReader& r, std::string_view b, std::vector<T>& out) {
  if (b.size() % sizeof(T)) r.fail(str_cat("packed array of ", b.size(), " bytes is not a multiple of ", sizeof(T)));
  size_t n = b.size() / sizeof(T), at = out.size();
  out.resize(at + n);
  if (n) std::memcpy(out.data() + at, b.data(), b.size());
}

void ProtoReader::read_repeated_float(std::vector<float>& out) {
  if (wire_ == WireType::kBytes) return read_packed_fixed(*this, read_bytes(), out);
  out.push_back(read_float());
}

void ProtoReader::read_repeated_double(std::vector<double>& out) {
  if (wire_ == WireType::kBytes) return read_packed_fixed(*this, read_bytes(), out);
  out.push_back(read_double());
}

}  // namespace kiln::onnx
