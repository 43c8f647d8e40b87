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

// GGUF tokenizer metadata <-> JSON, as engine files embed it.
nlohmann::json gguf_tokenizer_to_json(const tok::GgufTokenizerData& data);
tok::GgufTokenizerData gguf_tokenizer_from_json(const nlohmann::json& j);

// The bytes each token decodes to alone, "" for special tokens: what constrained decoding
// (grammar.h) masks a logits row by.
std::vector<std::string> token_pieces(const tok::Tokenizer& tokenizer);

// The tokenizer files of a HF model directory that an engine embeds (name, bytes).
std::vector<std::pair<std::string, std::string>> hf_tokenizer_files(const std::string& dir);

}  // namespace kiln
