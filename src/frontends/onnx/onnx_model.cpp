// ONNX ModelProto decoding (see onnx_model.h). Field numbers follow onnx/onnx.proto3.
#include "frontends/onnx/onnx_model.h"

#include <cstring>
#include <filesystem>

#include "core/mapped_file.h"
#include "core/status.h"
#include "frontends/onnx/protobuf.h"

namespace kiln::onnx {

namespace {

// Largest element count kiln accepts for one tensor (2^40): beyond it products of
// dims could overflow and no real model is that large.
constexpr int64_t kMaxNumel = int64_t(1) << 40;

struct Ctx {
  std::string label, base_dir;
};

struct RawTensor {
  OnnxTensor t;
  std::string_view raw;
  bool has_raw = false;
  std::vector<float> floats;
  std::vector<int64_t> int32s, int64s;  // int32_data is varint-encoded like int64
  std::vector<double> doubles;
  bool external = false;
  std::vector<std::pair<std::string, std::string>> external_data;
};

std::string read_external_entry(ProtoReader r, std::string* value) {
  std::string key;
  while (r.next()) {
    if (r.field() == 1) key = r.read_string();
    else if (r.field() == 2) *value = r.read_string();
    else r.skip();
  }
  return key;
}

void load_external(RawTensor& rt, size_t nbytes, const Ctx& ctx, const std::string& where) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (auto& entry : rt.external_data) {
    const std::string& k = entry.first;
    const std::string& v = entry.second;
    auto num = [&](const std::string& s) {
      char* rest = nullptr;
      long long x = std::strtoll(s.c_str(), &rest, 10);
      if (s.empty() || *rest || x < 0)
        throw_error(ErrorCode::kInvalidFile, where, ": external_data ", k, " = '", s, "' is not a byte count");
      return int64_t(x);
    };
    if (k == "location") location = v;
    else if (k == "offset") offset = num(v);
    else if (k == "length") length = num(v);
  }
  if (location.empty())
    throw_error(ErrorCode::kInvalidFile, where, ": data_location is EXTERNAL but external_data has no 'location'");
  if (ctx.base_dir.empty())
    throw_error(ErrorCode::kUnsupported, where, ": external data '", location,
                "' needs the model's directory (load the model from a file)");
  namespace fs = std::filesystem;
  fs::path rel(location);
  bool escapes = rel.is_absolute();
  for (auto& part : rel) escapes = escapes || part == "..";
  if (escapes)
    throw_error(ErrorCode::kInvalidFile, where, ": external data location '", location,
                "' must be a relative path inside the model's directory");
  std::string path = (fs::path(ctx.base_dir) / rel).string();
  auto file = MappedFile::open(path);
  if (length >= 0 && size_t(length) != nbytes)
    throw_error(ErrorCode::kInvalidFile, where, ": external_data length ", length, " but the tensor needs ",
                nbytes, " bytes");
  if (size_t(offset) > file->size() || nbytes > file->size() - size_t(offset))
    throw_error(ErrorCode::kInvalidFile, where, ": external data [", offset, ", ", offset + int64_t(nbytes),
                ") runs past the end of '", path, "' (", file->size(), " bytes)");
  std::memcpy(rt.t.value.data(), file->data() + offset, nbytes);
}

OnnxTensor parse_tensor(ProtoReader r, const Ctx& ctx) {
  RawTensor rt;
  int32_t location = 0;
  while (r.next()) {
    switch (r.field()) {
      case 1: r.read_repeated_int64(rt.t.dims); break;
      case 2: rt.t.data_type = r.read_int32(); break;
      case 8: rt.t.name = r.read_string(); break;
      case 9: rt.raw = r.read_bytes(); rt.has_raw = true; break;
      case 4: r.read_repeated_float(rt.floats); break;
      case 5: r.read_repeated_int64(rt.int32s); break;
      case 7: r.read_repeated_int64(rt.int64s); break;
      case 10: r.read_repeated_double(rt.doubles); break;
      case 13: {
        std::string v;
        std::string k = read_external_entry(r.read_message("external_data"), &v);
        rt.external_data.emplace_back(k, v);
        break;
      }
      case 14: location = r.read_int32(); break;
      case 3: r.fail("segmented tensors are not supported");
      case 6: r.fail(str_cat("string tensors are not supported"));
      default: r.skip();
    }
  }
  std::string where = str_cat(r.context(), " (tensor '", rt.t.name, "')");
  DType dt = dtype_from_onnx(rt.t.data_type, where);
  int64_t numel = 1;
  for (int64_t d : rt.t.dims) {
    if (d < 0) throw_error(ErrorCode::kInvalidFile, where, ": negative dim ", d);
    if (d && numel > kMaxNumel / d)
      throw_error(ErrorCode::kInvalidFile, where, ": ", shape_to_string(rt.t.dims), " has too many elements");
    numel *= d;
  }
  size_t esize = dtype_size(dt), nbytes = size_t(numel) * esize;
  auto count_error = [&](const char* field, size_t n) {
    throw_error(ErrorCode::kInvalidFile, where, ": shape ", shape_to_string(rt.t.dims), " of ",
                onnx_dtype_name(rt.t.data_type), " needs ", numel, " values, ", field, " holds ", n);
  };
  if (location == 1) {
    rt.t.value = Tensor(dt, rt.t.dims);
    load_external(rt, nbytes, ctx, where);
    return std::move(rt.t);
  }
  if (rt.has_raw) {
    if (rt.raw.size() != nbytes)
      throw_error(ErrorCode::kInvalidFile, where, ": raw_data has ", rt.raw.size(), " bytes, shape ",
                  shape_to_string(rt.t.dims), " of ", onnx_dtype_name(rt.t.data_type), " needs ", nbytes);
    rt.t.value = Tensor(dt, rt.t.dims);
    if (nbytes) std::memcpy(rt.t.value.data(), rt.raw.data(), nbytes);
    return std::move(rt.t);
  }
  switch (rt.t.data_type) {
    case kOnnxFloat:
      if (rt.floats.size() != size_t(numel)) count_error("float_data", rt.floats.size());
      rt.t.value = Tensor(dt, rt.t.dims);
      if (numel) std::memcpy(rt.t.value.data(), rt.floats.data(), nbytes);
      break;
    case kOnnxInt64:
      if (rt.int64s.size() != size_t(numel)) count_error("int64_data", rt.int64s.size());
      rt.t.value = Tensor(dt, rt.t.dims);
      if (numel) std::memcpy(rt.t.value.data(), rt.int64s.data(), nbytes);
      break;
    default: {  // int32_data carries int32, int8, uint8, bool and 16-bit floats as bits
      if (rt.int32s.size() != size_t(numel)) count_error("int32_data", rt.int32s.size());
      rt.t.value = Tensor(dt, rt.t.dims);
      auto* out = static_cast<uint8_t*>(rt.t.value.data());
      for (size_t i = 0; i < size_t(numel); ++i) {
        int64_t v = rt.int32s[i];
        if (esize == 4) { int32_t x = int32_t(v); std::memcpy(out + 4 * i, &x, 4); }
        else if (esize == 2) { uint16_t x = uint16_t(v); std::memcpy(out + 2 * i, &x, 2); }
        else out[i] = uint8_t(v);
      }
    }
  }
  return std::move(rt.t);
}

OnnxAttribute parse_attribute(ProtoReader r, const Ctx& ctx) {
  OnnxAttribute a;
  while (r.next()) {
    switch (r.field()) {
      case 1: a.name = r.read_string(); break;
      case 20: a.type = AttrType(r.read_int32()); break;
      case 2: a.f = r.read_float(); break;
      case 3: a.i = r.read_int64(); break;
      case 4: a.s = r.read_string(); break;
      case 5: a.t = std::make_shared<OnnxTensor>(parse_tensor(r.read_message("t"), ctx)); break;
      case 7: r.read_repeated_float(a.floats); break;
      case 8: r.read_repeated_int64(a.ints); break;
      case 9: a.strings.push_back(r.read_string()); break;
      default: r.skip();  // subgraphs (If/Loop bodies) and sparse tensors: the op is refused later
    }
  }
  return a;
}

OnnxNode parse_node(ProtoReader r, const Ctx& ctx) {
  OnnxNode n;
  while (r.next()) {
    switch (r.field()) {
      case 1: n.inputs.push_back(r.read_string()); break;
      case 2: n.outputs.push_back(r.read_string()); break;
      case 3: n.name = r.read_string(); break;
      case 4: n.op_type = r.read_string(); break;
      case 7: n.domain = r.read_string(); break;
      case 5: n.attrs.push_back(parse_attribute(r.read_message(str_cat("attribute[", n.attrs.size(), "]")), ctx)); break;
      default: r.skip();
    }
  }
  return n;
}

void parse_shape(ProtoReader r, OnnxValueInfo& v) {
  v.has_shape = true;
  while (r.next()) {
    if (r.field() != 1) { r.skip(); continue; }
    ProtoReader d = r.read_message(str_cat("dim[", v.shape.size(), "]"));
    Dim dim("?");
    while (d.next()) {
      if (d.field() == 1) {
        int64_t x = d.read_int64();
        if (x < 0) d.fail(str_cat("negative dim_value ", x));
        dim = Dim(x);
      } else if (d.field() == 2) {
        std::string s = d.read_string();
        dim = Dim(s.empty() ? std::string("?") : s);
      } else {
        d.skip();
      }
    }
    v.shape.push_back(dim);
  }
}

OnnxValueInfo parse_value_info(ProtoReader r) {
  OnnxValueInfo v;
  while (r.next()) {
    if (r.field() == 1) { v.name = r.read_string(); continue; }
    if (r.field() != 2) { r.skip(); continue; }
    ProtoReader type = r.read_message("type");
    while (type.next()) {
      if (type.field() != 1) { type.skip(); continue; }  // sequence/map/optional: elem_type stays 0
      ProtoReader tt = type.read_message("tensor_type");
      while (tt.next()) {
        if (tt.field() == 1) v.elem_type = tt.read_int32();
        else if (tt.field() == 2) parse_shape(tt.read_message("shape"), v);
        else tt.skip();
      }
    }
  }
  return v;
}

OnnxGraph parse_graph(ProtoReader r, const Ctx& ctx) {
  OnnxGraph g;
  while (r.next()) {
    switch (r.field()) {
      case 1: g.nodes.push_back(parse_node(r.read_message(str_cat("node[", g.nodes.size(), "]")), ctx)); break;
      case 2: g.name = r.read_string(); break;
      case 5: g.initializers.push_back(parse_tensor(r.read_message(str_cat("initializer[", g.initializers.size(), "]")), ctx)); break;
      case 11: g.inputs.push_back(parse_value_info(r.read_message(str_cat("input[", g.inputs.size(), "]")))); break;
      case 12: g.outputs.push_back(parse_value_info(r.read_message(str_cat("output[", g.outputs.size(), "]")))); break;
      case 15: r.fail("sparse initializers are not supported");
      default: r.skip();
    }
  }
  return g;
}

}  // namespace

