// Malformed tokenizer files, invalid UTF-8 and hostile inputs must be kiln::Errors,
// never crashes; encode stays fast on long inputs and safe across threads.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include "core/status.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kiln::tok {
namespace {

ErrorCode error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kInternal;  // "no error"
}

const char* kGoodJson = R"j({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false}, "decoder": {"type": "ByteLevel"}})j";

TEST(Robustness, MalformedTokenizerJson) {
  EXPECT_NO_THROW(Tokenizer::from_hf_json(kGoodJson));
  const char* bad[] = {
      "",
      "{",
      "[]",
      R"j({"model": 3})j",
      R"j({"model": {"type": "BPE", "vocab": [1, 2]}})j",
      R"j({"model": {"type": "BPE", "vocab": {"a": "zero"}}})j",
      R"j({"model": {"type": "BPE", "vocab": {"a": -1}}})j",
      R"j({"model": {"type": "BPE", "vocab": {"a": 1073741824}}})j",
      R"j({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a c"]}})j",
      R"j({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["nospace"]}})j",
      R"j({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [7]}})j",
      R"j({"model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": [{"id": 99999999, "content": "x"}]})j",
      R"j({"model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": [{"content": "x"}]})j",
      R"j({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})j",
      R"j({"model": {"type": "WordPiece", "vocab": {"a": 0}, "unk_token": "[UNK]"}})j",
      R"j({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(?=x)"}, "behavior": "Isolated"}})j",
      R"j({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}}})j",
      R"j({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Nope"}})j",
      R"j({"model": {"type": "BPE", "vocab": {"a": 0}}, "normalizer": {"type": "Precompiled"}})j",
      R"j({"model": {"type": "BPE", "vocab": {"a": 0}}, "decoder": {"type": "Sequence", "decoders": 5}})j",
      R"j({"model": {"type": "BPE", "vocab": {"a": 0}}, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "[X]"}}]}})j",
      R"j({"model": {"type": "BPE", "vocab": {"a": 0}}, "post_processor": {"type": "BertProcessing", "cls": ["[CLS]", 5], "sep": ["[SEP]", 6]}})j",
      R"j({"model": {"type": "BPE", "vocab": {"\u00ff\u00fe": 0}}, "added_tokens": [{"id": 1, "content": 5}]})j",
  };
  for (const char* json : bad) {
    SCOPED_TRACE(json);
    const ErrorCode code = error_of([&] { Tokenizer::from_hf_json(json); });
    EXPECT_TRUE(code == ErrorCode::kInvalidFile || code == ErrorCode::kUnsupported)
        << "got code " << static_cast<int>(code);
  }
}

TEST(Robustness, InvalidUtf8Input) {
  const Tokenizer tok = Tokenizer::from_hf_json(kGoodJson);
  EXPECT_EQ(error_of([&] { tok.encode("ok\xC3", true); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_of([&] { tok.encode("\xED\xA0\x80", true); }), ErrorCode::kInvalidArgument);
  // Decoding never fails: invalid bytes become U+FFFD, unknown ids are dropped.
  EXPECT_EQ(tok.decode(std::vector<int32_t>{0, -5, 1000, 2}, true), "aab");
}

TEST(Robustness, MalformedGgufData) {
  GgufTokenizerData d;
  EXPECT_EQ(error_of([&] { Tokenizer::from_gguf(d); }), ErrorCode::kInvalidFile);  // no tokens
  d.model = "gpt2";
  d.tokens = {"a", "b", "ab"};
  d.merges = {"a b"};
  EXPECT_NO_THROW(Tokenizer::from_gguf(d));
  auto bad = d;
  bad.eos_id = 7;
  EXPECT_EQ(error_of([&] { Tokenizer::from_gguf(bad); }), ErrorCode::kInvalidFile);
  bad = d;
  bad.token_type = {1, 1};
  EXPECT_EQ(error_of([&] { Tokenizer::from_gguf(bad); }), ErrorCode::kInvalidFile);
  bad = d;
  bad.merges = {"a z"};
  EXPECT_EQ(error_of([&] { Tokenizer::from_gguf(bad); }), ErrorCode::kInvalidFile);
  bad = d;
  bad.tokens[1] = "\xFF";
  EXPECT_EQ(error_of([&] { Tokenizer::from_gguf(bad); }), ErrorCode::kInvalidArgument);
  bad = d;
  bad.model = "rwkv";
  EXPECT_EQ(error_of([&] { Tokenizer::from_gguf(bad); }), ErrorCode::kUnsupported);
  bad = d;
  bad.pre = "some-future-pre";
  EXPECT_EQ(error_of([&] { Tokenizer::from_gguf(bad); }), ErrorCode::kUnsupported);
}

TEST(Robustness, MissingDirectory) {
  EXPECT_EQ(error_of([] { Tokenizer::from_hf_dir("/nonexistent/kiln"); }), ErrorCode::kNotFound);
  EXPECT_EQ(error_of([] { Tokenizer::from_sentencepiece("/nonexistent/tokenizer.model"); }),
            ErrorCode::kInvalidFile);
}

TEST(Robustness, HostileTemplatesTerminate) {
  const auto render = [](const std::string& src) {
    return error_of([&] { ChatTemplate(src).render(nlohmann::ordered_json::array(), {}); });
  };
  EXPECT_EQ(render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(render("{{ 'x' * 100000000 }}"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(render("{{ 1 // 0 }}"), ErrorCode::kInvalidArgument);
}

TEST(Performance, LongInputsAreLinear) {
  const auto path = test::smollm2_gguf();
  if (!path) GTEST_SKIP() << "SmolLM2 GGUF not found under " << test::models_dir();
  const Tokenizer tok = Tokenizer::from_gguf(test::read_gguf_tokenizer(*path));
  // One 200k-character "word" (worst case for naive O(n^2) merging) and 1 MB of
  // mixed text.
  const std::string word(200'000, 'a');
  std::string text;
  std::mt19937 rng(1);
  const char* words[] = {"the ", "tokenizer ", "你好", "  ", "123", "\n", "émoji😀 ", "code();"};
  while (text.size() < 1'000'000) text += words[rng() % 8];
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids_word = tok.encode(word, false);
  const auto ids_text = tok.encode(text, false);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 10.0);
  EXPECT_EQ(tok.decode(ids_word, false), word);
  EXPECT_EQ(tok.decode(ids_text, false), text);
  std::printf("encoded 1.2 MB in %.3f s (%zu tokens)\n", s, ids_word.size() + ids_text.size());

  // Concurrent encodes agree with the serial result (shared word cache).
  std::vector<std::thread> threads;
  std::vector<bool> same(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] { same[static_cast<size_t>(t)] = tok.encode(text, false) == ids_text; });
  }
  for (auto& th : threads) th.join();
  for (bool b : same) EXPECT_TRUE(b);
}

}  // namespace
}  // namespace kiln::tok
