// CPU implementations of the generic tensor ops (ir/generic_ops.h): numpy-broadcast
// elementwise math, comparisons, MatMul, Softmax, reductions and the shape/index ops
// of imported ONNX graphs, over f32, i64, i32 and u8 (bool). Shapes come from the
// actual tensors; a shape the op cannot take is a kiln::Error naming the node.
// Checked end to end against onnxruntime/PyTorch by tests/frontends/onnx_test.cpp.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/cpu_ops.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "ir/generic_ops.h"

namespace kiln::cpu {

namespace {

using Dims = std::vector<int64_t>;

[[noreturn]] void run_error(const std::string& node, const std::string& op, const std::string& what) {
  throw_error(ErrorCode::kInvalidArgument, "node '", node, "' (", op, "): ", what);
}

int64_t numel_of(const Dims& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

template <class F>
void visit_dtype(DType t, const std::string& node, F&& f) {
  switch (t) {
    case DType::kF32: f(float{}); return;
    case DType::kI64: f(int64_t{}); return;
    case DType::kI32: f(int32_t{}); return;
    case DType::kU8: f(uint8_t{}); return;
    case DType::kI8: f(int8_t{}); return;
    default:
      throw_error(ErrorCode::kUnsupported, "cpu: node '", node, "' has dtype ", dtype_name(t),
                  " (generic ops run f32, i64, i32, i8 and u8/bool)");
  }
}

Dims broadcast_dims(const std::string& node, const std::string& op, const Dims& a, const Dims& b) {
  size_t r = std::max(a.size(), b.size());
  Dims out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i + a.size() >= r ? a[i + a.size() - r] : 1;
    int64_t db = i + b.size() >= r ? b[i + b.size() - r] : 1;
    if (da != db && da != 1 && db != 1)
      run_error(node, op, str_cat("cannot broadcast ", shape_to_string(a), " with ", shape_to_string(b)));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Element strides of `shape` read as `out` (0 along broadcast dims).
Dims broadcast_strides(const Dims& shape, const Dims& out) {
  Dims s(out.size(), 0);
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    size_t o = i + out.size() - shape.size();
    s[o] = shape[i] == 1 ? 0 : stride;
    stride *= shape[i];
  }
  return s;
}

// Calls f(i, offsets) for every element of `out` in row-major order, where offsets[k]
// is the element offset of operand k (strides[k]).
template <size_t N, class F>
void for_each_index(const Dims& out, const std::array<Dims, N>& strides, F&& f) {
  const int64_t total = numel_of(out);
  if (total == 0) return;
  const size_t rank = out.size();
  Dims idx(rank, 0);
  std::array<int64_t, N> off{};
  for (int64_t i = 0; i < total; ++i) {
    f(i, off);
    for (size_t d = rank; d-- > 0;) {
      ++idx[d];
      for (size_t k = 0; k < N; ++k) off[k] += strides[k][d];
      if (idx[d] < out[d]) break;
      for (size_t k = 0; k < N; ++k) off[k] -= strides[k][d] * out[d];
      idx[d] = 0;
    }
  }
}

Dims row_major_strides(const Dims& shape) {
  Dims s(shape.size());
  int64_t st = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = st;
    st *= shape[i];
  }
  return s;
}

// An int64/int32 operand (shape, axes, bounds) as int64 values.
Dims read_ints(const Tensor& t, const std::string& node, const std::string& op, const char* role) {
  Dims v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::kI64) std::memcpy(v.data(), t.data(), v.size() * 8);
  else if (t.dtype() == DType::kI32)
    for (size_t i = 0; i < v.size(); ++i) v[i] = t.data_as<int32_t>()[i];
  else run_error(node, op, str_cat(role, " must be int64 or int32, got ", dtype_name(t.dtype())));
  return v;
}

Dims attr_ints(const ir::Node& n, const std::string& k) {
  auto it = n.attrs.find(k);
  if (it == n.attrs.end()) return {};
  if (auto* v = std::get_if<std::vector<int64_t>>(&it->second)) return *v;
  if (auto* v = std::get_if<int64_t>(&it->second)) return {*v};
  return {};
}

int64_t axis_of(const std::string& node, const std::string& op, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) run_error(node, op, str_cat("axis ", axis, " out of range for rank ", rank));
  return axis < 0 ? axis + rank : axis;
}

// ---- elementwise ---------------------------------------------------------------------

enum class Bin { kAdd, kSub, kMul, kDiv, kPow, kEq, kLt, kLe, kGt, kGe, kAnd, kOr, kXor };

