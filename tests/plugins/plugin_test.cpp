// Plugin tests: loading examples/plugins (plain C, com.example::ScaledSoftplus) and the
// test plugins of test_plugin.c; every load error; attributes, symbolic dims and each
// way a plugin can misbehave; a hand-made ONNX model with the custom op imported, run
// on the CPU backend and checked against softplus computed here in double; and an
// engine round trip with and without the plugin loaded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "../frontends/onnx_writer.h"
#include "../frontends/test_util.h"
#include "backends/backend.h"
#include "builder/builder.h"
#include "engine/engine.h"
#include "frontends/onnx/onnx_import.h"
#include "frontends/onnx/onnx_model.h"
#include "ir/plugin.h"
#include "runtime/model.h"

namespace kiln {
namespace {

using test::expect_error;
using namespace test::onnxw;

const ir::PluginLibrary& load_example() { return ir::plugin_load(KILN_EXAMPLE_PLUGIN_PATH); }
const ir::PluginLibrary& load_probe() { return ir::plugin_load(KILN_TEST_PLUGIN_GOOD_PATH); }

// Takes a library's ops out of the registry for a scope, then registers them again.
class Unloaded {
 public:
  Unloaded(std::string name, std::string path) : name_(std::move(name)), path_(std::move(path)) {
    ir::plugin_unregister(name_);
  }
  ~Unloaded() { ir::plugin_load(path_); }

