// libFuzzer target for the ONNX frontend (protobuf wire reader, ModelProto decoding,
// the HF family view, graph import): any byte string must either import or fail with a kiln::Error.
// External data is refused (no base directory), so the input is the whole world.
// Build: -fsanitize=fuzzer,address,undefined.
#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "frontends/onnx/onnx_hf.h"
#include "frontends/onnx/onnx_import.h"
#include "frontends/onnx/onnx_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto model = kiln::onnx::parse_onnx_model(data, size, "fuzz.onnx");
    std::string why;
    try {
      if (auto view = kiln::onnx::onnx_hf_view(model, "fuzz.onnx", &why))
        for (const auto& name : view->weights->names()) view->weights->load(name, kiln::DType::kF32);
    } catch (const kiln::Error&) {
    }
    auto graph = kiln::onnx::import_onnx_graph(model, "fuzz.onnx");
    if (graph.outputs().size() > model.graph.outputs.size()) __builtin_trap();
  } catch (const kiln::Error&) {
  }
  return 0;
}
