// libFuzzer target: encode/decode of arbitrary text with built-in tokenizers covering
// byte-level BPE (Llama-3 regex), WordPiece and SentencePiece-style byte fallback,
// plus chat-template rendering of the input as a template. Invariants: invalid UTF-8
// is a kiln::Error; byte-level BPE round-trips exactly; the stream decoder's output
// equals decode().
// Build: clang++ -std=c++20 -fsanitize=fuzzer,address,undefined -Isrc \
//   fuzz/tokenizer_encode_fuzz.cpp <kiln_tokenizer sources> -lre2 -lutf8proc -lsentencepiece
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/status.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

using kiln::tok::Tokenizer;

// Byte-level BPE over the 256 byte symbols with a few merges, Llama-3 pre-tokenizer.
Tokenizer make_byte_level() {
  kiln::tok::GgufTokenizerData d;
  d.model = "gpt2";
  d.pre = "llama-bpe";
  for (int b = 0; b < 256; ++b) d.tokens.push_back(kiln::tok::byte_to_unicode(static_cast<uint8_t>(b)));
  const char* merges[] = {"Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r"};
  for (const char* m : merges) {
    d.merges.push_back(m);
    std::string merged(m);
    merged.erase(merged.find(' '), 1);
    d.tokens.push_back(merged);
  }
  d.tokens.push_back("<|eot_id|>");
  d.token_type.assign(d.tokens.size(), 1);
  d.token_type.back() = 3;
  return Tokenizer::from_gguf(d);
}

Tokenizer make_wordpiece() {
  return Tokenizer::from_hf_json(R"j({
    "added_tokens": [{"id": 0, "content": "[UNK]", "special": true},
                     {"id": 1, "content": "[CLS]", "special": true},
                     {"id": 2, "content": "[SEP]", "special": true}],
    "normalizer": {"type": "BertNormalizer", "lowercase": true},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {"type": "BertProcessing", "cls": ["[CLS]", 1], "sep": ["[SEP]", 2]},
    "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {
      "[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "a": 3, "##b": 4, "中": 5, ",": 6, "the": 7}}})j");
}

Tokenizer make_spm() {
  std::string vocab = R"("<unk>": 0, "<s>": 1, "▁": 2, "a": 3, "▁a": 4)";
  for (int b = 0; b < 256; ++b) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), ", \"<0x%02X>\": %d", b, 5 + b);
    vocab += buf;
  }
  return Tokenizer::from_hf_json(std::string(R"j({
    "added_tokens": [{"id": 0, "content": "<unk>", "special": true}, {"id": 1, "content": "<s>", "special": true}],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                   {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "byte_fallback": true, "fuse_unk": true, "unk_token": "<unk>",
              "merges": ["▁ a"], "vocab": {)j") + vocab + "}}}");
}

// Every chunk is valid UTF-8; for byte-level BPE the chunks add up to decode().
void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool exact) {
  kiln::tok::StreamDecoder stream(tok);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string chunk = stream.put(id);
    if (kiln::tok::utf8_find_invalid(chunk) != std::string_view::npos) std::abort();
    streamed += chunk;
  }
  streamed += stream.flush();
  if (exact && streamed != tok.decode(ids, true)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizer byte_level = make_byte_level();
  static const Tokenizer wordpiece = make_wordpiece();
  static const Tokenizer spm = make_spm();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const bool valid = kiln::tok::utf8_find_invalid(text) == std::string_view::npos;
  try {
    const auto ids = byte_level.encode(text, true);
    if (!valid) std::abort();  // invalid UTF-8 must have been rejected
    if (byte_level.decode(ids, false) != text) std::abort();  // byte-level is lossless
    check_stream(byte_level, ids, true);
    const auto wp = wordpiece.encode(text, true);
    check_stream(wordpiece, wp, false);
    const auto sp = spm.encode(text, true);
    check_stream(spm, sp, false);
  } catch (const kiln::Error&) {
    if (valid) std::abort();
  }
  // The same bytes as a chat template.
  try {
    kiln::tok::ChatTemplate tmpl(text);
    (void)tmpl.render(kiln::tok::to_json({{"user", "hi"}, {"assistant", "yo"}}), {});
  } catch (const kiln::Error&) {
  }
  return 0;
}