Bin bin_of(const std::string& op) {
  static const std::map<std::string, Bin> m = {
      {"Add", Bin::kAdd}, {"Sub", Bin::kSub}, {"Mul", Bin::kMul}, {"Div", Bin::kDiv}, {"Pow", Bin::kPow},
      {"Equal", Bin::kEq}, {"Less", Bin::kLt}, {"LessOrEqual", Bin::kLe}, {"Greater", Bin::kGt},
      {"GreaterOrEqual", Bin::kGe}, {"And", Bin::kAnd}, {"Or", Bin::kOr}, {"Xor", Bin::kXor}};
  return m.at(op);
}

template <class T>
T arith(Bin op, T a, T b) {
  switch (op) {
    case Bin::kAdd: return T(a + b);
    case Bin::kSub: return T(a - b);
    case Bin::kMul: return T(a * b);
    case Bin::kDiv:
      if constexpr (std::is_integral_v<T>) {
        // Integer division by zero (or MIN / -1) would trap; ONNX leaves it undefined.
        if (b == 0 || (std::is_signed_v<T> && b == T(-1) && a == std::numeric_limits<T>::min())) return 0;
      }
      return T(a / b);
    case Bin::kPow: return T(std::pow(double(a), double(b)));
    default: return 0;
  }
}

template <class T>
uint8_t compare(Bin op, T a, T b) {
  switch (op) {
    case Bin::kEq: return a == b;
    case Bin::kLt: return a < b;
    case Bin::kLe: return a <= b;
    case Bin::kGt: return a > b;
    case Bin::kGe: return a >= b;
    case Bin::kAnd: return (a != 0) && (b != 0);
    case Bin::kOr: return (a != 0) || (b != 0);
    case Bin::kXor: return (a != 0) != (b != 0);
    default: return 0;
  }
}

OpRun prepare_binary(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  const Bin op = bin_of(n.op);
  const bool cmp = op >= Bin::kEq;
  return [op, cmp, name = n.name, opname = n.op](OpContext& c) {
    const Tensor* pa_in = c.inputs[0];
    const Tensor* pb_in = c.inputs[1];
    // Exporters often write bias + x: commute so the row vector comes second.
    if ((op == Bin::kAdd || op == Bin::kMul) && pa_in->rank() == 1 && pb_in->rank() > 1) std::swap(pa_in, pb_in);
    const Tensor& a = *pa_in;
    const Tensor& b = *pb_in;
    // The model builders' forms first: same shape or a row vector, f32 (SIMD kernels).
    if ((op == Bin::kAdd || op == Bin::kMul) && a.dtype() == DType::kF32 && b.dtype() == DType::kF32 &&
        a.rank() >= 1 && (a.shape() == b.shape() || (b.rank() == 1 && b.dim(0) == a.dim(-1)))) {
      Tensor& y = c.out(0, a.shape());
      auto fn = op == Bin::kMul ? &mul : &add;
      if (a.shape() == b.shape()) return fn(a.data_as<float>(), b.data_as<float>(), a.numel(), y.data_as<float>());
      int64_t dim = b.numel(), rows = dim ? a.numel() / dim : 0;
      for (int64_t r = 0; r < rows; ++r)
        fn(a.data_as<float>() + r * dim, b.data_as<float>(), dim, y.data_as<float>() + r * dim);
      return;
    }
    if (op != Bin::kPow && a.dtype() != b.dtype())
      run_error(name, opname, str_cat("operand dtypes differ: ", dtype_name(a.dtype()), " and ", dtype_name(b.dtype())));
    Dims out = broadcast_dims(name, opname, a.shape(), b.shape());
    std::array<Dims, 2> st = {broadcast_strides(a.shape(), out), broadcast_strides(b.shape(), out)};
    Tensor& y = c.out(0, out, cmp ? DType::kU8 : a.dtype());
    visit_dtype(a.dtype(), name, [&](auto ta) {
      using T = decltype(ta);
      const T* pa = a.data_as<T>();
      if (cmp) {
        const T* pb = b.data_as<T>();
        uint8_t* py = y.data_as<uint8_t>();
        for_each_index(out, st, [&](int64_t i, const std::array<int64_t, 2>& o) { py[i] = compare(op, pa[o[0]], pb[o[1]]); });
      } else if (b.dtype() == a.dtype()) {
        const T* pb = b.data_as<T>();
        T* py = y.data_as<T>();
        for_each_index(out, st, [&](int64_t i, const std::array<int64_t, 2>& o) { py[i] = arith(op, pa[o[0]], pb[o[1]]); });
      } else {  // Pow with an exponent of another dtype
        Tensor e = b.to(a.dtype());
        const T* pb = e.data_as<T>();
        T* py = y.data_as<T>();
        for_each_index(out, st, [&](int64_t i, const std::array<int64_t, 2>& o) { py[i] = arith(op, pa[o[0]], pb[o[1]]); });
      }
    });
  };
}

