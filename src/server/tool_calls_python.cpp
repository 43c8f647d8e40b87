// pythonic tool calls streamed as they are written (PythonCallStreamer, tool_calls.h).
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "server/tool_calls.h"
#include "server/tool_calls_detail.h"

namespace kiln::server {

using namespace tool_detail;

namespace {

// Whether the quote q at `at` may still be part of a triple quote: fewer than three chars
// are left and all are q, so it waits until the two after it are read.
bool undecided_triple(std::string_view s, size_t at, char q) {
  return at + 3 > s.size() && s.substr(at).find_first_not_of(q) == std::string_view::npos;
}

}  // namespace

size_t PythonCallStreamer::LiteralScan::scan(std::string_view s) {
  for (; pos_ < s.size(); ++pos_) {
    const char c = s[pos_];
    if (quote_) {
      if (escape_) {
        escape_ = false;  // the rest of a valid escape (hex digits, a name) holds no quote
      } else if (c == '\\') {
        escape_ = true;
      } else if (c == quote_) {
        if (!triple_) {
          quote_ = 0;
        } else {
          if (undecided_triple(s, pos_, c)) return std::string_view::npos;
          if (s.substr(pos_, 3) == std::string(3, c)) {
            pos_ += 2;
            quote_ = 0;
          }
        }
      }
    } else if (c == '"' || c == '\'') {
      if (undecided_triple(s, pos_, c)) return std::string_view::npos;
      quote_ = c;
      triple_ = s.substr(pos_, 3) == std::string(3, c);
      if (triple_) pos_ += 2;
    } else if (c == '[' || c == '(' || c == '{') {
      ++depth_;
    } else if (c == ']' || c == ')' || c == '}' || c == ',') {
      if (depth_ == 0) return pos_;
      if (c != ',') --depth_;
    }
  }
  return std::string_view::npos;
}

PythonCallStreamer::StringRead::Read PythonCallStreamer::StringRead::read(std::string_view s, bool final) {
  auto open_triple = [&](size_t at, char q) { return !final && undecided_triple(s, at, q); };
  if (!q_) {
    if (at_ >= s.size()) return final ? kBad : kMore;
    const char q = s[at_];
    if (q != '\'' && q != '"') return kBad;
    if (open_triple(at_, q)) return kMore;
    q_ = q;
    triple_ = s.substr(at_, 3) == std::string(3, q);
    at_ += triple_ ? 3 : 1;
  }
  for (;;) {
    if (at_ >= s.size()) return final ? kBad : kMore;
    const char c = s[at_];
    if (c == q_) {
      if (!triple_) {
        ++at_;
        return kDone;
      }
      if (open_triple(at_, c)) return kMore;
      if (s.substr(at_, 3) == std::string(3, c)) {
        at_ += 3;
        return kDone;
      }
    }
    if (c == '\n' && !triple_) return kBad;
    if (c != '\\') {
      out += c;
      ++at_;
      continue;
    }
    // An escape: its letter, then the digits \x, \u and \U take.
    if (!final && at_ + 1 >= s.size()) return kMore;
    const char e = at_ + 1 < s.size() ? s[at_ + 1] : '\0';
    const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (!final && at_ + 2 + digits > s.size()) return kMore;
    size_t pos = at_ + 1;
    if (!tok::python_unescape(s, pos, out)) return kBad;
    at_ = pos;
  }
}

std::vector<ToolCallFragment> PythonCallStreamer::feed(std::string_view text) {
  text_ += text;
  std::vector<ToolCallFragment> out;
  const std::string_view s = text_;
  auto emit = [&](std::string_view piece) {
    streamed_.back().arguments += piece;
    append_piece(out, streamed_.size() - 1, piece);
  };
  // "key": for the keyword being read, after a ',' unless it is the call's first.
  auto key_json = [&] {
    std::string k = keys_.empty() ? "" : ",";  // appended piece by piece: GCC 12 warns
    k += arg_json(key_);                       // (-Wrestrict) on a chain of operator+
    k += ':';
    return k;
  };
  // An identifier at pos_: false while it may still grow (it reaches the end of the text);
  // `id` is empty when none is there.
  auto ident = [&](std::string& id) {
    size_t end = pos_;
    while (end < s.size() && py_ident_char(s[end], end == pos_)) ++end;
    if (end == s.size()) return false;
    id = std::string(s.substr(pos_, end - pos_));
    pos_ = end;
    return true;
  };
  for (;;) {
    if (at_ == At::kStopped) break;
    if (at_ != At::kValue && at_ != At::kString) {  // those read their own text
      while (pos_ < s.size() && is_space(s[pos_])) ++pos_;
      if (pos_ == s.size()) break;
    }
    const char c = pos_ < s.size() ? s[pos_] : '\0';  // kValue reads its own text
    switch (at_) {
      case At::kList:
        at_ = c == '[' ? At::kName : At::kStopped;
        ++pos_;
        break;
      case At::kName:  // a call's name, or the list's end
        if (c == ']') {
          at_ = At::kStopped;
          break;
        }
        if (!ident(name_)) return out;
        at_ = name_.empty() ? At::kStopped : At::kParen;
        break;
      case At::kParen:
        if (c != '(') {
          at_ = At::kStopped;
          break;
        }
        ++pos_;
        out.push_back({streamed_.size(), name_, "{"});
        streamed_.push_back({name_, "{", "", true});
        keys_.clear();
        at_ = At::kKey;
        break;
      case At::kKey:  // a keyword, or the call's end
        if (c == ')') {
          ++pos_;
          emit("}");
          at_ = At::kAfterCall;
          break;
        }
        if (!ident(key_)) return out;
        at_ = key_.empty() ? At::kStopped : At::kEquals;
        break;
      case At::kEquals:  // a repeated keyword stops the stream (Python: a SyntaxError)
        if (c != '=' || std::find(keys_.begin(), keys_.end(), key_) != keys_.end()) {
          at_ = At::kStopped;
          break;
        }
        ++pos_;
        at_ = At::kValueStart;
        break;
      case At::kValueStart:  // a string streams as it is read; any other literal once closed
        if (c == '"' || c == '\'') {
          emit(key_json() + '"');
          string_ = StringRead(pos_);
          at_ = At::kString;
          break;
        }
        value_at_ = pos_;
        value_scan_ = LiteralScan(value_at_);
        at_ = At::kValue;
        break;
      case At::kString: {
        const StringRead::Read r = string_.read(s, /*final=*/false);
        // What is decoded so far, up to a whole character (all of it once closed), as the
        // string's JSON writes it: escaping goes character by character, so the pieces put
        // together are the whole string's JSON. Text that cannot be a string stops the
        // stream after what came before it, wherever the pieces were cut.
        const size_t n = r == StringRead::kDone ? string_.out.size() : tok::utf8_complete_prefix(string_.out);
        if (n > 0) {
          const std::string j = arg_json(Json(string_.out.substr(0, n)));
          emit(j.substr(1, j.size() - 2));
          string_.out.erase(0, n);
        }
        if (r == StringRead::kBad) {
          at_ = At::kStopped;
          break;
        }
        if (r == StringRead::kMore) return out;
        emit("\"");
        keys_.push_back(key_);
        pos_ = string_.end();
        at_ = At::kAfterValue;
        break;
      }
      case At::kAfterValue:  // the next keyword, or the call's end
        if (c == ',') {
          ++pos_;
          at_ = At::kKey;
        } else if (c == ')') {
          ++pos_;
          emit("}");
          at_ = At::kAfterCall;
        } else {
          at_ = At::kStopped;
        }
        break;
      case At::kValue: {
        const size_t end = value_scan_.scan(s);
        if (end == std::string_view::npos) return out;
        std::optional<Json> v;
        if (s[end] == ',' || s[end] == ')') v = PythonCalls(s.substr(value_at_, end - value_at_)).literal();
        if (!v) {
          at_ = At::kStopped;
          break;
        }
        emit(key_json() + arg_json(*v));
        keys_.push_back(key_);
        pos_ = end;  // the ',' or ')' that closed it
        at_ = At::kAfterValue;
        break;
      }
      case At::kAfterCall:
        at_ = c == ',' ? At::kName : At::kStopped;  // ']' ends the list
        ++pos_;
        break;
      case At::kStopped: break;
    }
  }
  return out;
}

std::vector<ToolCall> PythonCallStreamer::released(std::vector<ToolCall> parsed) const {
  return released_calls(streamed_, std::move(parsed));
}

}  // namespace kiln::server
