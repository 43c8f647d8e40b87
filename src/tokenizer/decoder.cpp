// Decoders (HF decoders/*), each a step over the list of token strings: ByteLevel,
// WordPiece, Metaspace, Replace, ByteFallback, Fuse, Strip, BPE suffix. Tested via
// decode round-trips in the golden tests and tests/tokenizer/stream_decoder_test.cpp.
#include <charconv>

#include "core/status.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {

std::string cleanup_tokenization(std::string s) {
  static const std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},           {" ,", ","},
      {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},         {" do not", " don't"},
      {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    std::string out;
    size_t start = 0;
    for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, start)) {
      out.append(s, start, pos - start);
      out += to;
      start = pos + from.size();
    }
    out.append(s, start);
    s.swap(out);
  }
  return s;
}

namespace {

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      // A token with a char outside the byte map is taken verbatim (HF does this
      // for added tokens such as "<|im_start|>" written with odd characters).
      std::string mapped;
      bool ok = true;
      size_t i = 0;
      char32_t cp;
      while (i < t.size()) {
        const size_t n = utf8_decode(t, i, &cp);
        const int b = n ? unicode_to_byte(cp) : -1;
        if (b < 0) {
          ok = false;
          break;
        }
        mapped.push_back(static_cast<char>(b));
        i += n;
      }
      bytes += ok ? mapped : t;
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

class WordPieceDecoder final : public Decoder {
 public:
  WordPieceDecoder(std::string prefix, bool cleanup) : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      auto& t = tokens[i];
      if (i != 0) {
        if (!prefix_.empty() && t.compare(0, prefix_.size(), prefix_) == 0) {
          t.erase(0, prefix_.size());
        } else {
          t.insert(t.begin(), ' ');
        }
      }
      if (cleanup_) t = cleanup_tokenization(std::move(t));
    }
  }

 private:
  std::string prefix_;
  bool cleanup_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, std::string scheme)
      : replacement_(std::move(replacement)), drop_first_(scheme != "never") {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const auto& t = tokens[i];
      for (size_t pos = 0; pos < t.size();) {
        if (t.compare(pos, replacement_.size(), replacement_) == 0) {
          // HF drops every replacement char of the first token, not just the first.
          if (!(i == 0 && drop_first_)) out += ' ';
          pos += replacement_.size();
        } else {
          out += t[pos++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool drop_first_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::string out;
      size_t start = 0;
      for (size_t pos = t.find(pattern_); pos != std::string::npos; pos = t.find(pattern_, start)) {
        out.append(t, start, pos - start);
        out += content_;
        start = pos + pattern_.size();
      }
      out.append(t, start);
      t.swap(out);
    }
  }

 private:
  std::string pattern_, content_;
};

// "<0xAB>" -> 0xAB, or -1.
int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  int v = 0;
  const auto r = std::from_chars(t.data() + 3, t.data() + 5, v, 16);
  return r.ec == std::errc() && r.ptr == t.data() + 5 ? v : -1;
}

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    size_t pending_count = 0;
    auto flush = [&] {
      if (pending_count == 0) return;
      if (utf8_find_invalid(pending) == std::string::npos) {
        out.push_back(pending);
      } else {
        // HF emits one U+FFFD per byte token of an invalid run.
        for (size_t k = 0; k < pending_count; ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
      pending_count = 0;
    };
    for (auto& t : tokens) {
      const int b = parse_byte_token(t);
      if (b >= 0) {
        pending.push_back(static_cast<char>(b));
        ++pending_count;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      for (size_t k = 0; k < start_ && t.compare(0, content_.size(), content_) == 0; ++k) {
        t.erase(0, content_.size());
      }
      for (size_t k = 0; k < stop_ && t.size() >= content_.size() &&
                         t.compare(t.size() - content_.size(), content_.size(), content_) == 0;
           ++k) {
        t.erase(t.size() - content_.size());
      }
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class BpeSuffixDecoder final : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      auto& t = tokens[i];
      std::string out;
      size_t start = 0;
      const std::string with = i + 1 == tokens.size() ? "" : " ";
      for (size_t pos = t.find(suffix_); pos != std::string::npos && !suffix_.empty();
           pos = t.find(suffix_, start)) {
        out.append(t, start, pos - start);
        out += with;
        start = pos + suffix_.size();
      }
      out.append(t, start);
      t.swap(out);
    }
  }

 private:
  std::string suffix_;
};

}  // namespace

std::unique_ptr<Decoder> make_byte_level_decoder() { return std::make_unique<ByteLevelDecoder>(); }
std::unique_ptr<Decoder> make_wordpiece_decoder(std::string prefix, bool cleanup) {
  return std::make_unique<WordPieceDecoder>(std::move(prefix), cleanup);
}
std::unique_ptr<Decoder> make_metaspace_decoder(std::string replacement,
                                                std::string prepend_scheme) {
  return std::make_unique<MetaspaceDecoder>(std::move(replacement), std::move(prepend_scheme));
}
std::unique_ptr<Decoder> make_replace_decoder(std::string pattern, std::string content) {
  if (pattern.empty()) throw_error(ErrorCode::kInvalidFile, "Replace decoder has an empty pattern");
  return std::make_unique<ReplaceDecoder>(std::move(pattern), std::move(content));
}
std::unique_ptr<Decoder> make_byte_fallback_decoder() {
  return std::make_unique<ByteFallbackDecoder>();
}
std::unique_ptr<Decoder> make_fuse_decoder() { return std::make_unique<FuseDecoder>(); }
std::unique_ptr<Decoder> make_strip_decoder(std::string content, size_t start, size_t stop) {
  if (content.empty()) throw_error(ErrorCode::kInvalidFile, "Strip decoder has empty content");
  return std::make_unique<StripDecoder>(std::move(content), start, stop);
}
std::unique_ptr<Decoder> make_bpe_suffix_decoder(std::string suffix) {
  return std::make_unique<BpeSuffixDecoder>(std::move(suffix));
}

}  // namespace kiln::tok
