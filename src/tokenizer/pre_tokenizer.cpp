// Pre-tokenizers (HF pre_tokenizers/*): regex Split, ByteLevel, Digits, BERT,
// WhitespaceSplit, Metaspace, Punctuation. Tested in tests/tokenizer/pre_tokenizer_test.cpp
// and through the golden-id tests.
#include "core/status.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {
namespace {

// Applies `fn(piece, out)` to every piece, replacing the list.
template <typename Fn>
void for_each_piece(std::vector<std::string>& pieces, Fn&& fn) {
  std::vector<std::string> out;
  out.reserve(pieces.size() * 2);
  for (auto& p : pieces) fn(p, out);
  pieces.swap(out);
}

// Splits on characters matching `pred`; isolated keeps each as its own piece,
// otherwise it is dropped.
template <typename Pred>
void split_chars(std::string_view s, Pred&& pred, bool isolate, std::vector<std::string>& out) {
  size_t start = 0, i = 0;
  char32_t cp;
  while (i < s.size()) {
    const size_t n = std::max<size_t>(1, utf8_decode(s, i, &cp));
    if (pred(cp)) {
      if (i > start) out.emplace_back(s.substr(start, i - start));
      if (isolate) out.emplace_back(s.substr(i, n));
      start = i + n;
    }
    i += n;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
}

class RegexSplit final : public PreTokenizer {
 public:
  RegexSplit(std::string_view pattern, bool removed) : re_(pattern), removed_(removed) {}
  void pre_tokenize(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string_view> spans;
    std::vector<bool> is_match;
    for_each_piece(pieces, [&](const std::string& p, std::vector<std::string>& out) {
      spans.clear();
      is_match.clear();
      re_.split(p, spans, &is_match);
      for (size_t i = 0; i < spans.size(); ++i) {
        if (removed_ && is_match[i]) continue;
        out.emplace_back(spans[i]);
      }
    });
  }

 private:
  RegexSplitter re_;
  bool removed_;
};

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {
    if (use_regex_) re_ = std::make_unique<RegexSplitter>(kGpt2Pattern);
  }
  void pre_tokenize(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string_view> spans;
    for_each_piece(pieces, [&](std::string& p, std::vector<std::string>& out) {
      if (add_prefix_space_ && (p.empty() || p[0] != ' ')) p.insert(p.begin(), ' ');
      spans.clear();
      if (use_regex_) {
        re_->split(p, spans, nullptr);
      } else {
        spans.push_back(p);
      }
      for (auto span : spans) {
        std::string mapped;
        mapped.reserve(span.size() * 2);
        for (unsigned char b : span) mapped += byte_to_unicode(b);
        out.push_back(std::move(mapped));
      }
    });
  }

 private:
  bool add_prefix_space_;
  bool use_regex_;
  std::unique_ptr<RegexSplitter> re_;
};

class Digits final : public PreTokenizer {
 public:
  explicit Digits(bool individual) : individual_(individual) {}
  void pre_tokenize(std::vector<std::string>& pieces, bool) const override {
    for_each_piece(pieces, [&](const std::string& p, std::vector<std::string>& out) {
      if (individual_) {
        split_chars(p, is_number, true, out);
        return;
      }
      // Contiguous runs of digits form one piece.
      size_t start = 0, i = 0;
      bool in_digits = false;
      char32_t cp;
      while (i < p.size()) {
        const size_t n = std::max<size_t>(1, utf8_decode(p, i, &cp));
        const bool d = is_number(cp);
        if (i > start && d != in_digits) {
          out.emplace_back(p.substr(start, i - start));
          start = i;
        }
        in_digits = d;
        i += n;
      }
      if (start < p.size()) out.emplace_back(p.substr(start));
    });
  }

 private:
  bool individual_;
};

bool is_bert_punctuation(char32_t c) {
  return (c < 0x80 && ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
                       (c >= 123 && c <= 126))) ||
         is_punctuation(c);
}

class Bert final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<std::string>& pieces, bool) const override {
    for_each_piece(pieces, [&](const std::string& p, std::vector<std::string>& out) {
      std::vector<std::string> words;
      split_chars(p, is_whitespace, false, words);
      for (const auto& w : words) split_chars(w, is_bert_punctuation, true, out);
    });
  }
};

class Punctuation final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<std::string>& pieces, bool) const override {
    for_each_piece(pieces, [&](const std::string& p, std::vector<std::string>& out) {
      split_chars(p, is_bert_punctuation, true, out);
    });
  }
};

class WhitespaceSplit final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<std::string>& pieces, bool) const override {
    for_each_piece(pieces, [&](const std::string& p, std::vector<std::string>& out) {
      split_chars(p, is_whitespace, false, out);
    });
  }
};

class Metaspace final : public PreTokenizer {
 public:
  Metaspace(std::string replacement, std::string scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(std::move(scheme)), split_(split) {}
  void pre_tokenize(std::vector<std::string>& pieces, bool first_segment) const override {
    size_t index = 0;
    for_each_piece(pieces, [&](const std::string& p, std::vector<std::string>& out) {
      std::string s;
      s.reserve(p.size() + replacement_.size());
      for (char c : p) {
        if (c == ' ') {
          s += replacement_;
        } else {
          s += c;
        }
      }
      const bool prepend = scheme_ == "always" || (scheme_ == "first" && first_segment && index == 0);
      if (prepend && s.compare(0, replacement_.size(), replacement_) != 0) s.insert(0, replacement_);
      ++index;
      if (!split_) {
        out.push_back(std::move(s));
        return;
      }
      // MergedWithNext: each replacement char starts a new piece.
      size_t start = 0;
      for (size_t pos = s.find(replacement_, 1); pos != std::string::npos;
           pos = s.find(replacement_, pos + replacement_.size())) {
        if (pos > start) out.push_back(s.substr(start, pos - start));
        start = pos;
      }
      if (start < s.size()) out.push_back(s.substr(start));
    });
  }

 private:
  std::string replacement_;
  std::string scheme_;
  bool split_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_regex_split_pre_tokenizer(std::string_view pattern,
                                                             bool removed, bool invert) {
  if (invert) {
    throw_error(ErrorCode::kUnsupported, "Split pre-tokenizer with invert=true is not supported");
  }
  return std::make_unique<RegexSplit>(pattern, removed);
}
std::unique_ptr<PreTokenizer> make_byte_level_pre_tokenizer(bool add_prefix_space,
                                                            bool use_regex) {
  return std::make_unique<ByteLevel>(add_prefix_space, use_regex);
}
std::unique_ptr<PreTokenizer> make_digits_pre_tokenizer(bool individual) {
  return std::make_unique<Digits>(individual);
}
std::unique_ptr<PreTokenizer> make_bert_pre_tokenizer() { return std::make_unique<Bert>(); }
std::unique_ptr<PreTokenizer> make_whitespace_split_pre_tokenizer() {
  return std::make_unique<WhitespaceSplit>();
}
std::unique_ptr<PreTokenizer> make_punctuation_pre_tokenizer() {
  return std::make_unique<Punctuation>();
}
std::unique_ptr<PreTokenizer> make_metaspace_pre_tokenizer(std::string replacement,
                                                           std::string prepend_scheme,
                                                           bool split) {
  if (prepend_scheme != "always" && prepend_scheme != "first" && prepend_scheme != "never") {
    throw_error(ErrorCode::kInvalidFile, "Metaspace prepend_scheme must be always/first/never, got '",
                prepend_scheme, "'");
  }
  return std::make_unique<Metaspace>(std::move(replacement), std::move(prepend_scheme), split);
}

}  // namespace kiln::tok
