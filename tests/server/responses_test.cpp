// /v1/responses (OpenAI's Responses API, stateless as vLLM's store=false): the request
// translation (parse_responses) on its own, then the route against the real SmolLM2 (skipped
// when not fetched): outputs equal the chat route's for the same conversation, instructions,
// max_output_tokens -> incomplete, text.format json_schema, forced function calls, tool-call
// history items in the prompt, the SSE event sequence and its deltas against the body, the
// reasoning item, refusals naming their field, and a hang-up cancelling the request.
#include <gtest/gtest.h>

#include <thread>

#include "server_util.h"
#include "tokenizer/chat_template.h"

namespace kiln::server {
namespace {

using namespace testing;

TEST(ResponsesProtocol, InputItemsBecomeTheChatConversation) {
  const Json body =
      Json::parse(R"({"model": "m", "instructions": "Be brief.", "max_output_tokens": 9,
    "temperature": 0.5, "input": [
      {"role": "developer", "content": "Use tools."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in "},
                                                       {"type": "input_text", "text": "Paris?"}]},
      {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
       "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
      {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
      {"type": "reasoning", "id": "rs_1", "summary": []},
      {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]}],
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": true},
              {"type": "function", "name": "get_time", "description": "The time."}],
    "tool_choice": {"type": "function", "name": "get_time"}, "parallel_tool_calls": false,
    "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": true}}})");
  const ResponsesParams r = parse_responses(body, {});
  const Json& m = r.chat.messages;
  ASSERT_EQ(m.size(), 6u) << m.dump();
  EXPECT_EQ(m[0], Json({{"role", "system"}, {"content", "Be brief."}}));
  EXPECT_EQ(m[1],
            Json({{"role", "system"}, {"content", "Use tools."}}));  // developer, as chat maps it
  EXPECT_EQ(m[2], Json({{"role", "user"}, {"content", "Weather in Paris?"}}));
  EXPECT_EQ(m[3]["role"], "assistant");
  EXPECT_EQ(m[3]["content"], "Let me look.");
  ASSERT_EQ(m[3]["tool_calls"].size(), 2u) << m[3].dump();  // both calls join the turn
  EXPECT_EQ(m[3]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(m[3]["tool_calls"][0]["function"]["arguments"], Json({{"city", "Paris"}}));
  EXPECT_EQ(m[4], Json({{"role", "tool"},
                        {"content", "18C"},
                        {"tool_call_id", "call_1"},
                        {"name", "get_weather"}}));
  EXPECT_EQ(m[5]["content"], "noon");
  EXPECT_EQ(m[5]["name"], "get_time");
  EXPECT_EQ(r.chat.max_tokens, 9);
  EXPECT_FLOAT_EQ(r.chat.sampling.temperature, 0.5f);
  ASSERT_EQ(r.chat.tools.size(), 2u);
  EXPECT_EQ(r.chat.tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(r.chat.tools[0]["function"]["strict"], true);
  EXPECT_EQ(r.chat.tool_choice, "function");
  EXPECT_EQ(r.chat.tool_choice_name, "get_time");
  EXPECT_FALSE(r.chat.parallel_tool_calls);
  EXPECT_EQ(r.chat.json_schema, Json({{"type", "object"}}));
  // The echo: tools in the Responses shape, the request's own values.
  EXPECT_EQ(r.echo["tools"][1], Json({{"type", "function"},
                                      {"name", "get_time"},
                                      {"description", "The time."},
                                      {"parameters", nullptr},
                                      {"strict", nullptr}}));
  EXPECT_EQ(r.echo["tool_choice"], body["tool_choice"]);
  EXPECT_EQ(r.echo["temperature"], 0.5);
  EXPECT_EQ(r.echo["top_p"], 1.0);
  EXPECT_EQ(r.echo["max_output_tokens"], 9);
  EXPECT_EQ(r.echo["instructions"], "Be brief.");
  EXPECT_EQ(r.echo["text"], Json({{"format", body["text"]["format"]}}));

  const ResponsesParams s =
      parse_responses(Json::parse(R"({"model": "m", "input": "hi", "store": false})"), {});
  EXPECT_EQ(s.chat.messages, Json::parse(R"([{"role": "user", "content": "hi"}])"));
  EXPECT_EQ(s.chat.max_tokens, -1);
  EXPECT_EQ(s.chat.tool_choice, "none");
  EXPECT_EQ(s.echo["tool_choice"], "auto");
  EXPECT_EQ(s.echo["text"], Json::parse(R"({"format": {"type": "text"}})"));
  EXPECT_TRUE(s.echo["instructions"].is_null());
  EXPECT_TRUE(s.echo["max_output_tokens"].is_null());
}

// Each refusal is a 400 naming its field (parse_responses alone; the route test sends some).
TEST(ResponsesProtocol, RefusalsNameTheirField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"model":"m","input":"hi","previous_response_id":"resp_1"})", "previous_response_id"},
      {R"({"model":"m","input":"hi","conversation":"conv_1"})", "conversation"},
      {R"({"model":"m","input":"hi","background":true})", "background"},
      {R"({"model":"m","input":"hi","store":"yes"})", "store"},
      {R"({"model":"m","input":"hi","tools":[{"type":"web_search"}]})", "tools"},
      {R"({"model":"m","input":"hi","tools":[{"type":"file_search","vector_store_ids":["v"]}]})",
       "tools"},
      {R"({"model":"m","input":"hi","tools":[{"type":"function"}]})", "tools"},
      {R"({"model":"m","input":"hi","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"web_search"}})",
       "tool_choice"},
      {R"({"model":"m","input":"hi","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"g"}})",
       "tool_choice"},
      {R"({"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"http://x"}]}]})",
       "input"},
      {R"({"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]})",
       "input"},
      {R"({"model":"m","input":[{"type":"web_search_call","id":"ws_1"}]})", "input"},
      {R"({"model":"m","input":[{"type":"item_reference","id":"msg_1"}]})", "input"},
      {R"({"model":"m","input":[{"role":"tool","content":"x"}]})", "input"},
      {R"({"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{bad"}]})",
       "input"},
      {R"({"model":"m","input":[{"type":"function_call_output","output":"x"}]})", "input"},
      {R"({"model":"m","input":[]})", "input"},
      {R"({"model":"m"})", "input"},
      {R"({"model":"m","input":"hi","max_output_tokens":0})", "max_output_tokens"},
      {R"({"model":"m","input":"hi","text":{"format":{"type":"xml"}}})", "text.format"},
      {R"({"model":"m","input":"hi","text":{"format":{"type":"json_schema","name":"x"}}})",
       "text.format"},
      {R"({"model":"m","input":"hi","temperature":3})", "temperature"},
  };
  for (const auto& [body, param] : cases) {
    try {
      parse_responses(Json::parse(body), {});
      ADD_FAILURE() << "accepted: " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << body;
      EXPECT_EQ(e.param, param) << body << " -> " << e.what();
      EXPECT_NE(std::string(e.what()).find(param), std::string::npos) << body << " -> " << e.what();
    }
  }
}