OpRun prepare_where(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  return [name = n.name](OpContext& c) {
    const Tensor& cond = *c.inputs[0];
    const Tensor& x = *c.inputs[1];
    const Tensor& y = *c.inputs[2];
    if (cond.dtype() != DType::kU8 || x.dtype() != y.dtype()) run_error(name, "Where", "bad operand dtypes");
    Dims out = broadcast_dims(name, "Where", broadcast_dims(name, "Where", cond.shape(), x.shape()), y.shape());
    std::array<Dims, 3> st = {broadcast_strides(cond.shape(), out), broadcast_strides(x.shape(), out),
                              broadcast_strides(y.shape(), out)};
    Tensor& r = c.out(0, out, x.dtype());
    visit_dtype(x.dtype(), name, [&](auto tx) {
      using T = decltype(tx);
      const uint8_t* pc = cond.data_as<uint8_t>();
      const T *px = x.data_as<T>(), *py = y.data_as<T>();
      T* pr = r.data_as<T>();
      for_each_index(out, st, [&](int64_t i, const std::array<int64_t, 3>& o) { pr[i] = pc[o[0]] ? px[o[1]] : py[o[2]]; });
    });
  };
}

template <class FloatFn>
OpRun float_unary(const ir::Node& n, FloatFn fn) {
  return [fn, name = n.name, op = n.op](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    if (x.dtype() != DType::kF32) run_error(name, op, str_cat("x must be f32, got ", dtype_name(x.dtype())));
    Tensor& y = c.out(0, x.shape());
    const float* px = x.data_as<float>();
    float* py = y.data_as<float>();
    for (int64_t i = 0; i < x.numel(); ++i) py[i] = fn(px[i]);
  };
}

OpRun prepare_unary(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  const std::string& op = n.op;
  if (op == "Sqrt") return float_unary(n, [](float v) { return std::sqrt(v); });
  if (op == "Erf") return float_unary(n, [](float v) { return std::erf(v); });
  if (op == "Exp") return float_unary(n, [](float v) { return std::exp(v); });
  if (op == "Log") return float_unary(n, [](float v) { return std::log(v); });
  if (op == "Sigmoid") return float_unary(n, [](float v) { return 1.0f / (1.0f + std::exp(-v)); });
  if (op == "Relu") return float_unary(n, [](float v) { return v > 0 ? v : 0.0f; });
  if (op == "Reciprocal") return float_unary(n, [](float v) { return 1.0f / v; });
  if (op == "Cos") return float_unary(n, [](float v) { return std::cos(v); });
  if (op == "Sin") return float_unary(n, [](float v) { return std::sin(v); });
  // Neg, Abs, Not, Identity: any dtype.
  return [name = n.name, op](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    Tensor& y = c.out(0, x.shape(), x.dtype());
    if (op == "Identity") {
      if (x.nbytes()) std::memcpy(y.data(), x.data(), x.nbytes());
      return;
    }
    visit_dtype(x.dtype(), name, [&](auto tx) {
      using T = decltype(tx);
      const T* px = x.data_as<T>();
      T* py = y.data_as<T>();
      for (int64_t i = 0; i < x.numel(); ++i)
        py[i] = op == "Neg" ? T(-px[i]) : op == "Abs" ? T(px[i] < 0 ? -px[i] : px[i]) : T(px[i] == 0);
    });
  };
}

OpRun prepare_cast(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  DType to = dtype_from_name(n.attr_str("to"));
  bool to_bool = n.attr_int("bool", 0) != 0;
  return [to, to_bool, name = n.name](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    Tensor& y = c.out(0, x.shape(), to);
    if (to_bool) {
      visit_dtype(x.dtype(), name, [&](auto tx) {
        using T = decltype(tx);
        for (int64_t i = 0; i < x.numel(); ++i) y.data_as<uint8_t>()[i] = x.data_as<T>()[i] != 0;
      });
      return;
    }
    dtype_convert(x.data(), x.dtype(), y.data(), to, size_t(x.numel()));
  };
}

// ---- MatMul, Softmax, reductions -------------------------------------------------------

