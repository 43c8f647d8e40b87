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
//   granite      the same array after <|tool_call|> (IBM Granite 3.x)
//   phi4_mini_json  the same array after functools (Phi-4-mini; vLLM's phi4_mini_json)
//   qwen3_xml    <tool_call><function=NAME><parameter=KEY>value</parameter>...</function>
//                </tool_call>, after optional text (Qwen3-Coder); each value is typed by the
//                tool's JSON Schema (string as written; integer, number, boolean; other
//                types parsed as JSON), as vLLM's qwen3_coder parser types them
//   pythonic     the whole output is a Python list of keyword calls, [f(a=1, b="x"), g()],
//                with Python literals as values (Llama 3.2, Llama 4: within <|python_start|>
//                ... <|python_end|> when those are in the text); positional arguments, or
//                anything but literals, make it text, as in vLLM's parser (unless a call's
//                name went out already: see ToolCallSplitter)
// A call whose JSON does not parse stays text, as vLLM leaves it. Tested in
// tests/server/tool_calls_test.cpp.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::server {

// Where a JSON object or array that opens at `at` closes, found resumably: each scan() reads
// only the text added since the last one (the text only grows), so streaming a long value
// stays linear. Strings and their escapes are skipped; the text need not be valid JSON.
class JsonCloseScan {
 public:
  explicit JsonCloseScan(size_t at = std::string::npos) : pos_(at) {}
  // One past the closing bracket within `s`, or npos while it is still open.
  size_t scan(std::string_view s);

 private:
  size_t pos_;
  int depth_ = 0;
  bool in_string_ = false, escape_ = false;
};

// kAuto: each model's parser is read from its chat template (tool_parser_for_template).
enum class ToolParser { kNone, kHermes, kLlama3Json, kMistral, kPythonic, kGranite, kQwen3Xml, kPhi4MiniJson, kAuto };
// "hermes", "llama3_json", "mistral", "pythonic", "granite", "qwen3_xml", "phi4_mini_json", "auto" (and "none");
// throws std::invalid_argument naming the choices.
ToolParser tool_parser_from_name(std::string_view name);
const char* tool_parser_name(ToolParser p);
// The format a chat template tells its model to write tool calls in, from the markers it
// renders: <function= (qwen3_xml), <tool_call> (hermes), [TOOL_CALLS] (mistral), <|tool_call|> (granite),
// <|python_start|> (Llama 4: pythonic), <|python_tag|> or Llama 3.1's "JSON for a function
// call" instruction (llama3_json); kNone when it shows none of them.
ToolParser tool_parser_for_template(std::string_view chat_template);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object's compact text, as OpenAI's API returns it
  std::string id;         // given by the server as the call is read ("call_...")
  bool streamed = false;  // its name and arguments went out as fragments before it closed
};

// A piece of a call still being written (hermes): the first names the call, the rest carry
// the next text of its arguments, as OpenAI streams delta.tool_calls. The pieces' arguments
// put together are the model's text of the arguments object.
struct ToolCallFragment {
  size_t call = 0;        // the call's number in the output (its index among the calls)
  std::string name;       // on the call's first fragment only
  std::string arguments;  // the next piece of the arguments' text (may be empty)
};

struct ToolCallDelta {
  std::string content;          // text that is not a tool call
  std::vector<ToolCall> calls;  // calls completed by this piece
  std::vector<ToolCallFragment> fragments;  // pieces of calls not yet complete (and completing)
};

// A run of calls, {"name": ..., "parameters" (or "arguments"): {...}}, streamed as fragments
// while it is written (each call's name once its head is read, then its arguments' text), as
// the hermes splitter streams its calls: tool_choice "required"'s constrained output and the
// mistral / granite bodies (kArray: a JSON array), llama3_json's (kSemicolons: objects
// separated by ';'). An element that does not open so stops the streaming; the text is
// parsed whole at the end either way.
class CallArrayStreamer {
 public:
  enum class Form { kArray, kSemicolons };
  explicit CallArrayStreamer(Form form = Form::kArray)
      : sep_(form == Form::kArray ? ',' : ';'), opened_(form == Form::kSemicolons) {}
  std::vector<ToolCallFragment> feed(std::string_view text);
  // The calls streamed so far: their names and the parameters' text as streamed.
  const std::vector<ToolCall>& streamed() const { return streamed_; }
  // The calls to release at the end, given those the whole text parsed into (none when it
  // did not parse): the streamed calls as their fragments said (arguments compact once they
  // parse), whatever the rest of the text holds, then the parsed calls past them; with
  // nothing streamed, the parsed calls.
  std::vector<ToolCall> released(std::vector<ToolCall> parsed) const;

