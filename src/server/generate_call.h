// One generation request's response state, shared by the generation routes
// (routes_generate.cpp: /v1/completions and /v1/chat/completions; routes_responses.cpp:
// /v1/responses): the executor's updates queue up in a Channel, absorb() takes them into
// each choice's text, reasoning and tool calls, and serve_call() writes them out as SSE or
// one JSON body through the route's own formatting. Internal to src/server/; tested through
// the routes (tests/server/server_test.cpp, responses_test.cpp).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "server/reasoning.h"
#include "server/server_internal.h"

namespace kiln::server {

using Clock = std::chrono::steady_clock;

// Updates from the executor thread to the HTTP thread writing the response.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RequestUpdate> q;
  Clock::time_point start = Clock::now();
  Clock::time_point first_token, end;
  bool got_first = false;

  void push(RequestUpdate&& u) {
    {
      std::lock_guard lk(mu);
      auto now = Clock::now();
      for (auto& c : u.choices)
        if (!c.tokens.empty() && !got_first) {
          got_first = true;
          first_token = now;
        }
      if (u.done) end = now;
      q.push_back(std::move(u));
    }
    cv.notify_all();  // after unlocking: the woken writer does not block on mu at once
  }
  bool pop(RequestUpdate& u, std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu);
    if (!cv.wait_for(lk, timeout, [&] { return !q.empty(); })) return false;
    u = std::move(q.front());
    q.pop_front();
    return true;
  }
};

struct ChoiceState {
  std::string text;  // chat with a reasoning parser: the answer (content) only
  std::optional<ReasoningSplitter> splitter;  // chat with --reasoning-parser
  std::string reasoning;                      // what the splitter took as reasoning
  ReasoningSplitter::Delta last;              // chat: the latest update's share of each
  std::optional<ToolCallSplitter> tools;      // chat with tools, tool_choice "auto"
  // tool_choice "required" (a JSON array of calls) or one function (its arguments): the
  // output, constrained to that JSON, is read back into calls as it ends.
  enum class Forced : uint8_t { kNone, kRequired, kNamed } forced = Forced::kNone;
  std::string forced_text;
  CallArrayStreamer required_calls;  // kRequired: the array's calls streamed as written
  std::vector<ToolCall> calls;                // the tool calls read so far ...
  size_t calls_sent = 0;                      // ... and how many a stream has sent (or streamed)
  std::vector<ToolCallFragment> fragments;    // the latest update's pieces of calls being written
  std::vector<std::string> call_ids;          // call k's id, given when its first piece or it appears
  std::vector<int32_t> tokens;
  Json logprobs;  // accumulated (non-streaming)
  std::string finish;
  bool role_sent = false;
};

// One prompt of a request (a completion may batch several): its executor request, its
// token counts, and for echo / prompt_logprobs its ids, text and tokens' logprobs (from the
// second token on).
struct PromptState {
  uint64_t request_id = 0;
  std::vector<int32_t> ids;
  std::string echo_text;
  std::vector<SampledToken> logprobs;
  bool echo_sent = false;  // streaming: its choices' echo chunks went out
  bool done = false;
  int32_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
};

// Everything the response writer needs, shared by the provider and its releaser.
struct Call {
  Server::Impl* srv = nullptr;
  ServedModel* model = nullptr;
  CompletionParams params;
  std::shared_ptr<Channel> channel = std::make_shared<Channel>();
  std::string id;
  int64_t created = 0;
  std::vector<PromptState> prompts;
  std::vector<ChoiceState> choices;  // n per prompt: choice i of prompt p is choices[p * n + i]
  std::string error;                 // the first failed prompt's
  bool finished = false;  // metrics and the active count are settled
  bool cancelled = false;
  std::mutex settle_mu;
  const char* route = nullptr;  // the endpoint its metrics count under, when not the params' own
  bool head_sent = false;       // streaming: CallWriter::head went out

  const char* endpoint() const {
    return route ? route : params.chat ? "/v1/chat/completions" : "/v1/completions";
  }
  size_t prompt_of(uint64_t request_id) const {
    for (size_t p = 0; p < prompts.size(); ++p)
      if (prompts[p].request_id == request_id) return p;
    return 0;
  }
  bool all_done() const {
    for (const PromptState& p : prompts)
      if (!p.done) return false;
    return true;
  }
  int32_t total(int32_t PromptState::*count) const {
    int32_t sum = 0;
    for (const PromptState& p : prompts) sum += p.*count;
    return sum;
  }
  void cancel_requests() {
    for (const PromptState& p : prompts)
      if (p.request_id && !p.done) model->executor->cancel(p.request_id);
  }
  void cancel() {
    cancel_requests();
    settle(499);
  }
  // Once per request: metrics and the server's count of active responses.
  void settle(int status) {
    std::lock_guard lk(settle_mu);
    if (finished) return;
    finished = true;
    srv->metrics.count_request(model->name, endpoint(), status);
    if (status == 200) {
      Channel& ch = *channel;
      std::lock_guard clk(ch.mu);
      double e2e = std::chrono::duration<double>(ch.end - ch.start).count();
      srv->metrics.observe_e2e(model->name, e2e);
      if (ch.got_first) {
        double ttft = std::chrono::duration<double>(ch.first_token - ch.start).count();
        srv->metrics.observe_ttft(model->name, ttft);
        int32_t most = 0;
        for (auto& c : choices) most = std::max<int32_t>(most, int32_t(c.tokens.size()));
        if (most > 1) srv->metrics.observe_tpot(model->name, (e2e - ttft) / double(most - 1));
      }
      srv->metrics.add_tokens(model->name, total(&PromptState::prompt_tokens), total(&PromptState::completion_tokens));
    }
    --srv->active;
  }
};

// Takes one prompt's update into the response's state; returns the prompt's index. A failed
// prompt cancels the others (the response is an error).
size_t absorb(Call& c, const RequestUpdate& u);
// A random id: `prefix` and 24 letters and digits ("call_...", "resp_...", "msg_...").
std::string random_id(const char* prefix);
// Call k's id ("call_..."): made when its first fragment or the call itself is read, the same after.
const std::string& call_id(ChoiceState& st, size_t k);

// How a route writes a call's response. `event` (optional) is called with each update, once
// absorbed (`prompt`: its prompt's index); streaming, its text goes out, after `head` (the
// stream's opening, sent at once; may be empty), and `end` follows the last update (the
// call's error, if any, is in call.error). Whole: `body` once every prompt is done.
struct CallWriter {
  std::string head;
  std::function<std::string(Call&, size_t prompt, const RequestUpdate&)> event;
  std::function<std::string(Call&)> end;
  std::function<std::string(Call&)> body;
};
// Answers `res` from the call's updates: SSE when call->params.stream, else one JSON body
// (a space each second while waiting, so that a vanished client is noticed). A failed write
// (the client went away) cancels the call.
void serve_call(const std::shared_ptr<Call>& call, httplib::Response& res, CallWriter writer);

}  // namespace kiln::server
