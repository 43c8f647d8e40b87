// GPTQ: calibration statistics, the inverse factor and the column sweep (see gptq.h).
#include "quant/gptq.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/log.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "quant/awq.h"

namespace kiln::quant {

namespace {

ThreadPool& pool() { return ThreadPool::global(); }

// Rows of the calibration batch transposed at a time: xt [k, kRowChunk] floats.
constexpr int64_t kRowChunk = 256;
// Rows of a weight swept together in gptq_quantize (they share each row of U from L1),
// and scored together in gptq_output_error (they share each row of H).
constexpr int64_t kRowBlock = 8;

// The loops below keep kLanes independent partial sums, so the compiler vectorizes them
// without reassociating (no -ffast-math); on x86-64 each also has an AVX2 clone, picked at
// load time.
constexpr int kLanes = 8;
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KILN_GPTQ_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KILN_GPTQ_CLONES
#endif

// sum a[r] * b[r] for r < n, n a multiple of kLanes.
KILN_GPTQ_CLONES float dot_lanes(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  for (int64_t r = 0; r < n; r += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[r + l] * b[r + l];
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// sum h[j] * d[j] for j < n, in double.
KILN_GPTQ_CLONES double dot_lanes(const double* h, const double* d, int64_t n) {
  double acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += h[j + l] * d[j + l];
  double s = 0;
  for (; j < n; ++j) s += h[j] * d[j];
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// y[t] -= e * u[t] for t < n.
KILN_GPTQ_CLONES void axpy_neg(float* y, float e, const float* u, int64_t n) {
  for (int64_t t = 0; t < n; ++t) y[t] -= e * u[t];
}

// In-place lower Cholesky factor of the symmetric a [k, k] (row-major; the upper triangle is
// left as it was). False when a pivot is not positive.
bool cholesky_lower(std::vector<double>& a, int64_t k) {
  for (int64_t j = 0; j < k; ++j) {
    const double* aj = a.data() + j * k;
    const double d = aj[j] - dot_lanes(aj, aj, j);
    if (!(d > 0.0) || !std::isfinite(d)) return false;
    const double ljj = std::sqrt(d);
    a[size_t(j * k + j)] = ljj;
    pool().parallel_for(k - j - 1, [&](int64_t b, int64_t e, int) {
      for (int64_t i = j + 1 + b; i < j + 1 + e; ++i) {
        double* ai = a.data() + i * k;
        ai[j] = (ai[j] - dot_lanes(ai, aj, j)) / ljj;
      }
    }, 16);
  }
  return true;
}

}  // namespace

void GptqCollector::observe(const float* x, int64_t rows, int64_t k) {
  if (k_ == 0) k_ = k, h_.assign(size_t(k * k), 0.0);
  KILN_CHECK(k == k_, "gptq calibration: '", name_, "' input width changed from ", k_, " to ", k);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j)
      if (!std::isfinite(x[r * k + j]))
        throw_error(ErrorCode::kInvalidArgument, "gptq calibration: non-finite activation ", x[r * k + j],
                    " entering Linear '", name_, "' (row ", rows_ + r, ", channel ", j, ")");
  std::vector<float> xt(size_t(k * kRowChunk));
  for (int64_t r0 = 0; r0 < rows; r0 += kRowChunk) {
    const int64_t nr = std::min(kRowChunk, rows - r0);
    const int64_t padded = (nr + kLanes - 1) / kLanes * kLanes;  // zeros after row nr
    for (int64_t j = 0; j < k; ++j) {
      float* xj = xt.data() + j * kRowChunk;
      for (int64_t r = 0; r < nr; ++r) xj[r] = x[(r0 + r) * k + j];
      for (int64_t r = nr; r < padded; ++r) xj[r] = 0.0f;
    }
    // Row i of the upper triangle costs k - i dot products: pair i with k - 1 - i so
    // contiguous chunks of pairs carry equal work.
    pool().parallel_for((k + 1) / 2, [&](int64_t b, int64_t e, int) {
      for (int64_t p = b; p < e; ++p) {
        const int64_t pair[2] = {p, k - 1 - p};
        for (int c = 0; c < (pair[1] == p ? 1 : 2); ++c) {  // k odd: the middle row once
          const int64_t i = pair[c];
          const float* xi = xt.data() + i * kRowChunk;
          double* hi = h_.data() + i * k;
          for (int64_t j = i; j < k; ++j) hi[j] += double(dot_lanes(xi, xt.data() + j * kRowChunk, padded));
        }
      }
    });
  }
  rows_ += rows;
}

std::shared_ptr<const GptqHessian> GptqCollector::finish() const {
  auto h = std::make_shared<GptqHessian>();
  h->k = k_;
  h->rows = rows_;
  h->sum = h_;
  for (int64_t i = 0; i < k_; ++i)
    for (int64_t j = 0; j < i; ++j) h->sum[size_t(i * k_ + j)] = h_[size_t(j * k_ + i)];
  return h;
}

std::vector<double> gptq_inverse_factor(const std::vector<double>& sum, int64_t rows, int64_t k, double damp,
                                        std::vector<int64_t>* dead) {
  if (rows <= 0) throw_error(ErrorCode::kInvalidArgument, "gptq: the Hessian saw no calibration rows");
  if (k <= 0 || int64_t(sum.size()) != k * k)
    throw_error(ErrorCode::kInvalidArgument, "gptq: Hessian of ", sum.size(), " values is not [", k, ", ", k, "]");
  if (!(damp >= 0.0) || !std::isfinite(damp))
    throw_error(ErrorCode::kInvalidArgument, "gptq: damping must be a finite value >= 0, got ", damp);
  std::vector<double> h(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) h[i] = sum[i] / double(rows);
  if (dead) dead->clear();
  double mean_diag = 0;
  for (int64_t j = 0; j < k; ++j) {
    double& d = h[size_t(j * k + j)];
    if (d == 0.0) {
      d = 1.0;
      if (dead) dead->push_back(j);
    }
    mean_diag += d / double(k);
  }
  std::vector<double> l;
  double add = damp * mean_diag;
  for (int attempt = 0;; ++attempt) {
    l = h;
    for (int64_t j = 0; j < k; ++j) l[size_t(j * k + j)] += add;
    if (cholesky_lower(l, k)) break;
    if (attempt == 4)
      throw_error(ErrorCode::kInvalidArgument, "gptq: the input Hessian (K=", k,
                  ") is not positive definite even with damping ", add / mean_diag, " of its mean diagonal");
    add = add > 0 ? add * 10 : 1e-6 * mean_diag;
  }
  // (H + damp I)^-1 = L^-T L^-1, column by column: forward then backward substitution.
  std::vector<double> lt(size_t(k * k));  // L^T, so the backward pass reads rows
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j <= i; ++j) lt[size_t(j * k + i)] = l[size_t(i * k + j)];
  std::vector<double> inv(size_t(k * k));  // column c stored as row c (symmetric)
  pool().parallel_for(k, [&](int64_t c0, int64_t c1, int) {
    std::vector<double> y(static_cast<size_t>(k));
    for (int64_t c = c0; c < c1; ++c) {
      std::fill(y.begin(), y.end(), 0.0);
      for (int64_t i = c; i < k; ++i) {  // L y = e_c: y is 0 above c
        const double* li = l.data() + i * k;
        y[size_t(i)] = ((i == c ? 1.0 : 0.0) - dot_lanes(li + c, y.data() + c, i - c)) / li[i];
      }
      double* x = inv.data() + c * k;
      for (int64_t i = k - 1; i >= 0; --i) {  // L^T x = y
        const double* ui = lt.data() + i * k;
        x[i] = (y[size_t(i)] - dot_lanes(ui + i + 1, x + i + 1, k - i - 1)) / ui[i];
      }
    }
  });
  // Symmetrize against rounding, then U = (lower Cholesky factor of the inverse)^T.
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < i; ++j) {
      const double v = 0.5 * (inv[size_t(i * k + j)] + inv[size_t(j * k + i)]);
      inv[size_t(i * k + j)] = inv[size_t(j * k + i)] = v;
    }
  if (!cholesky_lower(inv, k))
    throw_error(ErrorCode::kInvalidArgument, "gptq: the inverse Hessian (K=", k, ") lost positive definiteness");
  std::vector<double> u(size_t(k * k), 0.0);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j <= i; ++j) u[size_t(j * k + i)] = inv[size_t(i * k + j)];
  return u;
}

