// Tool calls in chat output (see tool_calls.h).
#include "server/tool_calls.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "server/tool_calls_detail.h"
#include "tokenizer/unicode.h"

namespace kiln::server {

using namespace tool_detail;

namespace {

constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>", kMistralTag = "[TOOL_CALLS]",
                           kGraniteTag = "<|tool_call|>", kPhi4Tag = "functools";

bool all_space(std::string_view s) {
  for (char c : s)
    if (!is_space(c)) return false;
  return true;
}

// The length of the longest suffix of s that is a proper prefix of tag (text that may
// still become the tag).
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

// {"name": string, "<args_key>": object or JSON text} -> a call; nullopt otherwise.
std::optional<ToolCall> call_of(const Json& j, std::initializer_list<const char*> args_keys) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  ToolCall c;
  c.name = name->get<std::string>();
  c.arguments = "{}";
  for (const char* key : args_keys) {
    auto a = j.find(key);
    if (a == j.end()) continue;
    if (a->is_object()) {
      c.arguments = a->dump();
    } else if (a->is_string()) {  // some models write the arguments' JSON as a string
      Json inner = Json::parse(a->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (!inner.is_object()) return std::nullopt;
      c.arguments = inner.dump();
    } else {
      return std::nullopt;
    }
    break;
  }
  return c;
}

std::optional<ToolCall> parse_call(std::string_view text, std::initializer_list<const char*> args_keys) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return call_of(j, args_keys);
}

// The end (one past '}') of the JSON object starting at s[at] == '{', or npos when it does
// not close within s.
size_t object_end(std::string_view s, size_t at) { return JsonCloseScan(at).scan(s); }

// Reading a hermes call's head, {"name": "<name>", "arguments" (or "parameters"): {.
// The head in `s` (a call's text so far): kYes with the name and where the arguments
// object starts; kIncomplete while the text is a prefix of a head; kNo otherwise (another
// key order, the arguments as a string: such calls are released whole).
Head call_head(std::string_view s, std::string& name, size_t& args_at) {
  size_t i = 0;
  auto ws = [&] {
    while (i < s.size() && is_space(s[i])) ++i;
  };
  auto lit = [&](std::string_view t) {
    const size_t n = std::min(t.size(), s.size() - i);
    if (s.substr(i, n) != t.substr(0, n)) return Head::kNo;
    if (n < t.size()) return Head::kIncomplete;
    i += n;
    return Head::kYes;
  };
  for (std::string_view t : {"{", "\"name\"", ":"}) {
    ws();
    if (const Head h = lit(t); h != Head::kYes) return h;
  }
  ws();
  if (i == s.size()) return Head::kIncomplete;
  if (s[i] != '"') return Head::kNo;
  size_t j = i + 1;
  for (bool escape = false; j < s.size() && (escape || s[j] != '"'); ++j) escape = !escape && s[j] == '\\';
  if (j == s.size()) return Head::kIncomplete;
  const Json n = Json::parse(s.substr(i, j + 1 - i), nullptr, /*allow_exceptions=*/false);
  if (!n.is_string() || n.get<std::string>().empty()) return Head::kNo;
  i = j + 1;
  ws();
  if (const Head h = lit(","); h != Head::kYes) return h;
  ws();
  const size_t key_at = i;
  Head key = lit("\"arguments\"");
  if (key != Head::kYes) {
    i = key_at;
    const Head other = lit("\"parameters\"");
    if (other == Head::kYes) key = other;
    else return key == Head::kIncomplete || other == Head::kIncomplete ? Head::kIncomplete : Head::kNo;
  }
  ws();
  if (const Head h = lit(":"); h != Head::kYes) return h;
  ws();
  if (i == s.size()) return Head::kIncomplete;
  if (s[i] != '{') return Head::kNo;
  name = n.get<std::string>();
  args_at = i;
  return Head::kYes;
}

// qwen3_xml: a call's body, <function=NAME> then <parameter=KEY>value</parameter>s and
// </function>; nullopt unless it is exactly that. A value loses one line break at each end
// and is typed by the tool's schema for KEY: string as written, integer / number / boolean
// parsed (a value that does not parse stays a string), anything else parsed as JSON when it
// parses (vLLM's qwen3_coder parser's rules).
std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}
constexpr std::string_view kFn = "<function=", kFnEnd = "</function>", kPar = "<parameter=", kParEnd = "</parameter>";

