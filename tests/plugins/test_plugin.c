/* Plugins for tests/plugins/plugin_test.cpp, one C file built several ways:
 *   KILN_TEST_PLUGIN_GOOD       test.kiln::Probe (every attribute kind; attr `bug` makes
 *                               its callbacks misbehave on purpose) and test.kiln::CudaOnly
 *   KILN_TEST_PLUGIN_BAD_ABI    a table claiming the next ABI version
 *   KILN_TEST_PLUGIN_DECLINE    kiln_plugin_get returns NULL
 *   KILN_TEST_PLUGIN_NO_ENTRY   exports no kiln_plugin_get
 *   KILN_TEST_PLUGIN_DUP        provides com.example::ScaledSoftplus like examples/plugins
 *   KILN_TEST_PLUGIN_NO_INFER   an op without an infer callback */
#include <stdio.h>
#include <string.h>

#include "kiln/plugin.h"

/* Each variant uses a subset of the callbacks below. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-const-variable"
#endif

static int bug_is(const kiln_plugin_attrs* a, const char* what) {
  const char* s = NULL;
  size_t len = 0;
  if (a->get_string(a, "bug", &s, &len) != KILN_PLUGIN_ATTR_FOUND) return 0;
  return len == strlen(what) && memcmp(s, what, len) == 0;
}

static int any_symbolic(const kiln_plugin_type* t) {
  uint32_t d;
  for (d = 0; d < t->rank; ++d)
    if (t->dims[d] < 0) return 1;
  return 0;
}

/* Probe: y = x * f + i + sum(ints) + sum(floats) + len(s), all attributes optional. */
static int32_t probe_infer(void* user, const kiln_plugin_type* in, int32_t num_inputs, const kiln_plugin_attrs* a,
                           kiln_plugin_type* out, int32_t* num_outputs, char* err, size_t err_size) {
  (void)user;
  (void)num_inputs;
  if (bug_is(a, "fail_infer")) {
    snprintf(err, err_size, "probe: infer asked to fail");
    return KILN_PLUGIN_ERROR;
  }
  if (in[0].dtype != KILN_PLUGIN_F32) {
    snprintf(err, err_size, "probe: x must be f32");
    return KILN_PLUGIN_UNSUPPORTED;
  }
  out[0] = in[0];
  *num_outputs = 1;
  if (bug_is(a, "negative_dim")) out[0].dims[0] = -77;
  if (bug_is(a, "output_count")) *num_outputs = 5;
  if (bug_is(a, "zero_outputs")) *num_outputs = 0;
  if (bug_is(a, "rank")) out[0].rank = KILN_PLUGIN_MAX_RANK + 1;
  if (bug_is(a, "dtype")) out[0].dtype = 99;
  /* Only at run time (every dim known): an output dtype the graph did not see. */
  if (bug_is(a, "runtime_dtype") && !any_symbolic(&in[0])) out[0].dtype = KILN_PLUGIN_I32;
  return KILN_PLUGIN_OK;
}

static int32_t probe_execute(void* user, const kiln_plugin_tensor* in, int32_t num_inputs, const kiln_plugin_attrs* a,
                             const kiln_plugin_tensor* out, int32_t num_outputs, char* err, size_t err_size) {
  double f = 1, add = 0;
  int64_t i = 0, n = 1, k;
  const int64_t* ints = NULL;
  const double* floats = NULL;
  const char* s = NULL;
  size_t count = 0, len = 0, j;
  uint32_t d;
  (void)user;
  (void)num_inputs;
  (void)num_outputs;
  if (bug_is(a, "fail_execute")) {
    snprintf(err, err_size, "probe: execution failed on purpose");
    return KILN_PLUGIN_ERROR;
  }
  if (a->get_float(a, "f", &f) == KILN_PLUGIN_ATTR_WRONG_TYPE ||
      a->get_int(a, "i", &i) == KILN_PLUGIN_ATTR_WRONG_TYPE) {
    snprintf(err, err_size, "probe: f must be a float and i an int");
    return KILN_PLUGIN_ERROR;
  }
  add += (double)i;
  if (a->get_ints(a, "ints", &ints, &count) == KILN_PLUGIN_ATTR_FOUND)
    for (j = 0; j < count; ++j) add += (double)ints[j];
  if (a->get_floats(a, "floats", &floats, &count) == KILN_PLUGIN_ATTR_FOUND)
    for (j = 0; j < count; ++j) add += floats[j];
  if (a->get_string(a, "s", &s, &len) == KILN_PLUGIN_ATTR_FOUND) add += (double)len;
  /* The reserved attributes are kiln's, not the node's. */
  if (a->get_string(a, "plugin_op", &s, &len) != KILN_PLUGIN_ATTR_ABSENT) {
    snprintf(err, err_size, "probe: kiln's plugin_op attribute is visible");
    return KILN_PLUGIN_ERROR;
  }
  for (d = 0; d < in[0].rank; ++d) {
    n *= in[0].dims[d];
    if (in[0].strides[d] != (d + 1 < in[0].rank ? in[0].dims[d + 1] * in[0].strides[d + 1] : 1)) {
      snprintf(err, err_size, "probe: input is not dense row-major");
      return KILN_PLUGIN_ERROR;
    }
  }
  for (k = 0; k < n; ++k) ((float*)out[0].data)[k] = (float)(((const float*)in[0].data)[k] * f + add);
  return KILN_PLUGIN_OK;
}

