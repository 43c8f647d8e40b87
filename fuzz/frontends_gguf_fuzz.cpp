// libFuzzer target for the GGUF parser and its HF view: any byte string must either
// parse (then every metadata getter, tensor load, quantized-image load and HF mapping
// must stay in bounds) or fail with a kiln::Error. Build: -fsanitize=fuzzer,address,undefined.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "core/status.h"
#include "frontends/gguf.h"
#include "frontends/gguf_hf.h"

namespace {

template <typename F>
void quietly(F&& f) {
  try {
    f();
  } catch (const kiln::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::shared_ptr<const kiln::GgufFile> file;
  try {
    file = std::make_shared<const kiln::GgufFile>(
        kiln::GgufFile::from_memory(data, size, "fuzz.gguf"));
  } catch (const kiln::Error&) {
    return 0;
  }
  for (const auto& key : file->keys()) {
    quietly([&] { file->get_string(key); });
    quietly([&] { file->get_u32(key); });
    quietly([&] { file->get_i64(key); });
    quietly([&] { file->get_f32(key); });
    quietly([&] { file->get_bool(key); });
    quietly([&] { file->get_array_strings(key); });
    quietly([&] { file->get_array_i32(key); });
    quietly([&] { file->get_array_f32(key); });
  }
  for (const auto& t : file->tensors())
    quietly([&] { file->load(t.name, kiln::DType::kBF16); });
  quietly([&] { kiln::gguf_to_hf_config(*file); });
  quietly([&] {
    kiln::GgufWeightSource src(file);
    for (const auto& name : src.names()) {
      quietly([&] { src.info(name); });
      quietly([&] { src.load(name, kiln::DType::kF32); });
      // Q8_0 / Q4_0 / Q4_1 / Q4_K tensors re-laid as kiln q8 / q4 images.
      quietly([&] { src.load_quantized(name, kiln::QuantFormat::kQ4); });
      quietly([&] { src.load_quantized(name, kiln::QuantFormat::kQ8); });
      // A view (16-bit checkpoints load so) lies inside the input: read its every byte.
      quietly([&] {
        if (std::optional<kiln::Tensor> v = src.view(name)) {
          uint8_t sum = 0;
          for (size_t i = 0; i < v->nbytes(); ++i) sum ^= static_cast<const uint8_t*>(v->data())[i];
          volatile uint8_t sink = sum;
          (void)sink;
          if (v->nbytes() != src.info(name).nbytes) __builtin_trap();
        }
      });
    }
  });
  return 0;
}