// The `properties` of the parameter schema of the tool named `name`, or null.
const Json* tool_properties(const Json& tools, const std::string& name) {
  const Json* properties = nullptr;
  for (const Json& t : tools)
    if (t.is_object() && t.contains("function") && t["function"].value("name", "") == name) {
      const Json& fn = t["function"];
      if (fn.contains("parameters") && fn["parameters"].is_object() && fn["parameters"].contains("properties") &&
          fn["parameters"]["properties"].is_object())
        properties = &fn["parameters"]["properties"];
    }
  return properties;
}

// A call's name from the text between <function= and '>', or empty when it is none.
std::string xml_name(std::string_view text) {
  const std::string_view name = trim(text);
  return name.find_first_of("<\n") == std::string_view::npos ? std::string(name) : std::string();
}

// A parameter's value from its text between '>' and </parameter>, typed by the schema.
Json xml_value(std::string_view raw, const Json* properties, const std::string& key) {
  if (raw.starts_with('\n')) raw.remove_prefix(1);
  if (raw.ends_with('\n')) raw.remove_suffix(1);
  std::string type;
  if (properties && properties->contains(key) && (*properties)[key].is_object()) {
    const Json& t = (*properties)[key].value("type", Json());
    if (t.is_string()) type = t.get<std::string>();
  }
  Json value = std::string(raw);
  if (type != "string" && !type.empty()) {
    const Json parsed = Json::parse(trim(raw), nullptr, /*allow_exceptions=*/false);
    const bool fits = type == "integer"   ? parsed.is_number_integer()
                      : type == "number"  ? parsed.is_number()
                      : type == "boolean" ? parsed.is_boolean()
                                          : !parsed.is_discarded();
    if (fits) value = parsed;
  }
  return value;
}

std::optional<ToolCall> xml_call(std::string_view body, const Json& tools) {
  body = trim(body);
  if (!body.starts_with(kFn) || !body.ends_with(kFnEnd)) return std::nullopt;
  body.remove_prefix(kFn.size());
  body.remove_suffix(kFnEnd.size());
  const size_t gt = body.find('>');
  if (gt == std::string_view::npos) return std::nullopt;
  ToolCall call;
  call.name = xml_name(body.substr(0, gt));
  if (call.name.empty()) return std::nullopt;
  const Json* properties = tool_properties(tools, call.name);
  Json args = Json::object();
  std::string_view rest = trim(body.substr(gt + 1));
  while (!rest.empty()) {
    if (!rest.starts_with(kPar)) return std::nullopt;
    rest.remove_prefix(kPar.size());
    const size_t key_end = rest.find('>'), value_end = rest.find(kParEnd);
    if (key_end == std::string_view::npos || value_end == std::string_view::npos || key_end > value_end)
      return std::nullopt;
    const std::string key(trim(rest.substr(0, key_end)));
    if (key.empty()) return std::nullopt;
    args[key] = xml_value(rest.substr(key_end + 1, value_end - key_end - 1), properties, key);
    rest = trim(rest.substr(value_end + kParEnd.size()));
  }
  call.arguments = arg_json(args);
  return call;
}

// Whole-output formats: whether the text so far (leading whitespace skipped) is too short to
// tell calls from text, and whether it opens as calls.
bool undecided(ToolParser p, std::string_view rest) {
  if (p == ToolParser::kPythonic) return PythonCalls(rest).opening() == Head::kIncomplete;
  if (p == ToolParser::kGranite)
    return rest.empty() || rest == "[" || (rest.size() < kGraniteTag.size() && kGraniteTag.starts_with(rest));
  if (p == ToolParser::kPhi4MiniJson) return rest.size() <= kPhi4Tag.size() && kPhi4Tag.starts_with(rest);
  if (p == ToolParser::kMistral)
    return rest.empty() || rest == "[" || (rest.size() < kMistralTag.size() && kMistralTag.starts_with(rest));
  return rest.empty();
}
bool opens_calls(ToolParser p, std::string_view rest) {
  if (p == ToolParser::kPythonic) return PythonCalls(rest).opening() == Head::kYes;
  if (p == ToolParser::kGranite)
    return rest.starts_with(kGraniteTag) || rest.starts_with("[{") || rest.starts_with("[ ") || rest.starts_with("[\n");
  if (p == ToolParser::kPhi4MiniJson) return rest.starts_with(kPhi4Tag) && rest.substr(kPhi4Tag.size()).starts_with('[');
  if (p == ToolParser::kMistral)
    return rest.starts_with(kMistralTag) || rest.starts_with("[{") || rest.starts_with("[ ") || rest.starts_with("[\n");
  return rest.starts_with("{");
}

