// What the route files share: the server's state and small response helpers.
// Internal to src/server/.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/grammar.h"
#include "server/metrics.h"
#include "server/server.h"

namespace kiln::server {

// httplib::Server with a deeper listen backlog: Debian's compiled library listens with
// a backlog of 5, so a burst of connections (64 clients at once) overflows the accept
// queue and some connects fail. Linux lets listen() be called again to raise it.
class HttpServer : public httplib::Server {
 public:
  void raise_backlog(int backlog);
};

// Counts a handler as active for its scope (a graceful drain waits until none is).
class ActiveScope {
 public:
  explicit ActiveScope(std::atomic<int64_t>& n) : n_(n) { ++n_; }
  ~ActiveScope() { --n_; }
  ActiveScope(const ActiveScope&) = delete;
  ActiveScope& operator=(const ActiveScope&) = delete;

 private:
  std::atomic<int64_t>& n_;
};

struct Call;  // one generation request's response state (generate_call.h)

struct Server::Impl {
  ModelRepository& repo;
  ServerOptions opt;
  HttpServer http;
  Metrics metrics;
  std::atomic<bool> draining{false};
  std::atomic<int64_t> active{0};  // generation/encode handlers still writing
  std::atomic<uint64_t> next_id{1};
  int port = 0;
  std::atomic<bool> stopped{false};
  // Compiled grammars by their source ("json:" + schema, "gbnf:" + text): a schema sent
  // again is not compiled again, and the executors' masks remember its states' token sets.
  std::mutex grammars_mu;
  std::map<std::string, std::shared_ptr<const Grammar>> grammars;
  static constexpr size_t kMaxGrammars = 256;

  Impl(ModelRepository& r, ServerOptions o) : repo(r), opt(std::move(o)) {}
  void install_routes();
  void handle_completion(const httplib::Request& req, httplib::Response& res, bool chat);
  void handle_tokenize(const httplib::Request& req, httplib::Response& res, bool detokenize);
  // OpenAI's Responses API (routes_responses.cpp), run as the chat completion it translates to.
  void handle_responses(const httplib::Request& req, httplib::Response& res);
  // A parsed completion or chat request (call->params) checked against its model, its prompts
  // rendered, tokenized and submitted to the model's executor, whose updates reach
  // call->channel; throws ApiError (or kiln::Error) for what the request got wrong.
  void submit_call(const std::shared_ptr<Call>& call, const httplib::Request& req);
  // The request's constrained decoding (json_schema, grammar, guided_choice, a forced tool
  // choice) compiled, or null; throws ApiError for a schema or grammar it cannot compile.
  std::shared_ptr<const Grammar> request_grammar(const CompletionParams& p);
  // A handler's failure as its response, counted in the metrics: an ApiError as it is, a
  // kiln::Error with the status of its code (status_of).
  void reply_error(httplib::Response& res, const std::string& model, const char* endpoint, const ApiError& e);
  void reply_error(httplib::Response& res, const std::string& model, const char* endpoint, const Error& e);
  void handle_embeddings(const httplib::Request& req, httplib::Response& res);
  void handle_kserve_infer(const httplib::Request& req, httplib::Response& res);
  void handle_rerank(const httplib::Request& req, httplib::Response& res, const char* endpoint);
  void answer_encoder(ServedModel& m, std::vector<EncoderInput> batch, int64_t tokens, httplib::Response& res,
                      const char* endpoint, std::function<Json(std::vector<EncoderOutput>&)> ok,
                      std::function<Json(int, const std::string&)> error_json);
  void handle_kserve_model(const httplib::Request& req, httplib::Response& res);
};

// JSON out: invalid UTF-8 (never expected, but a token piece can be a partial
// character) is replaced instead of throwing.
inline std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

inline void send_json(httplib::Response& res, int status, const Json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

inline void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, error_body(e)); }

// kiln::Error from the runtime -> an HTTP status.
int status_of(const Error& e);

inline int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace kiln::server
