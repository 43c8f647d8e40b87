// run_serve_bench (see bench_client.h). Times are taken on the client when each SSE
// chunk carrying tokens arrives, so TTFT includes queueing, prefill and the network path.
#include "server/bench_client.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <random>
#include <thread>

#include "server/protocol.h"

namespace kiln::server {

using Clock = std::chrono::steady_clock;

Summary summarize(std::vector<double> v) {
  Summary s;
  s.count = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.p99 = v[std::min(n - 1, size_t(std::ceil(0.99 * double(n))) - 1)];
  return s;
}

namespace {

struct TurnResult {
  bool ok = false;
  std::string error;
  int turn = 0;
  double ttft_ms = 0, e2e_ms = 0;
  std::vector<double> itl_ms;
  std::vector<int32_t> tokens;
  int64_t input_tokens = 0;
  int64_t sequences = 0;  // embeddings
};

TurnResult stream_one(const BenchOptions& o, const std::vector<int32_t>& prompt, int max_tokens,
                      const std::string& session) {
  TurnResult r;
  r.input_tokens = int64_t(prompt.size());
  Json body = {{"model", o.model}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
               {"ignore_eos", true}, {"stream", true}, {"return_token_ids", true}};
  if (!session.empty()) body["session_id"] = session;
  httplib::Client cli(o.host, o.port);
  cli.set_read_timeout(600);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!o.api_key.empty()) req.set_header("Authorization", "Bearer " + o.api_key);
  if (!session.empty()) req.set_header("X-Session-Id", session);
  std::string buf, raw;
  bool done = false;
  auto t0 = Clock::now();
  Clock::time_point last;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    auto now = Clock::now();
    buf.append(data, n);
    if (raw.size() < 512) raw.append(data, std::min<size_t>(n, 512));
    size_t pos;
    while ((pos = buf.find("\n\n")) != std::string::npos) {
      std::string ev = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      std::string payload = ev.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      Json j = Json::parse(payload, nullptr, false);
      if (j.is_discarded() || j.contains("error")) {
        r.error = payload.substr(0, 300);
        continue;
      }
      size_t got = 0;
      for (auto& c : j["choices"])
        for (auto& t : c["token_ids"]) {
          r.tokens.push_back(t.get<int32_t>());
          ++got;
        }
      if (got == 0) continue;
      double ms = std::chrono::duration<double, std::milli>(now - (r.tokens.size() == got ? t0 : last)).count();
      if (r.tokens.size() == got) r.ttft_ms = ms;
      else r.itl_ms.push_back(ms);
      last = now;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err;
  bool sent = cli.send(req, res, err);
  r.e2e_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (!sent) r.error = "connection failed: " + httplib::to_string(err);
  else if (res.status != 200) r.error = "HTTP " + std::to_string(res.status) + ": " + (raw.empty() ? res.body : raw);
  else if (!done && r.error.empty()) r.error = "stream ended without [DONE]";
  r.ok = r.error.empty() && !r.tokens.empty();
  return r;
}

void add_auth(const BenchOptions& o, httplib::Headers& h) {
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
}

// One /v1/embeddings request of these inputs; ok when every input got an embedding.
TurnResult embed_one(const BenchOptions& o, const std::vector<std::vector<int32_t>>& inputs) {
  TurnResult r;
  for (auto& in : inputs) r.input_tokens += int64_t(in.size());
  Json body = {{"model", o.model}, {"input", inputs}, {"encoding_format", "base64"}};
  httplib::Client cli(o.host, o.port);
  cli.set_read_timeout(600);
  httplib::Headers h;
  add_auth(o, h);
  auto t0 = Clock::now();
  auto res = cli.Post("/v1/embeddings", h, body.dump(), "application/json");
  r.e2e_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (!res) {
    r.error = "connection failed: " + httplib::to_string(res.error());
    return r;
  }
  if (res->status != 200) {
    r.error = "HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 300);
    return r;
  }
  Json j = Json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || j["data"].size() != inputs.size()) {
    r.error = "unexpected response: " + res->body.substr(0, 300);
    return r;
  }
  r.sequences = int64_t(inputs.size());
  r.ok = true;
  return r;
}

std::vector<int32_t> random_ids(std::mt19937_64& rng, int n, int vocab) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = int32_t(10 + rng() % uint64_t(std::max(1, vocab - 10)));
  return v;
}

