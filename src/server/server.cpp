// Server setup (see server.h): listener, thread pool, authentication, limits, the
// small endpoints (health, models, metrics, KServe metadata) and graceful shutdown.
// Generation routes are in routes_generate.cpp, encoder routes in routes_encode.cpp.
#include <sys/socket.h>

#include <cstdio>
#include <thread>

#include "core/status.h"
#include "runtime/encoder_runner.h"
#include "server/server_internal.h"

namespace kiln::server {

void HttpServer::raise_backlog(int backlog) { ::listen(svr_sock_, backlog); }

int status_of(const Error& e) {
  switch (e.code()) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kOutOfRange: return 400;
    case ErrorCode::kNotFound: return 404;
    case ErrorCode::kUnsupported: return 503;  // the executor refuses while draining
    case ErrorCode::kOutOfMemory: return 503;
    case ErrorCode::kCancelled: return 499;  // nginx's "client closed request"
    default: return 500;
  }
}

Server::Server(ModelRepository& repo, ServerOptions options)
    : impl_(std::make_unique<Impl>(repo, std::move(options))) {
  Impl& im = *impl_;
  const int threads = std::max(4, im.opt.http_threads);
  im.http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  im.http.set_payload_max_length(im.opt.max_body_bytes);
  im.http.set_read_timeout(30);
  im.http.set_write_timeout(30);
  im.http.set_keep_alive_max_count(1000);
  im.install_routes();
}

Server::~Server() { shutdown(); }

int Server::bind() {
  Impl& im = *impl_;
  if (im.opt.port == 0) {
    im.port = im.http.bind_to_any_port(im.opt.host);
    if (im.port <= 0) throw_error(ErrorCode::kIo, "cannot bind ", im.opt.host, " on any port");
  } else {
    if (!im.http.bind_to_port(im.opt.host, im.opt.port))
      throw_error(ErrorCode::kIo, "cannot bind ", im.opt.host, ":", im.opt.port,
                  " (in use, or a privileged port?)");
    im.port = im.opt.port;
  }
  im.http.raise_backlog(1024);
  std::string instance = im.opt.instance_name.empty() ? im.opt.host + ":" + std::to_string(im.port) : im.opt.instance_name;
  im.http.set_default_headers({{"X-Kiln-Instance", instance}});
  return im.port;
}

void Server::serve() { impl_->http.listen_after_bind(); }

int Server::port() const { return impl_->port; }

void Server::shutdown() {
  Impl& im = *impl_;
  if (im.stopped.exchange(true)) return;
  im.draining = true;
  // Executors finish what they hold (cancelling the rest at the deadline); then wait for
  // handlers still writing responses.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(im.opt.drain_timeout_s);
  if (!im.repo.drain(std::chrono::seconds(im.opt.drain_timeout_s)))
    std::fprintf(stderr, "[kiln] drain timeout: cancelled requests still running after %d s\n", im.opt.drain_timeout_s);
  deadline = std::max(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(2));
  while (im.active > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  im.http.stop();
}

static bool needs_auth(const std::string& path) {
  return path.rfind("/v1/", 0) == 0 || path.rfind("/v2", 0) == 0 || path == "/tokenize" || path == "/detokenize";
}

void Server::Impl::install_routes() {
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opt.api_keys.empty() || !needs_auth(req.path)) return httplib::Server::HandlerResponse::Unhandled;
    std::string auth = req.get_header_value("Authorization");
    const std::string bearer = "Bearer ";
    if (auth.rfind(bearer, 0) == 0) {
      std::string key = auth.substr(bearer.size());
      for (auto& k : opt.api_keys)
        if (k == key) return httplib::Server::HandlerResponse::Unhandled;
    }
    send_error(res, ApiError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')", {},
                             "invalid_request_error", "invalid_api_key"));
    metrics.count_request("", req.path, 401);
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib's own refusals (unknown path, body over the limit) in OpenAI's format.
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg = res.status == 404   ? "no route for " + req.method + " " + req.path
                      : res.status == 413 ? "the request body is larger than " +
                                                std::to_string(opt.max_body_bytes) + " bytes"
                      : res.status == 405 ? "method not allowed"
                                          : "request refused";
    send_json(res, res.status, error_body(res.status, msg, "invalid_request_error"));
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = std::string("internal error: ") + e.what();
    } catch (...) {
    }
    send_json(res, 500, error_body(500, msg, "server_error"));
  });

  http.Get("/health/live", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"live\"}", "application/json");
  });
  auto ready = [this](const httplib::Request&, httplib::Response& res) {
    if (draining) return send_json(res, 503, Json{{"status", "draining"}});
    send_json(res, 200, Json{{"status", "ready"}});
  };
  http.Get("/health/ready", ready);
  http.Get("/health", ready);
  http.Get("/v2/health/live", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"live\":true}", "application/json");
  });
  http.Get("/v2/health/ready", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, draining ? 503 : 200, Json{{"ready", !draining}});
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(repo), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    Json data = Json::array();
    for (auto& m : repo.models())
      data.push_back({{"id", m->name},
                      {"object", "model"},
                      {"created", m->created},
                      {"owned_by", "kiln"},
                      {"max_model_len", m->executor ? m->executor->max_context() : m->model->info().max_positions},
                      {"kind", m->is_decoder() ? "generate" : is_cross_encoder(m->model->info()) ? "rerank" : "embed"}});
    send_json(res, 200, Json{{"object", "list"}, {"data", data}});
  });
  http.Get(R"(/v1/models/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    ServedModel* m = repo.find(req.matches[1]);
    if (!m) return send_error(res, ApiError(404, "model '" + std::string(req.matches[1]) + "' does not exist", "model",
                                            "invalid_request_error", "model_not_found"));
    send_json(res, 200, Json{{"id", m->name}, {"object", "model"}, {"created", m->created}, {"owned_by", "kiln"}});
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_completion(req, res, false);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_completion(req, res, true);
  });
  http.Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) { handle_responses(req, res); });
  for (const bool detokenize : {false, true})
    http.Post(detokenize ? "/detokenize" : "/tokenize",
              [this, detokenize](const httplib::Request& req, httplib::Response& res) {
                handle_tokenize(req, res, detokenize);
              });
  http.Post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res) {
    handle_embeddings(req, res);
  });
  // Cohere's v1 and v2 paths, and llama.cpp's / Jina's bare one: one request and answer.
  for (const char* path : {"/v1/rerank", "/v2/rerank", "/rerank"})
    http.Post(path, [this, path](const httplib::Request& req, httplib::Response& res) { handle_rerank(req, res, path); });
  http.Get("/v2", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, Json{{"name", "kiln"}, {"version", "0.1.0"}, {"extensions", Json::array()}});
  });
  http.Get(R"(/v2/models/([^/]+)(/versions/[^/]+)?)", [this](const httplib::Request& req, httplib::Response& res) {
    handle_kserve_model(req, res);
  });
  http.Get(R"(/v2/models/([^/]+)(/versions/[^/]+)?/ready)", [this](const httplib::Request& req, httplib::Response& res) {
    ServedModel* m = repo.find(req.matches[1]);
    send_json(res, m && !draining ? 200 : (m ? 503 : 404), Json{{"name", std::string(req.matches[1])}, {"ready", m && !draining}});
  });
  http.Post(R"(/v2/models/([^/]+)(/versions/[^/]+)?/infer)", [this](const httplib::Request& req, httplib::Response& res) {
    handle_kserve_infer(req, res);
  });
}

}  // namespace kiln::server