OpRun prepare_matmul(const ir::Node& n, const ir::Graph& g, const CompileOptions&) {
  if (g.is_weight(n.inputs[1]) && g.value(n.inputs[1]).shape.rank() == 2) {
    // A constant [K, N] right operand is a Linear: pack its transpose once and run the
    // GEMM kernels over all leading rows of a.
    Tensor w = g.weight(n.inputs[1]).to(DType::kF32);
    int64_t k = w.dim(0), nn = w.dim(1);
    std::vector<float> wt(static_cast<size_t>(k * nn));
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < nn; ++j) wt[size_t(j * k + i)] = w.data_as<float>()[i * nn + j];
    auto packed = std::make_shared<PackedWeight>(pack_weight(wt.data(), nn, k, WeightStorage::kF32));
    return [packed, name = n.name](OpContext& c) {
      const Tensor& a = *c.inputs[0];
      if (a.rank() < 1 || a.dim(-1) != packed->k)
        run_error(name, "MatMul", str_cat("a ", a.shape_str(), " does not end in K = ", packed->k));
      Dims out = a.shape();
      out.back() = packed->n;
      Tensor& y = c.out(0, out);
      int64_t rows = a.numel() / packed->k;
      if (rows) linear(a.data_as<float>(), rows, packed->k, *packed, nullptr, y.data_as<float>());
    };
  }
  return [name = n.name](OpContext& c) {
    const Tensor& a = *c.inputs[0];
    const Tensor& b = *c.inputs[1];
    if (a.rank() < 2 || b.rank() < 2 || a.dim(-1) != b.dim(-2) || a.dtype() != DType::kF32 || b.dtype() != DType::kF32)
      run_error(name, "MatMul", str_cat("cannot multiply ", a.shape_str(), " by ", b.shape_str()));
    const int64_t m = a.dim(-2), k = a.dim(-1), nn = b.dim(-1);
    Dims ba(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
    Dims batch = broadcast_dims(name, "MatMul", ba, bb);
    Dims out = batch;
    out.push_back(m);
    out.push_back(nn);
    Tensor& y = c.out(0, out);
    std::array<Dims, 2> st = {broadcast_strides(ba, batch), broadcast_strides(bb, batch)};
    std::vector<std::array<int64_t, 2>> offs;
    for_each_index(batch, st, [&](int64_t, const std::array<int64_t, 2>& o) { offs.push_back(o); });
    const float* pa = a.data_as<float>();
    const float* pb = b.data_as<float>();
    float* py = y.data_as<float>();
    ThreadPool::global().parallel_for(int64_t(offs.size()) * m, [&](int64_t begin, int64_t end, int) {
      for (int64_t r = begin; r < end; ++r) {
        int64_t bi = r / m, i = r % m;
        const float* arow = pa + offs[size_t(bi)][0] * m * k + i * k;
        const float* bm = pb + offs[size_t(bi)][1] * k * nn;
        float* yrow = py + (bi * m + i) * nn;
        std::fill(yrow, yrow + nn, 0.0f);
        for (int64_t kk = 0; kk < k; ++kk) {
          const float av = arow[kk];
          const float* brow = bm + kk * nn;
          for (int64_t j = 0; j < nn; ++j) yrow[j] += av * brow[j];
        }
      }
    });
  };
}

OpRun prepare_softmax(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  int64_t axis_attr = n.attr_int("axis", -1);
  return [axis_attr, name = n.name](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    int64_t axis = axis_of(name, "Softmax", axis_attr, x.rank());
    Tensor& y = c.out(0, x.shape());
    int64_t dim = x.dim(int(axis)), inner = 1;
    for (int i = int(axis) + 1; i < x.rank(); ++i) inner *= x.dim(i);
    if (dim == 0 || x.numel() == 0) return;
    int64_t outer = x.numel() / (dim * inner);
    if (inner == 1) return softmax_rows(x.data_as<float>(), outer, dim, y.data_as<float>());
    const float* px = x.data_as<float>();
    float* py = y.data_as<float>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        const float* xs = px + o * dim * inner + in;
        float* ys = py + o * dim * inner + in;
        float mx = -INFINITY, sum = 0;
        for (int64_t d = 0; d < dim; ++d) mx = std::max(mx, xs[d * inner]);
        for (int64_t d = 0; d < dim; ++d) sum += (ys[d * inner] = std::exp(xs[d * inner] - mx));
        for (int64_t d = 0; d < dim; ++d) ys[d * inner] /= sum;
      }
  };
}

OpRun prepare_reduce(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  Dims axes_attr = attr_ints(n, "axes");
  bool keep = n.attr_int("keepdims", 1) != 0;
  int mode = n.op == "ReduceMean" ? 0 : n.op == "ReduceSum" ? 1 : 2;
  return [axes_attr, keep, mode, name = n.name, op = n.op](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    if (x.dtype() != DType::kF32) run_error(name, op, "x must be f32");
    std::vector<bool> red(size_t(x.rank()), axes_attr.empty());
    for (int64_t a : axes_attr) red[size_t(axis_of(name, op, a, x.rank()))] = true;
    Dims out_keep = x.shape(), out;
    int64_t count = 1;
    for (int i = 0; i < x.rank(); ++i) {
      if (red[size_t(i)]) {
        count *= x.dim(i);
        out_keep[size_t(i)] = 1;
        if (keep) out.push_back(1);
      } else {
        out.push_back(x.dim(i));
      }
    }
    Tensor& y = c.out(0, out);
    float* py = y.data_as<float>();
    const float* px = x.data_as<float>();
    std::fill(py, py + y.numel(), mode == 2 ? -INFINITY : 0.0f);
    std::array<Dims, 1> st = {broadcast_strides(out_keep, x.shape())};
    for_each_index(x.shape(), st, [&](int64_t i, const std::array<int64_t, 1>& o) {
      py[o[0]] = mode == 2 ? std::max(py[o[0]], px[i]) : py[o[0]] + px[i];
    });
    if (mode == 0 && count)
      for (int64_t i = 0; i < y.numel(); ++i) py[i] /= float(count);
  };
}