 private:
  std::string name_, path_;
};

// ---- loading -------------------------------------------------------------------------

TEST(PluginLoad, ExamplePluginRegistersItsOp) {
  const ir::PluginLibrary& lib = load_example();
  EXPECT_EQ(lib.name, "example-ops");
  EXPECT_EQ(lib.version, "1.0.0");
  EXPECT_EQ(lib.file, "libexample_ops.so");
  EXPECT_EQ(lib.abi_version, KILN_PLUGIN_ABI_VERSION);
  ASSERT_EQ(lib.ops.size(), 1u);
  const ir::PluginOp* op = ir::plugin_find_op("com.example", "ScaledSoftplus");
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->library, &lib);
  EXPECT_EQ(op->qualified_name(), "com.example::ScaledSoftplus");
  EXPECT_EQ(op->table.min_inputs, 1);
  EXPECT_EQ(op->table.max_inputs, 2);
  EXPECT_NE(op->table.execute_cpu, nullptr);
  EXPECT_EQ(op->table.execute_cuda, nullptr);
  EXPECT_EQ(ir::plugin_find_op("com.example", "Softplus"), nullptr);
  EXPECT_EQ(&load_example(), &lib) << "loading a loaded path again is a no-op";
}

TEST(PluginLoad, ErrorsNameTheFileAndTheProblem) {
  expect_error([] { ir::plugin_load("/nonexistent/libnothing.so"); }, ErrorCode::kNotFound,
               {"/nonexistent/libnothing.so", "no such file"});
  test::TempDir dir;
  test::write_file(dir.file("notalib.so"), "this is not an ELF file");
  expect_error([&] { ir::plugin_load(dir.file("notalib.so")); }, ErrorCode::kInvalidFile,
               {"notalib.so", "cannot be loaded"});
  expect_error([] { ir::plugin_load(KILN_TEST_PLUGIN_NO_ENTRY_PATH); }, ErrorCode::kInvalidFile,
               {KILN_TEST_PLUGIN_NO_ENTRY_PATH, "does not export kiln_plugin_get", "not a kiln plugin"});
  expect_error([] { ir::plugin_load(KILN_TEST_PLUGIN_BAD_ABI_PATH); }, ErrorCode::kUnsupported,
               {KILN_TEST_PLUGIN_BAD_ABI_PATH, "ABI version 2", "this kiln loads ABI version 1", "rebuild"});
  expect_error([] { ir::plugin_load(KILN_TEST_PLUGIN_DECLINE_PATH); }, ErrorCode::kUnsupported,
               {"declines kiln plugin ABI version 1"});
  expect_error([] { ir::plugin_load(KILN_TEST_PLUGIN_NO_INFER_PATH); }, ErrorCode::kInvalidArgument,
               {"NoInfer", "has no infer callback"});
  EXPECT_EQ(ir::plugin_find_op("test.kiln", "NoInfer"), nullptr) << "a refused library registers nothing";
  // A failed load leaves nothing behind: the same error again, not "already loaded".
  expect_error([] { ir::plugin_load(KILN_TEST_PLUGIN_BAD_ABI_PATH); }, ErrorCode::kUnsupported, {"ABI version 2"});
}

TEST(PluginLoad, DuplicateOpsAreRefused) {
  const ir::PluginLibrary& example = load_example();
  expect_error([] { ir::plugin_load(KILN_TEST_PLUGIN_DUP_PATH); }, ErrorCode::kInvalidArgument,
               {KILN_TEST_PLUGIN_DUP_PATH, "com.example::ScaledSoftplus", "already provides", "'example-ops' 1.0.0"});
  EXPECT_EQ(ir::plugin_find_op("com.example", "ScaledSoftplus")->library, &example);
  // With the example out of the way, the other library may provide the op.
  {
    Unloaded off("example-ops", KILN_EXAMPLE_PLUGIN_PATH);
    const ir::PluginLibrary& dup = ir::plugin_load(KILN_TEST_PLUGIN_DUP_PATH);
    EXPECT_EQ(ir::plugin_find_op("com.example", "ScaledSoftplus")->library, &dup);
    ir::plugin_unregister("kiln-test-dup");
  }
  EXPECT_EQ(ir::plugin_find_op("com.example", "ScaledSoftplus")->library, &example);
}

TEST(PluginLoad, EnvironmentListsLibraries) {
  setenv("KILN_PLUGINS", (std::string(KILN_EXAMPLE_PLUGIN_PATH) + "::" + KILN_TEST_PLUGIN_GOOD_PATH + ":").c_str(), 1);
  EXPECT_EQ(ir::plugin_paths_from_env(),
            (std::vector<std::string>{KILN_EXAMPLE_PLUGIN_PATH, KILN_TEST_PLUGIN_GOOD_PATH}));
  auto libs = ir::plugin_load_all({});
  ASSERT_EQ(libs.size(), 2u);
  EXPECT_EQ(libs[0]->name, "example-ops");
  EXPECT_EQ(libs[1]->name, "kiln-test");
  setenv("KILN_PLUGINS", "/nonexistent/a.so", 1);
  expect_error([] { ir::plugin_load_all({}); }, ErrorCode::kNotFound, {"KILN_PLUGINS", "/nonexistent/a.so"});
  unsetenv("KILN_PLUGINS");
  EXPECT_TRUE(ir::plugin_paths_from_env().empty());
}

// ---- the Plugin op: attributes, shapes, misbehaving plugins ---------------------------

std::map<std::string, ir::Attr> probe_attrs(std::map<std::string, ir::Attr> more = {}) {
  more[ir::kPluginOpAttr] = std::string("Probe");
  more[ir::kPluginDomainAttr] = std::string("test.kiln");
  return more;
}

Tensor iota(std::vector<int64_t> shape) {
  Tensor t(DType::kF32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = 0.25f * float(i) - 1.0f;
  return t;
}

TEST(PluginOp, AttributesReachThePluginAndSymbolicDimsPassThrough) {
  load_probe();
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, Shape{"T", 3});
  ir::ValueId y = g.add(ir::kPluginOp, {x},
                        probe_attrs({{"f", 2.0}, {"i", int64_t(3)}, {"ints", std::vector<int64_t>{1, 2}},
                                     {"floats", std::vector<double>{0.5, 0.25}}, {"s", std::string("abcd")}}),
                        "probe");
  g.add_output("y", y);
  EXPECT_EQ(g.value(y).shape, (Shape{"T", 3})) << "the plugin copied the symbolic dim";
  EXPECT_EQ(g.value(y).dtype, DType::kF32);
  auto backend = create_backend("cpu");
  EXPECT_TRUE(backend->supports(g.nodes()[0], g));
  auto compiled = backend->compile(g, {});
  for (int64_t t : {1, 5}) {
    Tensor in = iota({t, 3});
    Tensor out = compiled->run({{"x", in}}, StepInfo{}, nullptr).at("y");
    ASSERT_EQ(out.shape(), (std::vector<int64_t>{t, 3}));
    for (int64_t i = 0; i < in.numel(); ++i)  // x * f + i + sum(ints) + sum(floats) + len(s)
      EXPECT_FLOAT_EQ(out.data_as<float>()[i], in.data_as<float>()[i] * 2.0f + 3 + 3 + 0.75f + 4) << i;
  }
  // An int attribute reads as a float, a float does not read as an int.
  ir::Graph g2;
  ir::ValueId x2 = g2.add_input("x", DType::kF32, Shape{2});
  g2.add_output("y", g2.add(ir::kPluginOp, {x2}, probe_attrs({{"f", int64_t(3)}}), "probe"));
  auto compiled2 = create_backend("cpu")->compile(g2, {});
  Tensor out = compiled2->run({{"x", iota({2})}}, StepInfo{}, nullptr).at("y");
  EXPECT_FLOAT_EQ(out.data_as<float>()[1], -0.75f * 3);
  ir::Graph g3;
  ir::ValueId x3 = g3.add_input("x", DType::kF32, Shape{2});
  g3.add_output("y", g3.add(ir::kPluginOp, {x3}, probe_attrs({{"i", 1.5}}), "probe"));
  expect_error([&] { create_backend("cpu")->compile(g3, {})->run({{"x", iota({2})}}, StepInfo{}, nullptr); },
               ErrorCode::kInvalidArgument, {"node 'probe'", "cpu execution error", "f must be a float and i an int"});
}

// Adds a Probe node with attr bug = `bug` to a graph over x[T, 3]; returns the error of
// building it (or "").
std::string probe_build_error(const std::string& bug, ErrorCode* code = nullptr) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, Shape{"T", 3});
  try {
    g.add(ir::kPluginOp, {x}, probe_attrs({{"bug", bug}}), "probe_" + bug);
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

TEST(PluginOp, BadShapeInferenceIsAClearError) {
  load_probe();
  struct Case {
    std::string bug;
    std::vector<std::string> needles;
  };
  for (const Case& c : std::vector<Case>{
           {"negative_dim", {"output 0 dim 0 = -77", "not one of the inputs' symbolic dims", "plugin bug"}},
           {"output_count", {"returned 5 outputs", "declares 1..2"}},
           {"zero_outputs", {"returned 0 outputs"}},
           {"rank", {"rank 9, more than 8"}},
           {"dtype", {"unknown dtype code 99"}},
           {"fail_infer", {"shape inference error (status 1): probe: infer asked to fail"}},
       }) {
    ErrorCode code = ErrorCode::kInternal;
    std::string msg = probe_build_error(c.bug, &code);
    EXPECT_EQ(code, ErrorCode::kInvalidArgument) << c.bug << ": " << msg;
    for (auto& needle : std::vector<std::string>{"node 'probe_" + c.bug + "'", "test.kiln::Probe", "'kiln-test' 0.1"})
      EXPECT_NE(msg.find(needle), std::string::npos) << c.bug << ": '" << needle << "' missing in: " << msg;
    for (auto& needle : c.needles)
      EXPECT_NE(msg.find(needle), std::string::npos) << c.bug << ": '" << needle << "' missing in: " << msg;
  }
  EXPECT_EQ(probe_build_error("none"), "");
  // Wrong input count and dtype: kiln's check, then the plugin's own message.
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, Shape{2}), i = g.add_input("i", DType::kI64, Shape{2});
  expect_error([&] { g.add(ir::kPluginOp, {x, x}, probe_attrs(), "two"); }, ErrorCode::kInvalidArgument,
               {"node 'two'", "takes 1..1 inputs, got 2"});
  expect_error([&] { g.add(ir::kPluginOp, {i}, probe_attrs(), "ints"); }, ErrorCode::kUnsupported,
               {"node 'ints'", "shape inference unsupported (status 2): probe: x must be f32"});
}

