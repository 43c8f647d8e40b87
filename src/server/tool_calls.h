// Tool calls in chat output (OpenAI's `tools`): the formats models are trained to write
// them in, parsed into message.tool_calls as vLLM's tool-call parsers do. `kiln serve
// --tool-call-parser NAME`:
//   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number, after
//                optional text (Qwen2.5, Qwen3, QwQ, Hermes 2/3, SmolLM3)
//   llama3_json  the whole output is {"name": ..., "parameters": {...}} objects separated by
//                ';' (Llama 3.1-3.3: their template's JSON tool calling; <|python_tag|> is a
//                special token, already gone from the text)
//   mistral      the whole output is [{"name": ..., "arguments": {...}}, ...] after the
//                [TOOL_CALLS] control token (Mistral 7B v0.3, Nemo, Small; the token itself
//                is skipped from the text, or taken off when it is there)
// A call whose JSON does not parse stays text, as vLLM leaves it. Tested in
// tests/server/tool_calls_test.cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln::server {

enum class ToolParser { kNone, kHermes, kLlama3Json, kMistral };
// "hermes", "llama3_json", "mistral" (and "none"); throws std::invalid_argument naming the
// choices.
ToolParser tool_parser_from_name(std::string_view name);
const char* tool_parser_name(ToolParser p);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object's compact text, as OpenAI's API returns it
  std::string id;         // given by the server as the call is read ("call_...")
};

struct ToolCallDelta {
  std::string content;          // text that is not a tool call
  std::vector<ToolCall> calls;  // calls completed by this piece
};

// Splits one choice's output, fed in pieces as it streams, into content and tool calls.
// Text that might begin a call is held back until the next piece decides it; a call is
// released whole once it closes; finish() parses what is held (an unclosed hermes call,
// the llama3_json body) and releases the rest as content.
class ToolCallSplitter {
 public:
  explicit ToolCallSplitter(ToolParser parser) : parser_(parser) {}
  ToolCallDelta feed(std::string_view text);
  ToolCallDelta finish();
  bool saw_calls() const { return calls_ > 0; }

 private:
  ToolCallDelta drain(bool final);
  ToolParser parser_;
  std::string held_;
  bool decided_ = false;  // llama3_json: whether the output is tool calls was decided
  bool json_body_ = false;  // llama3_json, mistral: it is (calls are parsed at the end)
  bool in_call_ = false;    // hermes: inside <tool_call>
  int calls_ = 0;
};

// Whole-output convenience: feed(text) + finish().
ToolCallDelta parse_tool_calls(ToolParser parser, std::string_view text);

}  // namespace kiln::server