DType dtype_from_onnx(int32_t t, const std::string& what) {
  switch (t) {
    case kOnnxFloat: return DType::kF32;
    case kOnnxUint8: return DType::kU8;
    case kOnnxInt8: return DType::kI8;
    case kOnnxInt32: return DType::kI32;
    case kOnnxInt64: return DType::kI64;
    case kOnnxBool: return DType::kU8;
    case kOnnxFloat16: return DType::kF16;
    case kOnnxBFloat16: return DType::kBF16;
  }
  throw_error(ErrorCode::kUnsupported, what, ": ONNX element type ", t, " (", onnx_dtype_name(t),
              ") is not supported (kiln reads float, float16, bfloat16, int8, uint8, int32, int64, bool)");
}

const char* onnx_dtype_name(int32_t t) {
  static const char* names[] = {"undefined", "float", "uint8", "int8", "uint16", "int16", "int32", "int64",
                                "string", "bool", "float16", "double", "uint32", "uint64", "complex64",
                                "complex128", "bfloat16"};
  return t >= 0 && t <= 16 ? names[t] : "unknown";
}

const OnnxAttribute* OnnxNode::attr(const std::string& k) const {
  for (auto& a : attrs)
    if (a.name == k) return &a;
  return nullptr;
}

int64_t OnnxModel::default_opset() const {
  for (auto& [d, v] : opsets)
    if (d.empty() || d == "ai.onnx") return v;
  return 0;
}

