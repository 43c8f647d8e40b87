// JSON constrained decoding (see json_constraint.h).
#include "runtime/json_constraint.h"

#include <algorithm>
#include <limits>

#include "tokenizer/unicode.h"

namespace kiln {
namespace {

// Number sub-states: what was read last, and whether the number could end there.
enum : uint8_t {
  kMinus,       // '-'
  kZero,        // a leading 0 (complete)
  kInt,         // [1-9][0-9]* (complete)
  kDot,         // '.'
  kFrac,        // fraction digits (complete)
  kExp,         // 'e' / 'E'
  kExpSign,     // its sign
  kExpDigits,   // exponent digits (complete)
};

constexpr std::string_view kLiterals[] = {"true", "false", "null"};

bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }
int hex_value(uint8_t b) { return is_digit(b) ? b - '0' : (b | 0x20) - 'a' + 10; }
bool is_space(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }

}  // namespace

bool JsonAcceptor::accept(uint8_t b) {
  JsonAcceptor next = *this;
  if (!next.step(b)) return false;
  *this = next;
  return true;
}

bool JsonAcceptor::accept(std::string_view s) {
  for (char c : s)
    if (!step(uint8_t(c))) return false;
  return true;
}

void JsonAcceptor::value_done() {
  lex_ = Lex::kNone;
  if (depth_ == 0) {
    done_ = true;
    return;
  }
  expect_ = stack_[size_t(depth_ - 1)] == 0 ? Expect::kCommaOrBrace : Expect::kCommaOrBracket;
}

bool JsonAcceptor::start_value(uint8_t b) {
  switch (b) {
    case '{':
    case '[':
      if (depth_ == kMaxDepth) return false;
      stack_[size_t(depth_++)] = b == '{' ? 0 : 1;
      expect_ = b == '{' ? Expect::kKeyOrEnd : Expect::kValueOrEnd;
      return true;
    case '"':
      lex_ = Lex::kString;
      key_ = false;
      return true;
    case 't':
    case 'f':
    case 'n':
      lex_ = Lex::kLiteral;
      literal_ = b == 't' ? 0 : b == 'f' ? 1 : 2;
      literal_at_ = 1;
      return true;
    default:
      if (b != '-' && !is_digit(b)) return false;
      lex_ = Lex::kNumber;
      number_ = b == '-' ? kMinus : b == '0' ? kZero : kInt;
      return true;
  }
}

// A byte inside a number: true if it continues it; else `ended` says whether the number was
// whole (the byte then belongs to what follows).
bool JsonAcceptor::number_byte(uint8_t b, bool& ended) {
  ended = false;
  switch (number_) {
    case kMinus:
      if (!is_digit(b)) return false;
      number_ = b == '0' ? kZero : kInt;
      return true;
    case kZero:
    case kInt:
      if (is_digit(b) && number_ == kInt) return true;
      if (b == '.') return number_ = kDot, true;
      if (b == 'e' || b == 'E') return number_ = kExp, true;
      ended = true;
      return false;
    case kDot:
      if (!is_digit(b)) return false;
      number_ = kFrac;
      return true;
    case kFrac:
      if (is_digit(b)) return true;
      if (b == 'e' || b == 'E') return number_ = kExp, true;
      ended = true;
      return false;
    case kExp:
      if (b == '+' || b == '-') return number_ = kExpSign, true;
      [[fallthrough]];
    case kExpSign:
      if (!is_digit(b)) return false;
      number_ = kExpDigits;
      return true;
    default:  // kExpDigits
      if (is_digit(b)) return true;
      ended = true;
      return false;
  }
}

