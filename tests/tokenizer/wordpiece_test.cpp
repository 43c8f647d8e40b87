// WordPiece (BERT / all-MiniLM-L6-v2): golden ids from HF for single texts and
// pairs with LongestFirst truncation, the vocab.txt fallback, padding and masks; a
// GGUF's WordPiece vocabulary and normalizer options.
#include <gtest/gtest.h>

#include <filesystem>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace kiln::tok {
namespace {

using nlohmann::json;

class MiniLM : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::minilm_dir();
    if (!dir_) GTEST_SKIP() << "all-MiniLM-L6-v2 not found under " << test::models_dir() << " (set KILN_MODELS_DIR)";
    fixture_ = test::load_json(test::fixtures_dir() / "minilm_golden.json");
  }
  std::optional<std::filesystem::path> dir_;
  json fixture_;
};

TEST_F(MiniLM, SingleTextsMatchHuggingFace) {
  const Tokenizer tok = Tokenizer::from_hf_dir(*dir_);
  EXPECT_EQ(tok.vocab_size(), 30522u);
  EXPECT_EQ(tok.pad_id(), 0);
  for (const auto& c : fixture_["cases"]) {
    const std::string text = c["text"];
    SCOPED_TRACE(text.substr(0, 60));
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text, true), ids);
    EXPECT_EQ(tok.encode(text, false), c["ids_no_special"].get<std::vector<int32_t>>());
    EXPECT_EQ(tok.decode(ids, false), c["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip"].get<std::string>());
    StreamDecoder stream(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.put(id);
    streamed += stream.flush();
    EXPECT_EQ(streamed, c["decoded_skip"].get<std::string>());
  }
}

TEST_F(MiniLM, PairsWithTruncationMatchHuggingFace) {
  const Tokenizer tok = Tokenizer::from_hf_dir(*dir_);
  for (const auto& p : fixture_["pairs"]) {
    SCOPED_TRACE(p["a"].get<std::string>());
    EncodeOptions opt;
    opt.max_length = p["max_length"].get<size_t>();
    const Encoding e = tok.encode_pair(p["a"].get<std::string>(), p["b"].get<std::string>(), opt);
    EXPECT_EQ(e.ids, p["ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(e.type_ids, p["type_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(e.attention_mask, p["attention_mask"].get<std::vector<int32_t>>());
  }
}

TEST_F(MiniLM, VocabTxtFallbackAgreesWithTokenizerJson) {
  // A directory with only vocab.txt + tokenizer_config.json (older BERT exports).
  const auto tmp = std::filesystem::temp_directory_path() / "kiln_minilm_vocab_only";
  std::filesystem::create_directories(tmp);
  std::filesystem::copy_file(*dir_ / "vocab.txt", tmp / "vocab.txt",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(*dir_ / "tokenizer_config.json", tmp / "tokenizer_config.json",
                             std::filesystem::copy_options::overwrite_existing);
  const Tokenizer from_vocab = Tokenizer::from_hf_dir(tmp);
  for (const auto& c : fixture_["cases"]) {
    EXPECT_EQ(from_vocab.encode(c["text"].get<std::string>(), true),
              c["ids"].get<std::vector<int32_t>>());
  }
  std::filesystem::remove_all(tmp);
}

TEST_F(MiniLM, PaddingAndMask) {
  const Tokenizer tok = Tokenizer::from_hf_dir(*dir_);
  EncodeOptions opt;
  opt.pad_to = 8;
  const Encoding e = tok.encode_full("hello world", opt);
  EXPECT_EQ(e.ids, (std::vector<int32_t>{101, 7592, 2088, 102, 0, 0, 0, 0}));
  EXPECT_EQ(e.attention_mask, (std::vector<int32_t>{1, 1, 1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(e.type_ids, std::vector<int32_t>(8, 0));
  opt.pad_to = 0;
  opt.max_length = 3;
  EXPECT_EQ(tok.encode_full("hello world again", opt).ids, (std::vector<int32_t>{101, 7592, 102}));
}

TEST(WordPiece, ChineseCharactersAreSplitOneByOne) {
  // A tiny BERT vocabulary written in code: CJK chars split, accents stripped.
  const std::string json = R"({
    "added_tokens": [{"id": 0, "content": "[UNK]", "special": true},
                     {"id": 1, "content": "[CLS]", "special": true},
                     {"id": 2, "content": "[SEP]", "special": true}],
    "normalizer": {"type": "BertNormalizer", "lowercase": true},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {"type": "BertProcessing", "cls": ["[CLS]", 1], "sep": ["[SEP]", 2]},
    "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {
      "[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "中": 3, "文": 4, "cafe": 5, "un": 6, "##able": 7, ",": 8}}})";
  const Tokenizer tok = Tokenizer::from_hf_json(json);
  EXPECT_EQ(tok.encode("中文 Café, unable xyz", true),
            (std::vector<int32_t>{1, 3, 4, 5, 8, 6, 7, 0, 2}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{1, 5, 8, 6, 7, 2}, true), "cafe, unable");
}

// A GGUF's WordPiece vocabulary (llama.cpp's converter: word starts marked U+2581,
// continuations without "##") under llama.cpp's BertNormalizer options: lowercased and
// accent-stripped unless the file says otherwise (older files, all uncased, lack the keys).
TEST(WordPiece, GgufNormalizerOptionsFollowTheFile) {
  GgufTokenizerData d;
  d.model = "bert";
  d.tokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "\xE2\x96\x81hello", "\xE2\x96\x81Hello", "\xE2\x96\x81h\xC3\xA9llo", "s"};
  d.token_type = {3, 3, 3, 3, 1, 1, 1, 1};
  d.unk_id = 1;
  d.cls_id = 2;
  d.sep_id = 3;
  auto ids = [&](const std::string& text) { return Tokenizer::from_gguf(d).encode(text, true); };
  EXPECT_EQ(ids("Hellos"), (std::vector<int32_t>{2, 4, 7, 3})) << "no keys: lowercase";
  EXPECT_EQ(ids("h\xC3\xA9llo"), (std::vector<int32_t>{2, 4, 3})) << "no keys: accents stripped";
  d.lowercase = false;
  EXPECT_EQ(ids("Hellos"), (std::vector<int32_t>{2, 5, 7, 3})) << "cased";
  EXPECT_EQ(ids("h\xC3\xA9llo"), (std::vector<int32_t>{2, 6, 3})) << "cased: accents kept";
  d.strip_accents = true;
  EXPECT_EQ(ids("h\xC3\xA9llo"), (std::vector<int32_t>{2, 4, 3})) << "cased, accents stripped";
  // Today's converter names [CLS] the BOS and [SEP] the EOS, with no cls_token_id.
  d.cls_id = d.sep_id = -1;
  d.bos_id = 2;
  d.eos_id = 3;
  EXPECT_EQ(ids("h\xC3\xA9llo"), (std::vector<int32_t>{2, 4, 3})) << "[CLS] and [SEP] from the BOS and EOS";
}

}  // namespace
}  // namespace kiln::tok
