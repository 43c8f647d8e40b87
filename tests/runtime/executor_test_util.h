// Executor test helpers shared by the CPU, tensor-parallel and CUDA executor tests.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "runtime/executor.h"

namespace kiln::test_exec {

// Submits every request before the executor's next turn (the first one's first update,
// sent on the executor thread, waits until the others are submitted, so a small pool is
// oversubscribed however the client threads happen to be scheduled) and returns when all
// are done. on_update(i, u) sees each update of request i on the executor thread.
inline void submit_all_at_once(Executor& ex, const std::vector<GenerationRequest>& reqs,
                               const std::function<void(size_t, RequestUpdate&)>& on_update) {
  std::atomic<bool> queued{false};
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;
  for (size_t i = 0; i < reqs.size(); ++i)
    ex.submit(reqs[i], [&, i](RequestUpdate&& u) {
      while (i == 0 && !queued) std::this_thread::yield();
      on_update(i, u);
      if (u.done) {
        std::lock_guard lk(mu);
        ++done;
        cv.notify_all();
      }
    });
  queued = true;
  std::unique_lock lk(mu);
  cv.wait(lk, [&] { return done == reqs.size(); });
}

// submit_all_at_once, collecting each request's n choices at their indices, with their
// tokens and finish reasons.
inline std::vector<GenerationResult> run_all_at_once(Executor& ex, const std::vector<GenerationRequest>& reqs) {
  std::vector<GenerationResult> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) out[i].choices.resize(size_t(reqs[i].n));
  submit_all_at_once(ex, reqs, [&](size_t i, RequestUpdate& u) {
    for (auto& c : u.choices) {
      auto& choice = out[i].choices.at(size_t(c.index));
      choice.tokens.insert(choice.tokens.end(), c.tokens.begin(), c.tokens.end());
      if (c.finish != FinishReason::kNone) choice.finish = c.finish;
    }
    if (u.done) out[i].error = u.error;
  });
  return out;
}

// Submits every request from its own thread and waits for all of them.
inline std::vector<GenerationResult> run_concurrently(Executor& ex, const std::vector<GenerationRequest>& reqs) {
  std::vector<GenerationResult> out(reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) threads.emplace_back([&, i] { out[i] = ex.generate(reqs[i]); });
  for (auto& t : threads) t.join();
  return out;
}

// A greedy request that runs to max_tokens (end tokens ignored).
inline GenerationRequest greedy_request(const std::vector<int32_t>& prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  return r;
}

// The executor publishes its stats after each loop turn, after the done callbacks: waits
// (at most ~2 s) for them to show nothing running or waiting.
inline ExecutorStats settled_stats(Executor& ex) {
  for (int i = 0; i < 400 && ex.stats().running + ex.stats().waiting > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  return ex.stats();
}

// A byte-level BPE tokenizer.json for the fixtures' 512-token vocabulary (GPT-2's
// bytes-to-unicode alphabet, ids 0-255 the bytes, 256-511 merges of two of them): enough for
// the pieces a JSON-constrained choice is masked by.
inline std::string json_test_tokenizer() {
  std::vector<std::string> byte_char(256);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + extra++);
    std::string u;
    if (cp < 0x80) u += char(cp);
    else u += char(0xC0 | (cp >> 6)), u += char(0x80 | (cp & 0x3F));
    byte_char[size_t(b)] = u;
  }
  nlohmann::json vocab = nlohmann::json::object(), merges = nlohmann::json::array();
  for (int b = 0; b < 256; ++b) vocab[byte_char[size_t(b)]] = b;
  // JSON-ish pairs first, then arbitrary ones, 256 in all.
  std::vector<std::pair<uint8_t, uint8_t>> pairs = {{'{', '"'}, {'"', ':'}, {'"', ','}, {'"', '}'}, {':', ' '},
                                                     {',', ' '}, {' ', '"'}, {'t', 'r'}, {'u', 'e'}, {'n', 'u'},
                                                     {'1', '2'}, {'[', ']'}, {'{', '}'}, {'\\', 'n'}};
  for (int a = 'a'; pairs.size() < 256; ++a)
    for (int b = 'a'; b <= 'z' && pairs.size() < 256; ++b) pairs.push_back({uint8_t(a), uint8_t(b)});
  int id = 256;
  for (auto [a, b] : pairs) {
    const std::string merged = byte_char[a] + byte_char[b];
    if (vocab.contains(merged)) continue;
    vocab[merged] = id++;
    merges.push_back(byte_char[a] + " " + byte_char[b]);
  }
  return nlohmann::json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
                        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                        {"decoder", {{"type", "ByteLevel"}}}}
      .dump();
}

}  // namespace kiln::test_exec
