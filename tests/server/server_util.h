// Test helpers: an in-process server on a free loopback port, JSON requests through
// cpp-httplib's client, and an SSE reader that can hang up midway (a disconnect).
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <string>
#include <thread>

#include "runtime/executor.h"
#include "server/model_repository.h"
#include "server/server.h"

namespace kiln::server::testing {

inline std::string fixture(const std::string& name) {
  return std::string(KILN_FIXTURES_DIR) + "/models/" + name;
}
// A real model from scripts/fetch_models.sh, or "" when it was not fetched.
std::string real_model(const std::string& rel);

class TestServer {
 public:
  TestServer(ModelRepository& repo, ServerOptions opt = {});
  ~TestServer();
  int port() const { return port_; }
  Server& server() { return *server_; }
  void shutdown();

 private:
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
  bool stopped_ = false;
};

// A test suite's server over the real SmolLM2-135M-Instruct (model "smollm2"), started
// once for the suite; its tests skip when the model was not fetched. Suite: the deriving
// fixture, so that each suite has its own server.
template <class Suite>
class SmolLm2ServerSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string path = real_model("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    if (path.empty()) return;
    ExecutorOptions eo;
    eo.kv_tokens = 4096;
    repo_ = new ModelRepository({}, eo);
    repo_->add(path, "smollm2");
    srv_ = new TestServer(*repo_);
  }
  static void TearDownTestSuite() {
    delete srv_;
    delete repo_;
    srv_ = nullptr;
    repo_ = nullptr;
  }
  void SetUp() override {
    if (!srv_) GTEST_SKIP() << "SmolLM2 not fetched (scripts/fetch_models.sh)";
  }
  static int port() { return srv_->port(); }
  static inline ModelRepository* repo_ = nullptr;
  static inline TestServer* srv_ = nullptr;
};

struct HttpResult {
  int status = 0;  // 0: no response (connection failed)
  std::string body;
  Json json() const { return Json::parse(body); }
};

HttpResult get(int port, const std::string& path, const std::string& api_key = {});
HttpResult post(int port, const std::string& path, const std::string& body, const std::string& api_key = {});
inline HttpResult post(int port, const std::string& path, const Json& body) { return post(port, path, body.dump()); }

// A streamed response: every `data:` payload in order; stops reading (closing the
// connection) after `hang_up_after` events when that is > 0.
struct SseResult {
  int status = 0;
  std::vector<std::string> events;
  std::vector<std::string> names;  // each event's "event:" name ("" when it had none)
  bool done = false;  // saw [DONE]
  std::string raw;
};
SseResult post_sse(int port, const std::string& path, const Json& body, int hang_up_after = 0);

}  // namespace kiln::server::testing
