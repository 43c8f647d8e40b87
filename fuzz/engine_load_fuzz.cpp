// libFuzzer target for the engine loader: any byte string must either load (header,
// FlatBuffers metadata, graph rebuilt through shape inference, weights in bounds) or
// fail with a kiln::Error. The checksum is off so mutations reach the parser; seed
// the corpus with small engines (`kiln build -m tests/fixtures/models/gpt2 -o x.kiln`,
// and a tensor-parallel one: `kiln build --tp 2 -m tests/fixtures/models/llama -o y.kiln`).
// Build: -fsanitize=fuzzer,address,undefined.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/engine.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A 64-byte-aligned copy, as an mmap'd file would be.
  std::shared_ptr<uint8_t> buf(static_cast<uint8_t*>(kiln::aligned_alloc_bytes(size + 1)), std::free);
  if (size) std::memcpy(buf.get(), data, size);
  try {
    kiln::EngineContents e = kiln::engine_parse(buf.get(), size, buf, "fuzz.kiln", {/*verify_checksum=*/false});
    // Touch every weight byte the loader accepted (every rank's, for a tensor-parallel
    // engine): it must lie inside the input.
    volatile uint64_t sum = 0;
    for (const kiln::ir::Graph* g : kiln::engine_graphs(e))
      for (size_t v = 0; v < g->num_values(); ++v)
        if (g->is_weight(kiln::ir::ValueId(v))) {
          const kiln::Tensor& t = g->weight(kiln::ir::ValueId(v));
          const uint8_t* p = static_cast<const uint8_t*>(t.data());
          for (size_t i = 0; i < t.nbytes(); i += 61) sum += p[i];
        }
  } catch (const kiln::Error&) {
  }
  return 0;
}