std::vector<int64_t> gptq_act_order(const std::vector<double>& sum, int64_t k) {
  KILN_THROW_IF(k <= 0 || int64_t(sum.size()) != k * k, kInvalidArgument, "gptq: Hessian of ", sum.size(),
                " values is not [", k, ", ", k, "]");
  std::vector<int64_t> order(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) order[size_t(j)] = j;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return sum[size_t(a * k + a)] > sum[size_t(b * k + b)]; });
  return order;
}

std::vector<double> gptq_permute(const std::vector<double>& sum, int64_t k, const std::vector<int64_t>& order) {
  std::vector<double> p(sum.size());
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) p[size_t(i * k + j)] = sum[size_t(order[size_t(i)] * k + order[size_t(j)])];
  return p;
}

kiln::QuantizedRows gptq_quantize(const float* w, int64_t n, int64_t k, const std::vector<double>& u,
                                  const std::vector<int64_t>& dead, kiln::QuantFormat format,
                                  const std::vector<int64_t>& order) {
  KILN_THROW_IF(n <= 0 || k <= 0 || k % kQuantGroup != 0, kInvalidArgument,
                "gptq needs N > 0 and K a positive multiple of ", kQuantGroup, ", got N=", n, " K=", k);
  KILN_THROW_IF(int64_t(u.size()) != k * k, kInvalidArgument, "gptq: inverse factor of ", u.size(),
                " values for K=", k);
  KILN_THROW_IF(!order.empty() && int64_t(order.size()) != k, kInvalidArgument,
                "gptq: column order of ", order.size(), " for K=", k);
  q4_free_scales();  // its switch read here, not first in a pool thread
  kiln::QuantizedRows q;
  q.format = format;
  q.n = n;
  q.k = k;
  const size_t cb = quant_row_code_bytes(format, k), groups = size_t(q.groups());
  q.codes.reset(new uint8_t[size_t(n) * cb]());
  q.scales.reset(new uint16_t[size_t(n) * groups]);
  if (format == kiln::QuantFormat::kQ4) q.mins.reset(new uint16_t[size_t(n) * groups]);
  q.row_factor.reset(new float[size_t(n)]);
  // U in float for the sweep's updates (the error moved is a fraction of one grid step).
  std::vector<float> uf(u.size());
  for (size_t i = 0; i < u.size(); ++i) uf[i] = float(u[i]);
  const int64_t blocks = (n + kRowBlock - 1) / kRowBlock;
  pool().parallel_for(blocks, [&](int64_t b0, int64_t b1, int) {
    // Swept in U's order: rows[i] holds the block's row i permuted by `order`, so every
    // update is one contiguous axpy over the steps still to come.
    std::vector<float> rows(static_cast<size_t>(kRowBlock * k)), row(static_cast<size_t>(k));
    std::vector<QuantGroup> grid(size_t(kRowBlock) * groups);
    // q4: each row's super-group exponents, from the unmodified row like its factor (act
    // order's static groups); column order takes them from the updated values (below).
    const size_t supers = size_t(quant_super_groups(k));
    std::vector<QuantSuperExp> sexp(size_t(kRowBlock) * supers);
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t r0 = blk * kRowBlock, nb = std::min(kRowBlock, n - r0);
      for (int64_t i = 0; i < nb; ++i) {
        const int64_t r = r0 + i;
        std::copy(w + r * k, w + (r + 1) * k, row.begin());
        for (int64_t j : dead) row[size_t(j)] = 0.0f;
        // The row factor of the unmodified row: the sweep moves values by about one step
        // of the grid, far inside f16's 2x headroom above the largest scale (q8's
        // quant_group saturates; q4's 8-bit codes clamp at the super-group's exponents).
        const float factor = quant_row_factor(row.data(), k, format);
        q.row_factor[size_t(r)] = factor;
        for (size_t sg = 0; sg < supers && !order.empty(); ++sg) {  // column order: at the sweep
          const int64_t at = int64_t(sg) * kQ4SuperGroups * kQuantGroup;
          sexp[size_t(i) * supers + sg] = quant_super_exp(
              row.data() + at, std::min(k - at, kQ4SuperGroups * kQuantGroup), factor);
        }
        // In act order a group's columns are spread over the sweep: its grid comes from the
        // unmodified row (GPTQ's static groups). In column order each group's grid is
        // chosen from the updated values when the sweep reaches it.
        if (!order.empty())
          for (size_t g = 0; g < groups; ++g)
            grid[size_t(i) * groups + g] =
                quant_group(row.data() + g * kQuantGroup, format, factor,
                            sexp[size_t(i) * supers + g / kQ4SuperGroups]);
        float* ri = rows.data() + i * k;
        for (int64_t s = 0; s < k; ++s) ri[s] = row[size_t(order.empty() ? s : order[size_t(s)])];
      }
      for (int64_t s = 0; s < k; ++s) {  // s: sweep step, U's row; j: the weight column
        const int64_t j = order.empty() ? s : order[size_t(s)];
        const float* us = uf.data() + s * k;
        for (int64_t i = 0; i < nb; ++i) {
          float* ri = rows.data() + i * k;
          QuantGroup& qg = grid[size_t(i) * groups + size_t(j / kQuantGroup)];
          // Column order: a super-group's exponents, like each group's grid, from the updated
          // values when the sweep reaches it (its later groups may still grow past them by
          // the time they are reached: their codes then clamp at 255 / +-127).
          QuantSuperExp& se = sexp[size_t(i) * supers + size_t(j / kQuantGroup / kQ4SuperGroups)];
          if (order.empty() && j % (kQ4SuperGroups * kQuantGroup) == 0)
            se = quant_super_exp(ri + s, std::min(k - s, kQ4SuperGroups * kQuantGroup),
                                 q.row_factor[size_t(r0 + i)]);
          if (order.empty() && j % kQuantGroup == 0)
            qg = quant_group(ri + s, format, q.row_factor[size_t(r0 + i)], se);
          const int c = qg.code(ri[s], format);
          set_quant_code(format, q.codes.get() + size_t(r0 + i) * cb, j, c);
          const float err = float((double(ri[s]) - double(qg.value(c))) / u[size_t(s * k + s)]);
          axpy_neg(ri + s + 1, err, us + s + 1, k - s - 1);
        }
      }
      for (int64_t i = 0; i < nb; ++i)
        for (size_t g = 0; g < groups; ++g) {
          q.scales[size_t(r0 + i) * groups + g] = grid[size_t(i) * groups + g].scale16;
          if (q.mins) q.mins[size_t(r0 + i) * groups + g] = grid[size_t(i) * groups + g].min16;
        }
    }
  });
  return q;
}