bool JsonAcceptor::step(uint8_t b) {
  if (done_) return false;
  switch (lex_) {
    case Lex::kString:
      if (utf8_left_ > 0) {
        if (b < utf8_min_ || b > utf8_max_) return false;
        --utf8_left_;
        utf8_min_ = 0x80;
        utf8_max_ = 0xBF;
        return true;
      }
      if (need_low_ && b != '\\') return false;  // a high surrogate's \u pair
      if (b == '"') {
        if (key_) {
          lex_ = Lex::kNone;
          expect_ = Expect::kColon;
        } else {
          value_done();
        }
        return true;
      }
      if (b == '\\') return lex_ = Lex::kEscape, true;
      if (b < 0x20) return false;
      if (b < 0x80) return true;
      {  // a UTF-8 lead byte, and the bounds of its first continuation byte
        size_t length = 0;
        if (!tok::utf8_lead_bounds(b, length, utf8_min_, utf8_max_)) return false;
        utf8_left_ = uint8_t(length - 1);
        return true;
      }
    case Lex::kEscape:
      if (need_low_ && b != 'u') return false;
      if (b == 'u') {
        lex_ = Lex::kUnicode;
        hex_left_ = 4;
        code_ = 0;
        return true;
      }
      if (b != '"' && b != '\\' && b != '/' && b != 'b' && b != 'f' && b != 'n' && b != 'r' && b != 't') return false;
      lex_ = Lex::kString;
      return true;
    case Lex::kUnicode:
      if (!is_hex(b)) return false;
      code_ = uint16_t(code_ << 4 | hex_value(b));
      if (--hex_left_ > 0) return true;
      lex_ = Lex::kString;
      // Surrogates come in (high, low) pairs, as parsers require.
      if (need_low_) {
        if (code_ < 0xDC00 || code_ > 0xDFFF) return false;
        need_low_ = false;
      } else if (code_ >= 0xD800 && code_ <= 0xDBFF) {
        need_low_ = true;
      } else if (code_ >= 0xDC00 && code_ <= 0xDFFF) {
        return false;
      }
      return true;
    case Lex::kLiteral: {
      const std::string_view lit = kLiterals[literal_];
      if (b != uint8_t(lit[literal_at_])) return false;
      if (++literal_at_ == lit.size()) value_done();
      return true;
    }
    case Lex::kNumber: {
      bool ended = false;
      if (number_byte(b, ended)) return true;
      if (!ended) return false;
      value_done();  // the byte belongs to what follows the number
      if (done_) return false;
      break;
    }
    case Lex::kNone:
      break;
  }
  if (is_space(b)) return ++whitespace_ <= kMaxWhitespace;
  whitespace_ = 0;
  if (!started_) {
    if (b != '{') return false;  // the document is an object
    started_ = true;
    return start_value(b);
  }
  switch (expect_) {
    case Expect::kValue:
    case Expect::kArrayValue:
      return start_value(b);
    case Expect::kValueOrEnd:
      if (b == ']') {
        --depth_;
        value_done();
        return true;
      }
      return start_value(b);
    case Expect::kKeyOrEnd:
    case Expect::kKey:
      if (b == '"') {
        lex_ = Lex::kString;
        key_ = true;
        return true;
      }
      if (b == '}' && expect_ == Expect::kKeyOrEnd) {
        --depth_;
        value_done();
        return true;
      }
      return false;
    case Expect::kColon:
      if (b != ':') return false;
      expect_ = Expect::kValue;
      return true;
    case Expect::kCommaOrBrace:
    case Expect::kCommaOrBracket: {
      const bool object = expect_ == Expect::kCommaOrBrace;
      if (b == ',') {
        expect_ = object ? Expect::kKey : Expect::kArrayValue;
        return true;
      }
      if (b != (object ? '}' : ']')) return false;
      --depth_;
      value_done();
      return true;
    }
  }
  return false;
}

std::string JsonAcceptor::key() const {
  std::string k;
  k.reserve(24 + size_t(depth_));
  for (uint8_t v : {uint8_t(expect_), uint8_t(lex_), uint8_t(key_), uint8_t(started_), uint8_t(done_), utf8_left_,
                    utf8_min_, utf8_max_, hex_left_, uint8_t(code_ >> 8), uint8_t(code_), uint8_t(need_low_), number_,
                    literal_, literal_at_, whitespace_})
    k += char(v);
  k.append(reinterpret_cast<const char*>(stack_.data()), size_t(depth_));
  return k;
}

namespace {

// A bit per token of `pieces`: whether all its bytes continue the document.
std::vector<uint64_t> allowed_bits(const JsonAcceptor& state, std::span<const std::string> pieces) {
  std::vector<uint64_t> bits((pieces.size() + 63) / 64, 0);
  for (size_t id = 0; id < pieces.size(); ++id) {
    JsonAcceptor next = state;
    if (!pieces[id].empty() && next.accept(pieces[id])) bits[id / 64] |= uint64_t(1) << (id % 64);
  }
  return bits;
}

// -inf on the tokens whose bit is clear (and on ids past the bits' `n` tokens).
int64_t apply_bits(const std::vector<uint64_t>& bits, size_t n, std::span<float> logits) {
  constexpr float kOff = -std::numeric_limits<float>::infinity();
  int64_t allowed = 0;
  for (size_t id = 0; id < logits.size(); ++id) {
    if (id < n && (bits[id / 64] >> (id % 64) & 1)) ++allowed;
    else logits[id] = kOff;
  }
  return allowed;
}

}  // namespace

int64_t mask_json_logits(const JsonAcceptor& state, std::span<const std::string> pieces, std::span<float> logits) {
  return apply_bits(allowed_bits(state, pieces), pieces.size(), logits);
}

int64_t JsonTokenMask::apply(const JsonAcceptor& state, std::span<float> logits) {
  const std::string key = state.key();
  std::vector<uint64_t> bits;
  {
    std::lock_guard lk(mu_);
    if (auto it = sets_.find(key); it != sets_.end()) bits = it->second;
  }
  if (bits.empty()) {
    bits = allowed_bits(state, pieces_);
    std::lock_guard lk(mu_);
    if (sets_.size() >= kMaxStates) sets_.clear();
    sets_.emplace(key, bits);
  }
  return apply_bits(bits, pieces_.size(), logits);
}

const std::string& JsonTokenMask::piece(int32_t id) const {
  static const std::string kNone;
  return id >= 0 && size_t(id) < pieces_.size() ? pieces_[size_t(id)] : kNone;
}

size_t JsonTokenMask::cached_states() const {
  std::lock_guard lk(mu_);
  return sets_.size();
}

}  // namespace kiln
