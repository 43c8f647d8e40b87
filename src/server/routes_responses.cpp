// /v1/responses: OpenAI's Responses API, served without state as vLLM serves it with
// store=false. The request runs as the chat completion it translates to (parse_responses,
// then the chat route's submit_call: template, sampling, tools, reasoning parser, constrained
// decoding); this file writes the answer as a response object whose output items -
// reasoning, message, function_call - are built from each update the chat route's absorb()
// has split, the same way streamed or not, so a stream's deltas add up to the body's items.
// Tested in tests/server/responses_test.cpp and tests/server/openai_client_test.py.
#include <string>
#include <utility>

#include "server/generate_call.h"

namespace kiln::server {

namespace {

// One output item as it forms.
struct Item {
  enum class Kind : uint8_t { kReasoning, kMessage, kCall } kind;
  std::string id;
  std::string text;  // the reasoning's or the message's text, or the call's arguments
  size_t call = 0;   // kCall: the call's index among the choice's calls
  std::string name, call_id;
  bool done = false;
  std::string status = "in_progress";
};

// The response's items and, when streaming, the events that tell them.
struct ResponseState {
  Json echo;  // the request's fields a response object carries (parse_responses)
  bool stream = false;
  std::vector<Item> items;
  // Message text waiting while it is whitespace only: the whitespace a model writes before
  // a tool call opens no message (as chat's content is null then).
  std::string pending;
  size_t calls_done = 0;  // the choice's calls released as items
  int64_t seq = 0;
  std::string out;  // SSE text not yet written
};

void emit(ResponseState& rs, const std::string& type, Json fields) {
  if (!rs.stream) return;
  Json j = {{"type", type}};
  for (auto& [k, v] : fields.items()) j[k] = std::move(v);
  j["sequence_number"] = rs.seq++;
  rs.out += "event: " + type + "\ndata: " + dump(j) + "\n\n";
}

Json text_part(const Item& it) {
  if (it.kind == Item::Kind::kReasoning) return {{"type", "reasoning_text"}, {"text", it.text}};
  return {{"type", "output_text"},
          {"text", it.text},
          {"annotations", Json::array()},
          {"logprobs", Json::array()}};
}

Json item_json(const Item& it) {
  switch (it.kind) {
    case Item::Kind::kReasoning:
      return {{"id", it.id},
              {"type", "reasoning"},
              {"summary", Json::array()},
              {"content", it.done ? Json::array({text_part(it)}) : Json::array()},
              {"encrypted_content", nullptr},
              {"status", it.status}};
    case Item::Kind::kMessage:
      return {{"id", it.id},
              {"type", "message"},
              {"role", "assistant"},
              {"status", it.status},
              {"content", it.done ? Json::array({text_part(it)}) : Json::array()}};
    case Item::Kind::kCall:
      return {{"id", it.id},     {"type", "function_call"}, {"call_id", it.call_id},
              {"name", it.name}, {"arguments", it.text},    {"status", it.status}};
  }
  return nullptr;
}

Json where(const ResponseState& rs, size_t i) {
  return {{"item_id", rs.items[i].id}, {"output_index", i}};
}

void close_item(ResponseState& rs, size_t i, const std::string& status) {
  Item& it = rs.items[i];
  if (it.done) return;
  it.done = true;
  it.status = status;
  Json at = where(rs, i);
  if (it.kind == Item::Kind::kCall) {
    Json done = at;
    done["name"] = it.name;
    done["arguments"] = it.text;
    emit(rs, "response.function_call_arguments.done", std::move(done));
  } else {
    Json done = at;
    done["content_index"] = 0;
    done["text"] = it.text;
    if (it.kind == Item::Kind::kMessage) done["logprobs"] = Json::array();
    emit(rs,
         it.kind == Item::Kind::kMessage ? "response.output_text.done"
                                         : "response.reasoning_text.done",
         std::move(done));
    Json part = at;
    part["content_index"] = 0;
    part["part"] = text_part(it);
    emit(rs, "response.content_part.done", std::move(part));
  }
  emit(rs, "response.output_item.done", {{"output_index", i}, {"item", item_json(it)}});
}

// Opens an item after closing an open reasoning or message item (calls close as released).
size_t open_item(ResponseState& rs, Item::Kind kind, size_t call = 0, std::string name = {},
                 std::string call_id = {}) {
  for (size_t i = 0; i < rs.items.size(); ++i)
    if (rs.items[i].kind != Item::Kind::kCall) close_item(rs, i, "completed");
  Item it{kind};
  it.id = random_id(kind == Item::Kind::kReasoning ? "rs_"
                    : kind == Item::Kind::kMessage ? "msg_"
                                                   : "fc_");
  it.call = call;
  it.name = std::move(name);
  it.call_id = std::move(call_id);
  rs.items.push_back(std::move(it));
  const size_t i = rs.items.size() - 1;
  emit(rs, "response.output_item.added", {{"output_index", i}, {"item", item_json(rs.items[i])}});
  if (kind != Item::Kind::kCall) {
    Json part = where(rs, i);
    part["content_index"] = 0;
    part["part"] = text_part(rs.items[i]);
    emit(rs, "response.content_part.added", std::move(part));
  }
  return i;
}

// The open item of a kind (for calls: call k's), or npos.
size_t open_of(const ResponseState& rs, Item::Kind kind, size_t call = 0) {
  for (size_t i = rs.items.size(); i-- > 0;)
    if (!rs.items[i].done && rs.items[i].kind == kind &&
        (kind != Item::Kind::kCall || rs.items[i].call == call))
      return i;
  return std::string::npos;
}

void add_text(ResponseState& rs, size_t i, const std::string& delta) {
  if (delta.empty()) return;
  Item& it = rs.items[i];
  it.text += delta;
  Json d = where(rs, i);
  if (it.kind != Item::Kind::kCall) d["content_index"] = 0;
  d["delta"] = delta;
  if (it.kind == Item::Kind::kMessage) d["logprobs"] = Json::array();
  emit(rs,
       it.kind == Item::Kind::kCall      ? "response.function_call_arguments.delta"
       : it.kind == Item::Kind::kMessage ? "response.output_text.delta"
                                         : "response.reasoning_text.delta",
       std::move(d));
}

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

// Takes the choice's latest update (absorbed: its reasoning, content, call pieces and calls)
// into the items; at the end, closes them.
void take_update(ResponseState& rs, ChoiceState& st, bool last) {
  if (!st.last.reasoning.empty()) {
    size_t i = open_of(rs, Item::Kind::kReasoning);
    if (i == std::string::npos) i = open_item(rs, Item::Kind::kReasoning);
    add_text(rs, i, st.last.reasoning);
  }
  if (!st.last.content.empty()) {
    size_t i = open_of(rs, Item::Kind::kMessage);
    if (i != std::string::npos) {
      add_text(rs, i, st.last.content);
    } else {
      rs.pending += st.last.content;
      if (!blank(rs.pending)) {
        add_text(rs, open_item(rs, Item::Kind::kMessage), rs.pending);
        rs.pending.clear();
      }
    }
  }
  auto call_item = [&](size_t k, const std::string& name) {
    size_t i = open_of(rs, Item::Kind::kCall, k);
    if (i != std::string::npos) return i;
    rs.pending.clear();
    return open_item(rs, Item::Kind::kCall, k, name, call_id(st, k));
  };
  for (const ToolCallFragment& f : st.fragments)
    add_text(rs, call_item(f.call, f.name), f.arguments);
  st.fragments.clear();
  for (; rs.calls_done < st.calls.size(); ++rs.calls_done) {
    const ToolCall& call = st.calls[rs.calls_done];
    const size_t i = call_item(rs.calls_done, call.name);
    // Its arguments as released: what streamed (compact once they parse), or the whole call.
    if (rs.items[i].text.empty()) add_text(rs, i, call.arguments);
    rs.items[i].text = call.arguments;
    close_item(rs, i, "completed");
  }
  if (!last) return;
  bool message = false, calls = false;
  for (const Item& it : rs.items) {
    message |= it.kind == Item::Kind::kMessage;
    calls |= it.kind == Item::Kind::kCall;
  }
  if (!message && !calls && (!rs.pending.empty() || rs.items.empty())) {
    const size_t i = open_item(rs, Item::Kind::kMessage);
    add_text(rs, i, rs.pending);
  }
  rs.pending.clear();
  const std::string status = st.finish == "length" ? "incomplete" : "completed";
  for (size_t i = 0; i < rs.items.size(); ++i) close_item(rs, i, status);
}

// The response object: "in_progress" (no output yet), "completed", "incomplete" or "failed".
Json response_json(const Call& c, const ResponseState& rs, const std::string& status) {
  const Json& e = rs.echo;
  Json j = {{"id", c.id},
            {"object", "response"},
            {"created_at", c.created},
            {"status", status},
            {"background", false}};
  j["error"] =
      status == "failed" ? Json{{"code", "server_error"}, {"message", c.error}} : Json(nullptr);
  j["incomplete_details"] =
      status == "incomplete" ? Json{{"reason", "max_output_tokens"}} : Json(nullptr);
  j["instructions"] = e["instructions"];
  j["max_output_tokens"] = e["max_output_tokens"];
  j["max_tool_calls"] = nullptr;
  j["metadata"] = e["metadata"];
  j["model"] = c.model->name;
  Json output = Json::array();
  if (status != "in_progress")
    for (const Item& it : rs.items) output.push_back(item_json(it));
  j["output"] = std::move(output);
  j["parallel_tool_calls"] = e["parallel_tool_calls"];
  j["previous_response_id"] = nullptr;
  j["reasoning"] = e["reasoning"];
  j["store"] = false;
  j["temperature"] = e["temperature"];
  j["text"] = e["text"];
  j["tool_choice"] = e["tool_choice"];
  j["tools"] = e["tools"];
  j["top_p"] = e["top_p"];
  j["truncation"] = "disabled";
  if (status == "in_progress") {
    j["usage"] = nullptr;
  } else {
    const int32_t in = c.total(&PromptState::prompt_tokens),
                  out = c.total(&PromptState::completion_tokens);
    // The reasoning's share of the output, as its text encodes (the splitter reads text).
    int64_t reasoning = 0;
    for (const ChoiceState& st : c.choices)
      if (!st.reasoning.empty() && c.model->tokenizer)
        reasoning +=
            int64_t(c.model->tokenizer->encode(st.reasoning, /*add_special=*/false).size());
    j["usage"] = {
        {"input_tokens", in},
        {"input_tokens_details", {{"cached_tokens", c.total(&PromptState::cached_tokens)}}},
        {"output_tokens", out},
        {"output_tokens_details", {{"reasoning_tokens", std::min<int64_t>(reasoning, out)}}},
        {"total_tokens", in + out}};
  }
  j["user"] = nullptr;
  return j;
}

std::string final_status(const Call& c) {
  if (!c.error.empty()) return "failed";
  return !c.choices.empty() && c.choices[0].finish == "length" ? "incomplete" : "completed";
}

}  // namespace

void Server::Impl::handle_responses(const httplib::Request& req, httplib::Response& res) {
  const char* endpoint = "/v1/responses";
  auto call = std::make_shared<Call>();
  call->route = endpoint;
  auto rs = std::make_shared<ResponseState>();
  std::string model_name;
  try {
    if (draining) throw ApiError(503, "the server is shutting down", {}, "server_error");
    ResponsesParams r = parse_responses(parse_json_body(req.body), opt.limits);
    call->params = std::move(r.chat);
    rs->echo = std::move(r.echo);
    model_name = call->params.model;
    submit_call(call, req);
  } catch (ApiError& e) {
    rename_for_responses(e);  // submission's errors (parse_responses renames its own)
    return reply_error(res, model_name, endpoint, e);
  } catch (const Error& e) {
    return reply_error(res, model_name, endpoint, e);
  }
  call->id = random_id("resp_");
  rs->stream = call->params.stream;
  CallWriter writer;
  if (rs->stream) {
    emit(*rs, "response.created", {{"response", response_json(*call, *rs, "in_progress")}});
    emit(*rs, "response.in_progress", {{"response", response_json(*call, *rs, "in_progress")}});
    writer.head = std::move(rs->out);
    rs->out.clear();
  }
  // One choice (the Responses API has no n): take each of its updates into the items.
  writer.event = [rs](Call& c, size_t, const RequestUpdate& u) {
    for (const ChoiceUpdate& cu : u.choices)
      take_update(*rs, c.choices.at(size_t(cu.index)), cu.finish != FinishReason::kNone);
    return std::exchange(rs->out, {});
  };
  writer.end = [rs](Call& c) {
    const std::string status = final_status(c);  // completed, incomplete or failed: the event's name
    emit(*rs, "response." + status, {{"response", response_json(c, *rs, status)}});
    return std::exchange(rs->out, {});
  };
  writer.body = [rs](Call& c) {
    if (!c.error.empty()) return dump(error_body(500, c.error, "server_error"));
    return dump(response_json(c, *rs, final_status(c)));
  };
  serve_call(call, res, std::move(writer));
}

}  // namespace kiln::server