double gptq_output_error(const float* w, const kiln::QuantizedRows& q, const std::vector<double>& sum, int64_t rows) {
  const int64_t n = q.n, k = q.k;
  KILN_THROW_IF(int64_t(sum.size()) != k * k || rows <= 0, kInvalidArgument, "gptq: Hessian does not match K=", k);
  std::vector<double> part(size_t(pool().num_threads()), 0.0);
  const int64_t blocks = (n + kRowBlock - 1) / kRowBlock;
  pool().parallel_for(blocks, [&](int64_t b0, int64_t b1, int t) {
    std::vector<float> deq(static_cast<size_t>(k));
    std::vector<double> d(static_cast<size_t>(kRowBlock * k));
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t r0 = blk * kRowBlock, nb = std::min(kRowBlock, n - r0);
      for (int64_t i = 0; i < nb; ++i) {
        const int64_t r = r0 + i;
        dequantize_rows(q, r, r + 1, deq.data());
        for (int64_t j = 0; j < k; ++j) d[size_t(i * k + j)] = double(w[r * k + j]) - double(deq[size_t(j)]);
      }
      double e = 0;
      for (int64_t row = 0; row < k; ++row) {  // H's row, shared by the block's rows
        const double* hr = sum.data() + row * k;
        for (int64_t i = 0; i < nb; ++i) e += d[size_t(i * k + row)] * dot_lanes(hr, d.data() + i * k, k);
      }
      part[size_t(t)] += e;
    }
  });
  double e = 0;
  for (double p : part) e += p;
  return e / double(rows);
}

