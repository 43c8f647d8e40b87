// Schemas and shape inference of the generic tensor ops (see generic_ops.h). Operands
// that decide an output shape (Reshape's shape, Unsqueeze's axes, Slice's bounds...)
// are attributes when they are constants, so shapes are exact; when computed at run
// time they stay inputs and the dims they decide are unknown ("?"): the backends
// re-derive every shape from the actual tensors, so these only describe the graph.
#include "ir/generic_ops.h"

#include <algorithm>
#include <set>

#include "core/status.h"

namespace kiln::ir {

namespace {

using In = std::vector<const Value*>;
const Dim kUnknown("?");

[[noreturn]] void fail(const Node& n, const std::string& what) {
  throw_error(ErrorCode::kInvalidArgument, "node '", n.name, "' (", n.op, "): ", what);
}

const Value& need(const Node& n, const In& in, size_t i) {
  if (i >= in.size() || !in[i]) fail(n, str_cat("input ", i, " is required"));
  return *in[i];
}

std::vector<int64_t> ints_attr(const Node& n, const std::string& k) {
  auto it = n.attrs.find(k);
  if (it == n.attrs.end()) return {};
  if (auto* v = std::get_if<std::vector<int64_t>>(&it->second)) return *v;
  if (auto* v = std::get_if<int64_t>(&it->second)) return {*v};
  fail(n, str_cat("attribute ", k, " must be a list of integers"));
}

// Length of a rank-1 shape operand computed at run time (the output rank it decides).
int64_t shape_operand_len(const Node& n, const Value& v) {
  if (v.shape.rank() != 1 || !v.shape[0].is_concrete() || v.dtype != DType::kI64)
    fail(n, str_cat("shape operand %", v.name, " must be int64 of a known length, got ", dtype_name(v.dtype),
                    v.shape.str()));
  return v.shape[0].value;
}

std::vector<ValueType> infer_broadcast(const Node& n, const In& in) {
  const Value& a = need(n, in, 0);
  const Value& b = need(n, in, 1);
  const bool pow = n.op == "Pow";
  if (a.dtype != b.dtype && !pow)
    fail(n, str_cat("operand dtypes differ: ", dtype_name(a.dtype), " and ", dtype_name(b.dtype)));
  static const std::set<std::string> kCompare = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
                                                 "And", "Or", "Xor"};
  DType out = kCompare.count(n.op) ? DType::kU8 : a.dtype;
  return {{out, broadcast_shapes(n, a.shape, b.shape)}};
}

std::vector<ValueType> infer_where(const Node& n, const In& in) {
  const Value& c = need(n, in, 0);
  const Value& x = need(n, in, 1);
  const Value& y = need(n, in, 2);
  if (c.dtype != DType::kU8) fail(n, str_cat("condition must be bool (u8), got ", dtype_name(c.dtype)));
  if (x.dtype != y.dtype) fail(n, str_cat("x and y dtypes differ: ", dtype_name(x.dtype), " and ", dtype_name(y.dtype)));
  return {{x.dtype, broadcast_shapes(n, broadcast_shapes(n, c.shape, x.shape), y.shape)}};
}

std::vector<ValueType> infer_same(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  return {{x.dtype, x.shape}};
}

std::vector<ValueType> infer_float_unary(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  if (!dtype_is_float(x.dtype)) fail(n, str_cat("x must be a float type, got ", dtype_name(x.dtype)));
  return {{x.dtype, x.shape}};
}

std::vector<ValueType> infer_cast(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  return {{dtype_from_name(n.attr_str("to")), x.shape}};
}

std::vector<ValueType> infer_matmul(const Node& n, const In& in) {
  const Value& a = need(n, in, 0);
  const Value& b = need(n, in, 1);
  if (a.shape.rank() < 2 || b.shape.rank() < 2)
    fail(n, str_cat("operands must have rank >= 2, got ", a.shape.str(), " and ", b.shape.str()));
  if (a.dtype != DType::kF32 || b.dtype != DType::kF32) fail(n, "operands must be f32");
  const Dim& ka = a.shape[a.shape.rank() - 1];
  const Dim& kb = b.shape[b.shape.rank() - 2];
  if (ka.is_concrete() && kb.is_concrete() && ka.value != kb.value)
    fail(n, str_cat("inner dims differ: ", a.shape.str(), " x ", b.shape.str()));
  Shape ba(std::vector<Dim>(a.shape.dims().begin(), a.shape.dims().end() - 2));
  Shape bb(std::vector<Dim>(b.shape.dims().begin(), b.shape.dims().end() - 2));
  Shape out = broadcast_shapes(n, ba, bb);
  out.push_back(a.shape[a.shape.rank() - 2]);
  out.push_back(b.shape.back());
  return {{DType::kF32, out}};
}

std::vector<ValueType> infer_softmax(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  normalize_axis(n, n.attr_int("axis", -1), int64_t(x.shape.rank()));
  return infer_float_unary(n, in);
}

// q [B, H, Sq, D], k [B, H, Sk, D], v [B, H, Sk, Dv], optional additive mask
// broadcastable to [B, H, Sq, Sk]; dims broadcast numpy-style exactly as in the
// MatMul / Add / MatMul it replaces.
std::vector<ValueType> infer_sdpa(const Node& n, const In& in) {
  const Value& q = need(n, in, 0);
  const Value& k = need(n, in, 1);
  const Value& v = need(n, in, 2);
  const Value* mask = in.size() > 3 ? in[3] : nullptr;
  for (const Value* x : {&q, &k, &v, mask}) {
    if (!x) continue;
    if (x->dtype != DType::kF32) fail(n, str_cat("%", x->name, " must be f32, got ", dtype_name(x->dtype)));
    if (x->shape.rank() != 4 && x != mask) fail(n, str_cat("%", x->name, " must be 4-D [B, H, S, D], got ", x->shape.str()));
  }
  auto same = [&](const Dim& a, const Dim& b, const char* what) {
    if (a.is_concrete() && b.is_concrete() && a.value != b.value)
      fail(n, str_cat(what, " differ: q ", q.shape.str(), ", k ", k.shape.str(), ", v ", v.shape.str()));
  };
  same(q.shape[3], k.shape[3], "head dims of q and k");
  Shape qb{q.shape[0], q.shape[1]}, kb{k.shape[0], k.shape[1]}, vb{v.shape[0], v.shape[1]};
  Shape batch = broadcast_shapes(n, broadcast_shapes(n, qb, kb), vb);
  Shape rows{q.shape[2], k.shape[2]};  // the scores' [Sq, Sk]
  if (mask) {
    if (mask->shape.rank() > 4) fail(n, str_cat("mask must have rank <= 4, got ", mask->shape.str()));
    Shape m;
    for (size_t i = mask->shape.rank(); i < 4; ++i) m.push_back(Dim(int64_t(1)));
    for (auto& d : mask->shape.dims()) m.push_back(d);
    batch = broadcast_shapes(n, batch, Shape{m[0], m[1]});
    rows = broadcast_shapes(n, rows, Shape{m[2], m[3]});  // like the Add it replaces
  }
  same(rows[1], v.shape[2], "key lengths of the scores and v");
  return {{DType::kF32, Shape{batch[0], batch[1], rows[0], v.shape[3]}}};
}

std::vector<ValueType> infer_reduce(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  int64_t rank = int64_t(x.shape.rank());
  std::vector<int64_t> axes = ints_attr(n, "axes");
  std::vector<bool> reduced(size_t(rank), axes.empty());
  for (int64_t a : axes) reduced[size_t(normalize_axis(n, a, rank))] = true;
  bool keep = n.attr_int("keepdims", 1) != 0;
  Shape out;
  for (int64_t i = 0; i < rank; ++i)
    if (!reduced[size_t(i)]) out.push_back(x.shape[size_t(i)]);
    else if (keep) out.push_back(Dim(int64_t(1)));
  return {{x.dtype, out}};
}

// Reshape target with ONNX's 0 (copy the input dim) and -1 (infer) rules.
Shape reshape_shape(const Node& n, const Shape& in, const std::vector<int64_t>& target, bool allowzero) {
  Shape out;
  int64_t known = 1, infer_at = -1;
  bool in_concrete = in.is_concrete();
  for (size_t i = 0; i < target.size(); ++i) {
    int64_t t = target[i];
    if (t == -1) {
      if (infer_at >= 0) fail(n, "more than one -1 in the target shape");
      infer_at = int64_t(i);
      out.push_back(kUnknown);
    } else if (t == 0 && !allowzero) {
      if (i >= in.rank()) fail(n, str_cat("target dim ", i, " is 0 (copy) but the input ", in.str(), " has no such dim"));
      out.push_back(in[i]);
      if (in[i].is_concrete()) known *= in[i].value;
    } else if (t < 0) {
      fail(n, str_cat("negative target dim ", t));
    } else {
      out.push_back(Dim(t));
      known *= t;
    }
  }
  if (infer_at >= 0 && in_concrete && known > 0) {
    int64_t total = in.numel();
    if (total % known) fail(n, str_cat("cannot reshape ", in.str(), " into ", shape_to_string(target)));
    out[size_t(infer_at)] = Dim(total / known);
  } else if (infer_at >= 0) {
    // [B, S, H] -> [-1, H] style: the unknown dim is the product of the symbolic ones
    // that the fixed target dims do not account for; left unknown here.
    out[size_t(infer_at)] = kUnknown;
  }
  return out;
}

std::vector<ValueType> infer_reshape(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  if (n.has_attr("shape")) return {{x.dtype, reshape_shape(n, x.shape, ints_attr(n, "shape"), n.attr_int("allowzero", 0))}};
  int64_t r = shape_operand_len(n, need(n, in, 1));
  return {{x.dtype, Shape(std::vector<Dim>(size_t(r), kUnknown))}};
}

std::vector<ValueType> infer_flatten(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  int64_t rank = int64_t(x.shape.rank());
  int64_t axis = n.attr_int("axis", 1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis > rank) fail(n, str_cat("axis ", n.attr_int("axis", 1), " out of range for ", x.shape.str()));
  auto prod = [&](int64_t b, int64_t e) -> Dim {
    int64_t p = 1;
    for (int64_t i = b; i < e; ++i) {
      if (!x.shape[size_t(i)].is_concrete()) return (e - b == 1) ? x.shape[size_t(i)] : kUnknown;
      p *= x.shape[size_t(i)].value;
    }
    return Dim(p);
  };
  return {{x.dtype, Shape{prod(0, axis), prod(axis, rank)}}};
}

std::vector<ValueType> infer_transpose(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  std::vector<int64_t> perm = ints_attr(n, "perm");
  size_t rank = x.shape.rank();
  if (perm.empty())
    for (size_t i = 0; i < rank; ++i) perm.push_back(int64_t(rank - 1 - i));
  if (perm.size() != rank) fail(n, str_cat("perm has ", perm.size(), " entries for rank ", rank));
  std::vector<bool> seen(rank, false);
  Shape out;
  for (int64_t p : perm) {
    if (p < 0 || p >= int64_t(rank) || seen[size_t(p)]) fail(n, "perm is not a permutation");
    seen[size_t(p)] = true;
    out.push_back(x.shape[size_t(p)]);
  }
  return {{x.dtype, out}};
}

std::vector<ValueType> infer_gather(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  const Value& idx = need(n, in, 1);
  if (idx.dtype != DType::kI64 && idx.dtype != DType::kI32)
    fail(n, str_cat("indices must be int32/int64, got ", dtype_name(idx.dtype)));
  int64_t rank = int64_t(x.shape.rank());
  if (rank < 1) fail(n, "data must have rank >= 1");
  int64_t axis = normalize_axis(n, n.attr_int("axis", 0), rank);
  Shape out;
  for (int64_t i = 0; i < axis; ++i) out.push_back(x.shape[size_t(i)]);
  for (auto& d : idx.shape.dims()) out.push_back(d);
  for (int64_t i = axis + 1; i < rank; ++i) out.push_back(x.shape[size_t(i)]);
  return {{x.dtype, out}};
}

std::vector<ValueType> infer_concat(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  int64_t rank = int64_t(x.shape.rank());
  int64_t axis = normalize_axis(n, n.attr_int("axis"), rank);
  Shape out = x.shape;
  int64_t total = 0;
  bool concrete = true;
  for (size_t i = 0; i < in.size(); ++i) {
    const Value& v = need(n, in, i);
    if (v.dtype != x.dtype || int64_t(v.shape.rank()) != rank)
      fail(n, str_cat("input ", i, " ", dtype_name(v.dtype), v.shape.str(), " does not match ", dtype_name(x.dtype),
                      x.shape.str()));
    const Dim& d = v.shape[size_t(axis)];
    if (d.is_concrete()) total += d.value;
    else concrete = false;
  }
  out[size_t(axis)] = concrete ? Dim(total) : kUnknown;
  return {{x.dtype, out}};
}

std::vector<ValueType> infer_slice(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  int64_t rank = int64_t(x.shape.rank());
  Shape out = x.shape;
  if (!n.has_attr("starts")) {
    for (size_t i = 0; i < out.rank(); ++i) out[i] = kUnknown;
    return {{x.dtype, out}};
  }
  auto starts = ints_attr(n, "starts"), ends = ints_attr(n, "ends"), axes = ints_attr(n, "axes"),
       steps = ints_attr(n, "steps");
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    fail(n, "starts, ends, axes and steps must have the same length");
  for (size_t i = 0; i < starts.size(); ++i) {
    int64_t a = normalize_axis(n, axes[i], rank);
    if (steps[i] == 0) fail(n, "step 0");
    const Dim& d = x.shape[size_t(a)];
    if (!d.is_concrete()) {
      // [0, INT_MAX) with step 1 keeps a symbolic dim whole.
      bool whole = starts[i] == 0 && steps[i] == 1 && ends[i] >= (int64_t(1) << 31);
      out[size_t(a)] = whole ? d : kUnknown;
      continue;
    }
    int64_t dim = d.value, s = starts[i], e = ends[i], st = steps[i];
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    if (st > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      out[size_t(a)] = Dim(e > s ? (e - s + st - 1) / st : 0);
    } else {
      s = std::clamp<int64_t>(s, -1, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      out[size_t(a)] = Dim(s > e ? (s - e - st - 1) / -st : 0);
    }
  }
  return {{x.dtype, out}};
}

std::vector<ValueType> infer_unsqueeze(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  auto axes = ints_attr(n, "axes");
  int64_t rank = int64_t(x.shape.rank() + axes.size());
  std::vector<bool> ins(size_t(rank), false);
  for (int64_t a : axes) {
    int64_t k = normalize_axis(n, a, rank);
    if (ins[size_t(k)]) fail(n, "repeated axis");
    ins[size_t(k)] = true;
  }
  Shape out;
  size_t j = 0;
  for (int64_t i = 0; i < rank; ++i) out.push_back(ins[size_t(i)] ? Dim(int64_t(1)) : x.shape[j++]);
  return {{x.dtype, out}};
}

std::vector<ValueType> infer_squeeze(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  int64_t rank = int64_t(x.shape.rank());
  auto axes = ints_attr(n, "axes");
  std::vector<bool> drop(size_t(rank), false);
  if (axes.empty()) {
    for (int64_t i = 0; i < rank; ++i) drop[size_t(i)] = x.shape[size_t(i)] == Dim(int64_t(1));
  } else {
    for (int64_t a : axes) {
      int64_t k = normalize_axis(n, a, rank);
      const Dim& d = x.shape[size_t(k)];
      if (d.is_concrete() && d.value != 1) fail(n, str_cat("cannot squeeze dim ", k, " of ", x.shape.str()));
      drop[size_t(k)] = true;
    }
  }
  Shape out;
  for (int64_t i = 0; i < rank; ++i)
    if (!drop[size_t(i)]) out.push_back(x.shape[size_t(i)]);
  return {{x.dtype, out}};
}

std::vector<ValueType> infer_shape(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  int64_t rank = int64_t(x.shape.rank());
  int64_t s = n.attr_int("start", 0), e = n.attr_int("end", rank);
  if (s < 0) s += rank;
  if (e < 0) e += rank;
  s = std::clamp<int64_t>(s, 0, rank);
  e = std::clamp<int64_t>(e, 0, rank);
  return {{DType::kI64, Shape{Dim(std::max<int64_t>(e - s, 0))}}};
}

std::vector<ValueType> infer_expand(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  if (n.has_attr("shape")) {
    Shape target;
    for (int64_t d : ints_attr(n, "shape")) target.push_back(Dim(d));
    // A target dim of 1 keeps the input's dim (numpy broadcasting both ways).
    Shape out = broadcast_shapes(n, x.shape, target);
    return {{x.dtype, out}};
  }
  int64_t r = std::max<int64_t>(shape_operand_len(n, need(n, in, 1)), int64_t(x.shape.rank()));
  return {{x.dtype, Shape(std::vector<Dim>(size_t(r), kUnknown))}};
}

std::vector<ValueType> infer_constant_of_shape(const Node& n, const In& in) {
  DType dt = dtype_from_name(n.attr_str("dtype", "f32"));
  if (n.has_attr("shape")) {
    Shape out;
    for (int64_t d : ints_attr(n, "shape")) {
      if (d < 0) fail(n, str_cat("negative dim ", d));
      out.push_back(Dim(d));
    }
    return {{dt, out}};
  }
  int64_t r = shape_operand_len(n, need(n, in, 0));
  return {{dt, Shape(std::vector<Dim>(size_t(r), kUnknown))}};
}

std::vector<ValueType> infer_range(const Node& n, const In& in) {
  const Value& s = need(n, in, 0);
  for (size_t i = 0; i < 3; ++i)
    if (need(n, in, i).dtype != s.dtype || need(n, in, i).shape.rank() != 0)
      fail(n, "start, limit and delta must be scalars of one dtype");
  return {{s.dtype, Shape{kUnknown}}};
}

std::vector<ValueType> infer_trilu(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  if (x.shape.rank() < 2) fail(n, str_cat("x must have rank >= 2, got ", x.shape.str()));
  return {{x.dtype, x.shape}};
}

std::vector<ValueType> infer_split(const Node& n, const In& in) {
  const Value& x = need(n, in, 0);
  int64_t axis = normalize_axis(n, n.attr_int("axis", 0), int64_t(x.shape.rank()));
  auto sizes = ints_attr(n, "split");
  const Dim& d = x.shape[size_t(axis)];
  if (sizes.empty()) {
    int64_t k = n.attr_int("num_outputs");
    if (k <= 0) fail(n, "num_outputs must be positive");
    if (d.is_concrete() && d.value % k) fail(n, str_cat("dim ", d.value, " does not split into ", k, " equal parts"));
    sizes.assign(size_t(k), d.is_concrete() ? d.value / k : -1);
  } else {
    int64_t total = 0;
    for (int64_t s : sizes) {
      if (s < 0) fail(n, str_cat("negative split size ", s));
      total += s;
    }
    if (d.is_concrete() && total != d.value) fail(n, str_cat("split sizes add to ", total, ", the dim is ", d.value));
  }
  std::vector<ValueType> out;
  for (int64_t s : sizes) {
    Shape sh = x.shape;
    sh[size_t(axis)] = s < 0 ? kUnknown : Dim(s);
    out.push_back({x.dtype, sh});
  }
  return out;
}

}  // namespace

int64_t normalize_axis(const Node& n, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) fail(n, str_cat("axis ", axis, " is out of range for rank ", rank));
  return axis < 0 ? axis + rank : axis;
}

