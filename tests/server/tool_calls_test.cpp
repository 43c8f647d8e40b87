// Tool-call parsing (server/tool_calls.h): each format's outputs as whole texts and
// streamed in every split, text before and between calls, malformed calls left as text (or
// released as streamed), and held-back partial tags.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "server/tool_calls.h"
#include "tokenizer/unicode.h"

namespace kiln::server {
namespace {

// Streams `text` split at `cuts` and collects the deltas (stream = false: a response sent
// whole, fed the same way).
ToolCallDelta streamed(ToolParser p, const std::string& text, std::vector<size_t> cuts, bool stream = true,
                       const nlohmann::ordered_json& tools = nlohmann::ordered_json::array()) {
  ToolCallSplitter s(p, tools, stream);
  ToolCallDelta all;
  size_t at = 0;
  cuts.push_back(text.size());
  for (size_t cut : cuts) {
    ToolCallDelta d = s.feed(std::string_view(text).substr(at, cut - at));
    all.content += d.content;
    for (auto& c : d.calls) all.calls.push_back(c);
    for (auto& f : d.fragments) all.fragments.push_back(f);
    at = cut;
  }
  ToolCallDelta d = s.finish();
  all.content += d.content;
  for (auto& c : d.calls) all.calls.push_back(c);
  for (auto& f : d.fragments) all.fragments.push_back(f);
  return all;
}

// The fragments agree with the calls: a streamed call's first fragment names it and the
// rest follow in order with its arguments' text (the same JSON value as the call's); a
// call released whole has none.
void expect_fragments_agree(const ToolCallDelta& d, const std::string& where) {
  for (size_t k = 0; k < d.calls.size(); ++k) {
    std::string args;
    int named = 0, pieces = 0;
    for (const ToolCallFragment& f : d.fragments)
      if (f.call == k) {
        if (!f.name.empty()) {
          EXPECT_EQ(pieces, 0) << where << ": the name comes first";
          EXPECT_EQ(f.name, d.calls[k].name) << where;
          ++named;
        }
        ++pieces;
        args += f.arguments;
      }
    if (!d.calls[k].streamed) {
      EXPECT_EQ(pieces, 0) << where << ": call " << k << " came whole";
      continue;
    }
    EXPECT_EQ(named, 1) << where;
    // The same JSON value, or (a call released broken, as streamed) the same text.
    const auto streamed = nlohmann::json::parse(args, nullptr, false);
    const auto released = nlohmann::json::parse(d.calls[k].arguments, nullptr, false);
    if (released.is_discarded()) EXPECT_EQ(args, d.calls[k].arguments) << where;
    else EXPECT_EQ(streamed, released) << where << ": " << args;
  }
  for (const ToolCallFragment& f : d.fragments) EXPECT_LT(f.call, d.calls.size()) << where << ": a fragment of no call";
}

// Every single split, and random multi-way splits, give the whole-text result.
void expect_any_split_agrees(ToolParser p, const std::string& text) {
  const ToolCallDelta whole = parse_tool_calls(p, text);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ToolCallDelta d = streamed(p, text, {cut});
    EXPECT_EQ(d.content, whole.content) << "split at " << cut;
    ASSERT_EQ(d.calls.size(), whole.calls.size()) << "split at " << cut;
    for (size_t i = 0; i < d.calls.size(); ++i) {
      EXPECT_EQ(d.calls[i].name, whole.calls[i].name);
      EXPECT_EQ(d.calls[i].arguments, whole.calls[i].arguments);
      EXPECT_EQ(d.calls[i].streamed, whole.calls[i].streamed);
    }
    expect_fragments_agree(d, "split at " + std::to_string(cut));
  }
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i)
      if (rng() % 3 == 0) cuts.push_back(i);
    ToolCallDelta d = streamed(p, text, cuts);
    EXPECT_EQ(d.content, whole.content);
    EXPECT_EQ(d.calls.size(), whole.calls.size());
    expect_fragments_agree(d, "random split");
  }
}

// Outputs that are not calls: all content, however they are split.
void expect_text(ToolParser p, std::initializer_list<std::string> texts) {
  for (const std::string& text : texts) {
    ToolCallDelta d = parse_tool_calls(p, text);
    EXPECT_TRUE(d.calls.empty()) << text;
    EXPECT_EQ(d.content, text);
    expect_any_split_agrees(p, text);
  }
}

TEST(ToolCalls, HermesCallsAfterText) {
  const std::string out =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  ToolCallDelta d = parse_tool_calls(ToolParser::kHermes, out);
  EXPECT_EQ(d.content, "Let me check.\n");
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(d.calls[0].arguments, R"({"city":"Paris","days":2})");
  EXPECT_EQ(d.calls[1].name, "get_time");
  EXPECT_EQ(d.calls[1].arguments, "{}");
  expect_any_split_agrees(ToolParser::kHermes, out);
  // Text between calls keeps its whitespace however it arrives (found by tool_calls_fuzz:
  // a line break after the text, in a piece of its own, was taken for space between calls).
  const std::string between = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\nsee below\n"
                              "<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>\n";
  EXPECT_EQ(parse_tool_calls(ToolParser::kHermes, between).content, "\nsee below\n");
  expect_any_split_agrees(ToolParser::kHermes, between);
}

