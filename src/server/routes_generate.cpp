// /v1/completions and /v1/chat/completions: parse -> tokenize (chat template) -> check
// the context -> submit to the model's Executor (submit_call, which /v1/responses shares)
// -> stream SSE chunks, or one JSON body. Both kinds of response are written by serve_call's
// chunked content provider, which waits on the request's update queue; a failed write (the
// client went away) cancels the request. Non-streaming responses send a space every second
// while waiting (JSON allows leading whitespace) so that a vanished client is noticed too.
#include <random>

#include "core/status.h"
#include "server/generate_call.h"
#include "tokenizer/chat_template.h"

namespace kiln::server {

namespace {

std::string piece_of(const ServedModel& m, int32_t id) {
  return m.tokenizer ? m.tokenizer->token_to_piece(id) : std::to_string(id);
}

Json bytes_of(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// The logprobs of one update's tokens, in the endpoint's format. Completions'
// text_offset is the byte offset of each token's piece in the choice's text, counted
// from `base` (the text before this update); approximate where the detokenizer merges
// pieces (byte fallback, cleanup) or a stop string cut the text.
Json logprobs_json(const ServedModel& m, const ChoiceUpdate& u, bool chat, size_t base = 0) {
  if (chat) {
    Json content = Json::array();
    for (auto& lp : u.logprobs) {
      std::string piece = piece_of(m, lp.token);
      Json top = Json::array();
      for (auto& t : lp.top) {
        std::string p = piece_of(m, t.token);
        top.push_back({{"token", p}, {"logprob", t.logprob}, {"bytes", bytes_of(p)}});
      }
      content.push_back({{"token", piece}, {"logprob", lp.logprob}, {"bytes", bytes_of(piece)}, {"top_logprobs", top}});
    }
    return Json{{"content", content}};
  }
  Json tokens = Json::array(), lps = Json::array(), tops = Json::array(), offsets = Json::array();
  size_t offset = base;
  for (auto& lp : u.logprobs) {
    std::string piece = piece_of(m, lp.token);
    tokens.push_back(piece);
    lps.push_back(lp.logprob);
    Json top = Json::object();
    for (auto& t : lp.top) top[piece_of(m, t.token)] = t.logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += piece.size();
  }
  return Json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// echo with logprobs: the prompt's tokens in completions' logprobs format, the first
// token's logprob null (nothing comes before it), offsets from the start of the text.
Json prompt_logprobs_json(const Call& c, const PromptState& ps) {
  Json tokens = Json::array(), lps = Json::array(), tops = Json::array(), offsets = Json::array();
  size_t offset = 0;
  for (size_t i = 0; i < ps.ids.size(); ++i) {
    std::string piece = piece_of(*c.model, ps.ids[i]);
    tokens.push_back(piece);
    offsets.push_back(offset);
    offset += piece.size();
    if (i == 0 || i > ps.logprobs.size()) {
      lps.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    const SampledToken& lp = ps.logprobs[i - 1];
    lps.push_back(lp.logprob);
    Json top = Json::object();
    for (auto& t : lp.top) top[piece_of(*c.model, t.token)] = t.logprob;
    tops.push_back(top);
  }
  return Json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// vLLM's prompt_logprobs: per prompt token (the first null) {"<id>": {logprob, rank,
// decoded_token}} for the token itself and its top alternatives.
Json vllm_prompt_logprobs(const Call& c, const PromptState& ps) {
  Json out = Json::array({nullptr});
  for (const SampledToken& lp : ps.logprobs) {
    Json entry = Json::object();
    entry[std::to_string(lp.token)] = {{"logprob", lp.logprob}, {"rank", lp.rank},
                                       {"decoded_token", piece_of(*c.model, lp.token)}};
    for (size_t k = 0; k < lp.top.size(); ++k)
      if (lp.top[k].token != lp.token)
        entry[std::to_string(lp.top[k].token)] = {{"logprob", lp.top[k].logprob}, {"rank", k + 1},
                                                  {"decoded_token", piece_of(*c.model, lp.top[k].token)}};
    out.push_back(entry);
  }
  return out;
}

void append_logprobs(Json& acc, const Json& more, bool chat) {
  if (acc.is_null()) {
    acc = more;
    return;
  }
  if (chat) {
    for (auto& x : more["content"]) acc["content"].push_back(x);
  } else {
    for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
      for (auto& x : more[k]) acc[k].push_back(x);
  }
}

std::string finish_name(const ChoiceState& st, FinishReason r) {
  if (r == FinishReason::kError || r == FinishReason::kCancelled) return "abort";
  if (r == FinishReason::kStop && !st.calls.empty()) return "tool_calls";
  return finish_reason_name(r);
}

Json tool_call_json(const ChoiceState& st, size_t k) {
  return Json{{"id", st.calls[k].id},
              {"type", "function"},
              {"function", {{"name", st.calls[k].name}, {"arguments", st.calls[k].arguments}}}};
}

}  // namespace

std::string random_id(const char* prefix) {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kAlnum[rng() % 62];
  return id;
}

const std::string& call_id(ChoiceState& st, size_t k) {
  while (st.call_ids.size() <= k) st.call_ids.push_back(random_id("call_"));
  return st.call_ids[k];
}

namespace {

Json usage_json(const Call& c) {
  const int32_t prompt = c.total(&PromptState::prompt_tokens), completion = c.total(&PromptState::completion_tokens);
  return Json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", c.total(&PromptState::cached_tokens)}}}};
}

Json envelope(const Call& c, bool chunk) {
  const char* object = c.params.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return Json{{"id", c.id}, {"object", object}, {"created", c.created}, {"model", c.model->name}};
}

// One SSE chunk for one choice's update; `index` is the choice's in the response (prompt p's
// choice i is p * n + i).
Json stream_chunk(Call& c, const ChoiceUpdate& u, size_t index) {
  Json j = envelope(c, true);
  ChoiceState& st = c.choices.at(index);
  Json choice = {{"index", index}};
  if (c.params.chat) {
    Json delta = Json::object();
    if (!st.role_sent) {
      delta["role"] = "assistant";
      st.role_sent = true;
    }
    // Pieces of calls being written (OpenAI's form: the first names the call, the rest
    // carry arguments text), then calls that came whole; a streamed call is not sent again.
    Json calls = Json::array();
    for (ToolCallFragment& f : st.fragments) {
      Json piece = {{"index", f.call}};
      if (!f.name.empty()) {
        piece["id"] = call_id(st, f.call);
        piece["type"] = "function";
        piece["function"] = {{"name", f.name}, {"arguments", f.arguments}};
      } else {
        piece["function"] = {{"arguments", f.arguments}};
      }
      calls.push_back(std::move(piece));
    }
    st.fragments.clear();
    for (; st.calls_sent < st.calls.size(); ++st.calls_sent) {
      if (st.calls[st.calls_sent].streamed) continue;
      Json c = tool_call_json(st, st.calls_sent);
      c["index"] = st.calls_sent;
      calls.push_back(c);
    }
    const bool new_calls = !calls.empty();
    if (!st.last.reasoning.empty()) delta["reasoning_content"] = st.last.reasoning;
    if (!st.last.content.empty() || (st.last.reasoning.empty() && !new_calls && u.finish == FinishReason::kNone))
      delta["content"] = st.last.content;
    if (new_calls) delta["tool_calls"] = calls;
    choice["delta"] = delta;
  } else {
    choice["text"] = u.text;
  }
  // absorb() already appended this update's text.
  size_t base = st.text.size() >= u.text.size() ? st.text.size() - u.text.size() : 0;
  choice["logprobs"] =
      c.params.logprobs && !u.logprobs.empty() ? logprobs_json(*c.model, u, c.params.chat, base) : Json(nullptr);
  choice["finish_reason"] = u.finish == FinishReason::kNone ? Json(nullptr) : Json(finish_name(st, u.finish));
  if (c.params.return_token_ids) choice["token_ids"] = u.tokens;
  j["choices"] = Json::array({choice});
  return j;
}

// Streaming echo / prompt_logprobs: a chunk per choice of prompt p with the prompt's text (and
// logprobs), before its first generated token's (the prompt's logprobs are all in by then).
std::string echo_chunks(Call& c, size_t p) {
  PromptState& ps = c.prompts[p];
  ps.echo_sent = true;
  if (!c.params.echo && c.params.prompt_logprobs < 0) return {};
  std::string out;
  const size_t n = size_t(c.params.n);
  for (size_t i = p * n; i < (p + 1) * n; ++i) {
    Json j = envelope(c, true);
    Json choice = {{"index", i}, {"text", ps.echo_text}};
    choice["logprobs"] = c.params.echo && c.params.logprobs ? prompt_logprobs_json(c, ps) : Json(nullptr);
    choice["finish_reason"] = nullptr;
    if (c.params.prompt_logprobs >= 0) choice["prompt_logprobs"] = vllm_prompt_logprobs(c, ps);
    if (c.params.return_token_ids) choice["prompt_token_ids"] = ps.ids;
    j["choices"] = Json::array({choice});
    out += "data: " + dump(j) + "\n\n";
  }
  return out;
}

Json final_body(Call& c) {
  Json j = envelope(c, false);
  Json choices = Json::array();
  for (size_t i = 0; i < c.choices.size(); ++i) {
    ChoiceState& st = c.choices[i];
    const PromptState& ps = c.prompts[i / size_t(c.params.n)];
    Json choice = {{"index", i}};
    if (c.params.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", st.text}};
      if (st.splitter) choice["message"]["reasoning_content"] = st.reasoning.empty() ? Json(nullptr) : Json(st.reasoning);
      if (!st.calls.empty()) {
        if (st.text.find_first_not_of(" \t\r\n") == std::string::npos) choice["message"]["content"] = nullptr;
        Json calls = Json::array();
        for (size_t k = 0; k < st.calls.size(); ++k) calls.push_back(tool_call_json(st, k));
        choice["message"]["tool_calls"] = calls;
      }
    } else {
      choice["text"] = st.text;
    }
    Json logprobs = c.params.logprobs ? st.logprobs : Json(nullptr);
    if (c.params.logprobs && c.params.echo) {
      Json all = prompt_logprobs_json(c, ps);
      if (!logprobs.is_null()) append_logprobs(all, logprobs, false);
      logprobs = std::move(all);
    }
    choice["logprobs"] = logprobs;
    if (c.params.prompt_logprobs >= 0) choice["prompt_logprobs"] = vllm_prompt_logprobs(c, ps);
    choice["finish_reason"] = st.finish.empty() ? Json(nullptr) : Json(st.finish);
    if (c.params.return_token_ids) choice["token_ids"] = st.tokens;
    choices.push_back(choice);
  }
  j["choices"] = choices;
  j["usage"] = usage_json(c);
  return j;
}

// A forced tool choice's output as calls; none when it is not the JSON it was constrained to
// (max_tokens cut it).
std::vector<ToolCall> forced_calls(const CompletionParams& p, const ChoiceState& st) {
  const Json j = Json::parse(st.forced_text, nullptr, /*allow_exceptions=*/false);
  std::vector<ToolCall> calls;
  if (st.forced == ChoiceState::Forced::kNamed) {
    if (j.is_object()) calls.push_back({p.tool_choice_name, j.dump()});
    return calls;
  }
  if (!j.is_array()) return {};
  for (const Json& x : j) {
    if (!x.is_object() || !x.contains("name") || !x["name"].is_string() || !x.contains("parameters") ||
        !x["parameters"].is_object())
      return {};
    calls.push_back({x["name"].get<std::string>(), x["parameters"].dump()});
  }
  return calls;
}

// GBNF for exactly one of `choices` (vLLM's guided_choice). Non-ASCII bytes stay as they are
// (a literal matches its UTF-8 bytes); quotes, backslashes and control bytes are escaped.
std::string choice_gbnf(const std::vector<std::string>& choices) {
  std::string g = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i) g += " | ";
    g += '"';
    for (unsigned char ch : choices[i]) {
      if (ch == '"' || ch == '\\') {
        g += '\\';
        g += char(ch);
      } else if (ch < 0x20 || ch == 0x7f) {
        static constexpr char kHex[] = "0123456789ABCDEF";
        g += "\\x";
        g += kHex[ch >> 4];
        g += kHex[ch & 15];
      } else {
        g += char(ch);
      }
    }
    g += '"';
  }
  return g;
}

// Rewrites the local $refs of a schema that is embedded at JSON pointer `at` of a larger
// one, so that they still point into it ("#" -> "#<at>", "#/$defs/x" -> "#<at>/$defs/x"): a
// tool's parameters (pydantic's $defs) inside the "required" array schema. Values that
// are data, not schemas (enum, const, default, examples), are left as they are.
void rebase_refs(Json& s, const std::string& at) {
  if (s.is_array()) {
    for (Json& v : s) rebase_refs(v, at);
    return;
  }
  if (!s.is_object()) return;
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& key = it.key();
    if (key == "enum" || key == "const" || key == "default" || key == "examples") continue;
    if (key == "$ref" && it->is_string()) {
      const std::string ref = it->get<std::string>();
      if (!ref.empty() && ref[0] == '#') *it = "#" + at + ref.substr(1);
    } else {
      rebase_refs(*it, at);
    }
  }
}

// The JSON a forced tool choice constrains the output to: the named function's arguments
// (its parameters schema), or for "required" an array of one or more {"name", "parameters"}
// calls of any of the tools (vLLM's form; one with parallel_tool_calls false), each tool's
// local $refs rebased to where its parameters sit. A tool without parameters takes any object.
Json forced_tool_schema(const CompletionParams& p) {
  auto params = [](const Json& tool) {
    const Json& fn = tool["function"];
    return fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"] : Json{{"type", "object"}};
  };
  Json any = Json::array();
  for (const Json& t : p.tools) {
    if (p.tool_choice == "function" && t["function"]["name"] == p.tool_choice_name) return params(t);
    Json parameters = params(t);
    rebase_refs(parameters, "/items/anyOf/" + std::to_string(any.size()) + "/properties/parameters");
    any.push_back({{"type", "object"},
                   {"properties", {{"name", {{"const", t["function"]["name"]}}}, {"parameters", std::move(parameters)}}},
                   {"required", {"name", "parameters"}},
                   {"additionalProperties", false}});
  }
  Json array = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", any}}}};
  if (!p.parallel_tool_calls) array["maxItems"] = 1;
  return array;
}

}  // namespace

size_t absorb(Call& c, const RequestUpdate& u) {
  const size_t p = c.prompt_of(u.id);
  PromptState& ps = c.prompts[p];
  ps.logprobs.insert(ps.logprobs.end(), u.prompt_logprobs.begin(), u.prompt_logprobs.end());
  for (auto& cu : u.choices) {
    ChoiceState& st = c.choices.at(p * size_t(c.params.n) + size_t(cu.index));
    const size_t base = st.text.size();
    const bool last = cu.finish != FinishReason::kNone;
    if (c.params.chat) {
      // Reasoning apart first, then tool calls out of the answer.
      if (st.splitter) {
        st.last = st.splitter->feed(cu.text);
        if (last) {
          const ReasoningSplitter::Delta rest = st.splitter->finish();
          st.last.reasoning += rest.reasoning;
          st.last.content += rest.content;
        }
      } else {
        st.last = {{}, cu.text};
      }
      if (st.forced != ChoiceState::Forced::kNone) {
        // A named function's output is its arguments: they stream as the call's pieces.
        const bool named = st.forced == ChoiceState::Forced::kNamed;
        st.fragments.clear();
        if (named && !st.last.content.empty())
          st.fragments.push_back({0, st.forced_text.empty() ? c.params.tool_choice_name : "", st.last.content});
        if (!named) st.fragments = st.required_calls.feed(st.last.content);
        st.forced_text += st.last.content;
        st.last.content.clear();
        if (last) {
          std::vector<ToolCall> calls = forced_calls(c.params, st);
          // Cut short (max_tokens): a named call whose pieces are out is released as
          // streamed; otherwise the text as it is.
          if (named && calls.empty() && !st.forced_text.empty())
            calls.push_back({c.params.tool_choice_name, st.forced_text});
          if (named && !calls.empty()) calls[0].streamed = true;
          // The calls whose pieces are out are what those said; the rest, if the array
          // parsed, come whole.
          if (!named) calls = st.required_calls.released(std::move(calls));
          if (calls.empty()) st.last.content = st.forced_text;
          for (auto& call : calls) {
            call.id = call_id(st, st.calls.size());
            st.calls.push_back(std::move(call));
          }
        }
      } else if (st.tools) {
        ToolCallDelta d = st.tools->feed(st.last.content);
        if (last) {
          ToolCallDelta rest = st.tools->finish();
          d.content += rest.content;
          for (auto& call : rest.calls) d.calls.push_back(std::move(call));
          for (auto& f : rest.fragments) d.fragments.push_back(std::move(f));
        }
        st.last.content = std::move(d.content);
        st.fragments = std::move(d.fragments);
        if (!c.params.parallel_tool_calls) {  // one call at most: the first
          std::erase_if(st.fragments, [](const ToolCallFragment& f) { return f.call > 0; });
          d.calls.resize(std::min(d.calls.size(), st.calls.empty() ? size_t(1) : size_t(0)));
        }
        for (auto& call : d.calls) {
          call.id = call_id(st, st.calls.size());
          st.calls.push_back(std::move(call));
        }
      }
      st.reasoning += st.last.reasoning;
      st.text += st.last.content;
    } else {
      st.text += cu.text;
    }
    st.tokens.insert(st.tokens.end(), cu.tokens.begin(), cu.tokens.end());
    if (c.params.logprobs && !cu.logprobs.empty())
      append_logprobs(st.logprobs, logprobs_json(*c.model, cu, c.params.chat, base), c.params.chat);
    if (cu.finish != FinishReason::kNone) st.finish = finish_name(st, cu.finish);
  }
  if (u.done) {
    ps.done = true;
    ps.prompt_tokens = u.prompt_tokens;
    ps.cached_tokens = u.cached_tokens;
    ps.completion_tokens = u.completion_tokens;
    if (!u.error.empty() && c.error.empty()) {
      c.error = u.error;
      c.cancel_requests();
    }
  }
  return p;
}

namespace {

bool write(httplib::DataSink& sink, const std::string& s) { return sink.write(s.data(), s.size()); }

// `chat_text`: the rendered chat prompt (chat requests).
std::vector<int32_t> build_prompt(const ServedModel& m, const CompletionParams& p, std::string* chat_text) {
  if (p.chat) {
    KILN_CHECK(chat_text, "a chat prompt renders into chat_text");
    if (!m.tokenizer || !m.chat_template)
      throw ApiError(400, "model '" + m.name + "' has no chat template; use /v1/completions", "messages");
    tok::ChatTemplateOptions o;
    o.bos_token = m.tokenizer->bos_token();
    o.eos_token = m.tokenizer->eos_token();
    o.extra = p.template_kwargs;
    if (!p.tools.empty()) o.extra["tools"] = p.tools;
    *chat_text = m.chat_template->render(p.messages, o);
    return m.tokenizer->encode(*chat_text, /*add_special=*/false);
  }
  if (!p.prompt_ids.empty()) return p.prompt_ids;
  if (!m.tokenizer)
    throw ApiError(400, "model '" + m.name + "' has no tokenizer; send the prompt as an array of token ids", "prompt");
  return m.tokenizer->encode(p.prompt_text);
}

}  // namespace

// vLLM's /tokenize and /detokenize: a prompt or chat messages to the token ids a
// completion would run (with the model's context), or ids back to text.
void Server::Impl::handle_tokenize(const httplib::Request& req, httplib::Response& res, bool detokenize) {
  const char* endpoint = detokenize ? "/detokenize" : "/tokenize";
  std::string model_name;
  try {
    const Json body = parse_json_body(req.body);
    ServedModel* m = nullptr;
    auto find_model = [&](const std::string& name) {
      model_name = name;
      m = repo.find(name);
      if (!m) throw ApiError(404, "model '" + name + "' does not exist", "model", "invalid_request_error", "model_not_found");
      if (!m->tokenizer) throw ApiError(400, "model '" + name + "' has no tokenizer", "model");
    };
    Json out;
    if (detokenize) {
      DetokenizeParams d = parse_detokenize(body);
      find_model(d.model);
      const int64_t vocab = int64_t(m->tokenizer->vocab_size());
      for (int32_t t : d.tokens)
        if (t >= vocab)
          throw ApiError(400, "token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(vocab) +
                                  " tokens)", "tokens");
      out = {{"prompt", m->tokenizer->decode(d.tokens)}};
    } else {
      TokenizeParams t = parse_tokenize(body, opt.limits);
      find_model(t.request.model);
      std::string chat_text;
      std::vector<int32_t> ids = t.request.chat || !t.request.prompt_ids.empty() || t.add_special_tokens
                                     ? build_prompt(*m, t.request, &chat_text)
                                     : m->tokenizer->encode(t.request.prompt_text, /*add_special=*/false);
      if (t.request.chat && t.add_special_tokens) {
        // Messages with add_special_tokens: the tokenizer's own BOS in front, as vLLM adds it.
        std::vector<int32_t> with = m->tokenizer->encode(chat_text, /*add_special=*/true);
        ids = std::move(with);
      }
      const int64_t max_len = m->executor ? m->executor->max_context() : m->model->info().max_positions;
      out = {{"count", ids.size()}, {"max_model_len", max_len}, {"tokens", ids}};
    }
    metrics.count_request(model_name, endpoint, 200);
    send_json(res, 200, out);
  } catch (const ApiError& e) {
    reply_error(res, model_name, endpoint, e);
  } catch (const Error& e) {
    reply_error(res, model_name, endpoint, e);
  }
}

std::shared_ptr<const Grammar> Server::Impl::request_grammar(const CompletionParams& p) {
  Json schema = p.json_schema;
  std::string key, param = "response_format";
  if (p.tool_choice == "required" || p.tool_choice == "function") {
    schema = forced_tool_schema(p);
    param = "tools";
  }
  if (!schema.is_null()) {
    key = "json:" + schema.dump();
  } else if (!p.grammar.empty()) {
    key = "gbnf:" + p.grammar;
    param = "grammar";
  } else if (!p.guided_choice.empty()) {
    key = "gbnf:" + choice_gbnf(p.guided_choice);
    param = "guided_choice";
  } else {
    return nullptr;
  }
  {
    std::lock_guard lk(grammars_mu);
    if (auto it = grammars.find(key); it != grammars.end()) return it->second;
  }
  std::shared_ptr<const Grammar> g;
  try {  // outside the lock: a large schema takes a while
    g = !schema.is_null() ? grammar_from_json_schema(schema) : grammar_from_gbnf(std::string_view(key).substr(5));
  } catch (const Error& e) {
    throw ApiError(400, std::string("cannot constrain decoding to it: ") + e.what(), param);
  }
  std::lock_guard lk(grammars_mu);
  if (grammars.size() >= kMaxGrammars) grammars.clear();
  grammars.emplace(key, g);
  return g;
}

void Server::Impl::submit_call(const std::shared_ptr<Call>& call, const httplib::Request& req) {
  CompletionParams& p = call->params;
  const bool chat = p.chat;
  ServedModel* m = repo.find(p.model);
  if (!m) throw ApiError(404, "model '" + p.model + "' does not exist", "model", "invalid_request_error", "model_not_found");
  if (!m->is_decoder())
    throw ApiError(400, "model '" + p.model + "' is " + (m->model->info().is_decoder ? "an embedding model" : "an encoder") +
                            "; use /v1/embeddings, /v1/rerank or /v2/models/" + p.model + "/infer", "model");
  if (p.session_id.empty()) p.session_id = req.get_header_value("X-Session-Id");
  if (!p.session_id.empty() && !p.more_prompts.empty())
    throw ApiError(400, "a session holds one conversation: a batch of prompts cannot carry a session id", "prompt");
  // --tool-call-parser auto: the format the model's chat template shows.
  const ToolParser tool_parser = opt.tool_parser != ToolParser::kAuto ? opt.tool_parser
                                 : m->chat_template ? tool_parser_for_template(m->chat_template->source())
                                                    : ToolParser::kNone;
  if (p.tool_choice == "auto" && tool_parser == ToolParser::kNone)
    throw ApiError(400,
                   std::string("tool_choice \"auto\" (the default with 'tools') needs to know how the model writes "
                               "tool calls: ") +
                       (opt.tool_parser == ToolParser::kAuto
                            ? "its chat template shows no format kiln reads; start the server with "
                            : "start the server with ") +
                       "--tool-call-parser (hermes, llama3_json, mistral, pythonic, granite, qwen3_xml, phi4_mini_json), or send "
                       "tool_choice "
                       "\"required\" or a function",
                   "tool_choice");
  const bool forced = p.tool_choice == "required" || p.tool_choice == "function";
  if (forced && (p.json_object || !p.json_schema.is_null() || !p.grammar.empty() || !p.guided_choice.empty()))
    throw ApiError(400, "tool_choice \"" + p.tool_choice + "\" constrains the output itself; drop the response format",
                   "tool_choice");
  if (!m->tokenizer) p.return_token_ids = true;  // no text to return: the ids are the output
  call->model = m;
  // The prompts: chat's rendered messages, or a completion's prompt and its batch.
  std::string chat_text;
  std::vector<std::vector<int32_t>> prompts = {build_prompt(*m, p, &chat_text)};
  std::vector<std::string> texts = {p.prompt_text};
  for (const CompletionParams::Prompt& more : p.more_prompts) {
    CompletionParams one;
    one.prompt_text = more.text;
    one.prompt_ids = more.ids;
    prompts.push_back(build_prompt(*m, one, nullptr));
    texts.push_back(more.text);
  }
  const int64_t ctx = m->executor->max_context();
  if (const int32_t most = m->executor->options().max_running; p.n > most)
    throw ApiError(400, "n is " + std::to_string(p.n) + ", but this server runs at most " + std::to_string(most) +
                            " sequences at once (--max-running) and a request's n choices run together",
                   "n");
  int64_t max_tokens = p.max_tokens;
  for (size_t k = 0; k < prompts.size(); ++k) {
    const std::vector<int32_t>& prompt = prompts[k];
    const std::string where = prompts.size() > 1 ? "prompt " + std::to_string(k) + ": " : "";
    if (prompt.empty()) throw ApiError(400, where + "the prompt encodes to no tokens", chat ? "messages" : "prompt");
    if (p.max_tokens < 0) max_tokens = std::min<int64_t>(opt.limits.max_tokens, ctx - int64_t(prompt.size()));
    if (max_tokens < (p.echo ? 0 : 1) || int64_t(prompt.size()) + max_tokens > ctx)
      throw ApiError(400, where + "this model's maximum context length is " + std::to_string(ctx) +
                              " tokens; you requested " +
                              std::to_string(int64_t(prompt.size()) + std::max<int64_t>(max_tokens, 0)) + " (" +
                              std::to_string(prompt.size()) + " in the prompt, " +
                              std::to_string(std::max<int64_t>(max_tokens, 0)) +
                              " for the completion); shorten the prompt or lower max_tokens",
                     chat ? "messages" : "prompt", "invalid_request_error", "context_length_exceeded");
  }
  GenerationRequest g;
  g.prompt_logprobs = std::max(p.prompt_logprobs, p.echo && p.logprobs ? p.sampling.logprobs : -1);
  g.sampling = p.sampling;
  g.max_tokens = int32_t(max_tokens);
  g.n = p.n;
  g.stop_ids = p.stop_token_ids;
  g.stop = p.stop;
  g.ignore_eos = p.ignore_eos;
  g.json_object = p.json_object;
  g.grammar = request_grammar(p);
  g.priority = p.priority;
  g.session_id = p.session_id;
  call->srv = this;
  call->prompts.resize(prompts.size());
  call->choices.resize(prompts.size() * size_t(p.n));
  for (size_t k = 0; k < prompts.size(); ++k) {
    PromptState& ps = call->prompts[k];
    if (p.echo) ps.echo_text = texts[k].empty() && m->tokenizer ? m->tokenizer->decode(prompts[k]) : texts[k];
    if (p.echo || p.prompt_logprobs >= 0) ps.ids = prompts[k];
    for (size_t i = 0; i < size_t(p.n); ++i) call->choices[k * size_t(p.n) + i].text = ps.echo_text;  // offsets count it
  }
  for (ChoiceState& st : call->choices) {
    if (chat && opt.reasoning_parser) st.splitter.emplace(ReasoningSplitter::prompt_opens_reasoning(chat_text));
    if (chat && p.tool_choice == "auto") st.tools.emplace(tool_parser, p.tools, p.stream);
    if (chat && p.tool_choice == "required") st.forced = ChoiceState::Forced::kRequired;
    if (chat && p.tool_choice == "function") st.forced = ChoiceState::Forced::kNamed;
  }
  call->created = unix_now();
  call->id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
  auto ch = call->channel;
  ++active;
  try {
    for (size_t k = 0; k < prompts.size(); ++k) {
      GenerationRequest one = g;
      one.prompt = std::move(prompts[k]);
      call->prompts[k].request_id = m->executor->submit(std::move(one), [ch](RequestUpdate&& u) { ch->push(std::move(u)); });
    }
  } catch (...) {
    call->cancel_requests();  // those already submitted
    --active;
    throw;
  }
}

void serve_call(const std::shared_ptr<Call>& call, httplib::Response& res, CallWriter writer) {
  if (call->params.stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [call, writer](size_t, httplib::DataSink& sink) {
          if (!call->head_sent) {
            call->head_sent = true;
            if (!writer.head.empty() && !write(sink, writer.head)) {
              call->cancel();
              return false;
            }
          }
          RequestUpdate u;
          if (!call->channel->pop(u, std::chrono::milliseconds(1000))) {
            if (write(sink, ": keep-alive\n\n")) return true;
            call->cancel();
            return false;
          }
          const size_t prompt = absorb(*call, u);
          const bool all_done = call->all_done();
          std::string out = writer.event(*call, prompt, u);
          if (all_done) out += writer.end(*call);
          if (!out.empty() && !write(sink, out)) {
            call->cancel();
            return false;
          }
          if (all_done) {
            call->settle(call->error.empty() ? 200 : 500);
            sink.done();
          }
          return true;
        },
        [call](bool success) {
          if (!success) call->cancel();
        });
    return;
  }
  res.set_chunked_content_provider(
      "application/json",
      [call, writer](size_t, httplib::DataSink& sink) {
        RequestUpdate u;
        if (!call->channel->pop(u, std::chrono::milliseconds(1000))) {
          if (write(sink, " ")) return true;
          call->cancel();
          return false;
        }
        const size_t prompt = absorb(*call, u);
        if (writer.event) writer.event(*call, prompt, u);  // its state only: nothing streams
        if (!call->all_done()) return true;
        const std::string body = writer.body(*call);
        if (!write(sink, body)) {
          call->cancel();
          return false;
        }
        call->settle(call->error.empty() ? 200 : 500);
        sink.done();
        return true;
      },
      [call](bool success) {
        if (!success) call->cancel();
      });
}

void Server::Impl::handle_completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  const char* endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
  auto call = std::make_shared<Call>();
  std::string model_name;
  try {
    if (draining) throw ApiError(503, "the server is shutting down", {}, "server_error");
    Json body = parse_json_body(req.body);
    call->params = parse_completion(body, chat, opt.limits);
    model_name = call->params.model;
    submit_call(call, req);
  } catch (const ApiError& e) {
    return reply_error(res, model_name, endpoint, e);
  } catch (const Error& e) {
    return reply_error(res, model_name, endpoint, e);
  }
  CallWriter writer;
  if (call->params.stream) writer.event = [](Call& c, size_t prompt, const RequestUpdate& u) {
    std::string out;
    if (!c.prompts[prompt].echo_sent && (!u.choices.empty() || u.done)) out += echo_chunks(c, prompt);
    for (auto& cu : u.choices)
      out += "data: " + dump(stream_chunk(c, cu, prompt * size_t(c.params.n) + size_t(cu.index))) + "\n\n";
    return out;
  };
  writer.end = [](Call& c) {
    std::string out;
    if (!c.error.empty()) out += "data: " + dump(error_body(500, c.error, "server_error")) + "\n\n";
    if (c.params.include_usage) {
      Json j = envelope(c, true);
      j["choices"] = Json::array();
      j["usage"] = usage_json(c);
      out += "data: " + dump(j) + "\n\n";
    }
    return out + "data: [DONE]\n\n";
  };
  writer.body = [](Call& c) {
    return c.error.empty() ? dump(final_body(c)) : dump(error_body(500, c.error, "server_error"));
  };
  serve_call(call, res, std::move(writer));
}

}  // namespace kiln::server