Shape broadcast_shapes(const Node& n, const Shape& a, const Shape& b) {
  size_t rank = std::max(a.rank(), b.rank());
  Shape out;
  for (size_t i = 0; i < rank; ++i) {
    const Dim one(int64_t(1));
    const Dim& da = i + a.rank() >= rank ? a[i + a.rank() - rank] : one;
    const Dim& db = i + b.rank() >= rank ? b[i + b.rank() - rank] : one;
    if (da.is_concrete() && db.is_concrete()) {
      if (da.value != db.value && da.value != 1 && db.value != 1)
        fail(n, str_cat("cannot broadcast ", a.str(), " with ", b.str()));
      out.push_back(da.value == 1 ? db : da);
    } else if (da.is_concrete()) {
      out.push_back(da.value == 1 ? db : da);
    } else if (db.is_concrete()) {
      out.push_back(db.value == 1 ? da : db);
    } else {
      out.push_back(da == db ? da : (da.sym == "?" ? db : da));
    }
  }
  return out;
}

void add_generic_op_schemas(std::map<std::string, OpSchema>& r) {
  auto add = [&](OpSchema s) { r[s.name] = std::move(s); };
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And",
                         "Or", "Xor"})
    add({op, 2, 2, {}, "elementwise with numpy broadcasting (comparisons give bool as u8)", infer_broadcast});
  add({"Where", 3, 3, {}, "cond ? x : y with numpy broadcasting", infer_where});
  for (const char* op :
       {"Sqrt", "Erf", "Exp", "Log", "Sigmoid", "Relu", "Reciprocal", "Cos", "Sin"})
    add({op, 1, 1, {}, "elementwise float function", infer_float_unary});
  for (const char* op : {"Neg", "Abs", "Not", "Identity"})
    add({op, 1, 1, {}, "elementwise (Not: bool as u8; Identity: a copy)", infer_same});
  add({"Cast", 1, 1, {"to"}, "converts to dtype `to` (bool=1: nonzero -> 1)", infer_cast});
  add({"MatMul", 2, 2, {}, "numpy matmul of rank >= 2 f32 operands, batch dims broadcast", infer_matmul});
  add({"Softmax", 1, 1, {}, "softmax over attr axis (default -1)", infer_softmax});
  add({"ScaledDotProductAttention", 3, 4, {"scale"},
       "softmax(q k^T * attr scale (+ additive mask)) v over 4-D [B, H, S, D]; fuse_attention_pattern emits it",
       infer_sdpa});
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax"})
    add({op, 1, 1, {}, "reduction over attr axes (all when absent), attr keepdims (default 1)", infer_reduce});
  add({"Reshape", 1, 2, {}, "new shape from attr shape (ONNX 0/-1 rules) or an int64 input", infer_reshape});
  add({"Flatten", 1, 1, {}, "[d0..d(axis-1)] x [d(axis)..] as a matrix", infer_flatten});
  add({"Transpose", 1, 1, {}, "permutes dims by attr perm (reverse when absent)", infer_transpose});
  add({"Gather", 2, 2, {}, "takes indices along attr axis (negative indices wrap)", infer_gather});
  add({"Concat", 1, 1 << 16, {"axis"}, "joins inputs along attr axis", infer_concat});
  add({"Slice", 1, 5, {}, "ONNX slice by attrs starts/ends/axes/steps, or by int64 inputs", infer_slice});
  add({"Unsqueeze", 1, 1, {"axes"}, "inserts size-1 dims at attr axes", infer_unsqueeze});
  add({"Squeeze", 1, 1, {}, "drops size-1 dims at attr axes (all when absent)", infer_squeeze});
  add({"Shape", 1, 1, {}, "the input's dims [start, end) as int64", infer_shape});
  add({"Expand", 1, 2, {}, "broadcasts to attr shape or an int64 input", infer_expand});
  add({"ConstantOfShape", 0, 1, {}, "a tensor of attr dtype filled with attr value; shape from attr or input",
       infer_constant_of_shape});
  add({"Range", 3, 3, {}, "start, start + delta, ... below limit", infer_range});
  add({"Trilu", 1, 2, {}, "keeps the upper (attr upper=1) or lower triangle of the last two dims; optional k input",
       infer_trilu});
  add({"Split", 1, 1, {}, "splits along attr axis by attr split sizes or into attr num_outputs parts",
       infer_split});
}

}  // namespace kiln::ir