class ResponsesTest : public SmolLm2ServerSuite<ResponsesTest> {};

// What the openai client's response.output_text is: the output_text parts of the message items.
std::string output_text(const Json& r) {
  std::string text;
  for (const Json& item : r["output"])
    if (item["type"] == "message")
      for (const Json& part : item["content"])
        if (part["type"] == "output_text") text += part["text"].get<std::string>();
  return text;
}

Json post_json(int port, const std::string& path, const Json& body) {
  auto r = post(port, path, body);
  EXPECT_EQ(r.status, 200) << path << " " << body.dump() << " -> " << r.body;
  return r.status == 200 ? r.json() : Json::object();
}

// String input: greedy output, token counts and the stop reason are the chat route's for the
// same message; the response object carries what the openai client's Response model needs.
TEST_F(ResponsesTest, StringInputAnswersAsTheChatRoute) {
  const std::string question = "What is the capital of France?";
  const Json chat = post_json(port(), "/v1/chat/completions",
                              {{"model", "smollm2"},
                               {"messages", {{{"role", "user"}, {"content", question}}}},
                               {"max_tokens", 24},
                               {"temperature", 0}});
  const Json r = post_json(
      port(), "/v1/responses",
      {{"model", "smollm2"}, {"input", question}, {"max_output_tokens", 24}, {"temperature", 0}});
  ASSERT_FALSE(r.empty());
  const std::string text = output_text(r);
  std::printf("  responses output_text: %s\n", Json(text).dump().c_str());
  EXPECT_EQ(text, chat["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_NE(text.find("Paris"), std::string::npos) << text;
  EXPECT_TRUE(r["id"].get<std::string>().starts_with("resp_")) << r["id"];
  EXPECT_EQ(r["object"], "response");
  EXPECT_GT(r["created_at"].get<int64_t>(), 1700000000);
  EXPECT_EQ(r["model"], "smollm2");
  const bool cut = chat["choices"][0]["finish_reason"] == "length";
  EXPECT_EQ(r["status"], cut ? "incomplete" : "completed");
  EXPECT_TRUE(r["error"].is_null());
  for (const char* key :
       {"tools", "tool_choice", "parallel_tool_calls", "temperature", "top_p", "max_output_tokens",
        "text", "instructions", "reasoning", "metadata", "store", "previous_response_id"})
    EXPECT_TRUE(r.contains(key)) << key;
  EXPECT_EQ(r["temperature"], 0);
  EXPECT_EQ(r["max_output_tokens"], 24);
  EXPECT_EQ(r["tool_choice"], "auto");
  EXPECT_EQ(r["store"], false);
  ASSERT_EQ(r["output"].size(), 1u) << r["output"].dump();
  const Json& msg = r["output"][0];
  EXPECT_EQ(msg["type"], "message");
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_TRUE(msg["id"].get<std::string>().starts_with("msg_"));
  EXPECT_EQ(msg["content"][0]["annotations"], Json::array());
  const Json& u = r["usage"];
  EXPECT_EQ(u["input_tokens"], chat["usage"]["prompt_tokens"]);
  EXPECT_EQ(u["output_tokens"], chat["usage"]["completion_tokens"]);
  EXPECT_EQ(u["total_tokens"], chat["usage"]["total_tokens"]);
  EXPECT_TRUE(u["input_tokens_details"]["cached_tokens"].is_number_integer());
  EXPECT_EQ(u["output_tokens_details"]["reasoning_tokens"], 0);
  const std::string m = get(port(), "/metrics").body;
  EXPECT_NE(m.find("endpoint=\"/v1/responses\",status=\"200\""), std::string::npos);
}

// Array input with instructions (a system message first), content parts, a developer message
// and an earlier assistant turn: the chat route's answer to the same messages.
TEST_F(ResponsesTest, ArrayInputWithInstructionsIsTheChatConversation) {
  const Json messages = {{{"role", "system"}, {"content", "You are a geography teacher."}},
                         {{"role", "user"}, {"content", "Name a country in Europe."}},
                         {{"role", "assistant"}, {"content", "France."}},
                         {{"role", "system"}, {"content", "Answer in one sentence."}},
                         {{"role", "user"}, {"content", "What is its capital?"}}};
  const Json chat = post_json(
      port(), "/v1/chat/completions",
      {{"model", "smollm2"}, {"messages", messages}, {"max_tokens", 16}, {"temperature", 0}});
  const Json input = Json::parse(R"([
    {"role": "user", "content": [{"type": "input_text", "text": "Name a country "}, {"type": "input_text", "text": "in Europe."}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "France.", "annotations": []}]},
    {"role": "developer", "content": "Answer in one sentence."},
    {"type": "message", "role": "user", "content": "What is its capital?"}])");
  const Json r = post_json(port(), "/v1/responses",
                           {{"model", "smollm2"},
                            {"instructions", "You are a geography teacher."},
                            {"input", input},
                            {"max_output_tokens", 16},
                            {"temperature", 0}});
  ASSERT_FALSE(r.empty());
  EXPECT_EQ(r["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
  EXPECT_EQ(output_text(r), chat["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(r["instructions"], "You are a geography teacher.");
  // Without the instructions: the chat route's prompt without the system message.
  const Json bare = post_json(
      port(), "/v1/responses",
      {{"model", "smollm2"}, {"input", input}, {"max_output_tokens", 1}, {"temperature", 0}});
  const Json rest(messages.begin() + 1, messages.end());
  const Json chat_rest =
      post_json(port(), "/v1/chat/completions",
                {{"model", "smollm2"}, {"messages", rest}, {"max_tokens", 1}, {"temperature", 0}});
  EXPECT_EQ(bare["usage"]["input_tokens"], chat_rest["usage"]["prompt_tokens"]);
  EXPECT_NE(bare["usage"]["input_tokens"], r["usage"]["input_tokens"]);
}

TEST_F(ResponsesTest, MaxOutputTokensMakesItIncomplete) {
  const Json r = post_json(port(), "/v1/responses",
                           {{"model", "smollm2"},
                            {"input", "Tell me a long story about a dragon."},
                            {"max_output_tokens", 3},
                            {"temperature", 0}});
  ASSERT_FALSE(r.empty());
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"], Json({{"reason", "max_output_tokens"}}));
  EXPECT_EQ(r["usage"]["output_tokens"], 3);
  ASSERT_EQ(r["output"].size(), 1u);
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
  EXPECT_FALSE(output_text(r).empty());
}

TEST_F(ResponsesTest, JsonSchemaTextFormatConstrainsTheOutput) {
  const Json schema =
      Json::parse(R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
      "population": {"type": "integer"}}, "required": ["city", "population"], "additionalProperties": false})");
  Json body = {
      {"model", "smollm2"},
      {"input", "Which city is the capital of France? Answer in JSON."},
      {"max_output_tokens", 80},
      {"temperature", 0},
      {"text",
       {{"format",
         {{"type", "json_schema"}, {"name", "city"}, {"schema", schema}, {"strict", true}}}}}};
  const Json r = post_json(port(), "/v1/responses", body);
  ASSERT_FALSE(r.empty());
  const std::string text = output_text(r);
  std::printf("  json_schema output: %s\n", text.c_str());
  EXPECT_EQ(r["status"], "completed");
  const Json doc = Json::parse(text, nullptr, false);
  ASSERT_TRUE(doc.is_object()) << text;
  EXPECT_TRUE(doc["city"].is_string()) << doc;
  EXPECT_TRUE(doc["population"].is_number_integer()) << doc;
  EXPECT_EQ(doc.size(), 2u) << doc;
  EXPECT_EQ(r["text"]["format"]["type"], "json_schema");
  body["text"] = {{"format", {{"type", "json_object"}}}};
  const Json o = post_json(port(), "/v1/responses", body);
  EXPECT_TRUE(Json::parse(output_text(o), nullptr, false).is_object()) << output_text(o);
  // A schema the grammar compiler refuses names text.format.
  body["text"] = {
      {"format", {{"type", "json_schema"}, {"name", "x"}, {"schema", {{"type", "colour"}}}}}};
  auto bad = post(port(), "/v1/responses", body);
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(bad.json()["error"]["param"], "text.format") << bad.body;
}

const Json kTools = Json::parse(R"([
  {"type": "function", "name": "get_weather", "description": "Get the weather for a city.", "strict": true,
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                  "required": ["city"], "additionalProperties": false}},
  {"type": "function", "name": "get_time", "parameters": {"type": "object",
   "properties": {"zone": {"type": "string", "maxLength": 24}}, "required": ["zone"], "additionalProperties": false}}])");

