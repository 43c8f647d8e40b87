// `kiln serve`: an HTTP server (cpp-httplib; see docs/serving.md for why) in front of a
// model repository. OpenAI-compatible /v1/completions, /v1/chat/completions (SSE
// streaming), /v1/embeddings, /v1/models; KServe v2 REST for encoders; /health/live,
// /health/ready; Prometheus /metrics. Optional API keys, request limits with OpenAI-
// format 4xx errors, graceful drain, client disconnect cancels the request.
// Tested in tests/server/server_test.cpp and tests/server/load_test.cpp over loopback.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/model_repository.h"
#include "server/protocol.h"
#include "server/tool_calls.h"

namespace kiln::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (tests)
  std::vector<std::string> api_keys;  // empty: no authentication
  size_t max_body_bytes = 1 << 20;
  RequestLimits limits;
  int http_threads = 128;  // connections served at once (each stream holds one)
  int drain_timeout_s = 30;
  // Sent as X-Kiln-Instance on every response (which replica answered, behind a proxy);
  // empty: "host:port".
  std::string instance_name;
  // Chat responses of thinking models (Qwen3, DeepSeek-R1): true carries the text between
  // <think> and </think> as reasoning_content beside the answer's content (reasoning.h).
  bool reasoning_parser = false;
  // How chat output with tools is read back into message.tool_calls (tool_calls.h); kAuto:
  // each model's from its chat template; kNone (or a template that shows no format):
  // tool_choice "auto" is refused (nothing would read the calls).
  ToolParser tool_parser = ToolParser::kAuto;
};

class Server {
 public:
  Server(ModelRepository& repo, ServerOptions options);
  ~Server();
  // Binds the listening socket; returns the port. Throws kiln::Error (kIo) on failure.
  int bind();
  // Serves until shutdown() (from another thread or a signal watcher).
  void serve();
  // Graceful: readiness turns 503, new generation requests get 503, in-flight ones
  // finish (up to drain_timeout_s), then the listener stops. Safe to call twice.
  void shutdown();
  int port() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::server