TEST(PluginOp, RunTimeFailuresAreClearErrors) {
  load_probe();
  for (const std::string bug : {"fail_execute", "runtime_dtype"}) {
    ir::Graph g;
    ir::ValueId x = g.add_input("x", DType::kF32, Shape{"T", 3});
    g.add_output("y", g.add(ir::kPluginOp, {x}, probe_attrs({{"bug", bug}}), "probe"));
    auto compiled = create_backend("cpu")->compile(g, {});
    const std::string needle = bug == "fail_execute"
                                   ? "cpu execution error (status 1): probe: execution failed on purpose"
                                   : "output 0 is i32 at run time but was f32 when the graph was built";
    expect_error([&] { compiled->run({{"x", iota({2, 3})}}, StepInfo{}, nullptr); }, ErrorCode::kInvalidArgument,
                 {"node 'probe'", "test.kiln::Probe", needle});
  }
}

TEST(PluginOp, ABackendWithoutAnImplementationSaysSo) {
  load_probe();
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, Shape{2});
  g.add_output("y", g.add(ir::kPluginOp, {x},
                          {{ir::kPluginOpAttr, std::string("CudaOnly")},
                           {ir::kPluginDomainAttr, std::string("test.kiln")}},
                          "gpu_op"));
  auto backend = create_backend("cpu");
  EXPECT_FALSE(backend->supports(g.nodes()[0], g));
  expect_error([&] { backend->compile(g, {}); }, ErrorCode::kUnsupported,
               {"cpu backend cannot run node 'gpu_op'", "test.kiln::CudaOnly", "no CPU implementation"});
}

