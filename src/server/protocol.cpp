// Request parsing and validation (see protocol.h). Every field is type-checked before
// use; unknown fields are ignored as OpenAI's API does; unsupported options that would
// change results (chat's echo, best_of > n) are refused rather than ignored.
#include "server/protocol.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/status.h"
#include "runtime/grammar.h"
#include "server/protocol_fields.h"

namespace kiln::server {

Json error_body(int status, const std::string& message, const std::string& type,
                const std::string& param, const std::string& code) {
  Json e = {{"message", message}, {"type", type}};
  e["param"] = param.empty() ? Json(nullptr) : Json(param);
  e["code"] = code.empty() ? Json(status) : Json(code);
  return Json{{"error", e}};
}

Json error_body(const ApiError& e) { return error_body(e.status, e.what(), e.type, e.param, e.code); }

Json parse_json_body(const std::string& body) {
  if (body.empty()) throw ApiError(400, "the request body is empty; expected a JSON object");
  Json j;
  try {
    j = Json::parse(body);
  } catch (const std::exception& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

[[noreturn]] void bad_type(const std::string& key, const char* want) {
  throw ApiError(400, "'" + key + "' must be " + want, key);
}

const Json* field(const Json& j, const std::string& key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

double get_number(const Json& j, const std::string& key, double def, double lo, double hi) {
  const Json* v = field(j, key);
  if (!v) return def;
  if (!v->is_number()) bad_type(key, "a number");
  double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw ApiError(400, "'" + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                            "], got " + v->dump(),
                   key);
  return x;
}

int64_t get_int(const Json& j, const std::string& key, int64_t def, int64_t lo, int64_t hi) {
  const Json* v = field(j, key);
  if (!v) return def;
  if (!v->is_number_integer() && !(v->is_number_float() && std::floor(v->get<double>()) == v->get<double>()))
    bad_type(key, "an integer");
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (d < double(lo) || d > double(hi))
      throw ApiError(400, "'" + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                              "], got " + v->dump(), key);
    return int64_t(d);
  }
  // Unsigned values above INT64_MAX arrive as number_unsigned.
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    throw ApiError(400, "'" + key + "' is out of range, got " + v->dump(), key);
  int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    throw ApiError(400, "'" + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                            "], got " + std::to_string(x), key);
  return x;
}

bool get_bool(const Json& j, const std::string& key, bool def) {
  const Json* v = field(j, key);
  if (!v) return def;
  if (!v->is_boolean()) bad_type(key, "a boolean");
  return v->get<bool>();
}

std::string get_string(const Json& j, const std::string& key, bool required) {
  const Json* v = field(j, key);
  if (!v) {
    if (required) throw ApiError(400, "'" + key + "' is required", key);
    return {};
  }
  if (!v->is_string()) bad_type(key, "a string");
  return v->get<std::string>();
}

namespace {

std::vector<int32_t> token_ids(const Json& a, const std::string& key) {
  std::vector<int32_t> ids;
  for (const Json& t : a) {
    if (!t.is_number_integer()) bad_type(key, "a string or an array of token ids");
    int64_t x = t.get<int64_t>();
    if (x < 0 || x > std::numeric_limits<int32_t>::max())
      throw ApiError(400, "'" + key + "' holds token id " + t.dump() + ", outside [0, 2^31)", key);
    ids.push_back(int32_t(x));
  }
  return ids;
}

// A JSON Schema given as an object (or a boolean), or as its JSON text (vLLM's guided_json).
Json schema_value(const Json& s, const std::string& key) {
  if (s.is_object() || s.is_boolean()) return s;
  if (s.is_string()) {
    Json parsed = Json::parse(s.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded() && (parsed.is_object() || parsed.is_boolean())) return parsed;
  }
  bad_type(key, "a JSON Schema (an object or its JSON text)");
}

void parse_sampling(const Json& j, CompletionParams& p, const RequestLimits& limits) {
  SamplingParams& s = p.sampling;
  s.temperature = float(get_number(j, "temperature", 1.0, 0.0, 2.0));
  s.top_p = float(get_number(j, "top_p", 1.0, 0.0, 1.0));
  if (s.top_p <= 0) throw ApiError(400, "'top_p' must be in (0, 1]", "top_p");
  s.top_k = int32_t(get_int(j, "top_k", 0, -1, 1 << 20));
  s.min_p = float(get_number(j, "min_p", 0.0, 0.0, 1.0));
  s.repetition_penalty = float(get_number(j, "repetition_penalty", 1.0, 0.01, 10.0));
  s.presence_penalty = float(get_number(j, "presence_penalty", 0.0, -2.0, 2.0));
  s.frequency_penalty = float(get_number(j, "frequency_penalty", 0.0, -2.0, 2.0));
  if (field(j, "seed")) s.seed = uint64_t(get_int(j, "seed", 0, std::numeric_limits<int64_t>::min(),
                                                   std::numeric_limits<int64_t>::max()));
  p.n = int32_t(get_int(j, "n", 1, 1, limits.max_n));
  if (field(j, "best_of") && get_int(j, "best_of", p.n, 1, limits.max_n) != p.n)
    throw ApiError(400, "'best_of' other than n is not supported", "best_of");
  if (const Json* lb = field(j, "logit_bias"); lb && !lb->is_null()) {
    // {"<token id>": bias in [-100, 100], ...}, as OpenAI's API takes it.
    if (!lb->is_object()) bad_type("logit_bias", "an object mapping token ids to biases");
    if (lb->size() > size_t(limits.max_logit_bias))
      throw ApiError(400, "'logit_bias' has more than " + std::to_string(limits.max_logit_bias) + " entries",
                     "logit_bias");
    for (const auto& [key, value] : lb->items()) {
      char* end = nullptr;
      errno = 0;
      const long long id = key.empty() ? -1 : std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || errno != 0 || id < 0 || id > std::numeric_limits<int32_t>::max())
        throw ApiError(400, "'logit_bias' key '" + key + "' is not a token id", "logit_bias");
      if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < -100 ||
          value.get<double>() > 100)
        throw ApiError(400, "'logit_bias' of token " + key + " must be a number in [-100, 100]", "logit_bias");
      s.logit_bias.emplace_back(int32_t(id), float(value.get<double>()));
    }
  }
  if (const Json* st = field(j, "stop")) {
    if (st->is_string()) {
      p.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      for (const Json& x : *st) {
        if (!x.is_string()) bad_type("stop", "a string or an array of strings");
        p.stop.push_back(x.get<std::string>());
      }
    } else {
      bad_type("stop", "a string or an array of strings");
    }
    if (int32_t(p.stop.size()) > limits.max_stop)
      throw ApiError(400, "'stop' has more than " + std::to_string(limits.max_stop) + " entries", "stop");
    for (auto& x : p.stop)
      if (x.size() > limits.max_stop_bytes)
        throw ApiError(400, "a 'stop' string is longer than " + std::to_string(limits.max_stop_bytes) + " bytes",
                       "stop");
  }
  if (const Json* ids = field(j, "stop_token_ids")) {
    if (!ids->is_array()) bad_type("stop_token_ids", "an array of token ids");
    p.stop_token_ids = token_ids(*ids, "stop_token_ids");
  }
  p.ignore_eos = get_bool(j, "ignore_eos", false);
  if (const Json* rf = field(j, "response_format"); rf && !rf->is_null()) {
    // {"type": "text"} (the default) or {"type": "json_object"}; a JSON schema is refused
    // rather than ignored.
    if (!rf->is_object()) bad_type("response_format", "an object");
    const std::string type = get_string(*rf, "type", true);
    if (type == "json_object") {
      // llama.cpp's server takes a schema here too.
      if (const Json* s = field(*rf, "schema"); s && !s->is_null()) p.json_schema = schema_value(*s, "response_format");
      else p.json_object = true;
    } else if (type == "json_schema") {
      const Json* js = field(*rf, "json_schema");
      if (!js || !js->is_object()) throw ApiError(400, "response_format json_schema needs a 'json_schema' object", "response_format");
      const Json* s = field(*js, "schema");
      if (!s) throw ApiError(400, "response_format json_schema needs 'json_schema.schema'", "response_format");
      p.json_schema = schema_value(*s, "response_format");
    } else if (type != "text") {
      throw ApiError(400, "'response_format' type '" + type + "' is not supported (text, json_object, json_schema)",
                     "response_format");
    }
  }
  // vLLM's structured_outputs object (since v0.12) and its older top-level guided_* fields;
  // llama.cpp's json_schema and grammar.
  auto constraint = [&](const std::string& kind, const Json& v, const std::string& key) {
    if (v.is_null()) return;
    if (kind == "json") {
      if (!p.json_schema.is_null()) throw ApiError(400, "more than one JSON schema given", key);
      p.json_schema = schema_value(v, key);
    } else if (kind == "grammar") {
      if (!v.is_string() || v.get<std::string>().empty()) bad_type(key, "a non-empty GBNF grammar");
      if (!p.grammar.empty()) throw ApiError(400, "more than one grammar given", key);
      p.grammar = v.get<std::string>();
      if (p.grammar.size() > 65536) throw ApiError(400, "'" + key + "' is longer than 64 KiB", key);
    } else if (kind == "choice") {
      if (!v.is_array() || v.empty()) bad_type(key, "a non-empty array of strings");
      if (!p.guided_choice.empty()) throw ApiError(400, "more than one choice list given", key);
      for (const Json& x : v) {
        if (!x.is_string() || x.get<std::string>().empty()) bad_type(key, "a non-empty array of non-empty strings");
        p.guided_choice.push_back(x.get<std::string>());
      }
    } else if (kind == "regex") {
      // The whole output matches it: compiled here to GBNF, so a bad pattern is named at once.
      if (!v.is_string() || v.get<std::string>().empty()) bad_type(key, "a non-empty regular expression");
      if (!p.grammar.empty()) throw ApiError(400, "more than one grammar or regex given", key);
      if (v.get<std::string>().size() > 65536) throw ApiError(400, "'" + key + "' is longer than 64 KiB", key);
      try {
        p.grammar = regex_to_gbnf(v.get<std::string>());
      } catch (const Error& e) {
        throw ApiError(400, "'" + key + "': " + e.what(), key);
      }
    } else {  // whitespace_pattern, structural_tag: they would change the output
      throw ApiError(400, "'" + key + "' is not supported (json, grammar, regex and choice are)", key);
    }
  };
  for (const char* kind : {"json", "grammar", "choice", "regex", "whitespace_pattern"})
    if (const Json* v = field(j, std::string("guided_") + kind)) constraint(kind, *v, std::string("guided_") + kind);
  if (const Json* v = field(j, "json_schema")) constraint("json", *v, "json_schema");
  if (const Json* v = field(j, "grammar")) constraint("grammar", *v, "grammar");
  if (const Json* so = field(j, "structured_outputs"); so && !so->is_null()) {
    if (!so->is_object()) bad_type("structured_outputs", "an object");
    for (const auto& [kind, v] : so->items())
      if (kind == "json" || kind == "grammar" || kind == "choice" || kind == "regex" || kind == "whitespace_pattern" ||
          kind == "structural_tag")
        constraint(kind, v, "structured_outputs." + kind);
    // Other keys (disable_fallback, disable_any_whitespace, ...) choose among backends: none here.
  }
  if (int(p.json_object) + int(!p.json_schema.is_null()) + int(!p.grammar.empty()) + int(!p.guided_choice.empty()) > 1)
    throw ApiError(400, "give at most one of response_format, a JSON schema, a grammar and guided_choice",
                   "response_format");
  p.priority = int32_t(get_int(j, "priority", 0, -1000000, 1000000));
  p.session_id = get_string(j, "session_id", false);
  if (p.session_id.size() > 256) throw ApiError(400, "'session_id' is longer than 256 bytes", "session_id");
  p.return_token_ids = get_bool(j, "return_token_ids", false);
  p.stream = get_bool(j, "stream", false);
  if (const Json* so = field(j, "stream_options")) {
    if (!so->is_object()) bad_type("stream_options", "an object");
    p.include_usage = get_bool(*so, "include_usage", false);
  }
}

// An assistant message's tool_calls as chat templates read them: OpenAI's
// {"id", "type": "function", "function": {"name", "arguments": "<JSON text>"}} with the
// arguments parsed into an object (what HF templates and vLLM give them: Qwen2.5's writes
// `arguments | tojson`).
Json tool_calls_for_template(const Json& calls) {
  if (!calls.is_array()) bad_type("messages[].tool_calls", "an array of tool calls");
  Json out = Json::array();
  for (const Json& call : calls) {
    if (!call.is_object()) bad_type("messages[].tool_calls", "an array of tool calls");
    const Json* fn = field(call, "function");
    if (!fn || !fn->is_object()) throw ApiError(400, "a tool call needs a 'function' object", "messages");
    Json f = {{"name", get_string(*fn, "name", true)}};
    const Json* args = field(*fn, "arguments");
    if (!args || args->is_null()) {
      f["arguments"] = Json::object();
    } else if (args->is_string()) {
      Json parsed = Json::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded() || !parsed.is_object())
        throw ApiError(400, "tool call '" + f["name"].get<std::string>() + "': 'arguments' is not a JSON object",
                       "messages");
      f["arguments"] = parsed;
    } else if (args->is_object()) {
      f["arguments"] = *args;
    } else {
      bad_type("messages[].tool_calls[].function.arguments", "a JSON object's text");
    }
    Json c = {{"type", "function"}, {"function", f}};
    if (const Json* id = field(call, "id"); id && id->is_string()) c["id"] = *id;
    out.push_back(c);
  }
  return out;
}

// tools and tool_choice (chat).
void parse_tools(const Json& j, CompletionParams& p) {
  const Json* tools = field(j, "tools");
  if (tools && !tools->is_null()) {
    if (!tools->is_array()) bad_type("tools", "an array of tools");
    if (tools->size() > 128) throw ApiError(400, "'tools' has more than 128 entries", "tools");
    for (const Json& t : *tools) {
      if (!t.is_object() || get_string(t, "type", false) != "function")
        throw ApiError(400, "every tool must be {\"type\": \"function\", \"function\": {...}}", "tools");
      const Json* fn = field(t, "function");
      if (!fn || !fn->is_object()) throw ApiError(400, "a tool needs a 'function' object", "tools");
      const std::string name = get_string(*fn, "name", true);
      if (name.empty() || name.size() > 64) throw ApiError(400, "a tool's name must have 1 to 64 characters", "tools");
      if (const Json* params = field(*fn, "parameters"); params && !params->is_null() && !params->is_object())
        bad_type("tools[].function.parameters", "a JSON Schema object");
      p.tools.push_back(t);
    }
  }
  const Json* choice = field(j, "tool_choice");
  if (!choice || choice->is_null()) {
    p.tool_choice = p.tools.empty() ? "none" : "auto";
  } else if (choice->is_string()) {
    p.tool_choice = choice->get<std::string>();
    if (p.tool_choice != "none" && p.tool_choice != "auto" && p.tool_choice != "required")
      throw ApiError(400, "'tool_choice' must be \"none\", \"auto\", \"required\" or a function", "tool_choice");
  } else if (choice->is_object()) {
    const Json* fn = field(*choice, "function");
    if (get_string(*choice, "type", false) != "function" || !fn || !fn->is_object())
      bad_type("tool_choice", "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    p.tool_choice = "function";
    p.tool_choice_name = get_string(*fn, "name", true);
    bool known = false;
    for (const Json& t : p.tools) known |= t["function"]["name"] == p.tool_choice_name;
    if (!known) throw ApiError(400, "tool_choice names '" + p.tool_choice_name + "', which is not in 'tools'", "tool_choice");
  } else {
    bad_type("tool_choice", "a string or an object");
  }
  p.parallel_tool_calls = get_bool(j, "parallel_tool_calls", true);
  if (p.tools.empty() && p.tool_choice != "none")
    throw ApiError(400, "'tool_choice' \"" + p.tool_choice + "\" needs 'tools'", "tool_choice");
}

}  // namespace

CompletionParams parse_completion(const Json& j, bool chat, const RequestLimits& limits) {
  CompletionParams p;
  p.chat = chat;
  p.model = get_string(j, "model", true);
  parse_sampling(j, p, limits);
  if (chat) {
    const Json* m = field(j, "messages");
    if (!m) throw ApiError(400, "'messages' is required", "messages");
    if (!m->is_array() || m->empty()) bad_type("messages", "a non-empty array of messages");
    for (const Json& msg : *m) {
      if (!msg.is_object()) bad_type("messages", "an array of objects");
      std::string role = get_string(msg, "role", true);
      if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
        throw ApiError(400, "unknown message role '" + role + "'", "messages");
      const Json* c = field(msg, "content");
      Json out = {{"role", role == "developer" ? "system" : role}};
      if (!c || c->is_null()) {
        out["content"] = "";
      } else if (c->is_string()) {
        out["content"] = *c;
      } else if (c->is_array()) {  // content parts: only text is understood
        std::string text;
        for (const Json& part : *c) {
          if (!part.is_object() || get_string(part, "type", true) != "text")
            throw ApiError(400, "only text content parts are supported", "messages");
          text += get_string(part, "text", true);
        }
        out["content"] = text;
      } else {
        bad_type("messages[].content", "a string or an array of content parts");
      }
      if (role == "assistant") {
        if (const Json* calls = field(msg, "tool_calls"); calls && !calls->is_null())
          out["tool_calls"] = tool_calls_for_template(*calls);
      }
      if (role == "tool") {
        // The call this answers; templates that show it (Llama 3.1, Mistral) read tool_call_id.
        for (const char* key : {"tool_call_id", "name"})
          if (const Json* v = field(msg, key); v && !v->is_null()) {
            if (!v->is_string()) bad_type(std::string("messages[].") + key, "a string");
            out[key] = *v;
          }
      }
      p.messages.push_back(out);
    }
    parse_tools(j, p);
    if (const Json* kw = field(j, "chat_template_kwargs"); kw && !kw->is_null()) {
      if (!kw->is_object()) bad_type("chat_template_kwargs", "an object of template variables");
      for (const auto& [name, value] : kw->items()) {
        if (name == "messages" || name == "add_generation_prompt" || name == "bos_token" || name == "eos_token")
          throw ApiError(400, "chat_template_kwargs may not set '" + name + "' (the server sets it)",
                         "chat_template_kwargs");
        p.template_kwargs[name] = value;
      }
    }
    int64_t mt = get_int(j, "max_completion_tokens", -1, 1, limits.max_tokens);
    p.max_tokens = int32_t(get_int(j, "max_tokens", mt, 1, limits.max_tokens));
    p.logprobs = get_bool(j, "logprobs", false);
    int64_t top = get_int(j, "top_logprobs", 0, 0, 20);
    if (top > 0 && !p.logprobs) throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
    p.sampling.logprobs = p.logprobs ? int32_t(top) : -1;
    for (const char* key : {"echo", "prompt_logprobs"})
      if (const Json* f = field(j, key); f && !f->is_null() && *f != false)
        throw ApiError(400, std::string("'") + key + "' is supported on /v1/completions only", key);
  } else {
    const Json* pr = field(j, "prompt");
    if (!pr) throw ApiError(400, "'prompt' is required", "prompt");
    if (pr->is_string()) {
      p.prompt_text = pr->get<std::string>();
    } else if (pr->is_array() && !pr->empty() && (*pr)[0].is_number_integer()) {
      p.prompt_ids = token_ids(*pr, "prompt");
    } else if (pr->is_array() && pr->size() == 1 && (*pr)[0].is_string()) {
      p.prompt_text = (*pr)[0].get<std::string>();
    } else if (pr->is_array() && pr->size() == 1 && (*pr)[0].is_array()) {
      p.prompt_ids = token_ids((*pr)[0], "prompt");
    } else if (pr->is_array() && pr->size() > 1 && ((*pr)[0].is_string() || (*pr)[0].is_array())) {
      if (pr->size() > limits.max_inputs)
        throw ApiError(400, "'prompt' has more than " + std::to_string(limits.max_inputs) + " prompts", "prompt");
      for (size_t k = 0; k < pr->size(); ++k) {
        const Json& one = (*pr)[k];
        CompletionParams::Prompt q;
        if (one.is_string() && (*pr)[0].is_string()) q.text = one.get<std::string>();
        else if (one.is_array() && (*pr)[0].is_array()) q.ids = token_ids(one, "prompt");
        else bad_type("prompt", "an array of strings or an array of token-id arrays");
        if (q.text.empty() && q.ids.empty()) throw ApiError(400, "prompt " + std::to_string(k) + " is empty", "prompt");
        if (k == 0) p.prompt_text = q.text, p.prompt_ids = q.ids;
        else p.more_prompts.push_back(std::move(q));
      }
    } else {
      bad_type("prompt", "a string or an array of token ids");
    }
    if (p.prompt_text.empty() && p.prompt_ids.empty()) throw ApiError(400, "'prompt' is empty", "prompt");
    p.echo = get_bool(j, "echo", false);
    p.max_tokens = int32_t(get_int(j, "max_tokens", 16, p.echo ? 0 : 1, limits.max_tokens));
    if (p.max_tokens == 0 && p.n > 1)
      throw ApiError(400, "'max_tokens' 0 (the prompt alone) needs n = 1", "max_tokens");
    int64_t lp = get_int(j, "logprobs", -1, 0, 20);
    p.logprobs = lp >= 0;
    p.sampling.logprobs = int32_t(lp);
    p.prompt_logprobs = int32_t(get_int(j, "prompt_logprobs", -1, 0, 20));
  }
  return p;
}

TokenizeParams parse_tokenize(const Json& body, const RequestLimits& limits) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  TokenizeParams t;
  const bool chat = field(body, "messages") != nullptr;
  t.request = parse_completion(body, chat, limits);
  if (!t.request.more_prompts.empty()) throw ApiError(400, "/tokenize takes one prompt", "prompt");
  t.add_special_tokens = get_bool(body, "add_special_tokens", !chat);
  return t;
}