// A hermes call opening {"name": ..., "arguments": { streams: its name as soon as the head
// is read, then its arguments as they are written, held back only where a tail may be
// </tool_call>; a call in another key order or with string arguments comes whole.
TEST(ToolCalls, HermesCallsStreamAsFragments) {
  ToolCallSplitter s(ToolParser::kHermes);
  ToolCallDelta d = s.feed("Sure.\n<tool_call>\n{\"name\": \"write_file\", \"argu");
  EXPECT_EQ(d.content, "Sure.\n");
  EXPECT_TRUE(d.fragments.empty());
  d = s.feed("ments\": {\"path\": \"a.txt\", ");
  ASSERT_EQ(d.fragments.size(), 1u);
  EXPECT_EQ(d.fragments[0].call, 0u);
  EXPECT_EQ(d.fragments[0].name, "write_file");
  EXPECT_EQ(d.fragments[0].arguments, "{\"path\": \"a.txt\", ");
  d = s.feed("\"text\": \"line one\\nline }two\"");
  ASSERT_EQ(d.fragments.size(), 1u);
  EXPECT_EQ(d.fragments[0].name, "");
  EXPECT_EQ(d.fragments[0].arguments, "\"text\": \"line one\\nline }two\"");
  d = s.feed("}}\n</tool");
  ASSERT_EQ(d.fragments.size(), 1u);
  EXPECT_EQ(d.fragments[0].arguments, "}");  // the call's own brace and the tag's start wait
  EXPECT_TRUE(d.calls.empty());
  d = s.feed("_call>\n<tool_call>{\"name\": \"g\", \"parameters\": {}}</tool_call>");
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_TRUE(d.calls[0].streamed);
  EXPECT_EQ(d.calls[0].arguments, R"({"path":"a.txt","text":"line one\nline }two"})");
  EXPECT_TRUE(d.calls[1].streamed);
  ASSERT_EQ(d.fragments.size(), 1u);  // the second call's name and its arguments at once
  EXPECT_EQ(d.fragments[0].call, 1u);
  EXPECT_EQ(d.fragments[0].name, "g");
  EXPECT_EQ(d.fragments[0].arguments, "{}");
  EXPECT_EQ(s.finish().content, "");

  const std::string mixed =
      "<tool_call>{\"arguments\": {\"x\": 1}, \"name\": \"f\"}</tool_call>\n"
      "<tool_call>{\"name\": \"h\", \"arguments\": \"{\\\"y\\\": 2}\"}</tool_call>\n"
      "<tool_call>{\"name\": \"k\", \"arguments\": {\"z\": [1, {\"w\": \"}\"}]}}</tool_call>";
  ToolCallDelta all = parse_tool_calls(ToolParser::kHermes, mixed);
  ASSERT_EQ(all.calls.size(), 3u);
  EXPECT_FALSE(all.calls[0].streamed);
  EXPECT_FALSE(all.calls[1].streamed);
  EXPECT_EQ(all.calls[1].arguments, R"({"y":2})");
  EXPECT_TRUE(all.calls[2].streamed);
  expect_any_split_agrees(ToolParser::kHermes, mixed);

  // Streamed, then cut off (max_tokens): the call is released with what was streamed.
  all = parse_tool_calls(ToolParser::kHermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": [1, 2");
  ASSERT_EQ(all.calls.size(), 1u);
  EXPECT_TRUE(all.calls[0].streamed);
  EXPECT_EQ(all.calls[0].arguments, "{\"x\": [1, 2");
  EXPECT_EQ(all.content, "");
}

// tool_choice "required": the constrained array's calls stream as they are written, in any
// split; an element that does not open as a call stops the streaming.
TEST(ToolCalls, RequiredCallArraysStream) {
  const std::string out = "[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"n\": [1, {\"x\": \"}\"}]}},\n"
                          " {\"name\": \"get_time\", \"parameters\": {}}]";
  for (size_t step : {size_t(1), size_t(3), size_t(7), out.size()}) {
    CallArrayStreamer s;
    std::vector<ToolCallFragment> all;
    for (size_t at = 0; at < out.size(); at += step)
      for (auto& f : s.feed(std::string_view(out).substr(at, step))) all.push_back(f);
    ASSERT_EQ(s.streamed().size(), 2u) << step;
    EXPECT_EQ(s.streamed()[0].name, "get_weather");
    EXPECT_EQ(s.streamed()[0].arguments, R"({"city": "Paris", "n": [1, {"x": "}"}]})");
    EXPECT_EQ(s.streamed()[1].arguments, "{}");
    std::string args[2];
    int named[2] = {0, 0};
    for (const auto& f : all) {
      ASSERT_LT(f.call, 2u);
      if (!f.name.empty()) {
        EXPECT_TRUE(args[f.call].empty()) << "the name comes first";
        ++named[f.call];
      }
      args[f.call] += f.arguments;
    }
    EXPECT_EQ(named[0], 1);
    EXPECT_EQ(named[1], 1);
    EXPECT_EQ(args[0], s.streamed()[0].arguments);
    EXPECT_EQ(args[1], "{}");
  }
  CallArrayStreamer other;
  EXPECT_TRUE(other.feed("[{\"parameters\": {}, \"name\": \"f\"}, {\"name\": \"g\", \"parameters\": {}}]").empty());
  EXPECT_TRUE(other.streamed().empty());
  CallArrayStreamer not_array;
  EXPECT_TRUE(not_array.feed("{\"name\": \"g\", \"parameters\": {}}").empty());
}

TEST(ToolCalls, HermesPlainTextAndLookalikes) {
  for (const std::string out : {"The answer is 4.", "a < b and <tool_ is not a tag", "ends with <tool_c"}) {
    ToolCallDelta d = parse_tool_calls(ToolParser::kHermes, out);
    EXPECT_EQ(d.content, out);
    EXPECT_TRUE(d.calls.empty());
    expect_any_split_agrees(ToolParser::kHermes, out);
  }
  // A prefix of the tag is held back until the text decides it.
  ToolCallSplitter s(ToolParser::kHermes);
  EXPECT_EQ(s.feed("Hi <tool").content, "Hi ");
  EXPECT_EQ(s.feed("box>").content, "<toolbox>");
}

