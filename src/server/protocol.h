// The wire formats the server speaks, as pure functions: parsing and validating
// OpenAI (completions, chat, embeddings) and KServe v2 request bodies into typed
// parameters, OpenAI-style errors, and small JSON helpers for responses. No I/O, so the
// fuzz target (fuzz/server_request_fuzz.cpp) and unit tests (tests/server/) drive it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/sampling.h"

namespace kiln::server {

using Json = nlohmann::ordered_json;

// A request error in OpenAI's format: {"error": {"message", "type", "param", "code"}}.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = {},
           std::string type = "invalid_request_error", std::string code = {})
      : std::runtime_error(message), status(status), param(std::move(param)), type(std::move(type)),
        code(std::move(code)) {}
  int status;
  std::string param, type, code;
};
Json error_body(int status, const std::string& message, const std::string& type,
                const std::string& param = {}, const std::string& code = {});
Json error_body(const ApiError& e);

struct RequestLimits {
  int32_t max_tokens = 4096;  // per request
  int32_t max_n = 16;
  int32_t max_stop = 8;
  size_t max_stop_bytes = 256;
  size_t max_inputs = 256;  // embeddings / KServe batch
  int32_t max_logit_bias = 1024;  // logit_bias entries
};

// /v1/completions and /v1/chat/completions after validation, before tokenization.
struct CompletionParams {
  bool chat = false;
  std::string model;
  std::string prompt_text;          // completions: text (when prompt_ids is empty)
  std::vector<int32_t> prompt_ids;  // completions: a token-id prompt
  // completions given a batch of prompts (OpenAI's array of strings or of token-id arrays):
  // the second and later ones; prompt k's n choices come at indices k * n ... k * n + n - 1.
  struct Prompt {
    std::string text;
    std::vector<int32_t> ids;
  };
  std::vector<Prompt> more_prompts;
  Json messages;                    // chat
  // chat: extra chat-template variables (vLLM's and SGLang's chat_template_kwargs, e.g.
  // {"enable_thinking": false} for Qwen3), an object whose keys are names.
  Json template_kwargs = Json::object();
  int32_t max_tokens = -1;          // -1: up to the context (chat default)
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;       // stream_options.include_usage
  SamplingParams sampling;
  bool logprobs = false;            // chat: logprobs; completions: logprobs != null
  // completions: the prompt's text before the completion's, and with logprobs its tokens'
  // logprobs before the completion's (the first one null); max_tokens may then be 0.
  bool echo = false;
  // completions (vLLM's extension): each choice's "prompt_logprobs", the logprob, rank and
  // text of every prompt token (the first one null) with this many top alternatives.
  int32_t prompt_logprobs = -1;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t priority = 0;
  std::string session_id;
  bool return_token_ids = false;    // extension: choices carry "token_ids"
  bool json_object = false;         // response_format {"type": "json_object"}
  // Constrained decoding, at most one of: a JSON Schema (response_format {"type":
  // "json_schema", "json_schema": {"schema": ...}}, vLLM's guided_json, llama.cpp's
  // json_schema or response_format {"type": "json_object", "schema": ...}); a GBNF grammar
  // (llama.cpp's grammar, vLLM's guided_grammar); one of some strings (vLLM's guided_choice).
  Json json_schema;                 // null: none
  std::string grammar;
  std::vector<std::string> guided_choice;
  // chat: OpenAI's function tools, [{"type": "function", "function": {"name", "description",
  // "parameters"}}] (rendered by the chat template as its `tools`), and tool_choice: "auto"
  // (the model decides; its output is parsed by --tool-call-parser), "none", "required" or
  // one function by name (tool_choice_name).
  Json tools = Json::array();
  std::string tool_choice = "none";
  std::string tool_choice_name;
  // false: one call at most (tool_choice "required": exactly one; "auto": the model's first)
  bool parallel_tool_calls = true;
};

// Throws ApiError naming the offending field.
Json parse_json_body(const std::string& body);
CompletionParams parse_completion(const Json& body, bool chat, const RequestLimits& limits);

// /v1/responses (OpenAI's Responses API), served without state as vLLM serves it with
// store=false: the request as the chat completion it runs (instructions and input items as
// messages, function_call / function_call_output items as assistant tool_calls and tool
// messages, tools in chat's shape, text.format as response_format), and the request fields
// a response object echoes back (instructions, max_output_tokens, temperature, top_p, tools,
// tool_choice, parallel_tool_calls, text, reasoning), normalized. Refuses what needs stored
// state (previous_response_id, conversation, background) or that a text model cannot take
// (non-function tools, image and file inputs), naming the field.
struct ResponsesParams {
  CompletionParams chat;
  Json echo = Json::object();
};
ResponsesParams parse_responses(const Json& body, const RequestLimits& limits);
// An error of the chat request a Responses request runs as, in the Responses API's names:
// param messages -> input, response_format -> text.format, and a context-length error's
// advice max_tokens -> max_output_tokens (parse_responses and the route's submission).
void rename_for_responses(ApiError& e);

// /tokenize (vLLM's): a completions prompt or chat messages of `model`, with
// add_special_tokens (default: true for a prompt, false for messages, which the chat
// template renders with its own special tokens); /detokenize: token ids.
struct TokenizeParams {
  CompletionParams request;  // model, prompt_text / prompt_ids or messages (+ template kwargs)
  bool add_special_tokens = true;
};
TokenizeParams parse_tokenize(const Json& body, const RequestLimits& limits);
struct DetokenizeParams {
  std::string model;
  std::vector<int32_t> tokens;
};
DetokenizeParams parse_detokenize(const Json& body);

// /v1/embeddings: texts or token-id lists.
struct EmbeddingParams {
  std::string model;
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;
  bool base64 = false;  // encoding_format "base64" (the openai client's default)
  // > 0: the first `dimensions` values of each embedding, normalized again (Matryoshka
  // embeddings such as Qwen3-Embedding's or OpenAI's text-embedding-3 `dimensions`).
  int64_t dimensions = 0;
};
EmbeddingParams parse_embeddings(const Json& body, const RequestLimits& limits);

// /v1/rerank (and /v2/rerank, /rerank): the request Cohere, Jina, vLLM and llama.cpp's
// servers take - a query and documents (strings or {"text": ...} objects), optional
// top_n (the best n results; all by default) and return_documents.
struct RerankParams {
  std::string model;
  std::string query;
  std::vector<std::string> documents;
  int64_t top_n = 0;  // 0: every document
  bool return_documents = false;
};
RerankParams parse_rerank(const Json& body, const RequestLimits& limits);

// KServe v2 /infer for encoders: one input, a BYTES tensor [N] of texts or an
// INT32/INT64 tensor [N, L] of token ids.
struct KserveInferParams {
  std::string id;
  std::string input_name;
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> outputs;  // requested output names; empty: all
};
KserveInferParams parse_kserve_infer(const Json& body, const RequestLimits& limits);

// Little-endian float32 bytes as base64 (OpenAI's embedding encoding).
std::string base64_floats(const std::vector<float>& v);
// True when `s` is valid UTF-8 (JSON output must be).
bool valid_utf8(const std::string& s);

}  // namespace kiln::server