OnnxModel parse_onnx_model(const uint8_t* data, size_t size, const std::string& label,
                           const std::string& base_dir) {
  Ctx ctx{label, base_dir};
  ProtoReader r(data, size, label + ": model");
  OnnxModel m;
  bool has_graph = false;
  while (r.next()) {
    switch (r.field()) {
      case 1: m.ir_version = r.read_int64(); break;
      case 2: m.producer_name = r.read_string(); break;
      case 3: m.producer_version = r.read_string(); break;
      case 7: m.graph = parse_graph(r.read_message("graph"), ctx); has_graph = true; break;
      case 8: {
        ProtoReader o = r.read_message(str_cat("opset_import[", m.opsets.size(), "]"));
        std::pair<std::string, int64_t> e{"", 0};
        while (o.next()) {
          if (o.field() == 1) e.first = o.read_string();
          else if (o.field() == 2) e.second = o.read_int64();
          else o.skip();
        }
        m.opsets.push_back(e);
        break;
      }
      default: r.skip();
    }
  }
  if (!has_graph)
    throw_error(ErrorCode::kInvalidFile, label, ": not an ONNX model (no graph; is the file truncated or of another format?)");
  return m;
}

OnnxModel load_onnx_model(const std::string& path) {
  auto file = MappedFile::open(path);
  std::string dir = std::filesystem::path(path).parent_path().string();
  return parse_onnx_model(file->data(), file->size(), path, dir.empty() ? "." : dir);
}

}  // namespace kiln::onnx
