// Normalizers (HF normalizers/*): BERT, NFC/NFD/NFKC/NFKD, Lowercase, StripAccents,
// Replace, Prepend, Strip. Tested in tests/tokenizer/wordpiece_test.cpp and the
// golden-id tests.
#include <re2/re2.h>
#include <utf8proc.h>

#include "core/status.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {
namespace {

// BERT's notion of control characters: \p{C} minus \t \n \r.
bool is_bert_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  if (is_control(c)) return true;
  // Unassigned, private use and surrogates also count as "other" in Rust's
  // unicode_categories, which HF uses.
  const auto k = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return k == UTF8PROC_CATEGORY_CN || k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CS;
}

class BertNormalizer final : public Normalizer {
 public:
  BertNormalizer(bool clean, bool chinese, bool strip, bool lower)
      : clean_(clean), chinese_(chinese), strip_(strip), lower_(lower) {}
  std::string normalize(std::string text) const override {
    if (clean_ || chinese_) {
      std::string out;
      out.reserve(text.size());
      for (char32_t c : utf8_to_cps(text)) {
        if (clean_) {
          if (c == 0 || c == 0xFFFD || is_bert_control(c)) continue;
          if (is_whitespace(c)) c = ' ';
        }
        if (chinese_ && is_cjk(c)) {
          out += ' ';
          utf8_append(out, c);
          out += ' ';
        } else {
          utf8_append(out, c);
        }
      }
      text.swap(out);
    }
    if (strip_) text = unicode_strip_accents(text);
    if (lower_) text = unicode_lower(text);
    return text;
  }

 private:
  bool clean_, chinese_, strip_, lower_;
};

class FnNormalizer final : public Normalizer {
 public:
  explicit FnNormalizer(std::string (*fn)(std::string_view)) : fn_(fn) {}
  std::string normalize(std::string text) const override { return fn_(text); }

 private:
  std::string (*fn_)(std::string_view);
};

// HF's StripAccents removes nonspacing marks only (it is meant to follow NFD).
std::string drop_marks(std::string_view s) {
  std::string out;
  for (char32_t c : utf8_to_cps(s)) {
    if (!is_mark_nonspacing(c)) utf8_append(out, c);
  }
  return out;
}

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::string pattern, bool is_regex, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {
    if (is_regex) {
      re_ = std::make_unique<RE2>(pattern_);
      if (!re_->ok()) {
        throw_error(ErrorCode::kUnsupported, "Replace normalizer regex does not compile with RE2: ",
                    re_->error(), "; pattern: ", pattern_);
      }
    } else if (pattern_.empty()) {
      throw_error(ErrorCode::kInvalidFile, "Replace normalizer has an empty pattern");
    }
  }
  std::string normalize(std::string text) const override {
    if (re_) {
      // Escape backslashes so the content is literal for RE2's rewrite syntax.
      std::string rewrite;
      for (char c : content_) {
        if (c == '\\') rewrite += '\\';
        rewrite += c;
      }
      RE2::GlobalReplace(&text, *re_, rewrite);
      return text;
    }
    std::string out;
    out.reserve(text.size());
    size_t start = 0;
    for (size_t pos = text.find(pattern_); pos != std::string::npos;
         pos = text.find(pattern_, start)) {
      out.append(text, start, pos - start);
      out += content_;
      start = pos + pattern_.size();
    }
    out.append(text, start);
    return out;
  }

 private:
  std::string pattern_, content_;
  std::unique_ptr<RE2> re_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string text) const override {
    return text.empty() ? text : prefix_ + text;  // HF leaves empty strings alone
  }

 private:
  std::string prefix_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string text) const override {
    auto cps = utf8_to_cps(text);
    size_t b = 0, e = cps.size();
    if (left_) while (b < e && is_whitespace(cps[b])) ++b;
    if (right_) while (e > b && is_whitespace(cps[e - 1])) --e;
    std::string out;
    for (size_t i = b; i < e; ++i) utf8_append(out, cps[i]);
    return out;
  }

 private:
  bool left_, right_;
};

}  // namespace

std::unique_ptr<Normalizer> make_bert_normalizer(bool clean_text, bool handle_chinese,
                                                 bool strip_accents, bool lowercase) {
  return std::make_unique<BertNormalizer>(clean_text, handle_chinese, strip_accents, lowercase);
}
std::unique_ptr<Normalizer> make_unicode_normalizer(std::string_view form) {
  if (form == "NFC") return std::make_unique<FnNormalizer>(unicode_nfc);
  if (form == "NFD") return std::make_unique<FnNormalizer>(unicode_nfd);
  if (form == "NFKC") return std::make_unique<FnNormalizer>(unicode_nfkc);
  if (form == "NFKD") return std::make_unique<FnNormalizer>(unicode_nfkd);
  throw_error(ErrorCode::kUnsupported, "unicode normalization form '", form, "'");
}
std::unique_ptr<Normalizer> make_lowercase_normalizer() {
  return std::make_unique<FnNormalizer>(unicode_lower);
}
std::unique_ptr<Normalizer> make_strip_accents_normalizer() {
  return std::make_unique<FnNormalizer>(drop_marks);
}
std::unique_ptr<Normalizer> make_replace_normalizer(std::string pattern, bool is_regex,
                                                    std::string content) {
  return std::make_unique<ReplaceNormalizer>(std::move(pattern), is_regex, std::move(content));
}
std::unique_ptr<Normalizer> make_prepend_normalizer(std::string prefix) {
  return std::make_unique<PrependNormalizer>(std::move(prefix));
}
std::unique_ptr<Normalizer> make_strip_normalizer(bool left, bool right) {
  return std::make_unique<StripNormalizer>(left, right);
}

}  // namespace kiln::tok