TEST_F(ResponsesTest, ForcedToolChoiceGivesFunctionCallItems) {
  Json body = {{"model", "smollm2"},
               {"input", "What is the weather in Paris?"},
               {"max_output_tokens", 80},
               {"temperature", 0},
               {"tools", kTools},
               {"tool_choice", "required"},
               {"parallel_tool_calls", false}};
  const Json r = post_json(port(), "/v1/responses", body);
  ASSERT_FALSE(r.empty());
  std::printf("  required: %s\n", r["output"].dump().c_str());
  EXPECT_EQ(r["status"], "completed");
  ASSERT_EQ(r["output"].size(), 1u) << r["output"].dump();
  const Json& call = r["output"][0];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("fc_"));
  EXPECT_TRUE(call["call_id"].get<std::string>().starts_with("call_"));
  EXPECT_EQ(call["status"], "completed");
  EXPECT_TRUE(call["name"] == "get_weather" || call["name"] == "get_time") << call;
  const Json args = Json::parse(call["arguments"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(args.is_object()) << call;
  ASSERT_EQ(r["tools"].size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(r["tools"][0].dump()),
            nlohmann::json::parse(kTools[0].dump()));  // any key order
  EXPECT_EQ(r["tools"][1]["name"], "get_time");
  EXPECT_EQ(r["parallel_tool_calls"], false);
  EXPECT_EQ(output_text(r), "");

  body["tool_choice"] = {{"type", "function"}, {"name", "get_weather"}};
  const Json named = post_json(port(), "/v1/responses", body);
  ASSERT_EQ(named["output"].size(), 1u) << named.dump();
  EXPECT_EQ(named["output"][0]["name"], "get_weather");
  EXPECT_TRUE(Json::parse(named["output"][0]["arguments"].get<std::string>())["city"].is_string());
  EXPECT_EQ(named["tool_choice"], body["tool_choice"]);

  // Streamed: the arguments' deltas make the same call.
  body["stream"] = true;
  auto s = post_sse(port(), "/v1/responses", body);
  ASSERT_EQ(s.status, 200);
  std::string streamed;
  Json done_item;
  for (const std::string& e : s.events) {
    const Json ev = Json::parse(e);
    if (ev["type"] == "response.function_call_arguments.delta")
      streamed += ev["delta"].get<std::string>();
    if (ev["type"] == "response.output_item.done") done_item = ev["item"];
  }
  EXPECT_EQ(Json::parse(streamed), Json::parse(named["output"][0]["arguments"].get<std::string>()))
      << streamed;
  EXPECT_EQ(done_item["type"], "function_call");
  EXPECT_EQ(done_item["arguments"], named["output"][0]["arguments"]);
}

// A request the engine fails after the stream began (a GBNF grammar too ambiguous to mask
// within the mask's work budget, passed as the chat route's `grammar` extension): the stream
// ends with response.failed carrying the error; the server goes on serving.
TEST_F(ResponsesTest, EngineFailureEndsTheStreamWithResponseFailed) {
  Json body = {{"model", "smollm2"},
               {"input", "Say a letter."},
               {"max_output_tokens", 8},
               {"grammar", R"(root ::= ("" | [a-y]){0,300} "z")"},
               {"stream", true}};
  auto s = post_sse(port(), "/v1/responses", body);
  ASSERT_EQ(s.status, 200) << s.raw;
  ASSERT_GE(s.events.size(), 3u) << s.raw;
  EXPECT_FALSE(s.done) << "no [DONE] line";
  EXPECT_EQ(Json::parse(s.events.front())["type"], "response.created");
  const Json last = Json::parse(s.events.back());
  EXPECT_EQ(last["type"], "response.failed") << s.events.back();
  EXPECT_EQ(last["response"]["status"], "failed");
  EXPECT_EQ(last["response"]["error"]["code"], "server_error");
  EXPECT_NE(last["response"]["error"]["message"].get<std::string>().find("too ambiguous"), std::string::npos)
      << s.events.back();
  for (size_t i = 0; i < s.events.size(); ++i) EXPECT_EQ(Json::parse(s.events[i])["sequence_number"], int(i));
  const Json after = post_json(port(), "/v1/responses", Json{{"model", "smollm2"}, {"input", "hi"}, {"max_output_tokens", 2}});
  EXPECT_EQ(after["status"], "incomplete") << after.dump();
}

// function_call and function_call_output items reach the template as the chat route's
// assistant tool_calls and tool messages: the same prompt as that chat request, longer than
// the question alone.
TEST_F(ResponsesTest, FunctionCallHistoryItemsRender) {
  const Json input = Json::parse(R"([
    {"role": "user", "content": "What is the weather in Paris?"},
    {"type": "function_call", "call_id": "call_abc", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
    {"type": "function_call_output", "call_id": "call_abc", "output": "{\"temperature\": 18, \"sky\": \"clear\"}"}])");
  const Json with = post_json(
      port(), "/v1/responses",
      {{"model", "smollm2"}, {"input", input}, {"max_output_tokens", 8}, {"temperature", 0}});
  const Json without = post_json(
      port(), "/v1/responses",
      {{"model", "smollm2"}, {"input", Json::array({input[0]})}, {"max_output_tokens", 1}});
  ASSERT_FALSE(with.empty());
  ASSERT_FALSE(without.empty());
  EXPECT_GT(with["usage"]["input_tokens"].get<int>(), without["usage"]["input_tokens"].get<int>());
  const Json messages = Json::parse(R"([
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_abc", "name": "get_weather", "content": "{\"temperature\": 18, \"sky\": \"clear\"}"}])");
  const Json chat = post_json(
      port(), "/v1/chat/completions",
      {{"model", "smollm2"}, {"messages", messages}, {"max_tokens", 8}, {"temperature", 0}});
  EXPECT_EQ(with["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
  EXPECT_EQ(output_text(with), chat["choices"][0]["message"]["content"].get<std::string>());
}

// The stream: created, in_progress, the message item's events in order (added, part added,
// deltas, text done, part done, item done), then response.incomplete or completed with the
// whole response; sequence numbers count up from 0; each event's name is its type; no
// [DONE]. The deltas add up to the body's text, and the final response is the body.
TEST_F(ResponsesTest, StreamedEventsAddUpToTheBody) {
  for (const int max_tokens : {40, 5}) {
    Json body = {{"model", "smollm2"},
                 {"input", "What is the capital of France?"},
                 {"max_output_tokens", max_tokens},
                 {"temperature", 0}};
    const Json whole = post_json(port(), "/v1/responses", body);
    body["stream"] = true;
    auto s = post_sse(port(), "/v1/responses", body);
    ASSERT_EQ(s.status, 200);
    EXPECT_FALSE(s.done) << "no [DONE] line";
    EXPECT_EQ(s.raw.find("[DONE]"), std::string::npos);
    ASSERT_GE(s.events.size(), 8u) << s.raw;
    std::vector<std::string> types;
    std::string text;
    Json last;
    for (size_t i = 0; i < s.events.size(); ++i) {
      const Json ev = Json::parse(s.events[i]);
      types.push_back(ev["type"]);
      EXPECT_EQ(s.names[i], ev["type"]) << s.events[i];
      EXPECT_EQ(ev["sequence_number"], i) << s.events[i];
      if (ev["type"] == "response.output_text.delta") {
        EXPECT_EQ(ev["output_index"], 0);
        EXPECT_EQ(ev["content_index"], 0);
        EXPECT_TRUE(ev["item_id"].get<std::string>().starts_with("msg_"));
        text += ev["delta"].get<std::string>();
      }
      if (ev["type"] == "response.output_text.done") {
        EXPECT_EQ(ev["text"], text);
      }
      last = ev;
    }
    const std::string final_type = "response." + whole["status"].get<std::string>();
    if (max_tokens == 5) {
      EXPECT_EQ(whole["status"], "incomplete");
    }
    std::vector<std::string> want = {"response.created", "response.in_progress",
                                     "response.output_item.added", "response.content_part.added"};
    const size_t deltas = types.size() - 8;
    ASSERT_GE(deltas, 1u);
    for (size_t k = 0; k < deltas; ++k) want.push_back("response.output_text.delta");
    for (const char* t :
         {"response.output_text.done", "response.content_part.done", "response.output_item.done"})
      want.push_back(t);
    want.push_back(final_type);
    EXPECT_EQ(types, want);
    EXPECT_EQ(Json::parse(s.events[0])["response"]["status"], "in_progress");
    EXPECT_EQ(text, output_text(whole));
    const Json& resp = last["response"];
    EXPECT_EQ(resp["status"], whole["status"]);
    EXPECT_EQ(resp["usage"]["output_tokens"], whole["usage"]["output_tokens"]);
    EXPECT_EQ(resp["usage"]["input_tokens"], whole["usage"]["input_tokens"]);
    EXPECT_EQ(output_text(resp), text);
    EXPECT_EQ(resp["output"][0]["id"], Json::parse(s.events[2])["item"]["id"]);
  }
}

TEST_F(ResponsesTest, RefusalsAreA400NamingTheField) {
  const std::vector<std::pair<Json, std::string>> cases = {
      {{{"previous_response_id", "resp_123"}}, "previous_response_id"},
      {{{"background", true}}, "background"},
      {{{"tools", {{{"type", "web_search"}}}}}, "tools"},
      {{{"input",
         {{{"role", "user"},
           {"content", {{{"type", "input_image"}, {"image_url", "http://x/y.png"}}}}}}}},
       "input"},
      {{{"input", {{{"type", "computer_call_output"}, {"call_id", "c"}}}}}, "input"},
      {{{"text", {{"format", {{"type", "xml"}}}}}}, "text.format"},
      {{{"model", "nope"}}, "model"},
  };
  for (const auto& [extra, param] : cases) {
    Json body = {{"model", "smollm2"}, {"input", "hi"}, {"max_output_tokens", 2}};
    for (auto& [k, v] : extra.items()) body[k] = v;
    auto r = post(port(), "/v1/responses", body);
    EXPECT_EQ(r.status, param == "model" ? 404 : 400) << body.dump() << " -> " << r.body;
    const Json e = Json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.contains("error")) << r.body;
    EXPECT_EQ(e["error"]["param"], param) << r.body;
    EXPECT_TRUE(e["error"]["message"].is_string());
  }
  // A prompt past the context: the chat route's 400, its param and advice in this API's names.
  std::string long_input;
  for (int i = 0; i < 3000; ++i) long_input += "word ";
  auto too_long = post(port(), "/v1/responses",
                       Json{{"model", "smollm2"}, {"input", long_input}, {"max_output_tokens", 4000}});
  EXPECT_EQ(too_long.status, 400) << too_long.body;
  const Json tl = Json::parse(too_long.body, nullptr, false);
  EXPECT_EQ(tl["error"]["param"], "input") << too_long.body;
  EXPECT_EQ(tl["error"]["code"], "context_length_exceeded") << too_long.body;
  const std::string advice = tl["error"]["message"].is_string() ? tl["error"]["message"].get<std::string>() : "";
  EXPECT_NE(advice.find("lower max_output_tokens"), std::string::npos) << advice;
  // store: false is what is served; a missing store or store: true (the client's default
  // meaning) is answered the same way, nothing being stored.
  for (const Json& store : {Json(false), Json(true)}) {
    auto r = post(
        port(), "/v1/responses",
        Json{{"model", "smollm2"}, {"input", "hi"}, {"max_output_tokens", 2}, {"store", store}});
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json()["store"], false);
  }
  // tool_choice "auto" on a model whose template shows no tool-call format: the chat route's 400.
  auto a =
      post(port(), "/v1/responses", Json{{"model", "smollm2"}, {"input", "hi"}, {"tools", kTools}});
  EXPECT_EQ(a.status, 400) << a.body;
  EXPECT_EQ(a.json()["error"]["param"], "tool_choice") << a.body;
}

