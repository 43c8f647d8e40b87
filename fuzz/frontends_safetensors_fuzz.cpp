// libFuzzer target for the safetensors parser: any byte string must either parse (and
// then every tensor must copy and convert without touching memory outside the input)
// or fail with a kiln::Error. Build: -fsanitize=fuzzer,address,undefined.
#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "frontends/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = kiln::SafetensorsFile::from_memory(data, size, "fuzz.safetensors");
    for (const auto& name : f.names()) {
      const auto& info = f.info(name);
      kiln::Tensor t = f.tensor_copy(name, kiln::DType::kF32);
      if (size_t(t.numel()) * kiln::dtype_size(info.dtype) != info.nbytes) __builtin_trap();
      // The zero-copy view (16-bit checkpoints load so) lies inside the input.
      const kiln::Tensor v = f.tensor(name);
      const auto* p = static_cast<const uint8_t*>(v.data());
      if (v.nbytes() != info.nbytes || (v.nbytes() && (p < data || p + v.nbytes() > data + size))) __builtin_trap();
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
