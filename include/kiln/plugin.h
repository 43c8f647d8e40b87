/* kiln plugin ABI: custom ops in a shared library that any C or C++ compiler can build.
 *
 * A plugin library exports one C function, kiln_plugin_get(), returning a table of the
 * ops it provides: for each, its ONNX (domain, op_type), input/output counts, a shape and
 * dtype inference callback and execute callbacks (CPU; optionally CUDA). kiln loads it
 * with dlopen (`kiln ... --plugin FILE` or KILN_PLUGINS=a.so:b.so), imports ONNX nodes of
 * those ops as generic `Plugin` IR nodes, records the plugin in engines built from them,
 * and calls back into the library to infer shapes and to run the op.
 *
 * The promise (docs/plugins.md): this header is plain C; structs hold only fixed-width
 * integers, doubles and pointers (no enums, bitfields or C++ types), and nothing crosses
 * it but these structs and status codes: no exceptions, no allocation owned across the
 * boundary. Within one KILN_PLUGIN_ABI_VERSION, structs only grow at their end, and kiln
 * reads each table by the size the plugin says it has (struct_size, op_size), so a
 * plugin built against an older header of the same ABI version keeps loading. An
 * incompatible change bumps KILN_PLUGIN_ABI_VERSION and kiln refuses other versions by
 * name. Example: examples/plugins/scaled_softplus.c; tests: tests/plugins/.
 */
#ifndef KILN_PLUGIN_H_
#define KILN_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI this header describes; kiln passes its own to kiln_plugin_get() and loads a
 * table only when the table's abi_version equals it. */
#define KILN_PLUGIN_ABI_VERSION 1u

/* The entry point every plugin library exports (see kiln_plugin_get_fn below). */
#define KILN_PLUGIN_ENTRY_POINT "kiln_plugin_get"

#if defined(_WIN32)
#define KILN_PLUGIN_EXPORT __declspec(dllexport)
#else
#define KILN_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* Status codes every callback returns. */
#define KILN_PLUGIN_OK 0
#define KILN_PLUGIN_ERROR 1       /* bad input (shape, dtype, attribute): message says which */
#define KILN_PLUGIN_UNSUPPORTED 2 /* valid, but this plugin does not handle it */

/* Element types (the values are part of the ABI). */
#define KILN_PLUGIN_F32 0u
#define KILN_PLUGIN_F16 1u
#define KILN_PLUGIN_BF16 2u
#define KILN_PLUGIN_I8 3u
#define KILN_PLUGIN_FP8E4M3 4u
#define KILN_PLUGIN_I32 5u
#define KILN_PLUGIN_I64 6u
#define KILN_PLUGIN_U8 7u /* also ONNX bool (0 or 1) */

/* The highest tensor rank kiln passes or accepts. */
#define KILN_PLUGIN_MAX_RANK 8

/* The dtype of an absent optional input (it also has rank 0, and data NULL at run time). */
#define KILN_PLUGIN_ABSENT 0xFFFFFFFFu

/* A tensor type during shape inference. A dim >= 0 is known; a negative dim is a
 * symbolic one (the token count, a dynamic batch...): equal negative values are the
 * same symbol, kiln numbers them -1, -2, ... per call. A plugin may copy an input's
 * symbolic dim into an output, and must not do arithmetic on it; any other negative
 * output dim is refused. At run time every dim is known. */
typedef struct kiln_plugin_type {
  uint32_t dtype; /* KILN_PLUGIN_F32 ... */
  uint32_t rank;  /* <= KILN_PLUGIN_MAX_RANK */
  int64_t dims[KILN_PLUGIN_MAX_RANK];
} kiln_plugin_type;

/* A tensor at run time. kiln passes dense row-major tensors and fills `strides` (in
 * elements) accordingly; input data must not be written. For the CUDA callback `data`
 * is a device pointer (dims and strides stay on the host). */
typedef struct kiln_plugin_tensor {
  void* data;
  uint32_t dtype;
  uint32_t rank;
  const int64_t* dims;    /* rank entries */
  const int64_t* strides; /* rank entries */
} kiln_plugin_tensor;

/* What an attribute lookup found. */
#define KILN_PLUGIN_ATTR_FOUND 1
#define KILN_PLUGIN_ATTR_ABSENT 0
#define KILN_PLUGIN_ATTR_WRONG_TYPE (-1)

/* The node's attributes (the ONNX node's, as imported), looked up by name. Pointers
 * returned stay valid until the callback returns. An int attribute also reads as a
 * float; floats are doubles (ONNX stores float32). Strings are not NUL-terminated
 * unless `len` says so: use (s, len). */