 private:
  std::string text_;
  size_t next_ = 0;                      // where the next element is looked for
  size_t obj_at_ = std::string::npos;    // the element being read
  size_t args_at_ = std::string::npos;   // its parameters object (npos: head not read)
  JsonCloseScan obj_scan_, args_scan_;
  bool args_done_ = false;
  char sep_;     // between elements
  bool opened_;  // the array's '[' was read (kSemicolons: none to read)
  bool stopped_ = false;
  std::vector<ToolCall> streamed_;
};

// pythonic's list of keyword calls, [f(a=1, b="x"), g()], streamed as it is written: a call's
// name (with its arguments' '{') once `name(` is read, then each keyword argument's JSON:
// a string value as it is read ("key":" at its opening quote, then its characters,
// escapes decoded, as far as they are whole, then its closing quote), any other value,
// "key":value, once its literal is closed by ',' or ')', and '}' as the call closes. So each
// call's pieces put together are exactly the arguments the whole-output parse gives it.
// Text that does not read so (a positional argument, an expression, a repeated keyword)
// stops the streaming; the text is parsed whole at the end either way, and a call whose
// pieces went out is released as they said (ToolCallSplitter).
class PythonCallStreamer {
 public:
  std::vector<ToolCallFragment> feed(std::string_view text);
  // The calls streamed so far: their names and their arguments' JSON as streamed.
  const std::vector<ToolCall>& streamed() const { return streamed_; }
  // As CallArrayStreamer::released.
  std::vector<ToolCall> released(std::vector<ToolCall> parsed) const;

  // Where a Python literal that starts at `at` ends, found resumably (each scan() reads only
  // the text added since the last): the ',' or closing bracket after it outside any string
  // and bracket, as the whole-output parser reads strings (quotes, triple quotes, escapes).
  class LiteralScan {
   public:
    explicit LiteralScan(size_t at = 0) : pos_(at) {}
    // The delimiter's position within `s`, or npos while none is read yet.
    size_t scan(std::string_view s);

   private:
    size_t pos_;
    int depth_ = 0;
    char quote_ = 0;  // inside a string opened by this quote
    bool triple_ = false, escape_ = false;
  };

  // A Python string literal ('...', "...", '''...''', """...""") that starts at `at`,
  // read resumably: each read() decodes the text added since the last into `out` (escapes
  // decoded to UTF-8; the caller may take bytes off out's front) and says whether the
  // literal closed, needs more text, or cannot be one. With `final` the text ends there:
  // what would wait for more (a quote that may open or close a triple quote, an escape's
  // missing digits) decides on what is there.
  class StringRead {
   public:
    enum Read { kDone, kMore, kBad };
    explicit StringRead(size_t at = 0) : at_(at) {}
    Read read(std::string_view s, bool final);
    // Where the text after the literal starts (after kDone).
    size_t end() const { return at_; }
    std::string out;

   private:
    size_t at_;
    char q_ = 0;  // the quote, once read
    bool triple_ = false;
  };

 private:
  enum class At { kList, kName, kParen, kKey, kEquals, kValueStart, kValue, kString, kAfterValue, kAfterCall, kStopped };
  std::string text_;
  size_t pos_ = 0;  // where the next token is read
  At at_ = At::kList;
  std::string name_, key_;          // the call's name and the keyword being read
  std::vector<std::string> keys_;   // the call's keywords so far
  size_t value_at_ = 0;             // where the keyword's value starts
  LiteralScan value_scan_;
  StringRead string_;  // a string value, streamed as it is read
  std::vector<ToolCall> streamed_;
};