// llama3_json: {"name", "parameters"} objects separated by ';' and whitespace; none unless
// every object is a call.
std::vector<ToolCall> llama3_calls(std::string_view text) {
  std::vector<ToolCall> calls;
  size_t i = 0;
  for (;;) {
    while (i < text.size() && (is_space(text[i]) || text[i] == ';')) ++i;
    if (i == text.size()) return calls;
    const size_t end = text[i] == '{' ? object_end(text, i) : std::string_view::npos;
    if (end == std::string_view::npos) return {};
    std::optional<ToolCall> c = parse_call(text.substr(i, end - i), {"parameters", "arguments"});
    if (!c) return {};
    calls.push_back(std::move(*c));
    i = end;
  }
}

// mistral, granite and phi4_mini_json: the tag ([TOOL_CALLS], <|tool_call|>, functools) when still in the text and a JSON
// array of calls; none unless every element is a call.
std::vector<ToolCall> array_calls(std::string_view text, std::string_view tag) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  if (text.starts_with(tag)) text.remove_prefix(tag.size());
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return {};
  std::vector<ToolCall> calls;
  for (const Json& x : j) {
    std::optional<ToolCall> c = call_of(x, {"arguments", "parameters"});
    if (!c) return {};
    calls.push_back(std::move(*c));
  }
  return calls;
}

}  // namespace

size_t JsonCloseScan::scan(std::string_view s) {
  for (; pos_ < s.size(); ++pos_) {
    const char c = s[pos_];
    if (in_string_) {
      if (escape_) escape_ = false;
      else if (c == '\\') escape_ = true;
      else if (c == '"') in_string_ = false;
    } else if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if ((c == '}' || c == ']') && --depth_ == 0) {
      return ++pos_;
    }
  }
  return std::string_view::npos;
}

ToolParser tool_parser_from_name(std::string_view name) {
  if (name == "hermes") return ToolParser::kHermes;
  if (name == "llama3_json") return ToolParser::kLlama3Json;
  if (name == "mistral") return ToolParser::kMistral;
  if (name == "pythonic") return ToolParser::kPythonic;
  if (name == "granite") return ToolParser::kGranite;
  if (name == "qwen3_xml") return ToolParser::kQwen3Xml;
  if (name == "phi4_mini_json") return ToolParser::kPhi4MiniJson;
  if (name == "auto") return ToolParser::kAuto;
  if (name == "none" || name.empty()) return ToolParser::kNone;
  throw std::invalid_argument("unknown tool-call parser '" + std::string(name) +
                              "' (hermes, llama3_json, mistral, pythonic, granite, qwen3_xml, phi4_mini_json, auto, none)");
}

const char* tool_parser_name(ToolParser p) {
  switch (p) {
    case ToolParser::kHermes: return "hermes";
    case ToolParser::kLlama3Json: return "llama3_json";
    case ToolParser::kMistral: return "mistral";
    case ToolParser::kPythonic: return "pythonic";
    case ToolParser::kGranite: return "granite";
    case ToolParser::kQwen3Xml: return "qwen3_xml";
    case ToolParser::kPhi4MiniJson: return "phi4_mini_json";
    case ToolParser::kAuto: return "auto";
    default: return "none";
  }
}

ToolParser tool_parser_for_template(std::string_view t) {
  auto has = [&](std::string_view s) { return t.find(s) != std::string_view::npos; };
  if (has("<function=")) return ToolParser::kQwen3Xml;  // inside <tool_call>: before hermes
  if (has(kOpen)) return ToolParser::kHermes;
  if (has(kMistralTag)) return ToolParser::kMistral;
  if (has(kGraniteTag)) return ToolParser::kGranite;
  if (has(kPyStart)) return ToolParser::kPythonic;
  if (has("<|python_tag|>") || has("JSON for a function call")) return ToolParser::kLlama3Json;
  return ToolParser::kNone;
}

ToolCallDelta ToolCallSplitter::feed(std::string_view text) {
  held_ += text;
  return drain(false);
}