// The example has no execute_cuda: the CUDA backend (when built) says so, naming the op
// and the plugin. Compiling needs a visible GPU; supports() does not.
TEST(PluginOp, CudaBackendSaysWhatIsMissing) {
  const auto backends = available_backends();
  if (std::find(backends.begin(), backends.end(), "cuda") == backends.end()) GTEST_SKIP() << "built without CUDA";
  load_example();
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, Shape{"T", 4});
  g.add_output("y", g.add(ir::kPluginOp, {x},
                          {{ir::kPluginOpAttr, std::string("ScaledSoftplus")},
                           {ir::kPluginDomainAttr, std::string("com.example")}},
                          "softplus"));
  auto backend = create_backend("cuda");
  EXPECT_FALSE(backend->supports(g.nodes()[0], g));
  try {
    backend->compile(g, {});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find("no CUDA device is visible") != std::string::npos) GTEST_SKIP() << msg;
    for (const char* part : {"node 'softplus'", "'example-ops' 1.0.0",
                             "no CUDA implementation of com.example::ScaledSoftplus", "--backend cpu"})
      EXPECT_NE(msg.find(part), std::string::npos) << part << " missing in: " << msg;
  }
}

TEST(PluginOp, AnOpNoLoadedPluginProvidesSaysToPassPlugin) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, Shape{2});
  expect_error(
      [&] {
        g.add(ir::kPluginOp, {x},
              {{ir::kPluginOpAttr, std::string("Nope")}, {ir::kPluginDomainAttr, std::string("org.nowhere")}}, "n");
      },
      ErrorCode::kUnsupported,
      {"node 'n'", "org.nowhere::Nope", "domain 'org.nowhere'", "--plugin FILE", "KILN_PLUGINS"});
}

// ---- ONNX import, CPU run, engine round trip -----------------------------------------

constexpr float kBeta = 2.0f, kThreshold = 3.0f;
const std::vector<float> kBias = {0.5f, -1.0f, 0.0f, 2.0f}, kScale = {1.0f, 0.5f, -2.0f, 3.0f};