TEST(ToolCalls, HermesMalformedCallStaysText) {
  const std::string bad = "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>";
  ToolCallDelta d = parse_tool_calls(ToolParser::kHermes, bad);
  EXPECT_TRUE(d.calls.empty());
  EXPECT_EQ(d.content, bad);
  const std::string not_json = "<tool_call>not json</tool_call> after";
  d = parse_tool_calls(ToolParser::kHermes, not_json);
  EXPECT_TRUE(d.calls.empty());
  EXPECT_EQ(d.content, not_json);
  // Cut off before </tool_call> (max_tokens, or a stop at the end token): parsed if whole.
  d = parse_tool_calls(ToolParser::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments, R"({"x":1})");
  d = parse_tool_calls(ToolParser::kHermes, "<tool_call>\n{\"name\": \"f\", \"argu");
  EXPECT_TRUE(d.calls.empty());
  EXPECT_EQ(d.content, "<tool_call>\n{\"name\": \"f\", \"argu");
  // Arguments written as a JSON string are read as the object they encode.
  d = parse_tool_calls(ToolParser::kHermes, R"(<tool_call>{"name": "f", "arguments": "{\"x\": [1, 2]}"}</tool_call>)");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments, R"({"x":[1,2]})");
}

TEST(ToolCalls, Llama3JsonCalls) {
  const std::string out = R"({"name": "get_weather", "parameters": {"city": "Paris; France", "note": "a } b"}}; {"name": "g", "parameters": {}})";
  ToolCallDelta d = parse_tool_calls(ToolParser::kLlama3Json, out);
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(d.calls[0].arguments, R"({"city":"Paris; France","note":"a } b"})");
  EXPECT_EQ(d.calls[1].name, "g");
  expect_any_split_agrees(ToolParser::kLlama3Json, out);
  // Text is content, streamed as it comes once it does not open with '{'.
  ToolCallSplitter s(ToolParser::kLlama3Json);
  EXPECT_EQ(s.feed("  ").content, "");
  EXPECT_EQ(s.feed("Paris is sunny").content, "  Paris is sunny");
  // JSON that is not a call is content.
  for (const std::string text : {R"({"answer": 4})", "{\"name\": \"f\""}) {
    d = parse_tool_calls(ToolParser::kLlama3Json, text);
    EXPECT_TRUE(d.calls.empty()) << text;
    EXPECT_EQ(d.content, text);
  }
  // A call whose fragments are out is released as they said, whatever follows it.
  d = parse_tool_calls(ToolParser::kLlama3Json, R"({"name": "f", "parameters": {"a": 1}} trailing)");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_TRUE(d.calls[0].streamed);
  EXPECT_EQ(d.calls[0].arguments, R"({"a":1})");
  EXPECT_EQ(d.content, "");
}

// The JSON whole-output formats stream their calls as they are written (OpenAI's
// delta.tool_calls): a call's name once its head is read, then its arguments' text, each
// call released at the end marked streamed.
TEST(ToolCalls, WholeOutputJsonCallsStream) {
  struct Case {
    ToolParser parser;
    std::vector<std::string> pieces;
  };
  for (const Case& c : {Case{ToolParser::kMistral, {"[TOOL_CALLS]", "[{\"name\": \"get_weather\", \"argu", "ments\": {\"ci",
                                                    "ty\": \"Paris\"}}, {\"name\": \"g\", \"arguments\": {}}]"}},
                        Case{ToolParser::kGranite, {"<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"ci",
                                                    "ty\": \"Paris\"}}, {\"name\": \"g\", \"arguments\": {}}]"}},
                        Case{ToolParser::kLlama3Json, {"{\"name\": \"get_weather\", \"parameters\": {\"ci",
                                                       "ty\": \"Paris\"}}; {\"name\": \"g\", \"parameters\": {}}"}}}) {
    SCOPED_TRACE(tool_parser_name(c.parser));
    ToolCallSplitter s(c.parser);
    std::vector<ToolCallFragment> frags;
    size_t before_end = 0;
    for (const std::string& p : c.pieces) {
      ToolCallDelta d = s.feed(p);
      EXPECT_EQ(d.content, "");
      EXPECT_TRUE(d.calls.empty()) << "calls are released at the end";
      for (auto& f : d.fragments) frags.push_back(std::move(f));
    }
    before_end = frags.size();
    ToolCallDelta end = s.finish();
    for (auto& f : end.fragments) frags.push_back(std::move(f));
    ASSERT_GE(before_end, 3u) << "the first call's name and arguments went out while it was written";
    EXPECT_EQ(frags[0].call, 0u);
    EXPECT_EQ(frags[0].name, "get_weather");
    std::string args0;
    for (const auto& f : frags)
      if (f.call == 0) args0 += f.arguments;
    EXPECT_EQ(args0, R"({"city": "Paris"})");
    ASSERT_EQ(end.calls.size(), 2u);
    EXPECT_EQ(end.calls[0].name, "get_weather");
    EXPECT_EQ(end.calls[0].arguments, R"({"city":"Paris"})");
    EXPECT_TRUE(end.calls[0].streamed && end.calls[1].streamed);
    EXPECT_EQ(end.content, "");
  }
}