ToolCallDelta ToolCallSplitter::finish() { return drain(true); }

ToolCallDelta ToolCallSplitter::drain(bool final) {
  ToolCallDelta out;
  if (parser_ == ToolParser::kNone) {
    out.content = std::move(held_);
    held_.clear();
    return out;
  }
  const bool tagged = parser_ == ToolParser::kHermes || parser_ == ToolParser::kQwen3Xml;
  if (!tagged) {
    // Whole-output formats: once the output opens as calls it is held to the end and parsed
    // whole; if it does not parse, all of it is content.
    if (!decided_) {
      size_t i = 0;
      while (i < held_.size() && is_space(held_[i])) ++i;
      const std::string_view rest = std::string_view(held_).substr(i);
      if (!final && undecided(parser_, rest)) return out;
      decided_ = true;
      calls_body_ = opens_calls(parser_, rest);
      if (calls_body_) {
        // Calls stream as they are written, from after the tag when it is there.
        const std::string_view tag = parser_ == ToolParser::kMistral        ? kMistralTag
                                     : parser_ == ToolParser::kGranite      ? kGraniteTag
                                     : parser_ == ToolParser::kPhi4MiniJson ? kPhi4Tag
                                     : parser_ == ToolParser::kPythonic     ? kPyStart
                                                                            : std::string_view();
        body_fed_ = i + (!tag.empty() && rest.starts_with(tag) ? tag.size() : 0);
        if (!stream_) {
          // Nothing streams: the body is parsed whole at the end.
        } else if (parser_ == ToolParser::kPythonic) {
          py_body_.emplace();
        } else {
          body_.emplace(parser_ == ToolParser::kLlama3Json ? CallArrayStreamer::Form::kSemicolons
                                                           : CallArrayStreamer::Form::kArray);
        }
      }
    }
    if (!calls_body_) {
      out.content = std::move(held_);
      held_.clear();
      return out;
    }
    if (stream_ && body_fed_ < held_.size()) {
      const std::string_view more = std::string_view(held_).substr(body_fed_);
      out.fragments = body_ ? body_->feed(more) : py_body_->feed(more);
      body_fed_ = held_.size();
    }
    if (!final) return out;
    std::vector<ToolCall> calls;
    if (parser_ == ToolParser::kMistral) calls = array_calls(held_, kMistralTag);
    else if (parser_ == ToolParser::kGranite) calls = array_calls(held_, kGraniteTag);
    else if (parser_ == ToolParser::kPhi4MiniJson) calls = array_calls(held_, kPhi4Tag);
    else if (parser_ == ToolParser::kPythonic) calls = PythonCalls(held_).read().value_or(std::vector<ToolCall>{});
    else calls = llama3_calls(held_);
    if (body_) calls = body_->released(std::move(calls));
    else if (py_body_) calls = py_body_->released(std::move(calls));
    if (!calls.empty()) {
      calls_ += int(calls.size());
      out.calls = std::move(calls);
    } else {
      out.content = std::move(held_);
    }
    held_.clear();
    return out;
  }
  // hermes and qwen3_xml: calls within <tool_call> ... </tool_call> after text
  for (;;) {
    if (!in_call_) {  // outside a call
      const size_t at = held_.find(kOpen);
      if (at == std::string::npos) {
        const size_t keep = final ? 0 : partial_tag(held_, kOpen);
        std::string text = held_.substr(0, held_.size() - keep);
        // Whitespace between and after calls is not content; before text it is.
        if (after_call_ && all_space(text)) {
          if (final) held_.clear();
          return out;
        }
        out.content += text;
        after_call_ = false;
        held_.erase(0, held_.size() - keep);
        return out;
      }
      const std::string before = held_.substr(0, at);
      if (!(after_call_ && all_space(before))) out.content += before;
      held_.erase(0, at + kOpen.size());
      in_call_ = true;
      continue;
    }
    const size_t end = held_.find(kClose);
    // The call's text so far: a tail that may be the start of </tool_call> waits.
    const size_t visible = end != std::string::npos ? end : final ? held_.size() : held_.size() - partial_tag(held_, kClose);
    if (parser_ == ToolParser::kHermes && stream_) stream_call(out, visible);
    if (parser_ == ToolParser::kQwen3Xml && stream_) stream_xml(out, visible);
    if (end == std::string::npos && !final) return out;
    const std::string body = held_.substr(0, visible);
    std::optional<ToolCall> c;
    if (args_at_ != std::string::npos) {
      // Its fragments are out: the call is what they said (its arguments compact once they
      // parse, else as streamed), whatever else the body holds.
      std::string args = held_.substr(args_at_, args_sent_);
      const Json a = Json::parse(args, nullptr, /*allow_exceptions=*/false);
      c = ToolCall{streaming_name_, a.is_object() ? a.dump() : std::move(args), "", true};
    } else if (!xml_args_.empty()) {
      // A qwen3_xml call whose fragments are out, as they said (compact JSON already).
      c = ToolCall{streaming_name_, xml_args_, "", true};
    } else if (parser_ == ToolParser::kQwen3Xml) {
      c = xml_call(body, tools_);
    } else {
      c = parse_call(body, {"arguments", "parameters"});
    }
    if (c) {
      out.calls.push_back(std::move(*c));
      ++calls_;
    } else {
      out.content += std::string(kOpen) + body + (end == std::string::npos ? "" : std::string(kClose));
    }
    after_call_ = bool(c);
    held_.erase(0, end == std::string::npos ? held_.size() : end + kClose.size());
    in_call_ = false;
    args_at_ = std::string::npos;
    streaming_name_.clear();
    args_sent_ = 0;
    args_done_ = head_checked_ = false;
    xml_ = Xml::kHead;
    xml_at_ = 0;
    xml_props_ = nullptr;
    xml_keys_.clear();
    xml_args_.clear();
    if (final && held_.empty()) return out;
  }
}