DetokenizeParams parse_detokenize(const Json& body) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  DetokenizeParams d;
  d.model = get_string(body, "model", true);
  const Json* ids = field(body, "tokens");
  if (!ids) throw ApiError(400, "'tokens' is required", "tokens");
  if (!ids->is_array()) bad_type("tokens", "an array of token ids");
  d.tokens = token_ids(*ids, "tokens");
  return d;
}

EmbeddingParams parse_embeddings(const Json& j, const RequestLimits& limits) {
  EmbeddingParams p;
  p.model = get_string(j, "model", true);
  std::string fmt = get_string(j, "encoding_format", false);
  if (!fmt.empty() && fmt != "float" && fmt != "base64")
    throw ApiError(400, "'encoding_format' must be \"float\" or \"base64\"", "encoding_format");
  p.base64 = fmt == "base64";
  p.dimensions = get_int(j, "dimensions", 0, 1, int64_t(1) << 20);
  const Json* in = field(j, "input");
  if (!in) throw ApiError(400, "'input' is required", "input");
  if (in->is_string()) {
    p.texts.push_back(in->get<std::string>());
  } else if (in->is_array() && !in->empty()) {
    if ((*in)[0].is_number_integer()) {
      p.ids.push_back(token_ids(*in, "input"));
    } else {
      for (const Json& x : *in) {
        if (x.is_string()) p.texts.push_back(x.get<std::string>());
        else if (x.is_array()) p.ids.push_back(token_ids(x, "input"));
        else bad_type("input", "a string, an array of strings or an array of token-id arrays");
      }
      if (!p.texts.empty() && !p.ids.empty())
        throw ApiError(400, "'input' mixes strings and token arrays", "input");
    }
  } else {
    bad_type("input", "a string, an array of strings or an array of token-id arrays");
  }
  size_t n = p.texts.size() + p.ids.size();
  if (n > limits.max_inputs)
    throw ApiError(400, "'input' has " + std::to_string(n) + " entries, more than the limit of " +
                            std::to_string(limits.max_inputs), "input");
  for (auto& t : p.texts)
    if (t.empty()) throw ApiError(400, "'input' contains an empty string", "input");
  for (auto& t : p.ids)
    if (t.empty()) throw ApiError(400, "'input' contains an empty token array", "input");
  return p;
}