int uniform(std::mt19937_64& rng, int lo, int hi) { return lo + int(rng() % uint64_t(std::max(1, hi - lo + 1))); }

// A prompt of n ids: random, or (repeats > 1) one random run repeated, cut to n.
std::vector<int32_t> prompt_ids(std::mt19937_64& rng, int n, int vocab, int repeats) {
  if (repeats <= 1) return random_ids(rng, n, vocab);
  const std::vector<int32_t> run = random_ids(rng, std::max(1, (n + repeats - 1) / repeats), vocab);
  std::vector<int32_t> v;
  while (int(v.size()) < n) v.insert(v.end(), run.begin(), run.end());
  v.resize(size_t(n));
  return v;
}

}  // namespace

BenchReport run_serve_bench(const BenchOptions& o) {
  // Arrival times (Poisson when a rate is given), drawn up front so they do not depend
  // on how fast the server answers.
  std::vector<double> start_s(size_t(o.requests), 0.0);
  if (o.rate > 0) {
    std::mt19937_64 rng(o.seed ^ 0xa5a5);
    std::exponential_distribution<double> gap(o.rate);
    double t = 0;
    for (auto& s : start_s) {
      s = t;
      t += gap(rng);
    }
  }
  std::mutex mu;
  std::vector<TurnResult> results;
  std::atomic<int> next{0};
  auto t_begin = Clock::now();
  auto conversation = [&](int c) {
    std::mt19937_64 rng(o.seed * 1000003u + uint64_t(c));
    if (o.endpoint == "embeddings") {
      std::vector<std::vector<int32_t>> inputs;
      for (int i = 0; i < std::max(1, o.inputs_per_request); ++i)
        inputs.push_back(random_ids(rng, uniform(rng, o.input_min, o.input_max), o.vocab));
      TurnResult r = embed_one(o, inputs);
      std::lock_guard lk(mu);
      results.push_back(std::move(r));
      return;
    }
    std::vector<int32_t> prompt = prompt_ids(rng, uniform(rng, o.input_min, o.input_max), o.vocab, o.prompt_repeats);
    std::string session = o.sessions ? "bench-" + std::to_string(o.seed) + "-" + std::to_string(c) : "";
    for (int turn = 0; turn < o.turns; ++turn) {
      if (turn > 0) {
        auto more = random_ids(rng, o.turn_tokens, o.vocab);
        prompt.insert(prompt.end(), more.begin(), more.end());
      }
      TurnResult r = stream_one(o, prompt, uniform(rng, o.output_min, o.output_max), session);
      r.turn = turn;
      bool ok = r.ok;
      if (ok) prompt.insert(prompt.end(), r.tokens.begin(), r.tokens.end());
      {
        std::lock_guard lk(mu);
        results.push_back(std::move(r));
      }
      if (!ok) break;
    }
  };
  std::vector<std::thread> clients;
  for (int i = 0; i < std::max(1, o.concurrency); ++i)
    clients.emplace_back([&] {
      for (int c; (c = next++) < o.requests;) {
        std::this_thread::sleep_until(t_begin + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(start_s[size_t(c)])));
        conversation(c);
      }
    });
  for (auto& t : clients) t.join();

  BenchReport rep;
  rep.duration_s = std::chrono::duration<double>(Clock::now() - t_begin).count();
  std::vector<double> ttft, tpot, itl, e2e, ttft_first, ttft_later;
  int good = 0;
  for (auto& r : results) {
    if (!r.ok) {
      ++rep.failed;
      if (rep.first_error.empty()) rep.first_error = r.error;
      continue;
    }
    ++rep.completed;
    rep.input_tokens += r.input_tokens;
    rep.sequences += r.sequences;
    if (o.endpoint == "embeddings") {
      e2e.push_back(r.e2e_ms);
      if (r.e2e_ms <= o.ttft_target_ms) ++good;
      continue;
    }
    rep.output_tokens += int64_t(r.tokens.size());
    ttft.push_back(r.ttft_ms);
    e2e.push_back(r.e2e_ms);
    double t = r.tokens.size() > 1 ? (r.e2e_ms - r.ttft_ms) / double(r.tokens.size() - 1) : 0;
    tpot.push_back(t);
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    (r.turn == 0 ? ttft_first : ttft_later).push_back(r.ttft_ms);
    if (r.ttft_ms <= o.ttft_target_ms && t <= o.tpot_target_ms) ++good;
  }
  rep.ttft_ms = summarize(ttft);
  rep.tpot_ms = summarize(tpot);
  rep.itl_ms = summarize(itl);
  rep.e2e_ms = summarize(e2e);
  rep.ttft_first_turn_ms = summarize(ttft_first);
  rep.ttft_later_turns_ms = summarize(ttft_later);
  rep.request_throughput = double(rep.completed) / rep.duration_s;
  rep.output_throughput = double(rep.output_tokens) / rep.duration_s;
  rep.total_throughput = double(rep.input_tokens + rep.output_tokens) / rep.duration_s;
  rep.goodput = double(good) / rep.duration_s;
  rep.sequence_throughput = double(rep.sequences) / rep.duration_s;
  return rep;
}