static int32_t cuda_only_execute(void* user, const kiln_plugin_tensor* in, int32_t num_inputs,
                                 const kiln_plugin_attrs* a, const kiln_plugin_tensor* out, int32_t num_outputs,
                                 void* stream, char* err, size_t err_size) {
  (void)user, (void)in, (void)num_inputs, (void)a, (void)out, (void)num_outputs, (void)stream;
  snprintf(err, err_size, "cuda_only: not meant to run in tests");
  return KILN_PLUGIN_UNSUPPORTED;
}

#if defined(KILN_TEST_PLUGIN_GOOD)
static const kiln_plugin_op kOps[] = {
    {"test.kiln", "Probe", "y = x * f + i + sum(ints) + sum(floats) + len(s)", 1, 1, 2, 0, NULL, probe_infer,
     probe_execute, NULL},
    {"test.kiln", "CudaOnly", "no CPU implementation", 1, 1, 1, 0, NULL, probe_infer, NULL, cuda_only_execute},
};
#define KILN_TEST_NAME "kiln-test"
#elif defined(KILN_TEST_PLUGIN_DUP)
static const kiln_plugin_op kOps[] = {
    {"com.example", "ScaledSoftplus", NULL, 1, 2, 1, 0, NULL, probe_infer, probe_execute, NULL},
};
#define KILN_TEST_NAME "kiln-test-dup"
#elif defined(KILN_TEST_PLUGIN_NO_INFER)
static const kiln_plugin_op kOps[] = {
    {"test.kiln", "NoInfer", NULL, 1, 1, 1, 0, NULL, NULL, probe_execute, NULL},
};
#define KILN_TEST_NAME "kiln-test-no-infer"
#else
static const kiln_plugin_op kOps[] = {
    {"test.kiln", "Probe", NULL, 1, 1, 1, 0, NULL, probe_infer, probe_execute, NULL},
};
#define KILN_TEST_NAME "kiln-test-misc"
#endif

static const kiln_plugin_library kLibrary = {
#if defined(KILN_TEST_PLUGIN_BAD_ABI)
    KILN_PLUGIN_ABI_VERSION + 1,
#else
    KILN_PLUGIN_ABI_VERSION,
#endif
    sizeof(kiln_plugin_library), KILN_TEST_NAME, "0.1", (int32_t)(sizeof kOps / sizeof kOps[0]),
    sizeof(kiln_plugin_op), kOps,
};

#if defined(KILN_TEST_PLUGIN_NO_ENTRY)
KILN_PLUGIN_EXPORT const kiln_plugin_library* kiln_plugin_get_table(uint32_t v) {
  return v ? &kLibrary : NULL;
}
#else
KILN_PLUGIN_EXPORT const kiln_plugin_library* kiln_plugin_get(uint32_t host_abi_version) {
#if defined(KILN_TEST_PLUGIN_DECLINE)
  (void)host_abi_version;
  return NULL;
#else
  (void)host_abi_version; /* the BAD_ABI build answers anyway, as an out-of-date plugin would */
  return &kLibrary;
#endif
}
#endif