TEST(ToolCalls, MistralCallArrays) {
  for (const std::string out : {R"([{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "g", "arguments": {}}])",
                                R"([TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "g", "arguments": {}}])"}) {
    ToolCallDelta d = parse_tool_calls(ToolParser::kMistral, out);
    EXPECT_EQ(d.content, "") << out;
    ASSERT_EQ(d.calls.size(), 2u) << out;
    EXPECT_EQ(d.calls[0].name, "get_weather");
    EXPECT_EQ(d.calls[0].arguments, R"({"city":"Paris"})");
    EXPECT_EQ(d.calls[1].arguments, "{}");
    expect_any_split_agrees(ToolParser::kMistral, out);
  }
  // Text (even starting with '[' but not a call array) is content, streamed as it comes.
  expect_text(ToolParser::kMistral, {"Paris is sunny.", "[1] A footnote", R"([{"answer": 4}])", "[TOOL_CALLS] not json"});
  ToolCallSplitter s(ToolParser::kMistral);
  EXPECT_EQ(s.feed("[TOOL").content, "");
  EXPECT_EQ(s.feed("S] is a tag-like word").content, "[TOOLS] is a tag-like word");
}

// Llama 3.2 / Llama 4: a Python list of keyword calls with literal values, read as
// ast.literal_eval would (quotes, escapes, triple quotes, tuples, dicts with non-string keys,
// True/False/None); text that does not open as a call list is content, as vLLM's pythonic
// parser leaves it (what goes wrong after a call's name went out: PythonicCallsStream).
TEST(ToolCalls, PythonicCallLists) {
  const std::string out = R"([get_weather(city='San Francisco', metric="celsius"), get_time()])";
  ToolCallDelta d = parse_tool_calls(ToolParser::kPythonic, out);
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(d.calls[0].arguments, R"({"city":"San Francisco","metric":"celsius"})");
  EXPECT_EQ(d.calls[1].name, "get_time");
  EXPECT_EQ(d.calls[1].arguments, "{}");
  expect_any_split_agrees(ToolParser::kPythonic, out);

  const std::string values =
      "<|python_start|>[f(a=1, b=-2.5, c=True, d=None, e=[1, 'x', (2, 3)], g={'k': {\"n\": 1e3}, 2: 'two'},\n"
      "  h='it\\'s \\u00e9\\n', i=\"\"\"tri\"ple\"\"\", j=0x1F if False else 0) ]<|python_end|>";
  d = parse_tool_calls(ToolParser::kPythonic, values);
  ASSERT_EQ(d.calls.size(), 1u) << "streamed up to the expression, which is not a literal";
  EXPECT_EQ(d.calls[0].arguments.substr(0, 20), R"({"a":1,"b":-2.5,"c":)");
  EXPECT_TRUE(nlohmann::json::parse(d.calls[0].arguments, nullptr, false).is_discarded());
  EXPECT_EQ(d.content, "");
  const std::string literals =
      "<|python_start|>[f(a=1, b=-2.5, c=True, d=None, e=[1, 'x', (2, 3)], g={'k': {\"n\": 1e3}, 2: 'two'},\n"
      "  h='it\\'s \\u00e9\\n', i=\"\"\"tri\"ple\"\"\", k='a\\qb\\a',), g2(),]<|python_end|>";
  d = parse_tool_calls(ToolParser::kPythonic, literals);
  ASSERT_EQ(d.calls.size(), 2u) << d.content;
  EXPECT_EQ(nlohmann::json::parse(d.calls[0].arguments), nlohmann::json::parse(R"({"a": 1, "b": -2.5, "c": true,
      "d": null, "e": [1, "x", [2, 3]], "g": {"k": {"n": 1000.0}, "2": "two"}, "h": "it's \u00e9\n", "i": "tri\"ple",
      "k": "a\\qb\u0007"})"));
  EXPECT_EQ(d.calls[1].name, "g2");
  expect_any_split_agrees(ToolParser::kPythonic, literals);

  expect_text(ToolParser::kPythonic, {"The answer is 4.", "[1] A footnote", "[]", "[f.g(x=1)]", "[ f [x=1] ]",
                                      "<|python_start|>Sure"});
  // Text is content as it comes once it cannot open a call list.
  ToolCallSplitter s(ToolParser::kPythonic);
  EXPECT_EQ(s.feed("[").content, "");
  EXPECT_EQ(s.feed("1] sources").content, "[1] sources");
  ToolCallSplitter t(ToolParser::kPythonic);
  EXPECT_EQ(t.feed("[get_").content, "");
  EXPECT_EQ(t.feed("time(").content, "") << "a call list is held to the end";
  EXPECT_EQ(t.feed(")]").content, "");
  ASSERT_EQ(t.finish().calls.size(), 1u);
}

// Feeds `text` to a pythonic splitter in the pieces `cuts` marks and checks the result is
// the whole-output parse's, with each call streamed: its first fragment, and only it, names
// it, and its fragments put together are exactly its arguments.
void expect_pythonic_split_agrees(const std::string& text, const std::vector<size_t>& cuts, const ToolCallDelta& whole,
                                  const std::string& where) {
  const ToolCallDelta d = streamed(ToolParser::kPythonic, text, cuts);
  EXPECT_EQ(d.content, whole.content) << where;
  ASSERT_EQ(d.calls.size(), whole.calls.size()) << where;
  std::vector<std::string> args(d.calls.size());
  std::vector<int> named(d.calls.size());
  size_t last = 0;
  for (const ToolCallFragment& f : d.fragments) {
    ASSERT_LT(f.call, d.calls.size()) << where << ": a fragment of no call";
    EXPECT_GE(f.call, last) << where << ": calls stream in order";
    last = f.call;
    if (!f.name.empty()) {
      EXPECT_TRUE(args[f.call].empty()) << where << ": the name comes first";
      EXPECT_EQ(f.name, d.calls[f.call].name) << where;
      ++named[f.call];
    }
    args[f.call] += f.arguments;
  }
  for (size_t k = 0; k < d.calls.size(); ++k) {
    EXPECT_EQ(d.calls[k].name, whole.calls[k].name) << where;
    EXPECT_EQ(d.calls[k].arguments, whole.calls[k].arguments) << where;
    EXPECT_TRUE(d.calls[k].streamed) << where;
    EXPECT_EQ(named[k], 1) << where;
    EXPECT_EQ(args[k], d.calls[k].arguments) << where;
  }
}

