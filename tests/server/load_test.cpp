// Bounded loopback load test (CI, tiny Llama fixture): 64 concurrent clients send 320
// requests of mixed lengths: streamed and not, some sharing a prefix, some two-turn
// sessions, some hung up midway, and ~1 in 11 embedding requests to a tiny BERT served
// beside it (batched across clients). Every finished request must carry exactly the greedy
// tokens of that request run alone (no token lost, duplicated or mixed up between
// requests; embeddings within 1e-5 of each input alone), cancelled ones must end
// cleanly, and afterwards the server is healthy, idle, holds no leaked KV blocks and its
// memory did not grow.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <unistd.h>

#include "runtime/encoder_runner.h"
#include "runtime/llm_runner.h"
#include "server_util.h"

namespace kiln::server {
namespace {

using namespace testing;

int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * int64_t(sysconf(_SC_PAGESIZE));
}

// The second turn of a session: the first prompt, its answer, and a new message.
std::vector<int32_t> turn_two(std::vector<int32_t> prompt, const std::vector<int32_t>& answer) {
  prompt.insert(prompt.end(), answer.begin(), answer.end());
  prompt.insert(prompt.end(), {11, 12, 13});
  return prompt;
}

enum class Kind { kStream, kPlain, kShared, kCancel, kSession, kEmbed };

struct Job {
  Kind kind;
  std::vector<int32_t> prompt;
  int max_tokens;
  std::vector<std::vector<int32_t>> inputs;  // kEmbed: /v1/embeddings inputs (the encoder)
};

std::vector<int32_t> ids_of(const SseResult& s, std::string* finish) {
  std::vector<int32_t> ids;
  for (auto& e : s.events) {
    Json j = Json::parse(e);
    for (auto& c : j["choices"]) {
      for (auto& t : c["token_ids"]) ids.push_back(t.get<int32_t>());
      if (!c["finish_reason"].is_null()) *finish = c["finish_reason"];
    }
  }
  return ids;
}

TEST(ServerLoad, ConcurrentMixedTrafficIsExactAndLeavesNoTrace) {
  ExecutorOptions eo;
  eo.kv_tokens = 2048;  // 128 blocks for up to 64 sequences of <= 100 tokens: preemption happens
  eo.max_step_tokens = 256;
  eo.session_idle_timeout = std::chrono::milliseconds(500);
  ModelRepository repo({}, eo);
  repo.add(fixture("llama"), "llama");
  repo.add(fixture("bert"), "bert");  // embedding requests share the server (and batch with each other)
  Model& model = *repo.find("llama")->model;
  TestServer srv(repo);

  std::mt19937 rng(2024);
  auto random_ids = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& t : v) t = int32_t(3 + rng() % 500);
    return v;
  };
  const std::vector<int32_t> shared = random_ids(32);
  std::vector<Job> jobs;
  for (int i = 0; i < 320; ++i) {
    Job j;
    int r = int(rng() % 11);
    j.kind = r < 4 ? Kind::kStream : r < 6 ? Kind::kPlain : r < 8 ? Kind::kShared : r < 9 ? Kind::kCancel
           : r < 10 ? Kind::kSession : Kind::kEmbed;
    if (j.kind == Kind::kEmbed)
      for (int k = 0; k < 1 + int(rng() % 3); ++k) j.inputs.push_back(random_ids(2 + int(rng() % 39)));
    j.max_tokens = 4 + int(rng() % 37);
    if (j.kind == Kind::kShared) {
      j.prompt = shared;
      auto tail = random_ids(1 + int(rng() % 20));
      j.prompt.insert(j.prompt.end(), tail.begin(), tail.end());
    } else {
      j.prompt = random_ids(4 + int(rng() % (j.kind == Kind::kSession ? 30 : 57)));
    }
    if (j.kind == Kind::kSession) j.max_tokens = 4 + int(rng() % 16);
    if (j.kind == Kind::kCancel) j.max_tokens = 40;
    jobs.push_back(j);
  }
  // References first: the model's compiled graph serves one caller at a time, and the
  // executor thread is about to use it.
  std::map<std::pair<std::vector<int32_t>, int>, std::vector<int32_t>> refs;
  auto reference = [&](const std::vector<int32_t>& prompt, int n) {
    auto& r = refs[{prompt, n}];
    if (r.empty()) {
      LlmRunner runner(model);
      r = runner.generate_greedy({prompt}, n).at(0);
    }
    return r;
  };
  // Each embedding input alone (a batch of one through encode()), normalized as the route does.
  std::map<std::vector<int32_t>, std::vector<float>> embed_refs;
  Model& bert = *repo.find("bert")->model;
  for (auto& j : jobs)
    for (auto& in : j.inputs)
      if (!embed_refs.count(in)) {
        std::vector<float> e = encode(bert, {EncoderInput{in, {}}}, {.hidden = false}).at(0).mean_pooled;
        double n = 0;
        for (float x : e) n += double(x) * x;
        for (float& x : e) x = float(x / std::sqrt(n));
        embed_refs[in] = e;
      }
  for (auto& j : jobs) {
    if (j.kind == Kind::kEmbed) continue;
    auto first = reference(j.prompt, j.max_tokens);
    if (j.kind == Kind::kSession) reference(turn_two(j.prompt, first), j.max_tokens);
  }
  auto alone = [&](const std::vector<int32_t>& prompt, int n) { return refs.at({prompt, n}); };

  auto body_of = [](const std::vector<int32_t>& prompt, int max_tokens, bool stream) {
    Json b = {{"model", "llama"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
              {"ignore_eos", true}, {"return_token_ids", true}, {"stream", stream}};
    return b;
  };
  std::mutex fail_mu;
  std::vector<std::string> failures;
  auto fail = [&](int i, const std::string& what) {
    std::lock_guard lk(fail_mu);
    failures.push_back("job " + std::to_string(i) + ": " + what);
  };
  std::atomic<int> cancelled{0}, completed{0};

  auto run_job = [&](int i) {
    const Job& j = jobs[size_t(i)];
    std::string finish;
    if (j.kind == Kind::kPlain) {
      auto r = post(srv.port(), "/v1/completions", body_of(j.prompt, j.max_tokens, false));
      if (r.status != 200) return fail(i, "status " + std::to_string(r.status) + " " + r.body);
      Json rj = Json::parse(r.body, nullptr, false);
      if (rj.is_discarded() || !rj["choices"][0]["token_ids"].is_array()) return fail(i, "bad body " + r.body.substr(0, 300));
      auto got = rj["choices"][0]["token_ids"].get<std::vector<int32_t>>();
      if (got != alone(j.prompt, j.max_tokens)) return fail(i, "tokens differ from the request alone");
      ++completed;
      return;
    }
    if (j.kind == Kind::kEmbed) {
      auto r = post(srv.port(), "/v1/embeddings", Json{{"model", "bert"}, {"input", j.inputs}});
      if (r.status != 200) return fail(i, "embeddings status " + std::to_string(r.status) + " " + r.body.substr(0, 300));
      Json rj = Json::parse(r.body, nullptr, false);
      if (rj.is_discarded() || rj["data"].size() != j.inputs.size()) return fail(i, "bad body " + r.body.substr(0, 300));
      for (size_t k = 0; k < j.inputs.size(); ++k) {
        auto got = rj["data"][k]["embedding"].get<std::vector<float>>();
        const auto& want = embed_refs.at(j.inputs[k]);
        if (got.size() != want.size()) return fail(i, "embedding size");
        for (size_t d = 0; d < got.size(); ++d)
          if (std::fabs(got[d] - want[d]) > 1e-5f) return fail(i, "embedding differs from the input alone");
      }
      ++completed;
      return;
    }
    if (j.kind == Kind::kCancel) {
      auto s = post_sse(srv.port(), "/v1/completions", body_of(j.prompt, j.max_tokens, true), 2);
      if (s.status != 200 || s.done) return fail(i, "hang-up did not end the stream early");
      ++cancelled;
      return;
    }
    Json body = body_of(j.prompt, j.max_tokens, true);
    if (j.kind == Kind::kSession) body["session_id"] = "s" + std::to_string(i);
    auto s = post_sse(srv.port(), "/v1/completions", body);
    auto got = ids_of(s, &finish);
    if (s.status != 200 || !s.done) return fail(i, "stream did not finish: " + s.raw.substr(0, 200));
    if (got != alone(j.prompt, j.max_tokens)) return fail(i, "streamed tokens differ from the request alone");
    if (finish != "length") return fail(i, "finish_reason " + finish);
    if (j.kind == Kind::kSession) {  // second turn extends the first
      std::vector<int32_t> p2 = turn_two(j.prompt, got);
      Json b2 = body_of(p2, j.max_tokens, false);
      b2["session_id"] = "s" + std::to_string(i);
      auto r2 = post(srv.port(), "/v1/completions", b2);
      if (r2.status != 200) return fail(i, "turn 2 status " + std::to_string(r2.status));
      Json rj = Json::parse(r2.body, nullptr, false);
      if (rj.is_discarded() || !rj["choices"][0]["token_ids"].is_array()) return fail(i, "bad turn-2 body " + r2.body.substr(0, 300));
      if (rj["choices"][0]["token_ids"].get<std::vector<int32_t>>() != alone(p2, j.max_tokens))
        return fail(i, "turn 2 tokens differ from the request alone");
    }
    ++completed;
  };

  auto run_all = [&](int begin, int end, int clients) {
    std::atomic<int> next{begin};
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&] {
        for (int i; (i = next++) < end;) {
          try {
            run_job(i);
          } catch (const std::exception& e) {
            fail(i, std::string("exception: ") + e.what());
          }
        }
      });
    for (auto& t : threads) t.join();
  };
  run_all(0, 64, 64);  // warm-up: allocator pools, thread pools, caches
  int64_t rss_warm = rss_bytes();
  run_all(64, 320, 64);
  int64_t rss_end = rss_bytes();

  for (auto& f : failures) ADD_FAILURE() << f;
  EXPECT_EQ(completed + cancelled, 320);
  EXPECT_GT(cancelled, 0);

  Executor& ex = *repo.find("llama")->executor;
  for (int i = 0; i < 300 && (ex.stats().running + ex.stats().waiting > 0 || ex.stats().sessions > 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ExecutorStats st = ex.stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.sessions, 0) << "sessions should have expired";
  EXPECT_EQ(st.kv_blocks_free + st.kv_blocks_cached, st.kv_blocks_total) << "leaked KV blocks";
  EXPECT_GT(st.prefix_hit_blocks, 0);
  EXPECT_GT(st.session_hits, 0);
  std::printf("[load] %lld finished, %d cancelled, %lld preemptions, %lld steps, prefix hit rate %.2f, "
              "RSS %.1f -> %.1f MB\n",
              (long long)st.requests_finished, cancelled.load(), (long long)st.preemptions, (long long)st.steps,
              st.prefix_queried_blocks ? double(st.prefix_hit_blocks) / double(st.prefix_queried_blocks) : 0.0,
              double(rss_warm) / 1e6, double(rss_end) / 1e6);
#if defined(__SANITIZE_ADDRESS__)
  // ASan's quarantine keeps freed memory on purpose: RSS says nothing about leaks there
  // (LeakSanitizer checks those at exit).
#else
  EXPECT_LT(rss_end - rss_warm, int64_t(64) << 20) << "memory grew across the run";
#endif
  const EncoderBatcherStats es = repo.find("bert")->batcher->stats();
  EXPECT_EQ(es.failed_requests, 0);
  EXPECT_EQ(es.queued + es.running, 0);
  std::printf("[load] encoder: %lld requests, %lld sequences in %lld forwards\n", (long long)es.requests,
              (long long)es.sequences, (long long)es.forwards);
  EXPECT_EQ(get(srv.port(), "/health/ready").status, 200);
  EXPECT_EQ(post(srv.port(), "/v1/completions", body_of({1, 2, 3}, 3, false)).status, 200);
}

}  // namespace
}  // namespace kiln::server