// ---- shape and index ops ----------------------------------------------------------------

void copy_as(OpContext& c, const Tensor& x, Dims shape) {
  Tensor& y = c.out(0, std::move(shape), x.dtype());
  if (x.nbytes()) std::memcpy(y.data(), x.data(), x.nbytes());
}

Dims reshape_target(const std::string& name, const Dims& in, const Dims& target, bool allowzero) {
  Dims out = target;
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      if (infer_at >= 0) run_error(name, "Reshape", "more than one -1 in the target shape");
      infer_at = int64_t(i);
    } else if (out[i] == 0 && !allowzero) {
      if (i >= in.size()) run_error(name, "Reshape", "target dim 0 copies a dim the input does not have");
      out[i] = in[i];
      known *= out[i];
    } else if (out[i] < 0) {
      run_error(name, "Reshape", str_cat("negative target dim ", out[i]));
    } else {
      known *= out[i];
    }
  }
  int64_t total = numel_of(in);
  if (infer_at >= 0) {
    if (known == 0 || total % known) run_error(name, "Reshape", str_cat("cannot reshape ", shape_to_string(in), " into ", shape_to_string(target)));
    out[size_t(infer_at)] = total / known;
  }
  if (numel_of(out) != total)
    run_error(name, "Reshape", str_cat("cannot reshape ", shape_to_string(in), " (", total, " elements) into ",
                                       shape_to_string(out)));
  return out;
}

OpRun prepare_reshape(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  Dims attr = attr_ints(n, "shape");
  bool has = n.has_attr("shape"), allowzero = n.attr_int("allowzero", 0) != 0;
  return [attr, has, allowzero, name = n.name](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    Dims target = has ? attr : read_ints(*c.inputs.at(1), name, "Reshape", "shape");
    copy_as(c, x, reshape_target(name, x.shape(), target, allowzero));
  };
}

OpRun prepare_flatten(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  int64_t axis_attr = n.attr_int("axis", 1);
  return [axis_attr](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    int64_t axis = axis_attr < 0 ? axis_attr + x.rank() : axis_attr;
    int64_t a = 1;
    for (int64_t i = 0; i < axis; ++i) a *= x.dim(int(i));
    copy_as(c, x, {a, a ? x.numel() / a : 0});
  };
}

OpRun prepare_unsqueeze(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  Dims axes = attr_ints(n, "axes");
  return [axes, name = n.name](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    int64_t rank = x.rank() + int64_t(axes.size());
    std::vector<bool> ins(size_t(rank), false);
    for (int64_t a : axes) ins[size_t(axis_of(name, "Unsqueeze", a, rank))] = true;
    Dims out;
    size_t j = 0;
    for (int64_t i = 0; i < rank; ++i) out.push_back(ins[size_t(i)] ? 1 : x.shape()[j++]);
    copy_as(c, x, out);
  };
}

OpRun prepare_squeeze(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  Dims axes = attr_ints(n, "axes");
  return [axes, name = n.name](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    std::vector<bool> drop(size_t(x.rank()), false);
    for (int i = 0; i < x.rank(); ++i) drop[size_t(i)] = axes.empty() && x.dim(i) == 1;
    for (int64_t a : axes) {
      int64_t k = axis_of(name, "Squeeze", a, x.rank());
      if (x.dim(int(k)) != 1) run_error(name, "Squeeze", str_cat("dim ", k, " of ", x.shape_str(), " is not 1"));
      drop[size_t(k)] = true;
    }
    Dims out;
    for (int i = 0; i < x.rank(); ++i)
      if (!drop[size_t(i)]) out.push_back(x.dim(i));
    copy_as(c, x, out);
  };
}