// Every single split, and pieces of every size, give the whole-output result.
void expect_pythonic_streams(const std::string& text) {
  const ToolCallDelta whole = parse_tool_calls(ToolParser::kPythonic, text);
  for (size_t cut = 0; cut <= text.size(); ++cut)
    expect_pythonic_split_agrees(text, {cut}, whole, text + " split at " + std::to_string(cut));
  for (size_t step = 1; step <= text.size(); ++step) {
    std::vector<size_t> cuts;
    for (size_t at = step; at < text.size(); at += step) cuts.push_back(at);
    expect_pythonic_split_agrees(text, cuts, whole, text + " in pieces of " + std::to_string(step));
  }
}

// pythonic calls stream as they are written: the name (with the arguments' '{') once
// `name(` is read, a string value's "key":" and its characters as they are read, any other
// keyword's "key":value once its literal is closed by ',' or ')', and '}' as the call
// closes, so the pieces put together are the arguments the whole-output parse gives. A call
// list that goes wrong after a name went out releases the calls as streamed, as the JSON
// formats do.
TEST(ToolCalls, PythonicCallsStream) {
  ToolCallSplitter s(ToolParser::kPythonic);
  ToolCallDelta d = s.feed("<|python_start|>[get_wea");
  EXPECT_TRUE(d.fragments.empty());
  d = s.feed("ther(city=\"Paris, ');");
  ASSERT_EQ(d.fragments.size(), 1u);
  EXPECT_EQ(d.fragments[0].call, 0u);
  EXPECT_EQ(d.fragments[0].name, "get_weather");
  EXPECT_EQ(d.fragments[0].arguments, R"({"city":"Paris, ');)") << "the open string streams";
  d = s.feed("FR\", days=[1, (2, 3)]");
  ASSERT_EQ(d.fragments.size(), 1u);
  EXPECT_EQ(d.fragments[0].name, "");
  EXPECT_EQ(d.fragments[0].arguments, R"(FR")") << "the list is still open";
  d = s.feed(", metric=Tr");
  ASSERT_EQ(d.fragments.size(), 1u);
  EXPECT_EQ(d.fragments[0].arguments, R"(,"days":[1,[2,3]])");
  d = s.feed("ue), get_time(), g(x=None");
  ASSERT_EQ(d.fragments.size(), 3u);
  EXPECT_EQ(d.fragments[0].arguments, R"(,"metric":true})");
  EXPECT_EQ(d.fragments[1].call, 1u);
  EXPECT_EQ(d.fragments[1].name, "get_time");
  EXPECT_EQ(d.fragments[1].arguments, "{}");
  EXPECT_EQ(d.fragments[2].call, 2u);
  EXPECT_EQ(d.fragments[2].arguments, "{");
  d = s.feed(")]<|python_end|>");
  ASSERT_EQ(d.fragments.size(), 1u);
  EXPECT_EQ(d.fragments[0].arguments, R"("x":null})");
  EXPECT_TRUE(d.calls.empty()) << "calls are released at the end";
  d = s.finish();
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.calls.size(), 3u);
  EXPECT_EQ(d.calls[0].arguments, R"({"city":"Paris, ');FR","days":[1,[2,3]],"metric":true})");
  EXPECT_EQ(d.calls[1].arguments, "{}");
  EXPECT_EQ(d.calls[2].arguments, R"({"x":null})");
  for (const ToolCall& c : d.calls) EXPECT_TRUE(c.streamed);

  for (const std::string out : {
           R"([get_weather(city='San Francisco', metric="celsius"), get_time()])",
           R"([f(a='x, y) z=w', b="it's", c='say "hi"', d='a\'b\\', e="q\"", g=True, h=False, i=None)])",
           R"([f(n=[1, [2, {'k': (3, 4)}], {}], m={'a': {'b': [None]}, 1: 'one', 'c': ()}, e=-1.5e-3, z=0)])",
           R"(<|python_start|>[ f ( a = '' , b = "" , c = '''tri''ple''' , d = """x""" ) , g2 ( ) , ]<|python_end|>)",
           "\n[f(s='\\u00e9\\n\\x41\\\\', t='''line\nline''', u=\"\\\"\", v=('a',), w=[],)]\n",
       }) {
    const ToolCallDelta whole = parse_tool_calls(ToolParser::kPythonic, out);
    EXPECT_EQ(whole.content, "") << out;
    EXPECT_FALSE(whole.calls.empty()) << out;
    for (const ToolCall& c : whole.calls)  // streamed to the end, not stopped part way
      EXPECT_TRUE(nlohmann::json::parse(c.arguments, nullptr, false).is_object()) << out << ": " << c.arguments;
    expect_pythonic_streams(out);
  }
  d = parse_tool_calls(ToolParser::kPythonic, R"([f(n=[1, [2, {'k': (3, 4)}], {}], m={'a': {'b': [None]}, 1: 'one'},
      e=-1.5e-3, z=0)])");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments, R"({"n":[1,[2,{"k":[3,4]}],{}],"m":{"a":{"b":[null]},"1":"one"},"e":-0.0015,"z":0})");
  d = parse_tool_calls(ToolParser::kPythonic,
                       R"(<|python_start|>[ f ( a = '' , b = "" , c = '''tri''ple''' , d = """x""" ) , g2 ( ) , ]<|python_end|>)");
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].arguments, R"({"a":"","b":"","c":"tri''ple","d":"x"})");
  EXPECT_EQ(d.calls[1].name, "g2");
  d = parse_tool_calls(ToolParser::kPythonic, R"([f(a='x, y) z=w', b="it's", c='say "hi"', d='a\'b\\', e="q\""),g()])");
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].arguments, R"({"a":"x, y) z=w","b":"it's","c":"say \"hi\"","d":"a'b\\","e":"q\""})");

  // Gone wrong after a name went out (a positional argument, an expression, a repeated
  // keyword, an unclosed string or list, text after the list): the calls as streamed.
  const std::pair<std::string, std::vector<std::pair<std::string, std::string>>> broken[] = {
      {"[f(1)]", {{"f", "{"}}},
      {"[f(x=1)] and more", {{"f", R"({"x":1})"}}},
      {"[f(x=open('a'))]", {{"f", "{"}}},
      {"[f(x='unclosed)]", {{"f", R"({"x":"unclosed)])"}}},
      {"[f(x='a' 'b')]", {{"f", R"({"x":"a")"}}},
      {"[f(x=1)", {{"f", R"({"x":1})"}}},
      {"[ f (x = 1) ]x", {{"f", R"({"x":1})"}}},
      {"[f(a=1, a=2)]", {{"f", R"({"a":1)"}}},
      {"[f(a=1), g(b=[1, 2)]", {{"f", R"({"a":1})"}, {"g", "{"}}},
      {"[f(a=1), 2]", {{"f", R"({"a":1})"}}},
      {"[f(a='x'\n", {{"f", R"({"a":"x")"}}},
      {"[f(a=1, a='x')]", {{"f", R"({"a":1)"}}},
      {"[f(a='x\ny')]", {{"f", R"({"a":"x)"}}},
  };
  for (const auto& [out, want] : broken) {
    d = parse_tool_calls(ToolParser::kPythonic, out);
    EXPECT_EQ(d.content, "") << out;
    ASSERT_EQ(d.calls.size(), want.size()) << out;
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(d.calls[k].name, want[k].first) << out;
      EXPECT_EQ(d.calls[k].arguments, want[k].second) << out;
    }
    expect_pythonic_streams(out);
  }
  // A repeated keyword is not a call list (Python: "keyword argument repeated").
  PythonCallStreamer repeated;
  for (char c : std::string("[f(a=1, a=2), g()]")) (void)repeated.feed(std::string(1, c));
  ASSERT_EQ(repeated.streamed().size(), 1u);
  EXPECT_EQ(repeated.streamed()[0].arguments, R"({"a":1)");
}

// A long string argument (a file's body, code) streams as it is written, one piece per byte
// fed, escapes decoded once whole and a UTF-8 character once all its bytes are there, so no
// piece is invalid UTF-8 or half an escape.
TEST(ToolCalls, PythonicStringsStreamAsTheyAreRead) {
  const std::string out =
      "[write_file(path='/tmp/a.py', body='def f():\\n    return \"\xc3\xa9\\u00e9\\\\\"  # \xe2\x82\xac\\n', "
      "mode=\"\"\"w\"\"\")]";
  const ToolCallDelta whole = parse_tool_calls(ToolParser::kPythonic, out);
  ASSERT_EQ(whole.calls.size(), 1u);
  EXPECT_EQ(whole.calls[0].arguments,
            "{\"path\":\"/tmp/a.py\",\"body\":\"def f():\\n    return \\\"\xc3\xa9\xc3\xa9\\\\\\\"  # \xe2\x82\xac\\n\",\"mode\":\"w\"}");
  ToolCallSplitter s(ToolParser::kPythonic);
  std::string args;
  int pieces = 0;
  for (char c : out) {
    const ToolCallDelta piece = s.feed(std::string(1, c));
    for (const ToolCallFragment& f : piece.fragments) {
      EXPECT_EQ(tok::utf8_find_invalid(f.arguments), std::string::npos) << f.arguments;
      args += f.arguments;
      ++pieces;
    }
  }
  const ToolCallDelta d = s.finish();
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments, whole.calls[0].arguments);
  EXPECT_EQ(args, whole.calls[0].arguments);
  // Every byte of the strings' text that is not part of an escape or a character's first
  // bytes gave a piece of its own: far more pieces than the three arguments.
  EXPECT_GT(pieces, 40);
  expect_pythonic_streams(out);
}

// Qwen3-Coder: XML-style calls after text, each value typed by the tool's schema (a value
// that does not fit its type stays a string; a key the schema lacks is a string).
// A response sent whole (stream: false) streams nothing: every format's calls are those
// the whole text parses into, fed in any pieces, and an output whose calls break after
// their names (cut off, positional arguments, junk) stays content, as vLLM leaves it,
// where a streamed response releases what went out.
TEST(ToolCalls, WholeResponsesReleaseOnlyParsedCalls) {
  struct Case {
    ToolParser p;
    std::string text;
  };
  const std::vector<Case> parsed = {
      {ToolParser::kHermes, "Sure.\n<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": [1, 2]}}</tool_call>"},
      {ToolParser::kLlama3Json, R"({"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}})"},
      {ToolParser::kMistral, R"([TOOL_CALLS][{"name": "f", "arguments": {"a": "x"}}])"},
      {ToolParser::kGranite, R"(<|tool_call|>[{"name": "f", "arguments": {"a": 2}}])"},
      {ToolParser::kPythonic, R"py([f(a=1, b="x, )"), g()])py"}};
  for (const Case& c : parsed) {
    const ToolCallDelta whole = parse_tool_calls(c.p, c.text);
    ASSERT_FALSE(whole.calls.empty()) << c.text;
    for (size_t cut = 0; cut <= c.text.size(); ++cut) {
      const ToolCallDelta d = streamed(c.p, c.text, {cut}, /*stream=*/false);
      EXPECT_TRUE(d.fragments.empty()) << c.text;
      EXPECT_EQ(d.content, whole.content) << c.text << " split at " << cut;
      ASSERT_EQ(d.calls.size(), whole.calls.size()) << c.text << " split at " << cut;
      for (size_t i = 0; i < d.calls.size(); ++i) {
        EXPECT_EQ(d.calls[i].name, whole.calls[i].name);
        EXPECT_EQ(nlohmann::json::parse(d.calls[i].arguments), nlohmann::json::parse(whole.calls[i].arguments));
        EXPECT_FALSE(d.calls[i].streamed);
      }
    }
  }
  const std::vector<Case> broken = {
      {ToolParser::kHermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": [1, 2"},
      {ToolParser::kMistral, R"([TOOL_CALLS][{"name": "f", "arguments": {"a": 1}} junk)"},
      {ToolParser::kPythonic, "[f(1)]"},
      {ToolParser::kPythonic, "[f(x=1)] and more"}};
  for (const Case& c : broken) {
    // Streamed, the call whose name went out comes back as a call.
    EXPECT_FALSE(parse_tool_calls(c.p, c.text).calls.empty()) << c.text;
    for (size_t cut : {size_t(0), size_t(3), c.text.size() / 2}) {
      const ToolCallDelta d = streamed(c.p, c.text, {cut}, /*stream=*/false);
      EXPECT_TRUE(d.calls.empty()) << c.text;
      EXPECT_TRUE(d.fragments.empty()) << c.text;
      EXPECT_EQ(d.content, c.text) << "split at " << cut;
    }
  }
}

TEST(ToolCalls, Qwen3XmlCalls) {
  const auto tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
      "metric": {"type": "boolean"}, "opts": {"type": "object"}, "zip": {"type": "string"}}}}}])");
  const std::string out =
      "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n"
      "</parameter>\n<parameter=zip>\n01234\n</parameter>\n<parameter=note>\nline one\nline two\n</parameter>\n"
      "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>";
  ToolCallDelta d = parse_tool_calls(ToolParser::kQwen3Xml, out, tools);
  EXPECT_EQ(d.content, "Let me check.\n");
  ASSERT_EQ(d.calls.size(), 2u) << d.content;
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse(d.calls[0].arguments),
            nlohmann::json::parse(R"({"city": "New York", "days": 3, "metric": true, "opts": {"a": [1, 2]},
                "zip": "01234", "note": "line one\nline two"})"));
  EXPECT_TRUE(d.calls[0].streamed);
  EXPECT_EQ(d.calls[1].name, "get_time");
  EXPECT_EQ(d.calls[1].arguments, "{}");
  expect_any_split_agrees(ToolParser::kQwen3Xml, out);
  // Typed by the tools, streamed: the same calls for every split, and each call's pieces
  // put together are exactly its arguments.
  for (size_t cut = 0; cut <= out.size(); ++cut) {
    const ToolCallDelta s = streamed(ToolParser::kQwen3Xml, out, {cut}, true, tools);
    ASSERT_EQ(s.calls.size(), 2u) << cut;
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(s.calls[k].arguments, d.calls[k].arguments) << cut;
      std::string args;
      for (const ToolCallFragment& f : s.fragments)
        if (f.call == k) args += f.arguments;
      EXPECT_EQ(args, d.calls[k].arguments) << cut;
    }
  }
  // A value that does not fit its type stays a string.
  d = parse_tool_calls(ToolParser::kQwen3Xml,
                       "<tool_call><function=get_weather><parameter=days>three</parameter></function></tool_call>", tools);
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments, R"({"days":"three"})");
  expect_text(ToolParser::kQwen3Xml, {"Plain text.", "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
                                      "<tool_call>\n<function=\n</tool_call>"});
}

// qwen3_xml calls stream as vLLM's qwen3_coder parser streams them: the name once
// <function=NAME> is read, each parameter's "key":value once its </parameter> is (typed by
// the tool's schema, as the whole parse types it), '}' at </function>. A call that goes
// wrong after its name went out is released as streamed, as the other formats' are.
TEST(ToolCalls, Qwen3XmlCallsStream) {
  const auto tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "properties": {"n": {"type": "integer"}}}}}])");
  ToolCallSplitter s(ToolParser::kQwen3Xml, tools);
  ToolCallDelta d = s.feed("Sure.\n<tool_call>\n<function=f");
  EXPECT_EQ(d.content, "Sure.\n");
  EXPECT_TRUE(d.fragments.empty());
  d = s.feed(">\n<parameter=n>\n4");
  ASSERT_EQ(d.fragments.size(), 1u);
  EXPECT_EQ(d.fragments[0].name, "f");
  EXPECT_EQ(d.fragments[0].arguments, "{");
  d = s.feed("2\n</parameter>\n<parameter=s>\nhi\n</param");
  ASSERT_EQ(d.fragments.size(), 1u);
  EXPECT_EQ(d.fragments[0].arguments, R"("n":42)");
  d = s.feed("eter>\n</function>\n</tool_call>");
  ASSERT_EQ(d.fragments.size(), 1u);
  EXPECT_EQ(d.fragments[0].arguments, R"(,"s":"hi"})");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments, R"({"n":42,"s":"hi"})");
  EXPECT_TRUE(d.calls[0].streamed);

  const std::pair<std::string, std::string> broken[] = {
      {"<tool_call>\n<function=f>\n<parameter=x>1</function>\n</tool_call>", "{"},
      {"<tool_call>\n<function=f>\n<parameter=x>1</parameter>\njunk</function>\n</tool_call>", R"({"x":"1")"},
      {"<tool_call>\n<function=f>\n<parameter=x>1</parameter><parameter=x>2</parameter></function></tool_call>",
       R"({"x":"1")"},
      {"<tool_call>\n<function=f>\n<parameter=x>1</parameter>", R"({"x":"1")"},
  };
  for (const auto& [out, args] : broken) {
    d = parse_tool_calls(ToolParser::kQwen3Xml, out);
    EXPECT_EQ(d.content, "") << out;
    ASSERT_EQ(d.calls.size(), 1u) << out;
    EXPECT_EQ(d.calls[0].name, "f") << out;
    EXPECT_EQ(d.calls[0].arguments, args) << out;
    expect_any_split_agrees(ToolParser::kQwen3Xml, out);
  }
}

TEST(ToolCalls, GraniteCallArrays) {
  for (const std::string out : {R"(<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}])",
                                R"([{"name": "get_weather", "arguments": {"city": "Paris"}}])"}) {
    ToolCallDelta d = parse_tool_calls(ToolParser::kGranite, out);
    EXPECT_EQ(d.content, "") << out;
    ASSERT_EQ(d.calls.size(), 1u) << out;
    EXPECT_EQ(d.calls[0].arguments, R"({"city":"Paris"})");
    expect_any_split_agrees(ToolParser::kGranite, out);
  }
  expect_text(ToolParser::kGranite, {"Paris is sunny.", "<|tool_call|> not json", "<|tool_"});
}

// phi4_mini_json (Phi-4-mini, vLLM's parser of that name): the mistral array after
// `functools`, "arguments" or "parameters"; streamed call by call as the other arrays are.
TEST(ToolCalls, Phi4MiniJsonCallArrays) {
  const std::string out =
      R"(functools[{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}, {"name": "now", "parameters": {}}])";
  ToolCallDelta d = parse_tool_calls(ToolParser::kPhi4MiniJson, out);
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(d.calls[0].arguments, R"({"city":"Paris","days":[1,2]})");
  EXPECT_TRUE(d.calls[0].streamed);
  EXPECT_EQ(d.calls[1].name, "now");
  EXPECT_EQ(d.calls[1].arguments, "{}");
  expect_any_split_agrees(ToolParser::kPhi4MiniJson, out);
  expect_any_split_agrees(ToolParser::kPhi4MiniJson, "\n functools[{\"name\": \"f\", \"arguments\": {\"x\": \"]\"}}]");
  expect_text(ToolParser::kPhi4MiniJson, {"The weather is fine.", "functools are handy", "functools [1]", "func",
                                          R"([{"name": "f", "arguments": {}}])", "functools[1, 2]"});
}

// --tool-call-parser auto: the format a chat template renders or names.
TEST(ToolCalls, ParserFromTheChatTemplate) {
  const std::pair<const char*, ToolParser> cases[] = {
      {"{%- if tools %}For each function call, return a json object with function name and arguments within "
       "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
       "\n</tool_call>{%- endif %}",
       ToolParser::kHermes},
      {"{%- if message.tool_calls %}{{- \"[TOOL_CALLS][\" }}{%- endif %}", ToolParser::kMistral},
      {"{%- for tool_call in message.tool_calls %}<|tool_call|>{{ tool_call | tojson }}{%- endfor %}",
       ToolParser::kGranite},
      {"{{- '<|python_start|>' }}{%- if message.tool_calls %}[{{ call.name }}(...)]{%- endif %}",
       ToolParser::kPythonic},
      {"Given the following functions, please respond with a JSON for a function call with its proper arguments that "
       "best answers the given prompt.",
       ToolParser::kLlama3Json},
      {"<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>",
       ToolParser::kQwen3Xml},
      {"{%- if builtin_tools is defined %}{{- '<|python_tag|>' + tool_call.name }}{%- endif %}", ToolParser::kLlama3Json},
      {"{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}",
       ToolParser::kNone},
      {"", ToolParser::kNone},
  };
  for (const auto& [t, want] : cases) EXPECT_EQ(tool_parser_for_template(t), want) << t;
}

TEST(ToolCalls, ParserNames) {
  EXPECT_EQ(tool_parser_from_name("hermes"), ToolParser::kHermes);
  EXPECT_EQ(tool_parser_from_name("llama3_json"), ToolParser::kLlama3Json);
  EXPECT_EQ(tool_parser_from_name("mistral"), ToolParser::kMistral);
  EXPECT_EQ(tool_parser_from_name("pythonic"), ToolParser::kPythonic);
  EXPECT_EQ(tool_parser_from_name("granite"), ToolParser::kGranite);
  EXPECT_STREQ(tool_parser_name(ToolParser::kLlama3Json), "llama3_json");
  EXPECT_STREQ(tool_parser_name(ToolParser::kPythonic), "pythonic");
  EXPECT_EQ(tool_parser_from_name("auto"), ToolParser::kAuto);
  EXPECT_EQ(tool_parser_from_name("qwen3_xml"), ToolParser::kQwen3Xml);
  EXPECT_STREQ(tool_parser_name(ToolParser::kQwen3Xml), "qwen3_xml");
  EXPECT_EQ(tool_parser_from_name("phi4_mini_json"), ToolParser::kPhi4MiniJson);
  EXPECT_STREQ(tool_parser_name(ToolParser::kPhi4MiniJson), "phi4_mini_json");
  try {
    tool_parser_from_name("kimi_k2");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("hermes, llama3_json, mistral, pythonic, granite, qwen3_xml, phi4_mini_json, auto"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace kiln::server