void ToolCallSplitter::stream_xml(ToolCallDelta& out, size_t visible) {
  const std::string_view text = std::string_view(held_).substr(0, visible);
  auto emit = [&](std::string piece) {
    xml_args_ += piece;
    append_piece(out.fragments, size_t(calls_), piece);
  };
  // Whether `rest` may still grow into `tag`.
  auto partial = [](std::string_view rest, std::string_view tag) {
    return rest.size() < tag.size() && tag.starts_with(rest);
  };
  while (xml_ != Xml::kDone) {
    size_t p = xml_at_;
    while (p < text.size() && is_space(text[p])) ++p;
    const std::string_view rest = text.substr(p);
    if (rest.empty() || partial(rest, kFn) || partial(rest, kFnEnd) || partial(rest, kPar)) return;
    if (xml_ == Xml::kHead) {
      // Not <function=: nothing streams, the call is parsed whole as it closes.
      if (!rest.starts_with(kFn)) {
        xml_ = Xml::kDone;
        return;
      }
      const size_t gt = text.find('>', p + kFn.size());
      if (gt == std::string_view::npos) return;
      const std::string name = xml_name(text.substr(p + kFn.size(), gt - p - kFn.size()));
      if (name.empty()) {
        xml_ = Xml::kDone;
        return;
      }
      streaming_name_ = name;
      xml_props_ = tool_properties(tools_, name);
      out.fragments.push_back({size_t(calls_), name, ""});
      emit("{");
      xml_at_ = gt + 1;
      xml_ = Xml::kParams;
      continue;
    }
    if (rest.starts_with(kFnEnd)) {
      emit("}");
      xml_ = Xml::kDone;
      return;
    }
    // Anything but a parameter (or a repeated one) stops the stream: the call is then
    // released as its fragments said.
    if (!rest.starts_with(kPar)) {
      xml_ = Xml::kDone;
      return;
    }
    const size_t key_at = p + kPar.size(), value_end = text.find(kParEnd, key_at);
    if (value_end == std::string_view::npos) return;
    const size_t key_end = text.find('>', key_at);
    const std::string key = key_end < value_end ? std::string(trim(text.substr(key_at, key_end - key_at))) : "";
    if (key.empty() || std::find(xml_keys_.begin(), xml_keys_.end(), key) != xml_keys_.end()) {
      xml_ = Xml::kDone;
      return;
    }
    std::string pair = xml_keys_.empty() ? "" : ",";
    pair += arg_json(key);
    pair += ':';
    pair += arg_json(xml_value(text.substr(key_end + 1, value_end - key_end - 1), xml_props_, key));
    emit(std::move(pair));
    xml_keys_.push_back(key);
    xml_at_ = value_end + kParEnd.size();
  }
}