OpRun prepare_shape(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  int64_t s0 = n.attr_int("start", 0), e0 = n.attr_int("end", std::numeric_limits<int64_t>::max());
  return [s0, e0](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    int64_t rank = x.rank(), s = s0 < 0 ? s0 + rank : s0, e = e0 < 0 ? e0 + rank : e0;
    s = std::clamp<int64_t>(s, 0, rank);
    e = std::clamp<int64_t>(e, 0, rank);
    Tensor& y = c.out(0, {std::max<int64_t>(e - s, 0)}, DType::kI64);
    for (int64_t i = s; i < e; ++i) y.data_as<int64_t>()[i - s] = x.dim(int(i));
  };
}

OpRun prepare_transpose(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  Dims perm_attr = attr_ints(n, "perm");
  return [perm_attr, name = n.name](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    Dims perm = perm_attr;
    if (perm.empty())
      for (int i = x.rank() - 1; i >= 0; --i) perm.push_back(i);
    Dims in_st = row_major_strides(x.shape()), out, st;
    for (int64_t p : perm) {
      out.push_back(x.dim(int(p)));
      st.push_back(in_st[size_t(p)]);
    }
    Tensor& y = c.out(0, out, x.dtype());
    visit_dtype(x.dtype(), name, [&](auto tx) {
      using T = decltype(tx);
      const T* px = x.data_as<T>();
      T* py = y.data_as<T>();
      for_each_index(out, std::array<Dims, 1>{st}, [&](int64_t i, const std::array<int64_t, 1>& o) { py[i] = px[o[0]]; });
    });
  };
}

OpRun prepare_gather(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  int64_t axis_attr = n.attr_int("axis", 0);
  return [axis_attr, name = n.name](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    Dims idx = read_ints(*c.inputs[1], name, "Gather", "indices");
    int64_t axis = axis_of(name, "Gather", axis_attr, x.rank());
    int64_t dim = x.dim(int(axis)), outer = 1, inner = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= x.dim(int(i));
    for (int64_t i = axis + 1; i < x.rank(); ++i) inner *= x.dim(int(i));
    for (auto& v : idx) {
      if (v < -dim || v >= dim)
        throw_error(ErrorCode::kOutOfRange, "node '", name, "' (Gather): index ", v, " is outside [", -dim, ", ", dim,
                    ") of axis ", axis, " of ", x.shape_str());
      if (v < 0) v += dim;
    }
    Dims out(x.shape().begin(), x.shape().begin() + axis);
    for (int64_t d : c.inputs[1]->shape()) out.push_back(d);
    for (int64_t i = axis + 1; i < x.rank(); ++i) out.push_back(x.dim(int(i)));
    Tensor& y = c.out(0, out, x.dtype());
    const size_t es = dtype_size(x.dtype()), row = size_t(inner) * es;
    const auto* px = static_cast<const uint8_t*>(x.data());
    auto* py = static_cast<uint8_t*>(y.data());
    for (int64_t o = 0; o < outer; ++o)
      for (size_t j = 0; j < idx.size(); ++j)
        std::memcpy(py + (size_t(o) * idx.size() + j) * row, px + (size_t(o * dim + idx[j])) * row, row);
  };
}

OpRun prepare_concat(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  int64_t axis_attr = n.attr_int("axis");
  return [axis_attr, name = n.name](OpContext& c) {
    const Tensor& x0 = *c.inputs[0];
    int64_t axis = axis_of(name, "Concat", axis_attr, x0.rank());
    Dims out = x0.shape();
    out[size_t(axis)] = 0;
    for (const Tensor* t : c.inputs) {
      if (t->rank() != x0.rank() || t->dtype() != x0.dtype())
        run_error(name, "Concat", str_cat("inputs ", x0.shape_str(), " and ", t->shape_str(), " differ in rank or dtype"));
      for (int i = 0; i < x0.rank(); ++i)
        if (i != axis && t->dim(i) != x0.dim(i))
          run_error(name, "Concat", str_cat("inputs ", x0.shape_str(), " and ", t->shape_str(), " differ off axis ", axis));
      out[size_t(axis)] += t->dim(int(axis));
    }
    Tensor& y = c.out(0, out, x0.dtype());
    int64_t outer = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= out[size_t(i)];
    const size_t es = dtype_size(x0.dtype());
    size_t out_row = size_t(numel_of(out) / std::max<int64_t>(outer, 1)) * es, at = 0;
    auto* py = static_cast<uint8_t*>(y.data());
    for (const Tensor* t : c.inputs) {
      size_t row = outer ? t->nbytes() / size_t(outer) : 0;
      for (int64_t o = 0; o < outer; ++o)
        if (row) std::memcpy(py + size_t(o) * out_row + at, static_cast<const uint8_t*>(t->data()) + size_t(o) * row, row);
      at += row;
    }
  };
}

