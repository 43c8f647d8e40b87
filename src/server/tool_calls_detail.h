// Internal to the tool-call parsers (tool_calls.cpp, tool_calls_python.cpp): what the
// JSON formats' splitter and the pythonic streamer share, and the whole-output reader of
// pythonic call lists.
#pragma once

#include <cctype>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/tool_calls.h"
#include "tokenizer/unicode.h"

namespace kiln::server::tool_detail {

using Json = nlohmann::ordered_json;

inline bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Whether the text so far opens a call: kIncomplete while it may still.
enum class Head { kIncomplete, kNo, kYes };

// The streamed calls as their fragments said (arguments compact once they parse), then the
// parsed calls past them; with nothing streamed, the parsed calls (CallArrayStreamer and
// PythonCallStreamer's released()).
std::vector<ToolCall> released_calls(const std::vector<ToolCall>& streamed, std::vector<ToolCall> parsed);

// pythonic: a Python list of keyword-argument calls, [f(a=1, b="x"), g()], as Llama 3.2 and
// Llama 4 write them (ast.literal_eval's literals: strings, numbers, True/False/None, lists,
// tuples, dicts), within Llama 4's <|python_start|> ... <|python_end|> when those are still in
// the text. As vLLM's pythonic parser, positional arguments make the output text.
constexpr std::string_view kPyStart = "<|python_start|>", kPyEnd = "<|python_end|>";
constexpr int kMaxPyDepth = 64;

inline bool py_ident_char(char c, bool first) {
  return c == '_' || std::isalpha(static_cast<unsigned char>(c)) || (!first && std::isdigit(static_cast<unsigned char>(c)));
}

// A piece of call `call`'s arguments: added to the last fragment when that is the same
// call's, else a fragment of its own (unnamed: the name went out with the first).
inline void append_piece(std::vector<ToolCallFragment>& out, size_t call, std::string_view piece) {
  if (!out.empty() && out.back().call == call) out.back().arguments += piece;
  else out.push_back({call, "", std::string(piece)});
}

// The JSON text of a value as a call's arguments hold it (what dump() writes there).
inline std::string arg_json(const Json& v) { return v.dump(-1, ' ', false, Json::error_handler_t::replace); }

class PythonCalls {
 public:
  explicit PythonCalls(std::string_view s) : s_(s) {}

  // The calls, or nullopt unless the whole text is a list of them.
  std::optional<std::vector<ToolCall>> read() {
    ws();
    eat_tag(kPyStart);
    if (!eat('[')) return std::nullopt;
    std::vector<ToolCall> calls;
    while (!eat(']')) {
      ToolCall c;
      std::optional<std::string> name = ident();
      if (!name || !eat('(')) return std::nullopt;
      c.name = std::move(*name);
      Json args = Json::object();
      while (!eat(')')) {
        std::optional<std::string> key = ident();
        // A repeated keyword is a SyntaxError in Python.
        if (!key || args.contains(*key) || !eat('=')) return std::nullopt;
        std::optional<Json> v = value(0);
        if (!v) return std::nullopt;
        args[*key] = std::move(*v);
        if (!eat(',') && !peek(')')) return std::nullopt;
      }
      c.arguments = arg_json(args);
      calls.push_back(std::move(c));
      if (!eat(',') && !peek(']')) return std::nullopt;
    }
    eat_tag(kPyEnd);
    ws();
    if (at_ != s_.size() || calls.empty()) return std::nullopt;
    return calls;
  }

  // Whether the text so far opens such a list: [ and a name and ( (kIncomplete while it may).
  Head opening() {
    ws();
    const std::string_view rest = s_.substr(at_);
    if (rest.size() < kPyStart.size() && kPyStart.starts_with(rest)) return Head::kIncomplete;
    eat_tag(kPyStart);
    if (at_ == s_.size()) return Head::kIncomplete;
    if (!eat('[')) return Head::kNo;
    ws();
    if (at_ == s_.size()) return Head::kIncomplete;
    if (!ident()) return Head::kNo;
    ws();
    if (at_ == s_.size()) return Head::kIncomplete;
    return peek('(') ? Head::kYes : Head::kNo;
  }

  // The text as one literal (whitespace around it allowed), or nullopt.
  std::optional<Json> literal() {
    std::optional<Json> v = value(0);
    ws();
    if (at_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  void ws() {
    while (at_ < s_.size() && is_space(s_[at_])) ++at_;
  }
  bool peek(char c) {
    ws();
    return at_ < s_.size() && s_[at_] == c;
  }
  bool eat(char c) {
    if (!peek(c)) return false;
    ++at_;
    return true;
  }
  void eat_tag(std::string_view tag) {
    ws();
    if (s_.substr(at_).starts_with(tag)) at_ += tag.size();
  }
  std::optional<std::string> ident() {
    ws();
    const size_t from = at_;
    while (at_ < s_.size() && py_ident_char(s_[at_], at_ == from)) ++at_;
    if (at_ == from) return std::nullopt;
    return std::string(s_.substr(from, at_ - from));
  }

  std::optional<Json> value(int depth) {
    if (depth > kMaxPyDepth) return std::nullopt;
    ws();
    if (at_ == s_.size()) return std::nullopt;
    const char c = s_[at_];
    if (c == '"' || c == '\'') return string_literal();
    if (c == '[' || c == '(') {
      const char close = c == '[' ? ']' : ')';
      ++at_;
      Json list = Json::array();
      while (!eat(close)) {
        std::optional<Json> v = value(depth + 1);
        if (!v) return std::nullopt;
        list.push_back(std::move(*v));
        if (!eat(',') && !peek(close)) return std::nullopt;
      }
      return list;
    }
    if (c == '{') {
      ++at_;
      Json dict = Json::object();
      while (!eat('}')) {
        std::optional<Json> k = value(depth + 1);
        if (!k || !(k->is_string() || k->is_number()) || !eat(':')) return std::nullopt;
        std::optional<Json> v = value(depth + 1);
        if (!v) return std::nullopt;
        dict[k->is_string() ? k->get<std::string>() : k->dump()] = std::move(*v);
        if (!eat(',') && !peek('}')) return std::nullopt;
      }
      return dict;
    }
    for (auto [word, v] : {std::pair<std::string_view, Json>{"True", true}, {"False", false}, {"None", nullptr}})
      if (s_.substr(at_).starts_with(word) && !(at_ + word.size() < s_.size() && py_ident_char(s_[at_ + word.size()], false))) {
        at_ += word.size();
        return v;
      }
    // A number: JSON's grammar covers Python's decimal literals but a leading '+' or '.'.
    size_t end = at_;
    while (end < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[end])) || s_[end] == '.' || s_[end] == '-' ||
                               s_[end] == '+'))
      ++end;
    Json n = Json::parse(s_.substr(at_, end - at_), nullptr, /*allow_exceptions=*/false);
    if (!n.is_number()) return std::nullopt;
    at_ = end;
    return n;
  }

  // A Python string literal ('...', "...", or tripled), its escapes decoded to UTF-8.
  std::optional<Json> string_literal() {
    PythonCallStreamer::StringRead r(at_);
    if (r.read(s_, /*final=*/true) != PythonCallStreamer::StringRead::kDone) return std::nullopt;
    at_ = r.end();
    return Json(std::move(r.out));
  }

  std::string_view s_;
  size_t at_ = 0;
};

}  // namespace kiln::server::tool_detail
