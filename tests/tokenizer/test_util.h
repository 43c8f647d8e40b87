// Test helpers for the tokenizer tests: fixture/model paths, JSON loading and a
// minimal test-only GGUF metadata reader (the product's reader lives in
// src/frontends/gguf.*, owned by another layer).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tokenizer/tokenizer.h"

namespace kiln::tok::test {

std::filesystem::path fixtures_dir();  // tests/fixtures/tokenizer
std::filesystem::path models_dir();    // $KILN_MODELS_DIR or <repo>/.cache/models
nlohmann::json load_json(const std::filesystem::path& path);
std::string read_text(const std::filesystem::path& path);

// Reads the tokenizer.* keys of a GGUF file; throws on malformed files.
GgufTokenizerData read_gguf_tokenizer(const std::filesystem::path& path);

// The SmolLM2 GGUF path, or nullopt (tests GTEST_SKIP with a message).
std::optional<std::filesystem::path> smollm2_gguf();
std::optional<std::filesystem::path> minilm_dir();

}  // namespace kiln::tok::test