OpRun prepare_slice(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  bool has = n.has_attr("starts");
  Dims s_attr = attr_ints(n, "starts"), e_attr = attr_ints(n, "ends"), a_attr = attr_ints(n, "axes"),
       st_attr = attr_ints(n, "steps");
  return [=, name = n.name](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    auto in_or = [&](size_t i, const Dims& attr, const char* role) {
      if (has) return attr;
      if (i < c.inputs.size() && c.inputs[i]) return read_ints(*c.inputs[i], name, "Slice", role);
      return Dims{};
    };
    Dims starts = in_or(1, s_attr, "starts"), ends = in_or(2, e_attr, "ends"), axes = in_or(3, a_attr, "axes"),
         steps = in_or(4, st_attr, "steps");
    if (axes.empty())
      for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
    if (steps.empty()) steps.assign(starts.size(), 1);
    if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
      run_error(name, "Slice", "starts, ends, axes and steps differ in length");
    Dims begin(size_t(x.rank()), 0), step(size_t(x.rank()), 1), out = x.shape();
    for (size_t i = 0; i < starts.size(); ++i) {
      int64_t a = axis_of(name, "Slice", axes[i], x.rank()), dim = x.dim(int(a)), s = starts[i], e = ends[i],
              k = steps[i];
      if (k == 0) run_error(name, "Slice", "step 0");
      if (s < 0) s += dim;
      if (e < 0) e += dim;
      int64_t cnt;
      if (k > 0) {
        s = std::clamp<int64_t>(s, 0, dim);
        e = std::clamp<int64_t>(e, 0, dim);
        cnt = e > s ? (e - s + k - 1) / k : 0;
      } else {
        s = std::clamp<int64_t>(s, -1, dim - 1);
        e = std::clamp<int64_t>(e, -1, dim - 1);
        cnt = s > e ? (s - e - k - 1) / -k : 0;
      }
      begin[size_t(a)] = s;
      step[size_t(a)] = k;
      out[size_t(a)] = cnt;
    }
    Dims in_st = row_major_strides(x.shape()), st(size_t(x.rank()));
    int64_t base = 0;
    for (size_t d = 0; d < st.size(); ++d) {
      st[d] = in_st[d] * step[d];
      base += begin[d] * in_st[d];
    }
    Tensor& y = c.out(0, out, x.dtype());
    visit_dtype(x.dtype(), name, [&](auto tx) {
      using T = decltype(tx);
      const T* px = x.data_as<T>() + base;
      T* py = y.data_as<T>();
      for_each_index(out, std::array<Dims, 1>{st}, [&](int64_t i, const std::array<int64_t, 1>& o) { py[i] = px[o[0]]; });
    });
  };
}

OpRun prepare_expand(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  Dims attr = attr_ints(n, "shape");
  bool has = n.has_attr("shape");
  return [attr, has, name = n.name](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    Dims target = has ? attr : read_ints(*c.inputs.at(1), name, "Expand", "shape");
    Dims out = broadcast_dims(name, "Expand", x.shape(), target);
    if (numel_of(out) > (int64_t(1) << 34)) run_error(name, "Expand", str_cat("output ", shape_to_string(out), " is too large"));
    Tensor& y = c.out(0, out, x.dtype());
    visit_dtype(x.dtype(), name, [&](auto tx) {
      using T = decltype(tx);
      const T* px = x.data_as<T>();
      T* py = y.data_as<T>();
      for_each_index(out, std::array<Dims, 1>{broadcast_strides(x.shape(), out)},
                     [&](int64_t i, const std::array<int64_t, 1>& o) { py[i] = px[o[0]]; });
    });
  };
}

OpRun prepare_constant_of_shape(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  Dims attr = attr_ints(n, "shape");
  bool has = n.has_attr("shape");
  DType dt = dtype_from_name(n.attr_str("dtype", "f32"));
  double value = n.attr_float("value", 0.0);
  return [=, name = n.name](OpContext& c) {
    Dims shape = has ? attr : read_ints(*c.inputs.at(0), name, "ConstantOfShape", "shape");
    int64_t total = 1;
    for (int64_t d : shape) {
      if (d < 0 || (d && total > (int64_t(1) << 34) / d))
        run_error(name, "ConstantOfShape", str_cat("bad or too large shape ", shape_to_string(shape)));
      total *= d;
    }
    Tensor& y = c.out(0, shape, dt);
    visit_dtype(dt, name, [&](auto tv) {
      using T = decltype(tv);
      std::fill(y.data_as<T>(), y.data_as<T>() + total, T(value));
    });
  };
}