void ToolCallSplitter::stream_call(ToolCallDelta& out, size_t visible) {
  const std::string_view text = std::string_view(held_).substr(0, visible);
  if (args_at_ == std::string::npos && !head_checked_) {
    std::string name;
    size_t at = 0;
    const Head h = call_head(text, name, at);
    if (h == Head::kNo) head_checked_ = true;
    if (h != Head::kYes) return;
    args_at_ = at;
    args_scan_ = JsonCloseScan(at);
    streaming_name_ = name;
    out.fragments.push_back({size_t(calls_), name, ""});
  }
  if (args_at_ == std::string::npos || args_done_) return;
  const size_t close = args_scan_.scan(text);
  const size_t upto = close == std::string_view::npos ? text.size() : close;
  args_done_ = close != std::string_view::npos;
  if (upto <= args_at_ + args_sent_) return;
  const std::string_view piece = text.substr(args_at_ + args_sent_, upto - args_at_ - args_sent_);
  args_sent_ += piece.size();
  append_piece(out.fragments, size_t(calls_), piece);
}

std::vector<ToolCallFragment> CallArrayStreamer::feed(std::string_view text) {
  text_ += text;
  std::vector<ToolCallFragment> out;
  const std::string_view s = text_;
  while (!stopped_) {
    if (obj_at_ == std::string::npos) {  // between elements
      while (next_ < s.size() && (is_space(s[next_]) || (opened_ && s[next_] == sep_))) ++next_;
      if (next_ == s.size()) break;
      if (!opened_ && s[next_] == '[') {
        opened_ = true;
        ++next_;
        continue;
      }
      if (!opened_ || s[next_] != '{') {  // ']' (the end) or what no call opens with
        stopped_ = true;
        break;
      }
      obj_at_ = next_;
      obj_scan_ = JsonCloseScan(obj_at_);
    }
    if (args_at_ == std::string::npos) {
      std::string name;
      size_t rel = 0;
      const Head h = call_head(s.substr(obj_at_), name, rel);
      if (h == Head::kIncomplete) break;
      if (h == Head::kNo) {
        stopped_ = true;
        break;
      }
      args_at_ = obj_at_ + rel;
      args_scan_ = JsonCloseScan(args_at_);
      out.push_back({streamed_.size(), name, ""});
      streamed_.push_back({name, "", "", true});
    }
    ToolCall& call = streamed_.back();
    if (!args_done_) {
      const size_t close = args_scan_.scan(s);
      const size_t upto = close == std::string_view::npos ? s.size() : close;
      const size_t sent = args_at_ + call.arguments.size();
      if (upto > sent) {
        const std::string_view piece = s.substr(sent, upto - sent);
        call.arguments += piece;
        append_piece(out, streamed_.size() - 1, piece);
      }
      if (close == std::string_view::npos) break;
      args_done_ = true;
    }
    const size_t end = obj_scan_.scan(s);
    if (end == std::string_view::npos) break;
    next_ = end;
    obj_at_ = args_at_ = std::string::npos;
    args_done_ = false;
  }
  return out;
}

namespace tool_detail {

// The streamed calls as their fragments said (arguments compact once they parse), then the
// parsed calls past them; with nothing streamed, the parsed calls.
std::vector<ToolCall> released_calls(const std::vector<ToolCall>& streamed, std::vector<ToolCall> parsed) {
  if (streamed.empty()) return parsed;
  std::vector<ToolCall> out;
  for (ToolCall c : streamed) {
    const Json a = Json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
    if (a.is_object()) c.arguments = a.dump();
    out.push_back(std::move(c));
  }
  for (size_t k = out.size(); k < parsed.size(); ++k) out.push_back(std::move(parsed[k]));
  return out;
}

}  // namespace tool_detail


std::vector<ToolCall> CallArrayStreamer::released(std::vector<ToolCall> parsed) const {
  return released_calls(streamed_, std::move(parsed));
}


ToolCallDelta parse_tool_calls(ToolParser parser, std::string_view text, const nlohmann::ordered_json& tools) {
  ToolCallSplitter s(parser, tools);
  ToolCallDelta a = s.feed(text), b = s.finish();
  a.content += b.content;
  for (auto& c : b.calls) a.calls.push_back(std::move(c));
  for (auto& f : b.fragments) a.fragments.push_back(std::move(f));
  return a;
}

}  // namespace kiln::server