// Splits one choice's output, fed in pieces as it streams, into content and tool calls.
// Text that might begin a call is held back until the next piece decides it; a hermes call
// that opens as {"name": ..., "arguments": { streams as fragments (its name, then its
// arguments as they are written) and is released as a call, marked streamed, once it
// closes, and so does a qwen3_xml call that opens as <function=NAME> (its name, then each
// parameter once closed: stream_xml); the calls of mistral, granite, phi4_mini_json and llama3_json bodies
// stream the same way (CallArrayStreamer), pythonic's as PythonCallStreamer reads them, and
// are released at the end; other calls are released whole; finish() parses what is held
// (an unclosed hermes call, the whole-output bodies) and releases the rest as content. A
// streamed call is
// released as its fragments said, even when the rest of its text does not parse (cut off,
// or junk after the arguments): its name and arguments (compact when they parse, else as
// streamed) are out already. Built with stream = false (a response sent whole), nothing
// streams: every call is released as the whole text of it parses, and a call that does
// not parse stays content, as vLLM's whole-output parse leaves it.
class ToolCallSplitter {
 public:
  // `tools`: the request's tools (OpenAI's array), whose parameter schemas type qwen3_xml's
  // values.
  explicit ToolCallSplitter(ToolParser parser, nlohmann::ordered_json tools = nlohmann::ordered_json::array(),
                            bool stream = true)
      : parser_(parser), tools_(std::move(tools)), stream_(stream) {}
  ToolCallDelta feed(std::string_view text);
  ToolCallDelta finish();
  bool saw_calls() const { return calls_ > 0; }

 private:
  ToolCallDelta drain(bool final);
  // hermes, inside a call whose text so far is held_[0, visible): its head's fragment once
  // read, then the arguments written since.
  void stream_call(ToolCallDelta& out, size_t visible);
  ToolParser parser_;
  nlohmann::ordered_json tools_;
  bool stream_;  // fragments go out as calls are written (else calls come whole)
  std::string held_;
  // Whole-output formats (all but hermes): whether the output is tool calls was decided,
  // and whether it is (then its calls are parsed at the end).
  bool decided_ = false;
  bool calls_body_ = false;
  bool in_call_ = false;    // hermes: inside <tool_call>
  int calls_ = 0;
  // mistral, granite, phi4_mini_json and llama3_json bodies (body_) and pythonic's (py_body_): their calls
  // streamed as written, and how much of held_ the streamer has read.
  std::optional<CallArrayStreamer> body_;
  std::optional<PythonCallStreamer> py_body_;
  size_t body_fed_ = 0;
  bool after_call_ = false;  // hermes: a call closed and no text has come since
  // hermes, inside a call: where its arguments object starts in held_ (npos: the call's
  // head is not read yet, or it does not open as name then arguments), the call's name,
  // how much of the arguments has gone out, and whether all of it has.
  size_t args_at_ = std::string::npos;
  JsonCloseScan args_scan_;
  std::string streaming_name_;
  size_t args_sent_ = 0;
  bool args_done_ = false;
  bool head_checked_ = false;  // the head was read and does not stream
  // qwen3_xml, inside a call: its name (streaming_name_) once <function=NAME> is read, then
  // each parameter as "key":value once </parameter> closes it (typed as the whole parse
  // types it), then '}' at </function>. xml_at_: where the unread text starts in held_;
  // xml_args_: the arguments as streamed (empty: nothing went out).
  enum class Xml : uint8_t { kHead, kParams, kDone };
  void stream_xml(ToolCallDelta& out, size_t visible);
  Xml xml_ = Xml::kHead;
  size_t xml_at_ = 0;
  const nlohmann::ordered_json* xml_props_ = nullptr;  // the tool's parameter properties
  std::vector<std::string> xml_keys_;
  std::string xml_args_;
};

// Whole-output convenience: feed(text) + finish().
ToolCallDelta parse_tool_calls(ToolParser parser, std::string_view text,
                               const nlohmann::ordered_json& tools = nlohmann::ordered_json::array());

}  // namespace kiln::server
