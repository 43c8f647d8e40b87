// CPU ScaledDotProductAttention: softmax(q k^T * scale + mask) v over batched 4-D f32
// tensors, the op fuse_attention_pattern puts in place of an imported graph's
// MatMul-scale-mask-Softmax-MatMul. Each score row is computed, masked and
// softmaxed in a scratch row and never written out; the sums run in the same order
// as the generic MatMul and Softmax, so fused and unfused graphs agree to rounding.
// Tested against the unfused graph in tests/passes/attention_fusion_test.cpp.
#include <algorithm>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace kiln::cpu {

namespace {

constexpr const char* kOp = "ScaledDotProductAttention";
// Query rows per task: one block reads the same K/V head while they are in cache.
constexpr int64_t kQueryBlock = 16;

[[noreturn]] void sdpa_error(const std::string& node, const std::string& what) {
  throw_error(ErrorCode::kInvalidArgument, "node '", node, "' (", kOp, "): ", what);
}

// Numpy broadcast of two dims (1 stretches); throws naming the dims otherwise.
int64_t batch_dim(const std::string& node, int64_t a, int64_t b, const char* what) {
  if (a != b && a != 1 && b != 1) sdpa_error(node, str_cat("cannot broadcast the ", what, " dims ", a, " and ", b));
  return a == 1 ? b : a;
}

// Element offset of matrix (b, h) of a [B, H, rows, cols] operand read with broadcasting.
struct BatchIndex {
  int64_t b_dim, h_dim, matrix;
  int64_t offset(int64_t b, int64_t h) const {
    return ((b_dim == 1 ? 0 : b) * h_dim + (h_dim == 1 ? 0 : h)) * matrix;
  }
};

}  // namespace

OpRun prepare_sdpa(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  const float scale = float(n.attr_float("scale"));
  return [scale, name = n.name](OpContext& c) {
    const Tensor& q = *c.inputs[0];
    const Tensor& k = *c.inputs[1];
    const Tensor& v = *c.inputs[2];
    const Tensor* mask = c.inputs.size() > 3 ? c.inputs[3] : nullptr;
    for (const Tensor* t : {&q, &k, &v})
      if (t->rank() != 4 || t->dtype() != DType::kF32)
        sdpa_error(name, str_cat("q, k and v must be 4-D f32 [B, H, S, D], got q ", q.shape_str(), ", k ",
                                 k.shape_str(), ", v ", v.shape_str()));
    const int64_t d = q.dim(3), dv = v.dim(3);
    int64_t sq = q.dim(2), sk = k.dim(2);
    if (k.dim(3) != d)
      sdpa_error(name, str_cat("the head dims of q ", q.shape_str(), " and k ", k.shape_str(), " differ"));
    int64_t bb = batch_dim(name, batch_dim(name, q.dim(0), k.dim(0), "batch"), v.dim(0), "batch");
    int64_t hh = batch_dim(name, batch_dim(name, q.dim(1), k.dim(1), "head"), v.dim(1), "head");
    std::vector<int64_t> ms = {1, 1, 1, 1};
    if (mask) {
      if (mask->dtype() != DType::kF32 || mask->rank() > 4)
        sdpa_error(name, str_cat("mask must be f32 of rank <= 4, got ", dtype_name(mask->dtype()), mask->shape_str()));
      for (int i = 0; i < mask->rank(); ++i) ms[size_t(4 - mask->rank() + i)] = mask->dim(i);
      bb = batch_dim(name, bb, ms[0], "batch");
      hh = batch_dim(name, hh, ms[1], "head");
      // Like the Add it replaces, the mask may also stretch a single query or key row.
      sq = batch_dim(name, sq, ms[2], "query");
      sk = batch_dim(name, sk, ms[3], "key");
    }
    if (v.dim(2) != sk)
      sdpa_error(name, str_cat("the scores have ", sk, " keys but v ", v.shape_str(), " has ", v.dim(2), " rows"));
    const int64_t q_rows = q.dim(2), k_rows = k.dim(2);
    Tensor& y = c.out(0, {bb, hh, sq, dv});
    if (y.numel() == 0) return;
    const BatchIndex qi{q.dim(0), q.dim(1), q.dim(2) * d}, ki{k.dim(0), k.dim(1), k.dim(2) * d},
        vi{v.dim(0), v.dim(1), sk * dv},
        mi{ms[0], ms[1], ms[2] * ms[3]};
    const float* pq = q.data_as<float>();
    const float* pk = k.data_as<float>();
    const float* pv = v.data_as<float>();
    const float* pm = mask ? mask->data_as<float>() : nullptr;
    float* py = y.data_as<float>();
    const int64_t blocks = (sq + kQueryBlock - 1) / kQueryBlock;
    ThreadPool::global().parallel_for(bb * hh * blocks, [&](int64_t begin, int64_t end, int) {
      std::vector<float> s(static_cast<size_t>(sk));
      for (int64_t task = begin; task < end; ++task) {
        const int64_t bh = task / blocks, b = bh / hh, h = bh % hh;
        const float* kb = pk + ki.offset(b, h);
        const float* vb = pv + vi.offset(b, h);
        const float* mb = pm ? pm + mi.offset(b, h) : nullptr;
        const int64_t i_end = std::min(sq, (task % blocks + 1) * kQueryBlock);
        for (int64_t i = (task % blocks) * kQueryBlock; i < i_end; ++i) {
          const float* qrow = pq + qi.offset(b, h) + (q_rows == 1 ? 0 : i) * d;
          for (int64_t j = 0; j < sk; ++j) {
            const float* krow = kb + (k_rows == 1 ? 0 : j) * d;
            float acc = 0.0f;
            for (int64_t x = 0; x < d; ++x) acc += qrow[x] * krow[x];
            s[size_t(j)] = acc * scale;
          }
          if (mb) {
            const float* mrow = mb + (ms[2] == 1 ? 0 : i) * ms[3];
            for (int64_t j = 0; j < sk; ++j) s[size_t(j)] += mrow[ms[3] == 1 ? 0 : j];
          }
          softmax_row(s.data(), sk, s.data());
          float* yrow = py + ((b * hh + h) * sq + i) * dv;
          std::fill(yrow, yrow + dv, 0.0f);
          for (int64_t j = 0; j < sk; ++j) {
            const float p = s[size_t(j)];
            const float* vrow = vb + j * dv;
            for (int64_t x = 0; x < dv; ++x) yrow[x] += p * vrow[x];
          }
        }
      }
    });
  };
}

}  // namespace kiln::cpu
