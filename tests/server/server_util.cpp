// Test helpers (see server_util.h).
#include "server_util.h"

#include <filesystem>

namespace kiln::server::testing {

std::string real_model(const std::string& rel) {
  const char* dir = std::getenv("KILN_MODELS_DIR");
  std::string base = dir ? dir : std::string(KILN_SOURCE_DIR) + "/.cache/models";
  std::string p = base + "/" + rel;
  return std::filesystem::exists(p) ? p : "";
}

TestServer::TestServer(ModelRepository& repo, ServerOptions opt) {
  opt.port = 0;
  server_ = std::make_unique<Server>(repo, opt);
  port_ = server_->bind();
  thread_ = std::thread([this] { server_->serve(); });
  for (int i = 0; i < 500 && get(port_, "/health/live").status != 200; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

void TestServer::shutdown() {
  if (stopped_) return;
  stopped_ = true;
  server_->shutdown();
  thread_.join();
}

TestServer::~TestServer() { shutdown(); }

static httplib::Headers headers(const std::string& key) {
  httplib::Headers h;
  if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
  return h;
}

HttpResult get(int port, const std::string& path, const std::string& api_key) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(120);
  auto r = cli.Get(path.c_str(), headers(api_key));
  if (!r) return {};
  return {r->status, r->body};
}

HttpResult post(int port, const std::string& path, const std::string& body, const std::string& api_key) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(120);
  auto r = cli.Post(path.c_str(), headers(api_key), body, "application/json");
  if (!r) return {};
  return {r->status, r->body};
}

SseResult post_sse(int port, const std::string& path, const Json& body, int hang_up_after) {
  SseResult out;
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(120);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::string buf;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    out.raw.append(data, n);
    buf.append(data, n);
    size_t pos;
    while ((pos = buf.find("\n\n")) != std::string::npos) {
      std::string ev = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      // An optional "event: NAME" line (the Responses API's), then "data: ..."; comment
      // blocks (keep-alives) have neither.
      std::string name;
      if (ev.rfind("event: ", 0) == 0) {
        const size_t nl = ev.find('\n');
        name = ev.substr(7, nl == std::string::npos ? std::string::npos : nl - 7);
        ev = nl == std::string::npos ? "" : ev.substr(nl + 1);
      }
      if (ev.rfind("data: ", 0) != 0) continue;
      std::string payload = ev.substr(6);
      if (payload == "[DONE]") {
        out.done = true;
      } else {
        out.events.push_back(payload);
        out.names.push_back(name);
      }
      if (hang_up_after > 0 && int(out.events.size()) >= hang_up_after) return false;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err;
  cli.send(req, res, err);
  out.status = res.status;
  if (out.status != 200 && out.raw.empty()) out.raw = res.body;
  return out;
}

}  // namespace kiln::server::testing