RerankParams parse_rerank(const Json& j, const RequestLimits& limits) {
  RerankParams p;
  p.model = get_string(j, "model", true);
  p.query = get_string(j, "query", true);
  if (p.query.empty()) throw ApiError(400, "'query' is empty", "query");
  const Json* docs = field(j, "documents");
  if (!docs) throw ApiError(400, "'documents' is required", "documents");
  if (!docs->is_array() || docs->empty()) bad_type("documents", "a non-empty array of strings or {\"text\": ...} objects");
  if (docs->size() > limits.max_inputs)
    throw ApiError(400, "'documents' has " + std::to_string(docs->size()) + " entries, more than the limit of " +
                            std::to_string(limits.max_inputs), "documents");
  for (const Json& d : *docs) {
    const Json* text = d.is_object() ? field(d, "text") : &d;
    if (!text || !text->is_string()) bad_type("documents", "an array of strings or {\"text\": ...} objects");
    if (text->get_ref<const std::string&>().empty()) throw ApiError(400, "'documents' contains an empty text", "documents");
    p.documents.push_back(text->get<std::string>());
  }
  p.top_n = get_int(j, "top_n", 0, 1, std::numeric_limits<int32_t>::max());
  p.return_documents = get_bool(j, "return_documents", false);
  return p;
}