// y = ScaledSoftplus(x + b, scale; beta, threshold) - b, x: float [n, 4].
std::string softplus_model(const std::string& extra_attrs = "") {
  std::string nodes =
      bytes(1, node("Add", {"x", "b"}, {"s"}, "add")) +
      bytes(1, node("ScaledSoftplus", {"s", "scale"}, {"t"}, "softplus",
                    bytes(7, "com.example") + attr_float("beta", kBeta) + attr_float("threshold", kThreshold) +
                        extra_attrs)) +
      bytes(1, node("Sub", {"t", "b"}, {"y"}, "sub"));
  std::string inits = bytes(5, tensor("b", 1, {4}, f32s(kBias))) + bytes(5, tensor("scale", 1, {4}, f32s(kScale)));
  std::string graph = nodes + bytes(2, "g") + inits + bytes(11, value_info("x", 1, {-1, 4})) +
                      bytes(12, value_info("y", 1, {-1, 4}));
  return num(1, 8) + opset_import("", 14) + opset_import("com.example", 1) + bytes(7, graph);
}

// The reference, in double: PyTorch's Softplus(beta, threshold) semantics.
std::vector<float> softplus_reference(const Tensor& x) {
  std::vector<float> y(size_t(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    const size_t c = size_t(i % 4);
    const double v = double(x.data_as<float>()[i] + kBias[c]);  // the Add runs in f32
    const double sp = kBeta * v > kThreshold ? v : std::log(1.0 + std::exp(kBeta * v)) / kBeta;
    y[size_t(i)] = float(sp * kScale[c] - kBias[c]);
  }
  return y;
}

Tensor softplus_input(int64_t rows) {
  Tensor x(DType::kF32, {rows, 4});
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = float((i * 37) % 23) * 0.35f - 4.0f;
  return x;
}

void expect_matches_reference(const Tensor& got, const Tensor& x, const std::string& what) {
  std::vector<float> want = softplus_reference(x);
  ASSERT_EQ(got.shape(), x.shape()) << what;
  double err = 0;
  size_t above = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, double(std::fabs(got.data_as<float>()[i] - want[i])));
    above += (x.data_as<float>()[i] + kBias[i % 4]) * kBeta > kThreshold;
  }
  std::printf("  %-36s max|err| %.3g (%zu of %zu elements above the threshold)\n", what.c_str(), err, above,
              want.size());
  EXPECT_LE(err, 2e-6) << what;
  EXPECT_GT(above, 0u) << "the input must reach both branches";
  EXPECT_LT(above, want.size()) << "the input must reach both branches";
}

ir::Graph import_bytes(const std::string& b) {
  auto m = onnx::parse_onnx_model(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "t.onnx");
  return onnx::import_onnx_graph(m, "t.onnx");
}

TEST(PluginOnnx, CustomOpImportsAndRunsOnTheCpu) {
  load_example();
  ir::Graph g = import_bytes(softplus_model());
  const ir::Node* plugin = nullptr;
  for (auto& n : g.nodes())
    if (n.op == ir::kPluginOp) plugin = &n;
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->name, "softplus");
  EXPECT_EQ(plugin->attr_str(ir::kPluginOpAttr), "ScaledSoftplus");
  EXPECT_EQ(plugin->attr_str(ir::kPluginDomainAttr), "com.example");
  EXPECT_DOUBLE_EQ(plugin->attr_float("beta"), kBeta);
  EXPECT_DOUBLE_EQ(plugin->attr_float("threshold"), kThreshold);
  EXPECT_EQ(g.value(plugin->outputs[0]).shape, (Shape{"n", 4}));
  auto compiled = create_backend("cpu")->compile(g, {});
  for (int64_t rows : {1, 6}) {
    Tensor x = softplus_input(rows);
    expect_matches_reference(compiled->run({{"x", x}}, StepInfo{}, nullptr).at("y"), x,
                             "onnx import, " + std::to_string(rows) + " rows");
  }
}

// The same model written by onnx.helper (tools/gen_plugin_fixture.py), through
// Model::load's default ("auto") ONNX path.
TEST(PluginOnnx, ExportedFixtureMatchesTheReference) {
  load_example();
  auto m = Model::load(std::string(KILN_FIXTURES_DIR) + "/onnx/scaled_softplus/model.onnx");
  EXPECT_EQ(m->info().family, "onnx");
  Tensor x = softplus_input(3);
  expect_matches_reference(m->compiled().run({{"x", x}}, StepInfo{}, nullptr).at("y"), x, "onnx.helper fixture");
}