GptqReport apply_gptq(ir::Graph& g, const CalibrationTable& table, const GptqOptions& o) {
  AwqOptions ao;  // which Linears a weight-only format quantizes: AWQ's rule
  ao.format = o.format;
  ao.keep = o.keep;
  GptqReport rep;
  struct Factor {
    std::vector<double> u;
    std::vector<int64_t> order, dead;
  };
  std::map<const GptqHessian*, Factor> factors;
  for (size_t ni = 0; ni < g.nodes().size(); ++ni) {
    ir::Node& n = g.nodes()[ni];
    if (n.op != "Linear" || n.inputs.size() < 2 || !g.is_weight(n.inputs[1])) continue;
    if (n.has_attr("weight_quant")) continue;  // kept in its file's q8/q4 codes
    if (linear_kept(g, n, o.keep)) {
      n.attrs["precision"] = std::string("f32");
      ++rep.kept;
      continue;
    }
    if (!awq_quantizes(g, n, ao)) continue;
    auto it = table.gptq.find(n.name);
    if ((it == table.gptq.end() || !it->second) && o.partial) continue;
    if (it == table.gptq.end() || !it->second)
      throw_error(ErrorCode::kNotFound, "calibration table has no GPTQ Hessian for Linear '", n.name,
                  "' (calibrated on a different model or opt level?)");
    const GptqHessian& h = *it->second;
    // The node's own q4/q8 precision (a --pin-precision), else the options' format.
    const std::string pinned = n.attr_str("precision", "");
    const kiln::QuantFormat f = pinned == "q8" ? kiln::QuantFormat::kQ8
                                : pinned == "q4" ? kiln::QuantFormat::kQ4
                                                 : o.format;
    const std::string fmt = quant_format_name(f);
    const Tensor& wt = g.weight(n.inputs[1]);
    const int64_t rows = wt.dim(0), k = wt.dim(1);
    if (h.k != k)
      throw_error(ErrorCode::kInvalidArgument, "calibration table: GPTQ Hessian of '", n.name, "' is ", h.k, " wide, the Linear reads ", k);
    Tensor w = wt.dtype() == DType::kF32 ? wt : wt.to(DType::kF32);
    std::vector<double> sum = h.sum;
    if (o.awq_scaled) {  // the input is x / s: H_ij / (s_i s_j)
      auto a = table.awq.find(n.name);
      if (a == table.awq.end() || int64_t(a->second.scales.size()) != k)
        throw_error(ErrorCode::kNotFound, "calibration table has no AWQ scales of width ", k, " for Linear '", n.name, "'");
      const std::vector<float>& s = a->second.scales;
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < k; ++j) sum[size_t(i * k + j)] /= double(s[size_t(i)]) * double(s[size_t(j)]);
    }
    GptqResult res;
    const auto memo = o.memo ? o.memo->find(n.name) : std::map<std::string, GptqResult>::iterator{};
    if (o.memo && memo != o.memo->end() && memo->second.format == f) {
      res = memo->second;
    } else {
      // Linears sharing an input share its factor (unless AWQ scaled each group's H).
      Factor& fa = o.awq_scaled ? factors[nullptr] : factors[&h];
      if (o.awq_scaled || fa.u.empty()) {
        fa = Factor{};
        if (o.act_order) fa.order = gptq_act_order(sum, k);
        fa.u = gptq_inverse_factor(fa.order.empty() ? sum : gptq_permute(sum, k, fa.order), h.rows, k, o.damp,
                                   &fa.dead);
        for (int64_t& d : fa.dead) d = fa.order.empty() ? d : fa.order[size_t(d)];  // u's indices -> columns
      }
      const float* wp = w.data_as<float>();
      kiln::QuantizedRows q = gptq_quantize(wp, rows, k, fa.u, fa.dead, f, fa.order);
      res.format = f;
      res.error = gptq_output_error(wp, q, sum, h.rows);
      res.error_rtn = gptq_output_error(wp, kiln::quantize_rows(wp, rows, k, f), sum, h.rows);
      log_debug("gptq: ", n.name, " [", rows, ", ", k, "]: output error ",
                res.error_rtn > 0 ? res.error / res.error_rtn : 1.0, " of plain ", fmt,
                fa.dead.empty() ? "" : str_cat(", ", fa.dead.size(), " dead input channels"));
      res.image = Tensor(DType::kU8, {rows, int64_t(quant_image_row_bytes(f, k))});
      quant_rows_to_image(q, res.image.data_as<uint8_t>());
      if (o.memo) (*o.memo)[n.name] = res;
    }
    rep.error += res.error;
    rep.error_rtn += res.error_rtn;
    const ir::ValueId nv = g.add_weight(g.value(n.inputs[1]).name + ".gptq", std::move(res.image));
    ir::Node& nn = g.nodes()[ni];  // add_weight does not add nodes, but keep the reference fresh
    nn.inputs[1] = nv;
    nn.attrs["weight_quant"] = fmt;
    nn.attrs["weight_k"] = k;
    nn.attrs["precision"] = fmt;
    ++rep.quantized;
  }
  g.compact();
  ir::verify(g);
  return rep;
}

}  // namespace kiln::quant
