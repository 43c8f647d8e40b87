// Finds the tokenizer that belongs to a model: the HF directory's tokenizer files, or
// the `tokenizer.ggml.*` metadata of a GGUF file. Tested by tests/runtime/cli_test and
// the tokenizer golden tests.
#pragma once

#include <optional>

#include "runtime/model.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

// nullopt when the model ships no tokenizer (token ids in and out then).
std::optional<tok::Tokenizer> load_model_tokenizer(const Model& model);

// The `tokenizer.ggml.*` metadata of a GGUF file, for tok::Tokenizer::from_gguf.
tok::GgufTokenizerData gguf_tokenizer_data(const GgufFile& file);

}  // namespace kiln