TEST(PluginOnnx, BadAttributesAndShapesAreNamed) {
  load_example();
  expect_error([] { import_bytes(softplus_model(attr_tensor("w", tensor("w", 1, {1}, f32s({1}))))); },
               ErrorCode::kUnsupported, {"node 'softplus'", "attribute 'w'", "plugin ops take int, float, string"});
  expect_error([] { import_bytes(softplus_model(attr_string("plugin_op", "x"))); }, ErrorCode::kUnsupported,
               {"attribute 'plugin_op'", "reserves"});
  // The plugin's own check (beta <= 0), message included.
  std::string neg = softplus_model();
  const std::string beta = attr_float("beta", kBeta);
  neg.replace(neg.find(beta), beta.size(), attr_float("beta", -1.0f));
  // The graph's byte lengths are unchanged: only the float's bytes differ.
  expect_error([&] { import_bytes(neg); }, ErrorCode::kInvalidArgument,
               {"node 'softplus'", "com.example::ScaledSoftplus", "ScaledSoftplus: beta must be > 0, got -1"});
}

TEST(PluginOnnx, WithoutThePluginTheErrorSaysPassPlugin) {
  load_example();
  Unloaded off("example-ops", KILN_EXAMPLE_PLUGIN_PATH);
  expect_error([] { import_bytes(softplus_model()); }, ErrorCode::kUnsupported,
               {"node 'softplus'", "com.example::ScaledSoftplus", "opset 14", "--plugin FILE"});
}

TEST(PluginEngine, RoundTripWithAndWithoutThePlugin) {
  load_example();
  test::TempDir dir;
  test::write_file(dir.file("softplus.onnx"), softplus_model());
  BuildOptions o;
  o.model = dir.file("softplus.onnx");
  o.output = dir.file("softplus.kiln");
  o.tune = false;
  o.onnx_import = "graph";
  build_engine(o);
  ModelOptions mo;
  mo.onnx_import = "graph";
  auto direct = Model::load(o.model, mo);
  auto engine = Model::load(o.output);
  ASSERT_NE(engine->engine(), nullptr);
  const auto& plugins = engine->engine()->plugins;
  ASSERT_EQ(plugins.size(), 1u);
  EXPECT_EQ(plugins[0].name, "example-ops");
  EXPECT_EQ(plugins[0].version, "1.0.0");
  EXPECT_EQ(plugins[0].library, "libexample_ops.so");
  EXPECT_EQ(plugins[0].ops, std::vector<std::string>{"com.example::ScaledSoftplus"});
  EXPECT_EQ(engine->engine()->schema_minor, kEngineSchemaMinor);
  Tensor x = softplus_input(5);
  Tensor want = direct->compiled().run({{"x", x}}, StepInfo{}, nullptr).at("y").clone();
  Tensor got = engine->compiled().run({{"x", x}}, StepInfo{}, nullptr).at("y").clone();
  expect_matches_reference(got, x, "engine");
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(got.data_as<float>()[i], want.data_as<float>()[i]) << i;
  {
    Unloaded off("example-ops", KILN_EXAMPLE_PLUGIN_PATH);
    expect_error([&] { Model::load(o.output); }, ErrorCode::kUnsupported,
                 {o.output, "node 'softplus'", "com.example::ScaledSoftplus", "domain 'com.example'",
                  "--plugin FILE", "KILN_PLUGINS", "built with plugin 'example-ops' 1.0.0 (libexample_ops.so)"});
  }
  auto again = Model::load(o.output);  // loaded again: the engine runs again
  Tensor got2 = again->compiled().run({{"x", x}}, StepInfo{}, nullptr).at("y");
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(got2.data_as<float>()[i], want.data_as<float>()[i]) << i;
}

}  // namespace
}  // namespace kiln