static std::string fmt(const char* f, double a, double b, double c) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

std::string BenchReport::to_text(const BenchOptions& o) const {
  std::string s;
  s += "requests: " + std::to_string(completed) + " completed, " + std::to_string(failed) + " failed";
  s += fmt(" in %.2f s (concurrency %.0f, %.2f conversations/s; 0 = all at once)\n", duration_s,
           double(o.concurrency), o.rate);
  if (o.endpoint == "embeddings") {
    s += fmt("throughput: %.2f req/s, %.1f sequences/s, %.1f input tok/s\n", request_throughput, sequence_throughput,
             total_throughput);
    s += fmt("goodput (E2E <= %.0f ms): %.2f req/s\n", o.ttft_target_ms, goodput, 0.0);  // the third value is unused
  } else {
    s += fmt("throughput: %.2f req/s, %.1f output tok/s, %.1f total tok/s\n", request_throughput, output_throughput,
             total_throughput);
    s += fmt("goodput (TTFT <= %.0f ms, TPOT <= %.0f ms): %.2f req/s\n", o.ttft_target_ms, o.tpot_target_ms, goodput);
  }
  auto row = [&](const char* name, const Summary& x) {
    if (x.count) s += std::string(name) + fmt(" mean %9.2f   median %9.2f   p99 %9.2f\n", x.mean, x.median, x.p99);
  };
  row("TTFT ms          ", ttft_ms);
  row("TPOT ms          ", tpot_ms);
  row("ITL ms           ", itl_ms);
  row("E2E ms           ", e2e_ms);
  if (o.turns > 1) {
    row("TTFT turn 1 ms   ", ttft_first_turn_ms);
    row("TTFT turns 2+ ms ", ttft_later_turns_ms);
  }
  if (!first_error.empty()) s += "first error: " + first_error + "\n";
  return s;
}

std::string BenchReport::to_json(const BenchOptions& o) const {
  auto sj = [](const Summary& x) { return Json{{"mean", x.mean}, {"median", x.median}, {"p99", x.p99}, {"count", x.count}}; };
  Json j = {{"model", o.model}, {"requests", o.requests}, {"concurrency", o.concurrency}, {"rate", o.rate},
            {"input_len", {o.input_min, o.input_max}}, {"output_len", {o.output_min, o.output_max}},
            {"turns", o.turns}, {"sessions", o.sessions}, {"endpoint", o.endpoint},
            {"inputs_per_request", o.inputs_per_request}, {"sequences", sequences},
            {"sequence_throughput", sequence_throughput}, {"completed", completed}, {"failed", failed},
            {"duration_s", duration_s}, {"input_tokens", input_tokens}, {"output_tokens", output_tokens},
            {"request_throughput", request_throughput}, {"output_throughput", output_throughput},
            {"total_throughput", total_throughput}, {"goodput", goodput}, {"ttft_ms", sj(ttft_ms)},
            {"tpot_ms", sj(tpot_ms)}, {"itl_ms", sj(itl_ms)}, {"e2e_ms", sj(e2e_ms)},
            {"ttft_first_turn_ms", sj(ttft_first_turn_ms)}, {"ttft_later_turns_ms", sj(ttft_later_turns_ms)}};
  return j.dump(2);
}

}  // namespace kiln::server