TEST_F(ResponsesTest, ClientHangUpCancelsTheRequest) {
  Executor& ex = *repo_->find("smollm2")->executor;
  const auto before = ex.stats().requests_cancelled;
  Json body = {{"model", "smollm2"}, {"input", "Once upon a time"}, {"max_output_tokens", 300},
               {"temperature", 0},   {"ignore_eos", true},          {"stream", true}};
  auto s = post_sse(port(), "/v1/responses", body, /*hang_up_after=*/6);
  EXPECT_EQ(s.events.size(), 6u);
  for (int i = 0; i < 300 && ex.stats().requests_cancelled == before; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(ex.stats().requests_cancelled, before + 1);
  EXPECT_EQ(ex.stats().running, 0);
}

// tool_choice "auto" with a tool-call parser: the model's calls (here llama3_json's whole-output
// form, which text.format's schema makes SmolLM2 write) are read from its text into
// function_call items, whole and streamed alike, and no message item is left.
TEST_F(ResponsesTest, ParsedToolCallsAreFunctionCallItems) {
  ServerOptions so;
  so.tool_parser = ToolParser::kLlama3Json;
  ExecutorOptions eo;  // a repository of its own: this server's shutdown drains its executors
  eo.kv_tokens = 4096;
  ModelRepository repo({}, eo);
  repo.add(real_model("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"), "smollm2");
  TestServer srv(repo, so);
  const Json schema =
      Json::parse(R"({"type": "object", "properties": {"name": {"const": "get_weather"},
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                     "required": ["city"], "additionalProperties": false}},
      "required": ["name", "parameters"], "additionalProperties": false})");
  Json body = {
      {"model", "smollm2"},
      {"input", "What is the weather in Paris?"},
      {"max_output_tokens", 60},
      {"temperature", 0},
      {"tools", kTools},
      {"text", {{"format", {{"type", "json_schema"}, {"name", "call"}, {"schema", schema}}}}}};
  const Json r = post_json(srv.port(), "/v1/responses", body);
  ASSERT_FALSE(r.empty());
  std::printf("  parsed call: %s\n", r["output"].dump().c_str());
  ASSERT_EQ(r["output"].size(), 1u) << r["output"].dump();
  const Json& call = r["output"][0];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(r["status"], "completed");
  const Json args = Json::parse(call["arguments"].get<std::string>());
  EXPECT_TRUE(args["city"].is_string()) << args;
  body["stream"] = true;
  auto s = post_sse(srv.port(), "/v1/responses", body);
  std::vector<std::string> types;
  std::string streamed;
  Json last;
  for (const std::string& e : s.events) {
    const Json ev = Json::parse(e);
    if (types.empty() || types.back() != ev["type"]) types.push_back(ev["type"]);
    if (ev["type"] == "response.function_call_arguments.delta")
      streamed += ev["delta"].get<std::string>();
    last = ev;
  }
  const std::vector<std::string> want = {"response.created",
                                         "response.in_progress",
                                         "response.output_item.added",
                                         "response.function_call_arguments.delta",
                                         "response.function_call_arguments.done",
                                         "response.output_item.done",
                                         "response.completed"};
  EXPECT_EQ(types, want);
  EXPECT_EQ(Json::parse(streamed), args) << streamed;
  ASSERT_EQ(last["response"]["output"].size(), 1u);
  EXPECT_EQ(last["response"]["output"][0]["arguments"], call["arguments"]);
}