KserveInferParams parse_kserve_infer(const Json& j, const RequestLimits& limits) {
  KserveInferParams p;
  p.id = get_string(j, "id", false);
  const Json* in = field(j, "inputs");
  if (!in || !in->is_array() || in->size() != 1)
    throw ApiError(400, "'inputs' must be an array with one BYTES tensor of texts", "inputs");
  const Json& t = (*in)[0];
  if (!t.is_object()) bad_type("inputs[0]", "an object");
  p.input_name = get_string(t, "name", true);
  const std::string dtype = get_string(t, "datatype", true);
  const bool ids = dtype == "INT32" || dtype == "INT64";
  if (dtype != "BYTES" && !ids)
    throw ApiError(400, "inputs[0].datatype must be BYTES (texts) or INT32/INT64 (token ids)", "inputs");
  const Json* shape = field(t, "shape");
  const Json* data = field(t, "data");
  if (!shape || !shape->is_array()) bad_type("inputs[0].shape", "an array of integers");
  if (!data || !data->is_array()) bad_type("inputs[0].data", "an array");
  std::vector<int64_t> dims;
  int64_t elems = 1;
  for (const Json& d : *shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (1 << 20))
      bad_type("inputs[0].shape", "an array of non-negative integers");
    dims.push_back(d.get<int64_t>());
    elems *= dims.back();
  }
  if (ids ? dims.size() != 2 : (dims.size() < 1 || dims.size() > 2 || (dims.size() == 2 && dims[1] != 1)))
    throw ApiError(400, ids ? "token ids must have shape [N, L]" : "texts must have shape [N] or [N, 1]", "inputs");
  if (elems != int64_t(data->size()))
    throw ApiError(400, "inputs[0].shape holds " + std::to_string(elems) + " elements but data has " +
                            std::to_string(data->size()), "inputs");
  if (dims[0] == 0 || (ids && dims[1] == 0)) throw ApiError(400, "inputs[0] is empty", "inputs");
  if (size_t(dims[0]) > limits.max_inputs)
    throw ApiError(400, "inputs[0] has more than " + std::to_string(limits.max_inputs) + " rows", "inputs");
  if (ids) {
    std::vector<int32_t> all = token_ids(*data, "inputs[0].data");
    for (int64_t r = 0; r < dims[0]; ++r)
      p.ids.emplace_back(all.begin() + r * dims[1], all.begin() + (r + 1) * dims[1]);
  } else {
    for (const Json& d : *data) {
      if (!d.is_string()) bad_type("inputs[0].data", "an array of strings");
      p.texts.push_back(d.get<std::string>());
    }
  }
  if (const Json* outs = field(j, "outputs")) {
    if (!outs->is_array()) bad_type("outputs", "an array");
    for (const Json& o : *outs) {
      if (!o.is_object()) bad_type("outputs", "an array of objects");
      p.outputs.push_back(get_string(o, "name", true));
    }
  }
  return p;
}

std::string base64_floats(const std::vector<float>& v) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* b = reinterpret_cast<const unsigned char*>(v.data());  // x86: little-endian
  size_t n = v.size() * sizeof(float);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    uint32_t x = uint32_t(b[i]) << 16;
    if (i + 1 < n) x |= uint32_t(b[i + 1]) << 8;
    if (i + 2 < n) x |= b[i + 2];
    out += k[(x >> 18) & 63];
    out += k[(x >> 12) & 63];
    out += i + 1 < n ? k[(x >> 6) & 63] : '=';
    out += i + 2 < n ? k[x & 63] : '=';
  }
  return out;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t k = 1; k < len; ++k) {
      unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += len;
  }
  return true;
}

}  // namespace kiln::server
