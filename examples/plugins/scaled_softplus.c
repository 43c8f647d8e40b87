/* An example kiln plugin in plain C99: com.example::ScaledSoftplus, a softplus with
 * PyTorch's beta/threshold semantics and an optional per-channel scale, the kind of
 * custom op an ONNX export carries when a model uses its own activation:
 *
 *   y = scale * (x                          if beta * x > threshold
 *                log(1 + exp(beta * x)) / beta   otherwise)
 *
 * inputs:  x      float32, any rank >= 1
 *          scale  optional float32, [] or [1] or [C] with C = x's last dim
 * attrs:   beta (float, > 0, default 1), threshold (float, default 20)
 * output:  y      float32, x's shape
 *
 * It depends on nothing but include/kiln/plugin.h and libm. Build it alone with
 *   cc -std=c99 -O2 -fPIC -shared -fvisibility=hidden -I<kiln>/include scaled_softplus.c \
 *      -o libscaled_softplus.so -lm
 * and load it with `kiln ... --plugin ./libscaled_softplus.so` (docs/plugins.md).
 * kiln's tests load it (tests/plugins/plugin_test.cpp, tests/tools/cli_test.sh). */
#include <math.h>
#include <stdio.h>

#include "kiln/plugin.h"

typedef struct params {
  double beta, threshold;
} params;

/* Reads and checks the attributes; returns KILN_PLUGIN_OK or writes why into err. */
static int32_t read_params(const kiln_plugin_attrs* attrs, params* p, char* err, size_t err_size) {
  int32_t found;
  p->beta = 1.0;
  p->threshold = 20.0;
  found = attrs->get_float(attrs, "beta", &p->beta);
  if (found == KILN_PLUGIN_ATTR_WRONG_TYPE) {
    snprintf(err, err_size, "ScaledSoftplus: attribute beta must be a float");
    return KILN_PLUGIN_ERROR;
  }
  found = attrs->get_float(attrs, "threshold", &p->threshold);
  if (found == KILN_PLUGIN_ATTR_WRONG_TYPE) {
    snprintf(err, err_size, "ScaledSoftplus: attribute threshold must be a float");
    return KILN_PLUGIN_ERROR;
  }
  if (!(p->beta > 0.0)) {
    snprintf(err, err_size, "ScaledSoftplus: beta must be > 0, got %g", p->beta);
    return KILN_PLUGIN_ERROR;
  }
  return KILN_PLUGIN_OK;
}

/* Dims may be symbolic (negative) at graph time: only two known dims can disagree. */
static int dims_conflict(int64_t a, int64_t b) { return a >= 0 && b >= 0 && a != b; }

static int32_t infer(void* user, const kiln_plugin_type* inputs, int32_t num_inputs, const kiln_plugin_attrs* attrs,
                     kiln_plugin_type* outputs, int32_t* num_outputs, char* err, size_t err_size) {
  params p;
  int32_t st = read_params(attrs, &p, err, err_size);
  const kiln_plugin_type* x = &inputs[0];
  (void)user;
  if (st != KILN_PLUGIN_OK) return st;
  if (x->dtype != KILN_PLUGIN_F32) {
    snprintf(err, err_size, "ScaledSoftplus: x must be float32, got dtype code %u", (unsigned)x->dtype);
    return KILN_PLUGIN_UNSUPPORTED;
  }
  if (x->rank < 1) {
    snprintf(err, err_size, "ScaledSoftplus: x must have rank >= 1");
    return KILN_PLUGIN_ERROR;
  }
  if (num_inputs > 1 && inputs[1].dtype != KILN_PLUGIN_ABSENT) {
    const kiln_plugin_type* s = &inputs[1];
    if (s->dtype != KILN_PLUGIN_F32) {
      snprintf(err, err_size, "ScaledSoftplus: scale must be float32, got dtype code %u", (unsigned)s->dtype);
      return KILN_PLUGIN_UNSUPPORTED;
    }
    if (s->rank > 1) {
      snprintf(err, err_size, "ScaledSoftplus: scale must have rank 0 or 1, got rank %u", (unsigned)s->rank);
      return KILN_PLUGIN_ERROR;
    }
    if (s->rank == 1 && s->dims[0] != 1 && dims_conflict(s->dims[0], x->dims[x->rank - 1])) {
      snprintf(err, err_size, "ScaledSoftplus: scale has %lld entries, x's last dim is %lld (want 1 or equal)",
               (long long)s->dims[0], (long long)x->dims[x->rank - 1]);
      return KILN_PLUGIN_ERROR;
    }
  }
  outputs[0] = *x; /* same dtype, rank and dims (symbolic ones included) */
  *num_outputs = 1;
  return KILN_PLUGIN_OK;
}

static int32_t execute_cpu(void* user, const kiln_plugin_tensor* inputs, int32_t num_inputs,
                           const kiln_plugin_attrs* attrs, const kiln_plugin_tensor* outputs, int32_t num_outputs,
                           char* err, size_t err_size) {
  params p;
  int32_t st = read_params(attrs, &p, err, err_size);
  const kiln_plugin_tensor* x = &inputs[0];
  const float* xs = (const float*)x->data;
  float* ys = (float*)outputs[0].data;
  const float* scale = NULL;
  int64_t n = 1, c = x->dims[x->rank - 1], scale_len = 0, i;
  uint32_t d;
  (void)user;
  (void)num_outputs;
  if (st != KILN_PLUGIN_OK) return st;
  for (d = 0; d < x->rank; ++d) n *= x->dims[d];
  if (num_inputs > 1 && inputs[1].data) {
    scale = (const float*)inputs[1].data;
    scale_len = inputs[1].rank == 0 ? 1 : inputs[1].dims[0];
    if (scale_len != 1 && scale_len != c) { /* kiln re-infers first; checked again all the same */
      snprintf(err, err_size, "ScaledSoftplus: scale has %lld entries, x's last dim is %lld", (long long)scale_len,
               (long long)c);
      return KILN_PLUGIN_ERROR;
    }
  }
  /* kiln passes dense row-major tensors, so one flat loop covers every element. */
  for (i = 0; i < n; ++i) {
    const double v = xs[i], bx = p.beta * v;
    double y = bx > p.threshold ? v : log1p(exp(bx)) / p.beta;
    if (scale) y *= scale[scale_len == 1 ? 0 : i % c];
    ys[i] = (float)y;
  }
  return KILN_PLUGIN_OK;
}

static const kiln_plugin_op kOps[] = {
    {"com.example", "ScaledSoftplus",
     "y = scale * softplus(x; beta, threshold) (PyTorch's Softplus, optional per-channel scale)", 1, 2, 1, 0, NULL,
     infer, execute_cpu, NULL /* no CUDA implementation */},
};

static const kiln_plugin_library kLibrary = {
    KILN_PLUGIN_ABI_VERSION, sizeof(kiln_plugin_library), "example-ops", "1.0.0",
    (int32_t)(sizeof kOps / sizeof kOps[0]), sizeof(kiln_plugin_op), kOps,
};

KILN_PLUGIN_EXPORT const kiln_plugin_library* kiln_plugin_get(uint32_t host_abi_version) {
  return host_abi_version == KILN_PLUGIN_ABI_VERSION ? &kLibrary : NULL;
}