// --reasoning-parser: the thinking text becomes a reasoning item before the message, streamed
// as reasoning_text deltas, and counts as reasoning tokens.
TEST_F(ResponsesTest, ReasoningParserTextIsAReasoningItem) {
  ServerOptions so;
  so.reasoning_parser = true;
  ExecutorOptions eo;  // a repository of its own: this server's shutdown drains its executors
  eo.kv_tokens = 4096;
  ModelRepository repo({}, eo);
  repo.add(real_model("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"), "smollm2");
  TestServer srv(repo, so);
  ServedModel& m = *repo.find("smollm2");
  m.chat_template = std::make_unique<tok::ChatTemplate>(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "<|im_start|>assistant\n<think>\n");
  Json body = {{"model", "smollm2"},
               {"input", "What is the capital of France?"},
               {"max_output_tokens", 6},
               {"temperature", 0},
               {"reasoning", {{"effort", "low"}}}};
  const Json r = post_json(srv.port(), "/v1/responses", body);
  ASSERT_FALSE(r.empty());
  ASSERT_GE(r["output"].size(), 1u) << r.dump();
  const Json& rs = r["output"][0];
  EXPECT_EQ(rs["type"], "reasoning") << r["output"].dump();
  EXPECT_TRUE(rs["id"].get<std::string>().starts_with("rs_"));
  EXPECT_EQ(rs["summary"], Json::array());
  const std::string reasoning = rs["content"][0]["text"];
  EXPECT_FALSE(reasoning.empty());
  EXPECT_EQ(rs["content"][0]["type"], "reasoning_text");
  EXPECT_GT(r["usage"]["output_tokens_details"]["reasoning_tokens"].get<int>(), 0);
  EXPECT_EQ(r["reasoning"], body["reasoning"]);
  body["stream"] = true;
  auto s = post_sse(srv.port(), "/v1/responses", body);
  std::string streamed;
  for (const std::string& e : s.events) {
    const Json ev = Json::parse(e);
    if (ev["type"] == "response.reasoning_text.delta") streamed += ev["delta"].get<std::string>();
    EXPECT_NE(ev["type"], "response.output_text.delta") << "all of it is reasoning";
  }
  EXPECT_EQ(streamed, reasoning);
}

}  // namespace
}  // namespace kiln::server