typedef struct kiln_plugin_attrs kiln_plugin_attrs;
struct kiln_plugin_attrs {
  const void* impl; /* kiln's; do not touch */
  int32_t (*get_int)(const kiln_plugin_attrs* a, const char* name, int64_t* out);
  int32_t (*get_float)(const kiln_plugin_attrs* a, const char* name, double* out);
  int32_t (*get_string)(const kiln_plugin_attrs* a, const char* name, const char** s, size_t* len);
  int32_t (*get_ints)(const kiln_plugin_attrs* a, const char* name, const int64_t** v, size_t* count);
  int32_t (*get_floats)(const kiln_plugin_attrs* a, const char* name, const double** v, size_t* count);
};

/* Shape and dtype inference: fills outputs[0 .. *num_outputs) from the inputs (an absent
 * optional input has dtype KILN_PLUGIN_ABSENT) and attributes, sets *num_outputs (in
 * [1, max_outputs]; it holds max_outputs on entry) and returns KILN_PLUGIN_OK, or writes
 * a NUL-terminated message into err (err_size bytes) and returns an error status. Called
 * when a graph is built or loaded (dims may be symbolic) and before every execution
 * (dims known), so it must be cheap and pure. */
typedef int32_t (*kiln_plugin_infer_fn)(void* user, const kiln_plugin_type* inputs, int32_t num_inputs,
                                        const kiln_plugin_attrs* attrs, kiln_plugin_type* outputs,
                                        int32_t* num_outputs, char* err, size_t err_size);

/* Runs the op on the host: outputs are allocated by kiln with the inferred types. An
 * absent optional input has data NULL. */
typedef int32_t (*kiln_plugin_execute_cpu_fn)(void* user, const kiln_plugin_tensor* inputs, int32_t num_inputs,
                                              const kiln_plugin_attrs* attrs, const kiln_plugin_tensor* outputs,
                                              int32_t num_outputs, char* err, size_t err_size);

/* Runs the op on a CUDA device: tensor data are device pointers, `stream` is the
 * cudaStream_t to launch on (work must be enqueued there, not synchronized with the
 * host); launch errors are reported as a status. */
typedef int32_t (*kiln_plugin_execute_cuda_fn)(void* user, const kiln_plugin_tensor* inputs, int32_t num_inputs,
                                               const kiln_plugin_attrs* attrs, const kiln_plugin_tensor* outputs,
                                               int32_t num_outputs, void* stream, char* err, size_t err_size);

/* One op. Callbacks may run on any thread, for several graphs at once: keep them
 * reentrant (all state in `user` read-only after kiln_plugin_get, or locked). */
typedef struct kiln_plugin_op {
  const char* domain;  /* ONNX domain, e.g. "com.example"; "" or "ai.onnx" is the default domain */
  const char* name;    /* ONNX op_type */
  const char* doc;     /* one line for `kiln inspect`; may be NULL */
  int32_t min_inputs;  /* >= 0 */
  int32_t max_inputs;  /* >= min_inputs */
  int32_t max_outputs; /* >= 1 */
  int32_t reserved0;   /* 0 */
  void* user;          /* passed back to every callback */
  kiln_plugin_infer_fn infer;                    /* required */
  kiln_plugin_execute_cpu_fn execute_cpu;        /* NULL: the CPU backend cannot run it */
  kiln_plugin_execute_cuda_fn execute_cuda;      /* NULL: the CUDA backend cannot run it */
} kiln_plugin_op;

/* The library's table. */
typedef struct kiln_plugin_library {
  uint32_t abi_version; /* KILN_PLUGIN_ABI_VERSION the plugin was built against */
  uint32_t struct_size; /* sizeof(kiln_plugin_library) as the plugin was built */
  const char* name;     /* e.g. "example-ops"; must be non-empty */
  const char* version;  /* e.g. "1.0.0"; recorded in engines */
  int32_t num_ops;
  uint32_t op_size;     /* sizeof(kiln_plugin_op) as the plugin was built: the stride of ops */
  const kiln_plugin_op* ops;
} kiln_plugin_library;

/* The entry point: returns the library's table (static storage, valid until the library
 * is unloaded, which kiln never does), or NULL when the plugin cannot serve a host of
 * `host_abi_version`. kiln calls it once per load. */
typedef const kiln_plugin_library* (*kiln_plugin_get_fn)(uint32_t host_abi_version);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_PLUGIN_H_ */
