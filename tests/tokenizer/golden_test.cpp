// Golden-id tests: kiln's tokenizers must produce exactly the ids HF `tokenizers`
// produced for the corpus in tools/tokenizer/gen_tokenizer_fixtures.py, decode them
// back identically, and stream-decode to the same text.
#include <gtest/gtest.h>

#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {
namespace {

using nlohmann::json;

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

std::string stream_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  StreamDecoder stream(tok, skip);
  std::string out;
  for (int32_t id : ids) {
    const std::string chunk = stream.put(id);
    EXPECT_EQ(utf8_find_invalid(chunk), std::string::npos) << "stream chunk is broken UTF-8";
    out += chunk;
  }
  return out + stream.flush();
}

void check_cases(const Tokenizer& tok, const json& fixture, const std::string& name) {
  size_t n = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string text = c["text"];
    SCOPED_TRACE(name + ": " + text.substr(0, 60));
    const auto ids = ids_of(c["ids"]);
    EXPECT_EQ(tok.encode(text, true), ids);
    EXPECT_EQ(tok.encode(text, false), ids_of(c["ids_no_special"]));
    EXPECT_EQ(tok.decode(ids, false), c["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip"].get<std::string>());
    EXPECT_EQ(stream_decode(tok, ids, true), c["decoded_skip"].get<std::string>());
    EXPECT_EQ(stream_decode(tok, ids, false), c["decoded"].get<std::string>());
    ++n;
  }
  EXPECT_GT(n, 30u);
}

TEST(GoldenSmolLM2, GgufMatchesHuggingFace) {
  const auto path = test::smollm2_gguf();
  if (!path) GTEST_SKIP() << "SmolLM2 GGUF not found under " << test::models_dir() << " (set KILN_MODELS_DIR)";
  const Tokenizer tok = Tokenizer::from_gguf(test::read_gguf_tokenizer(*path));
  const json fixture = test::load_json(test::fixtures_dir() / "smollm2_golden.json");
  EXPECT_EQ(tok.vocab_size(), 49152u);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.chat_template(), fixture["chat_template"].get<std::string>());
  check_cases(tok, fixture, "smollm2");
  for (const auto& c : fixture["decode_cases"]) {
    EXPECT_EQ(tok.decode(ids_of(c["ids"]), false), c["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(ids_of(c["ids"]), true), c["decoded_skip"].get<std::string>());
  }
  // Lossless: text -> ids -> text round-trips for byte-level BPE.
  for (const auto& c : fixture["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tok.decode(tok.encode(text, true), false), text);
  }
  const auto stops = tok.stop_ids();
  EXPECT_NE(std::find(stops.begin(), stops.end(), 2), stops.end());
}

class GoldenTrained : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTrained, TokenizerJsonMatchesHuggingFace) {
  const auto dir = test::fixtures_dir() / "trained";
  const Tokenizer tok = Tokenizer::from_hf_json(test::read_text(dir / (GetParam() + ".tokenizer.json")));
  check_cases(tok, test::load_json(dir / (GetParam() + ".golden.json")), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Pipelines, GoldenTrained,
                         ::testing::Values("llama3_bpe", "qwen2_bpe", "gpt2_bpe", "spm_bpe",
                                           "spm_legacy_bpe"));

}  // namespace
}  // namespace kiln::tok
