// libFuzzer target for the tool-call parsers (server/tool_calls.h), which read what a
// model writes: any output, whole or fed in pieces, must split into the same content and
// calls (names, arguments, whether streamed), and a streamed call's fragments must name it
// first and put together the text of its arguments (the same JSON value once it parses;
// pythonic's: exactly its arguments, which its pieces are written as).
// The first byte picks the parser and the piece sizes; the rest is the output. Any crash,
// sanitizer report or disagreement (a trap) is a bug. Seed the corpus with calls, e.g.
// printf '\0<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>' > seeds/hermes,
// printf '\3[f(a=1, b="x, )"), g(c=[None, (True,)], d={1: 2})]' > seeds/pythonic,
// printf '\3[f(s=\x27a\\n\\u00e9\xc3\xa9\x27, t=\x27\x27\x27q\\x41\x27\x27\x27)]' > seeds/pystrings.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/tool_calls.h"
#include "tokenizer/unicode.h"

namespace {

using kiln::server::ToolCallDelta;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

void append(ToolCallDelta& all, ToolCallDelta d) {
  all.content += d.content;
  for (auto& c : d.calls) all.calls.push_back(std::move(c));
  for (auto& f : d.fragments) all.fragments.push_back(std::move(f));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 8192) return 0;
  using kiln::server::ToolParser;
  const ToolParser parsers[] = {ToolParser::kHermes,  ToolParser::kLlama3Json, ToolParser::kMistral,
                                ToolParser::kPythonic, ToolParser::kGranite,   ToolParser::kQwen3Xml,
                                ToolParser::kNone,     ToolParser::kPhi4MiniJson};
  const ToolParser p = parsers[data[0] % 8];
  const size_t step = 1 + data[0] / 8 % 13;  // piece sizes cycle 1..step
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  const ToolCallDelta whole = kiln::server::parse_tool_calls(p, text);
  kiln::server::ToolCallSplitter s(p);
  ToolCallDelta all;
  for (size_t at = 0, n = 1; at < text.size(); at += n, n = n % step + 1) append(all, s.feed(text.substr(at, n)));
  append(all, s.finish());

  check(all.content == whole.content);
  check(all.calls.size() == whole.calls.size());
  for (size_t k = 0; k < all.calls.size(); ++k) {
    const auto& c = all.calls[k];
    check(c.name == whole.calls[k].name && c.arguments == whole.calls[k].arguments &&
          c.streamed == whole.calls[k].streamed);
    std::string args;
    int pieces = 0;
    for (const auto& f : all.fragments)
      if (f.call == k) {
        check(f.name.empty() == (pieces > 0));  // the first piece, and only it, names the call
        check(f.name.empty() || f.name == c.name);
        args += f.arguments;
        ++pieces;
      }
    check(c.streamed == (pieces > 0));
    if (!c.streamed) continue;
    if (p == ToolParser::kPythonic) check(args == c.arguments);
    const auto parsed = nlohmann::json::parse(c.arguments, nullptr, false);
    if (parsed.is_discarded()) check(args == c.arguments);
    else check(nlohmann::json::parse(args, nullptr, false) == parsed);
  }
  for (const auto& f : all.fragments) check(f.call < all.calls.size());
  // pythonic strings stream a character at a time: no piece splits one (or an escape).
  if (p == ToolParser::kPythonic && kiln::tok::utf8_find_invalid(text) == std::string_view::npos)
    for (const auto& f : all.fragments) check(kiln::tok::utf8_find_invalid(f.arguments) == std::string_view::npos);

  // A response sent whole (stream = false): no fragments, no call marked streamed, the same
  // result in pieces as whole, and every call's arguments parse (a call that does not parse
  // stays content).
  kiln::server::ToolCallSplitter w_whole(p, nlohmann::ordered_json::array(), false),
      w_pieces(p, nlohmann::ordered_json::array(), false);
  ToolCallDelta ww, wp;
  append(ww, w_whole.feed(text));
  append(ww, w_whole.finish());
  for (size_t at = 0, n = 1; at < text.size(); at += n, n = n % step + 1) append(wp, w_pieces.feed(text.substr(at, n)));
  append(wp, w_pieces.finish());
  check(ww.fragments.empty() && wp.fragments.empty() && ww.content == wp.content && ww.calls.size() == wp.calls.size());
  for (size_t k = 0; k < wp.calls.size(); ++k) {
    check(!wp.calls[k].streamed && wp.calls[k].name == ww.calls[k].name && wp.calls[k].arguments == ww.calls[k].arguments);
    if (p != ToolParser::kQwen3Xml) check(nlohmann::json::parse(wp.calls[k].arguments, nullptr, false).is_object());
  }

  // tool_choice "required"'s array streamer: the same calls in pieces as whole, and each
  // call's fragments (its name first) put together are its streamed arguments.
  kiln::server::CallArrayStreamer whole_array, pieces;
  (void)whole_array.feed(text);
  std::vector<std::string> args;
  for (size_t at = 0, n = 1; at < text.size(); at += n, n = n % step + 1)
    for (const auto& f : pieces.feed(text.substr(at, n))) {
      check(f.name.empty() == (f.call < args.size()));
      if (f.call == args.size()) args.emplace_back();
      check(f.call < args.size());
      args[f.call] += f.arguments;
    }
  check(pieces.streamed().size() == whole_array.streamed().size() && args.size() == pieces.streamed().size());
  for (size_t k = 0; k < args.size(); ++k) {
    check(pieces.streamed()[k].name == whole_array.streamed()[k].name);
    check(pieces.streamed()[k].arguments == whole_array.streamed()[k].arguments && args[k] == pieces.streamed()[k].arguments);
  }
  return 0;
}
