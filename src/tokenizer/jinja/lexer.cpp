// Jinja lexer: splits a template into text and tag tokens applying jinja2's
// whitespace control, then tokenizes the expressions inside tags.
// Tested in tests/tokenizer/jinja_test.cpp.
#include <cctype>

#include "core/status.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/unicode.h"

namespace kiln::tok::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  Lexer(std::string_view src, const LexOptions& opt) : src_(src), opt_(opt) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const size_t tag = find_tag(pos_);
      std::string text(src_.substr(pos_, tag - pos_));
      if (tag == src_.size()) {
        emit_text(text);
        break;
      }
      const char kind = src_[tag + 1];
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign == '-') {
        size_t e = text.size();
        while (e > 0 && is_space(text[e - 1])) --e;
        text.resize(e);
      } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
        const size_t l = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l > 0 || line_starting) && l < text.size()) {
          bool all_ws = true;
          for (size_t k = l; k < text.size(); ++k) all_ws = all_ws && is_space(text[k]);
          if (all_ws) text.resize(l);
        }
      }
      emit_text(text);
      advance_lines(src_.substr(pos_, tag - pos_));
      pos_ = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t end = src_.find("#}", pos_);
        if (end == std::string_view::npos) fail("unterminated comment");
        advance_lines(src_.substr(pos_, end + 2 - pos_));
        const bool strip = end > pos_ && src_[end - 1] == '-';
        pos_ = end + 2;
        line_starting = after_tag(strip, true);
        continue;
      }
      const bool is_stmt = kind == '%';
      tokens_.push_back({is_stmt ? Token::Kind::kStmtOpen : Token::Kind::kExprOpen, "", line_});
      const bool strip = lex_expression(is_stmt ? '%' : '}');
      tokens_.push_back({is_stmt ? Token::Kind::kStmtClose : Token::Kind::kExprClose, "", line_});
      line_starting = after_tag(strip, is_stmt);
    }
    tokens_.push_back({Token::Kind::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(std::string_view what) {
    throw_error(ErrorCode::kInvalidFile, "chat template line ", line_, ": ", what);
  }

  size_t find_tag(size_t from) const {
    for (size_t k = from; k + 1 < src_.size(); ++k) {
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    }
    return src_.size();
  }

  void advance_lines(std::string_view s) {
    for (char c : s) line_ += c == '\n';
  }

  void emit_text(const std::string& text) {
    if (!text.empty()) tokens_.push_back({Token::Kind::kText, text, line_});
  }

  // Whitespace after a closing tag; returns whether the consumed text ended a line.
  bool after_tag(bool strip, bool block) {
    if (strip) {
      const size_t start = pos_;
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      advance_lines(src_.substr(start, pos_ - start));
      return pos_ > start && src_[pos_ - 1] == '\n';
    }
    if (block && opt_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
      return true;
    }
    return false;
  }

  // Tokenizes until the closing "%}" / "}}"; returns whether it was "-%}" / "-}}".
  bool lex_expression(char close) {
    int depth = 0;  // brackets: a "}" inside a dict literal does not close "}}"
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        line_ += src_[pos_] == '\n';
        ++pos_;
      }
      if (pos_ >= src_.size()) fail(close == '%' ? "unterminated {% tag" : "unterminated {{ tag");
      const char c = src_[pos_];
      auto closes_at = [&](size_t k) {
        return k + 1 < src_.size() && src_[k] == close && src_[k + 1] == '}' && (close == '%' || depth == 0);
      };
      if (c == '-' && closes_at(pos_ + 1)) {
        pos_ += 3;
        return true;
      }
      if (c == '+' && closes_at(pos_ + 1)) {
        pos_ += 3;
        return false;
      }
      if (closes_at(pos_)) {
        pos_ += 2;
        return false;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        const size_t start = pos_;
        while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
        tokens_.push_back({Token::Kind::kName, std::string(src_.substr(start, pos_ - start)), line_});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        const size_t start = pos_;
        bool is_float = false;
        while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
        if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
          is_float = true;
          ++pos_;
          while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) ++pos_;
        }
        if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {  // 1e20, 2.5e-3
          size_t k = pos_ + 1;
          if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
          if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
            is_float = true;
            pos_ = k;
            while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) ++pos_;
          }
        }
        std::string num;
        for (char d : src_.substr(start, pos_ - start)) {
          if (d != '_') num += d;
        }
        tokens_.push_back({is_float ? Token::Kind::kFloat : Token::Kind::kInt, num, line_});
      } else if (c == '\'' || c == '"') {
        tokens_.push_back({Token::Kind::kString, lex_string(c), line_});
      } else {
        static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* t : kTwo) {
          if (src_.substr(pos_, 2) == t) op = t;
        }
        if (op.size() == 1 && std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos) {
          fail(std::string("unexpected character '") + c + "' in tag");
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") --depth;
        pos_ += op.size();
        tokens_.push_back({Token::Kind::kOp, op, line_});
      }
    }
  }

  std::string lex_string(char quote) {
    std::string out;
    ++pos_;
    while (true) {
      if (pos_ >= src_.size()) fail("unterminated string literal");
      const char c = src_[pos_++];
      if (c == quote) return out;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= src_.size()) fail("unterminated string literal");
      if (src_[pos_] == '\n') ++line_;  // a line continuation
      if (!python_unescape(src_, pos_, out)) fail("bad escape in string literal");
    }
  }

  std::string_view src_;
  LexOptions opt_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(std::string_view source, const LexOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace kiln::tok::jinja
