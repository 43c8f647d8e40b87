// /v1/responses requests (see protocol.h): OpenAI's Responses API body translated into the
// chat completion request it runs, which parse_completion then validates, so sampling, tools
// and constrained decoding are read exactly as the chat route reads them. Errors name the
// Responses fields (input, text.format, max_output_tokens). Tested in
// tests/server/responses_test.cpp.
#include <map>
#include <string>
#include <string_view>

#include "server/protocol_fields.h"

namespace kiln::server {

namespace {

[[noreturn]] void bad_input(const std::string& message) { throw ApiError(400, message, "input"); }

// A message's or a tool output's text: a string, or text parts (input_text, output_text).
std::string content_text(const Json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad_input("'" + where + "' must be a string or an array of content parts");
  std::string text;
  for (const Json& part : c) {
    const std::string type = part.is_object() ? get_string(part, "type", false) : "";
    if (type == "input_text" || type == "output_text" || type == "text") {
      const Json* t = field(part, "text");
      if (!t || !t->is_string())
        bad_input("a '" + type + "' part of '" + where + "' needs its 'text' string");
      text += t->get<std::string>();
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      bad_input("'" + where + "' holds an '" + type +
                "' part: kiln serves text models, which read input_text only");
    } else {
      bad_input("'" + where + "' holds a content part of type '" + type +
                "'; expected input_text or output_text");
    }
  }
  return text;
}

// The input items as chat messages: function_call items join the assistant turn before them
// (its tool_calls), function_call_output items become tool messages naming their call.
Json input_messages(const Json& in) {
  Json messages = Json::array();
  std::map<std::string, std::string> call_names;  // call_id -> function name
  for (size_t i = 0; i < in.size(); ++i) {
    const Json& item = in[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!item.is_object())
      bad_input("'" + where + "' must be an object (a message or a function call item)");
    const Json* t = field(item, "type");
    if (t && !t->is_string()) bad_input("'" + where + ".type' must be a string");
    const std::string type = t ? t->get<std::string>() : "message";
    auto required = [&](const char* key) {
      const Json* v = field(item, key);
      if (!v || !v->is_string())
        bad_input("'" + where + "' (" + type + ") needs '" + key + "', a string");
      return v->get<std::string>();
    };
    if (type == "message") {
      const std::string role = required("role");
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        bad_input("'" + where + "' has role '" + role +
                  "'; expected user, system, developer or assistant");
      const Json* c = field(item, "content");
      messages.push_back(
          {{"role", role}, {"content", c ? content_text(*c, where + ".content") : ""}});
    } else if (type == "function_call") {
      const std::string call_id = required("call_id"), name = required("name"),
                        arguments = required("arguments");
      const Json parsed = Json::parse(arguments, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded() || !parsed.is_object())
        bad_input("'" + where + ".arguments' is not a JSON object's text");
      call_names[call_id] = name;
      Json call = {{"id", call_id},
                   {"type", "function"},
                   {"function", {{"name", name}, {"arguments", arguments}}}};
      if (messages.empty() || messages.back()["role"] != "assistant")
        messages.push_back({{"role", "assistant"}, {"content", nullptr}});
      Json& turn = messages.back();
      if (!turn.contains("tool_calls")) turn["tool_calls"] = Json::array();
      turn["tool_calls"].push_back(std::move(call));
    } else if (type == "function_call_output") {
      const std::string call_id = required("call_id");
      const Json* out = field(item, "output");
      if (!out) bad_input("'" + where + "' (function_call_output) needs 'output'");
      Json msg = {{"role", "tool"},
                  {"tool_call_id", call_id},
                  {"content", content_text(*out, where + ".output")}};
      if (auto it = call_names.find(call_id); it != call_names.end()) msg["name"] = it->second;
      messages.push_back(std::move(msg));
    } else if (type == "reasoning") {
      // An earlier response's reasoning sent back with its output: chat templates leave
      // earlier turns' reasoning out of the prompt, and so does this.
    } else if (type == "item_reference") {
      bad_input("'" + where +
                "' is an item_reference: responses and their items are not stored here; send the "
                "items themselves");
    } else {
      bad_input("'" + where + "' has type '" + type +
                "'; expected message, function_call, function_call_output or reasoning");
    }
  }
  return messages;
}

// tools in the Responses shape, {"type": "function", "name", "description", "parameters",
// "strict"}, into chat's (under "function"); `echo` gets them normalized.
Json chat_tools(const Json& tools, Json& echo) {
  if (!tools.is_array()) bad_type("tools", "an array of tools");
  Json out = Json::array();
  echo = Json::array();
  for (const Json& t : tools) {
    const std::string type = t.is_object() ? get_string(t, "type", false) : "";
    if (type != "function")
      throw ApiError(400,
                     "tool type '" + type +
                         "' is not supported: kiln serves function tools, "
                         "{\"type\": \"function\", \"name\", \"parameters\"} (built-in tools run "
                         "on OpenAI's side)",
                     "tools");
    const Json* name = field(t, "name");
    if (!name || !name->is_string())
      throw ApiError(
          400, "a function tool in 'tools' needs 'name', a string (the Responses API's flat shape)",
          "tools");
    Json fn = {{"name", *name}};
    Json e = {{"type", "function"}, {"name", fn["name"]}};
    for (const char* key : {"description", "parameters", "strict"}) {
      const Json* v = field(t, key);
      if (v) fn[key] = *v;
      e[key] = v ? *v : Json(nullptr);
    }
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    echo.push_back(std::move(e));
  }
  return out;
}

// text.format as chat's response_format.
Json response_format(const Json& text, Json& echo) {
  if (!text.is_object()) bad_type("text", "an object");
  const Json* f = field(text, "format");
  if (!f) {
    echo = {{"format", {{"type", "text"}}}};
    return nullptr;
  }
  if (!f->is_object()) bad_type("text.format", "an object");
  echo = {{"format", *f}};
  const std::string type = get_string(*f, "type", true);
  if (type == "text") return nullptr;
  if (type == "json_object") return {{"type", "json_object"}};
  if (type != "json_schema")
    throw ApiError(
        400, "'text.format' type '" + type + "' is not supported (text, json_object, json_schema)",
        "text.format");
  const Json* schema = field(*f, "schema");
  if (!schema || !schema->is_object())
    throw ApiError(400, "'text.format' json_schema needs 'schema', a JSON Schema object",
                   "text.format");
  Json js = {{"name", get_string(*f, "name", false)}, {"schema", *schema}};
  if (const Json* strict = field(*f, "strict")) js["strict"] = *strict;
  return {{"type", "json_schema"}, {"json_schema", std::move(js)}};
}

}  // namespace

void rename_for_responses(ApiError& e) {
  if (e.param == "messages") e.param = "input";
  if (e.param == "response_format") e.param = "text.format";
  if (e.code == "context_length_exceeded") {
    std::string message = e.what();
    if (const size_t at = message.rfind("max_tokens"); at != std::string::npos)
      message.replace(at, std::string_view("max_tokens").size(), "max_output_tokens");
    e = ApiError(e.status, std::move(message), e.param, e.type, e.code);
  }
}

ResponsesParams parse_responses(const Json& j, const RequestLimits& limits) {
  if (field(j, "previous_response_id"))
    throw ApiError(
        400,
        "'previous_response_id' is not supported: responses are not stored here (as vLLM with "
        "store=false); send the whole conversation as 'input'",
        "previous_response_id");
  if (field(j, "conversation"))
    throw ApiError(
        400,
        "'conversation' is not supported: conversations are not stored here; send the whole "
        "conversation as 'input'",
        "conversation");
  if (field(j, "prompt"))
    throw ApiError(
        400,
        "'prompt' (a stored prompt template) is not supported; send 'instructions' and 'input'",
        "prompt");
  if (get_bool(j, "background", false))
    throw ApiError(
        400,
        "'background': true is not supported: responses are not stored here, so there is nothing "
        "to poll; send the request without it (or stream it)",
        "background");
  get_bool(j, "store", false);  // accepted either way: nothing is stored

  ResponsesParams r;
  Json& echo = r.echo;
  Json chat = {{"model", get_string(j, "model", true)}};
  Json messages = Json::array();
  const std::string instructions = get_string(j, "instructions", false);
  echo["instructions"] = field(j, "instructions") ? Json(instructions) : Json(nullptr);
  if (field(j, "instructions")) messages.push_back({{"role", "system"}, {"content", instructions}});
  const Json* in = field(j, "input");
  if (!in) throw ApiError(400, "'input' is required", "input");
  if (in->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *in}});
  } else if (in->is_array() && !in->empty()) {
    for (Json& m : input_messages(*in)) messages.push_back(std::move(m));
  } else {
    bad_type("input", "a string or a non-empty array of input items");
  }
  if (messages.empty()) bad_input("'input' holds no message (only reasoning items)");
  chat["messages"] = std::move(messages);

  const int64_t max_output = get_int(j, "max_output_tokens", -1, 1, limits.max_tokens);
  if (max_output > 0) chat["max_completion_tokens"] = max_output;
  echo["max_output_tokens"] = max_output > 0 ? Json(max_output) : Json(nullptr);
  // Sampling and kiln's (vLLM's, llama.cpp's) extensions, constrained decoding's among them,
  // read as the chat route reads them.
  for (const char* key :
       {"temperature", "top_p", "seed", "stop", "top_k", "min_p", "repetition_penalty",
        "presence_penalty", "frequency_penalty", "logit_bias", "stop_token_ids", "ignore_eos",
        "priority", "session_id", "chat_template_kwargs", "parallel_tool_calls", "stream",
        "structured_outputs", "guided_json", "guided_grammar", "guided_regex", "guided_choice",
        "grammar", "json_schema"})
    if (const Json* v = field(j, key)) chat[key] = *v;
  echo["tools"] = Json::array();
  if (const Json* tools = field(j, "tools")) chat["tools"] = chat_tools(*tools, echo["tools"]);
  if (const Json* choice = field(j, "tool_choice")) {
    if (choice->is_object()) {
      const std::string type = get_string(*choice, "type", true);
      if (type != "function")
        throw ApiError(
            400, "'tool_choice' type '" + type + "' is not supported: kiln serves function tools",
            "tool_choice");
      chat["tool_choice"] = {{"type", "function"},
                             {"function", {{"name", get_string(*choice, "name", true)}}}};
    } else {
      chat["tool_choice"] = *choice;
    }
    echo["tool_choice"] = *choice;
  } else {
    echo["tool_choice"] = "auto";
  }
  Json text_echo;
  const Json* text = field(j, "text");
  const Json format = text ? response_format(*text, text_echo) : Json(nullptr);
  if (!text) text_echo = {{"format", {{"type", "text"}}}};
  if (!format.is_null()) chat["response_format"] = format;
  const Json* reasoning = field(j, "reasoning");
  if (reasoning && !reasoning->is_object()) bad_type("reasoning", "an object");
  echo["reasoning"] = reasoning ? *reasoning : Json(nullptr);

  try {
    r.chat = parse_completion(chat, /*chat=*/true, limits);
  } catch (ApiError& e) {
    rename_for_responses(e);
    throw;
  }
  echo["temperature"] = field(j, "temperature") ? j["temperature"] : Json(1.0);
  echo["top_p"] = field(j, "top_p") ? j["top_p"] : Json(1.0);
  const Json* metadata = field(j, "metadata");
  if (metadata && !metadata->is_object()) bad_type("metadata", "an object of strings");
  echo["metadata"] = metadata ? *metadata : Json::object();
  echo["parallel_tool_calls"] = r.chat.parallel_tool_calls;
  echo["text"] = std::move(text_echo);
  return r;
}

}  // namespace kiln::server