OpRun prepare_range(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  return [name = n.name](OpContext& c) {
    const Tensor& s = *c.inputs[0];
    visit_dtype(s.dtype(), name, [&](auto ts) {
      using T = decltype(ts);
      T start = s.data_as<T>()[0], limit = c.inputs[1]->data_as<T>()[0], delta = c.inputs[2]->data_as<T>()[0];
      if (delta == 0) run_error(name, "Range", "delta is 0");
      double cnt = std::ceil((double(limit) - double(start)) / double(delta));
      if (!(cnt <= double(int64_t(1) << 31))) run_error(name, "Range", "more than 2^31 elements");
      int64_t m = std::max<int64_t>(int64_t(cnt), 0);
      Tensor& y = c.out(0, {m}, s.dtype());
      for (int64_t i = 0; i < m; ++i) y.data_as<T>()[i] = T(start + T(i) * delta);
    });
  };
}

OpRun prepare_trilu(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  bool upper = n.attr_int("upper", 1) != 0;
  return [upper, name = n.name](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    int64_t k = 0;
    if (c.inputs.size() > 1 && c.inputs[1]) k = read_ints(*c.inputs[1], name, "Trilu", "k").at(0);
    Tensor& y = c.out(0, x.shape(), x.dtype());
    int64_t rows = x.dim(-2), cols = x.dim(-1), mats = (rows * cols) != 0 ? x.numel() / (rows * cols) : 0;
    visit_dtype(x.dtype(), name, [&](auto tx) {
      using T = decltype(tx);
      for (int64_t b = 0; b < mats; ++b)
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) {
            int64_t at = (b * rows + i) * cols + j;
            bool keep = upper ? j - i >= k : j - i <= k;
            y.data_as<T>()[at] = keep ? x.data_as<T>()[at] : T(0);
          }
    });
  };
}

OpRun prepare_split(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  Dims sizes_attr = attr_ints(n, "split");
  int64_t axis_attr = n.attr_int("axis", 0), parts = int64_t(n.outputs.size());
  return [=, name = n.name](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    int64_t axis = axis_of(name, "Split", axis_attr, x.rank()), dim = x.dim(int(axis));
    Dims sizes = sizes_attr;
    if (sizes.empty()) {
      if (dim % parts) run_error(name, "Split", str_cat("dim ", dim, " does not split into ", parts, " parts"));
      sizes.assign(size_t(parts), dim / parts);
    }
    int64_t total = 0;
    for (int64_t v : sizes) total += v < 0 ? dim + 1 : v;
    if (total != dim)
      run_error(name, "Split", str_cat("split sizes do not add up to ", dim));
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= x.dim(int(i));
    for (int64_t i = axis + 1; i < x.rank(); ++i) inner *= x.dim(int(i));
    const size_t es = dtype_size(x.dtype());
    int64_t at = 0;
    for (size_t p = 0; p < sizes.size(); ++p) {
      Dims out = x.shape();
      out[size_t(axis)] = sizes[p];
      Tensor& y = c.out(p, out, x.dtype());
      size_t row = size_t(sizes[p] * inner) * es;
      for (int64_t o = 0; o < outer; ++o)
        if (row)
          std::memcpy(static_cast<uint8_t*>(y.data()) + size_t(o) * row,
                      static_cast<const uint8_t*>(x.data()) + (size_t(o * dim + at) * size_t(inner)) * es, row);
      at += sizes[p];
    }
  };
}

}  // namespace

const std::map<std::string, OpPrepare>& generic_cpu_ops() {
  static const std::map<std::string, OpPrepare> table = [] {
    std::map<std::string, OpPrepare> t;
    for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "LessOrEqual", "Greater",
                           "GreaterOrEqual", "And", "Or", "Xor"})
      t[op] = prepare_binary;
    for (const char* op : {"Sqrt", "Erf", "Exp", "Log", "Sigmoid", "Relu", "Reciprocal", "Cos",
                           "Sin", "Neg", "Abs", "Not", "Identity"})
      t[op] = prepare_unary;
    for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax"}) t[op] = prepare_reduce;
    t["Where"] = prepare_where;
    t["Cast"] = prepare_cast;
    t["MatMul"] = prepare_matmul;
    t["Softmax"] = prepare_softmax;
    t["ScaledDotProductAttention"] = prepare_sdpa;
    t["Reshape"] = prepare_reshape;
    t["Flatten"] = prepare_flatten;
    t["Unsqueeze"] = prepare_unsqueeze;
    t["Squeeze"] = prepare_squeeze;
    t["Shape"] = prepare_shape;
    t["Transpose"] = prepare_transpose;
    t["Gather"] = prepare_gather;
    t["Concat"] = prepare_concat;
    t["Slice"] = prepare_slice;
    t["Expand"] = prepare_expand;
    t["ConstantOfShape"] = prepare_constant_of_shape;
    t["Range"] = prepare_range;
    t["Trilu"] = prepare_trilu;
    t["Split"] = prepare_split;
    return t;
  }();
  return table;
}

}  // namespace kiln::cpu
