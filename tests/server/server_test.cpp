// The HTTP server over loopback with cpp-httplib's client: OpenAI completions (plain
// and SSE), embeddings (float and base64), reranking, KServe v2, health, models, metrics, API
// keys, every kind of bad input as an OpenAI-format 4xx, graceful drain; with the
// real SmolLM2 and MiniLM (when fetched): chat, stop strings, sessions, disconnects;
// a tensor-parallel (TP=2) model served like any other; swap preemption and its metrics.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <regex>
#include <thread>

#include "../frontends/test_util.h"
#include "../models/golden_util.h"
#include "runtime/encoder_runner.h"
#include "runtime/llm_runner.h"
#include "server_util.h"

namespace kiln::server {
namespace {

using namespace testing;

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ExecutorOptions eo;
    eo.kv_tokens = 2048;
    repo_ = new ModelRepository({}, eo);
    repo_->add(fixture("llama"), "llama");
    repo_->add(fixture("bert"), "bert");
    ServerOptions so;
    so.max_body_bytes = 64 * 1024;
    srv_ = new TestServer(*repo_, so);
  }
  static void TearDownTestSuite() {
    delete srv_;
    delete repo_;
  }
  static int port() { return srv_->port(); }
  static std::vector<int32_t> alone(const std::vector<int32_t>& prompt, int n) {
    LlmRunner runner(*repo_->find("llama")->model);
    return runner.generate_greedy({prompt}, n).at(0);
  }
  static ModelRepository* repo_;
  static TestServer* srv_;
};
ModelRepository* ServerTest::repo_ = nullptr;
TestServer* ServerTest::srv_ = nullptr;

Json greedy_ids(const std::vector<int32_t>& prompt, int max_tokens) {
  return Json{{"model", "llama"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
              {"ignore_eos", true}, {"return_token_ids", true}};
}

TEST_F(ServerTest, HealthModelsAndMetrics) {
  EXPECT_EQ(get(port(), "/health/live").status, 200);
  EXPECT_EQ(get(port(), "/health/ready").status, 200);
  EXPECT_EQ(get(port(), "/v2/health/ready").status, 200);
  auto models = get(port(), "/v1/models");
  ASSERT_EQ(models.status, 200);
  auto j = models.json();
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][0]["id"], "llama");
  EXPECT_EQ(j["data"][1]["kind"], "embed");
  auto metrics = get(port(), "/metrics");
  ASSERT_EQ(metrics.status, 200);
  for (const char* name : {"kiln_kv_blocks_total{model=\"llama\"} 128", "kiln_num_requests_waiting",
                           "kiln_prefix_cache_hit_rate", "kiln_preemptions_total", "kiln_session_expiries_total",
                           "kiln_spec_decode_draft_tokens_total{model=\"llama\"} 0",
                           "kiln_spec_decode_accepted_tokens_total{model=\"llama\"} 0"})
    EXPECT_NE(metrics.body.find(name), std::string::npos) << name;
  // The process's host memory (Linux: the resident size holds at least its anonymous part),
  // CPU time and start time.
  auto gauge = [&](const std::string& name) {
    const size_t at = metrics.body.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(metrics.body.substr(at + name.size() + 2));
  };
  if (std::ifstream("/proc/self/status")) {
    EXPECT_GT(gauge("kiln_host_anonymous_memory_bytes"), 0) << metrics.body;
    EXPECT_GE(gauge("process_resident_memory_bytes"), gauge("kiln_host_anonymous_memory_bytes"));
    EXPECT_GE(gauge("process_cpu_seconds_total"), 0) << metrics.body;
    EXPECT_GT(gauge("process_start_time_seconds"), 1e9) << metrics.body;
  }
}

TEST_F(ServerTest, CompletionWithTokenIdsMatchesTheRunnerAlone) {
  std::vector<int32_t> prompt = {5, 17, 33, 250, 9, 41};
  auto r = post(port(), "/v1/completions", greedy_ids(prompt, 10));
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = r.json();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["token_ids"].get<std::vector<int32_t>>(), alone(prompt, 10));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 6);
  // Greedy steps sample from the TopKLogits candidates, and /metrics counts them.
  const std::string body = get(port(), "/metrics").body, key = "kiln_top_logits_steps_total{model=\"llama\"} ";
  const size_t at = body.find(key);
  ASSERT_NE(at, std::string::npos) << body;
  EXPECT_GT(std::stod(body.substr(at + key.size())), 0.0) << body.substr(at, 80);
  EXPECT_EQ(j["usage"]["completion_tokens"], 10);
  EXPECT_EQ(j["usage"]["total_tokens"], 16);
  auto metrics = get(port(), "/metrics").body;
  EXPECT_NE(metrics.find("kiln_requests_total{model=\"llama\",endpoint=\"/v1/completions\",status=\"200\"}"),
            std::string::npos);
  EXPECT_NE(metrics.find("kiln_time_to_first_token_seconds_count{model=\"llama\"}"), std::string::npos);
}

TEST_F(ServerTest, StreamingDeliversEveryTokenOnceThenUsageAndDone) {
  std::vector<int32_t> prompt = {7, 8, 9, 10};
  Json body = greedy_ids(prompt, 12);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  body["logprobs"] = 2;
  auto s = post_sse(port(), "/v1/completions", body);
  ASSERT_EQ(s.status, 200);
  EXPECT_TRUE(s.done);
  std::vector<int32_t> ids;
  std::string finish;
  Json usage;
  for (auto& e : s.events) {
    Json j = Json::parse(e);
    if (j.contains("usage")) usage = j["usage"];
    for (auto& c : j["choices"]) {
      for (auto& t : c["token_ids"]) ids.push_back(t.get<int32_t>());
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
      if (!c["token_ids"].empty()) {
        EXPECT_EQ(c["logprobs"]["top_logprobs"][0].size(), 2u);
      }
    }
  }
  EXPECT_EQ(ids, alone(prompt, 12));
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(usage["completion_tokens"], 12);
}

// echo with logprobs (how lm-evaluation-harness scores a continuation through an
// OpenAI-compatible server) and vLLM's prompt_logprobs, against transformers' logits of
// the fixture's prompt; max_tokens 0 returns the prompt alone; streaming sends the prompt
// first.
TEST_F(ServerTest, EchoAndPromptLogprobsAreTransformersLogSoftmax) {
  const kiln::testing::Reference ref("llama");
  const auto prompt = ref.prompts().at(2);
  const auto logits = ref.f32("logits");  // [3, Smax, V]
  const int64_t smax = ref.shape("logits")[1], vocab = ref.shape("logits")[2];
  auto ref_logprob = [&](size_t q, int32_t token) {  // of `token` after prompt[0..q]
    const float* x = logits.data() + (2 * smax + int64_t(q)) * vocab;
    double mx = *std::max_element(x, x + vocab), sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(x[v]) - mx);
    return double(x[token]) - mx - std::log(sum);
  };
  auto check_prompt = [&](const Json& lp) {
    ASSERT_GE(lp["token_logprobs"].size(), prompt.size());
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    EXPECT_TRUE(lp["top_logprobs"][0].is_null());
    for (size_t i = 1; i < prompt.size(); ++i) {
      EXPECT_EQ(lp["tokens"][i], std::to_string(prompt[i]));  // no tokenizer: the ids
      EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), ref_logprob(i - 1, prompt[i]), 1e-4) << i;
      EXPECT_EQ(lp["top_logprobs"][i].size(), 1u);
      EXPECT_GT(lp["text_offset"][i].get<int64_t>(), lp["text_offset"][i - 1].get<int64_t>());
    }
  };
  Json body = greedy_ids(prompt, 1);
  body["logprobs"] = 1;
  auto plain = post(port(), "/v1/completions", body);
  ASSERT_EQ(plain.status, 200) << plain.body;
  body["echo"] = true;
  auto echoed = post(port(), "/v1/completions", body);
  ASSERT_EQ(echoed.status, 200) << echoed.body;
  Json lp = echoed.json()["choices"][0]["logprobs"];
  check_prompt(lp);
  ASSERT_EQ(lp["token_logprobs"].size(), prompt.size() + 1);
  // The completion's token follows, as without echo.
  const Json gen = plain.json()["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"][prompt.size()], gen["tokens"][0]);
  EXPECT_NEAR(lp["token_logprobs"][prompt.size()].get<double>(), gen["token_logprobs"][0].get<double>(), 1e-5);
  EXPECT_EQ(echoed.json()["choices"][0]["token_ids"], plain.json()["choices"][0]["token_ids"]);

  body["max_tokens"] = 0;  // the prompt alone
  auto only = post(port(), "/v1/completions", body);
  ASSERT_EQ(only.status, 200) << only.body;
  check_prompt(only.json()["choices"][0]["logprobs"]);
  EXPECT_EQ(only.json()["choices"][0]["logprobs"]["token_logprobs"].size(), prompt.size());
  EXPECT_EQ(only.json()["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(only.json()["usage"]["completion_tokens"], 0);

  Json v = greedy_ids(prompt, 2);
  v["prompt_logprobs"] = 2;
  auto vl = post(port(), "/v1/completions", v);
  ASSERT_EQ(vl.status, 200) << vl.body;
  const Json pl = vl.json()["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(pl.size(), prompt.size());
  EXPECT_TRUE(pl[0].is_null());
  for (size_t i = 1; i < prompt.size(); ++i) {
    const Json& e = pl[i][std::to_string(prompt[i])];
    EXPECT_NEAR(e["logprob"].get<double>(), ref_logprob(i - 1, prompt[i]), 1e-4) << i;
    EXPECT_GE(e["rank"].get<int>(), 1);
    EXPECT_GE(pl[i].size(), 2u);
    EXPECT_LE(pl[i].size(), 3u);
  }

  body["max_tokens"] = 3;
  body["stream"] = true;
  auto s = post_sse(port(), "/v1/completions", body);
  ASSERT_EQ(s.status, 200);
  ASSERT_GE(s.events.size(), 2u);
  const Json first = Json::parse(s.events[0])["choices"][0];
  check_prompt(first["logprobs"]);
  EXPECT_EQ(first["logprobs"]["token_logprobs"].size(), prompt.size());
  std::vector<int32_t> ids;
  for (size_t e = 1; e < s.events.size(); ++e) {
    const Json j = Json::parse(s.events[e]);
    for (auto& c : j["choices"])
      for (auto& t : c["token_ids"]) ids.push_back(t.get<int32_t>());
  }
  EXPECT_EQ(ids, alone(prompt, 3));
}

// A batch of prompts (OpenAI's array prompt, as lm-evaluation-harness sends with batch_size
// > 1): prompt k's n choices at indices k * n ..., each what its prompt gives alone, usage
// summed over the prompts; streamed and not; with echo + logprobs each choice echoes its own
// prompt.
TEST_F(ServerTest, BatchedPromptsAnswerEachPromptsChoicesInOrder) {
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 33}, {250, 9, 41, 7, 8}, {100}};
  Json body = greedy_ids({}, 6);
  body["prompt"] = prompts;
  body["n"] = 2;
  auto r = post(port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = r.json();
  ASSERT_EQ(j["choices"].size(), 6u);
  for (size_t k = 0; k < prompts.size(); ++k)
    for (size_t i = 0; i < 2; ++i) {
      const Json& c = j["choices"][k * 2 + i];
      EXPECT_EQ(c["index"], k * 2 + i);
      EXPECT_EQ(c["token_ids"].get<std::vector<int32_t>>(), alone(prompts[k], 6)) << "prompt " << k;
    }
  EXPECT_EQ(j["usage"]["prompt_tokens"], 9);  // each prompt once, whatever n
  body["stream"] = true;
  auto s = post_sse(port(), "/v1/completions", body);
  ASSERT_TRUE(s.done);
  std::vector<std::vector<int32_t>> streamed(6);
  for (auto& e : s.events) {
    const Json ev = Json::parse(e);
    for (auto& c : ev["choices"])
      for (auto& t : c["token_ids"]) streamed[c["index"].get<size_t>()].push_back(t.get<int32_t>());
  }
  for (size_t k = 0; k < 6; ++k) EXPECT_EQ(streamed[k], alone(prompts[k / 2], 6)) << "choice " << k;
  Json echo = greedy_ids({}, 1);
  echo["prompt"] = prompts;
  echo["echo"] = true;
  echo["logprobs"] = 0;
  auto e = post(port(), "/v1/completions", echo);
  ASSERT_EQ(e.status, 200) << e.body;
  for (size_t k = 0; k < prompts.size(); ++k) {
    const Json lp = e.json()["choices"][k]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), prompts[k].size() + 1) << k;
    EXPECT_EQ(lp["tokens"][0], std::to_string(prompts[k][0]));
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  }
  body.erase("stream");
  body["prompt"] = Json::array({Json::array({1, 2}), Json::array({1, 99999})});
  auto bad = post(port(), "/v1/completions", body);
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("outside the vocabulary"), std::string::npos) << bad.body;
  body["prompt"] = Json::array({Json::array({1, 2}), "text"});
  EXPECT_EQ(post(port(), "/v1/completions", body).status, 400);
  body["prompt"] = Json::array({Json::array({1, 2}), Json::array({3})});
  body["session_id"] = "s1";
  EXPECT_EQ(post(port(), "/v1/completions", body).status, 400);
}

TEST_F(ServerTest, NChoicesAndSeedsAreReproducible) {
  Json body = {{"model", "llama"}, {"prompt", {1, 2, 3, 4, 5}}, {"max_tokens", 6}, {"n", 3},
               {"seed", 99}, {"temperature", 1.0}, {"ignore_eos", true}, {"return_token_ids", true}};
  auto a = post(port(), "/v1/completions", body).json();
  auto b = post(port(), "/v1/completions", body).json();
  ASSERT_EQ(a["choices"].size(), 3u);
  EXPECT_EQ(a["choices"], b["choices"]);
  EXPECT_EQ(a["usage"]["completion_tokens"], 18);
}

// logit_bias (OpenAI's): +100 on a token makes greedy choose it at every step, -100 on the
// token greedy would choose moves it off; the logprobs stay the model's own. Such requests
// sample from whole rows (a bias moves logits the top-k candidates lack).
TEST_F(ServerTest, LogitBiasSteersTheChoice) {
  std::vector<int32_t> prompt = {5, 17, 33, 250, 9, 41};
  const std::vector<int32_t> plain = alone(prompt, 4);
  Json body = greedy_ids(prompt, 4);
  body["logit_bias"] = {{"123", 100}};
  body["logprobs"] = 1;
  auto r = post(port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = r.json();
  EXPECT_EQ(j["choices"][0]["token_ids"].get<std::vector<int32_t>>(), std::vector<int32_t>(4, 123));
  for (const auto& lp : j["choices"][0]["logprobs"]["token_logprobs"]) EXPECT_LT(lp.get<double>(), 0.0);
  body = greedy_ids(prompt, 1);
  body["logit_bias"] = {{std::to_string(plain[0]), -100}};
  auto banned = post(port(), "/v1/completions", body).json();
  ASSERT_EQ(banned["choices"][0]["token_ids"].size(), 1u);
  EXPECT_NE(banned["choices"][0]["token_ids"][0].get<int32_t>(), plain[0]);
}

struct BadCase {
  const char* path;
  std::string body;
  int status;
  const char* needle;
};

TEST_F(ServerTest, BadInputIsAClear4xxAndTheServerIsUnaffected) {
  std::string big(100 * 1024, 'x');
  std::string bad_utf8 = "{\"model\":\"llama\",\"prompt\":\"a\xff\xfe\"}";
  std::vector<BadCase> cases = {
      {"/v1/completions", "{not json", 400, "not valid JSON"},
      {"/v1/completions", "", 400, "empty"},
      {"/v1/completions", "[1,2]", 400, "JSON object"},
      {"/v1/completions", R"({"prompt":[1,2]})", 400, "'model' is required"},
      {"/v1/completions", R"({"model":"nope","prompt":[1,2]})", 404, "does not exist"},
      {"/v1/completions", R"({"model":"llama"})", 400, "'prompt' is required"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"max_tokens":"ten"})", 400, "'max_tokens' must be an integer"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"max_tokens":-5})", 400, "max_tokens"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"max_tokens":100000000})", 400, "max_tokens"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"temperature":-1})", 400, "temperature"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"temperature":1e308})", 400, "temperature"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"top_p":5})", 400, "top_p"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"n":1000})", 400, "'n'"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"stream":"yes"})", 400, "'stream' must be a boolean"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"stop":[1]})", 400, "stop"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,99999]})", 400, "outside the vocabulary"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,-3]})", 400, "token id"},
      {"/v1/completions", R"({"model":"llama","prompt":"text"})", 400, "no tokenizer"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"max_tokens":200})", 400, "maximum context length"},
      {"/v1/chat/completions", R"({"model":"llama","messages":[{"role":"user","content":"hi"}],"echo":true})", 400,
       "'echo' is supported on /v1/completions only"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"echo":true,"max_tokens":0,"n":2})", 400, "needs n = 1"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"max_tokens":0})", 400, "max_tokens"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"prompt_logprobs":21})", 400, "prompt_logprobs"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"logit_bias":[5]})", 400, "logit_bias"},
      {"/v1/chat/completions", R"({"model":"llama","messages":[{"role":"user","content":"hi"}],"tools":{}})", 400, "'tools'"},
      {"/v1/chat/completions", R"({"model":"llama","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]})",
       400, "'function' object"},
      {"/v1/chat/completions", R"({"model":"llama","messages":[{"role":"user","content":"hi"}],"tool_choice":"auto"})", 400,
       "needs 'tools'"},
      {"/v1/chat/completions",
       R"({"model":"llama","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}})",
       400, "not in 'tools'"},
      {"/v1/chat/completions",
       R"({"model":"llama","messages":[{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":"{bad"}}]}]})",
       400, "not a JSON object"},
      {"/tokenize", R"({"model":"llama","prompt":"hi"})", 400, "has no tokenizer"},
      {"/tokenize", R"({"model":"nope","prompt":"hi"})", 404, "does not exist"},
      {"/detokenize", R"({"model":"llama"})", 400, "'tokens' is required"},
      {"/detokenize", R"({"model":"llama","tokens":"1"})", 400, "tokens"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"response_format":{"type":"json_schema"}})", 400,
       "needs a 'json_schema' object"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object"}}}})",
       400, "needs a model with a tokenizer"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"guided_choice":["a"],"grammar":"root ::= \"a\""})", 400,
       "at most one"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"guided_regex":"a(b"})", 400,
       "'guided_regex': regex: '(' is not closed"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"guided_regex":"(?=a)b"})", 400, "lookarounds"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"guided_regex":""})", 400, "guided_regex"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"structured_outputs":{"regex":"a+"}})", 400,
       "needs a model with a tokenizer"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"structured_outputs":{"regex":"a+"},"grammar":"root ::= \"a\""})",
       400, "more than one grammar"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"structured_outputs":{"whitespace_pattern":" "}})", 400,
       "'structured_outputs.whitespace_pattern' is not supported"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"structured_outputs":{"choice":[]}})", 400,
       "structured_outputs.choice"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"structured_outputs":{"choice":["a"]},"guided_choice":["b"]})",
       400, "more than one choice list"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"guided_json":"{not json"})", 400, "guided_json"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"response_format":"json"})", 400, "response_format"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"response_format":{"type":"json_object"}})", 400,
       "needs a model with a tokenizer"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"logit_bias":{"x5":1}})", 400, "'x5' is not a token id"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"logit_bias":{"5":101}})", 400, "[-100, 100]"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"logit_bias":{"5":"a"}})", 400, "[-100, 100]"},
      {"/v1/completions", R"({"model":"llama","prompt":[1,2],"logit_bias":{"99999":1}})", 400, "outside the vocabulary"},
      {"/v1/completions", R"({"model":"bert","prompt":[1,2]})", 400, "encoder"},
      {"/v1/completions", bad_utf8, 400, "not valid JSON"},
      {"/v1/completions", "{\"model\":\"llama\",\"prompt\":\"" + big + "\"}", 413, "larger than"},
      {"/v1/chat/completions", R"({"model":"llama","messages":[{"role":"user","content":"hi"}]})", 400, "chat template"},
      {"/v1/chat/completions", R"({"model":"llama","messages":[]})", 400, "messages"},
      {"/v1/chat/completions", R"({"model":"llama","messages":[{"role":"wizard","content":"hi"}]})", 400, "role"},
      {"/v1/chat/completions", R"({"model":"llama","messages":"hi"})", 400, "messages"},
      {"/v1/chat/completions", R"({"model":"llama","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":5})",
       400, "chat_template_kwargs"},
      {"/v1/chat/completions",
       R"({"model":"llama","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"messages":[]}})", 400,
       "may not set 'messages'"},
      {"/v1/embeddings", R"({"model":"llama","input":[1,2]})", 400, "decoder"},
      {"/v1/embeddings", R"({"model":"bert","input":[]})", 400, "input"},
      {"/v1/embeddings", R"({"model":"bert","input":{"a":1}})", 400, "input"},
      {"/v1/embeddings", R"({"model":"bert","input":"text"})", 400, "no tokenizer"},
      {"/v1/embeddings", R"({"model":"bert","input":[1,2],"encoding_format":"hex"})", 400, "encoding_format"},
      {"/v1/rerank", R"({"model":"bert","query":"q","documents":["a"]})", 400, "no tokenizer"},
      {"/v1/rerank", R"({"model":"llama","query":"q","documents":["a"]})", 400, "decoder"},
      {"/v1/rerank", R"({"model":"nope","query":"q","documents":["a"]})", 404, "does not exist"},
      {"/v1/rerank", R"({"model":"bert","documents":["a"]})", 400, "'query' is required"},
      {"/v1/rerank", R"({"model":"bert","query":"","documents":["a"]})", 400, "'query' is empty"},
      {"/v1/rerank", R"({"model":"bert","query":"q","documents":[]})", 400, "documents"},
      {"/v1/rerank", R"({"model":"bert","query":"q","documents":[1]})", 400, "documents"},
      {"/v1/rerank", R"({"model":"bert","query":"q","documents":[{"txt":"a"}]})", 400, "documents"},
      {"/v1/rerank", R"({"model":"bert","query":"q","documents":[""]})", 400, "empty text"},
      {"/v1/rerank", R"({"model":"bert","query":"q","documents":["a"],"top_n":0})", 400, "top_n"},
      {"/v1/rerank", R"({"model":"bert","query":"q","documents":["a"],"return_documents":"yes"})", 400, "return_documents"},
      {"/rerank", R"({"model":"bert","query":"q","documents":"a"})", 400, "documents"},
      {"/v1/nothing", "{}", 404, "no route"},
      {"/v2/models/bert/infer", R"({"inputs":[]})", 400, "inputs"},
      {"/v2/models/bert/infer", R"({"inputs":[{"name":"ids","datatype":"INT64","shape":[1,3],"data":[1,2]}]})", 400, "elements"},
      {"/v2/models/bert/infer", R"({"inputs":[{"name":"ids","datatype":"FP32","shape":[1],"data":[1.0]}]})", 400, "datatype"},
      {"/v2/models/nope/infer", R"({"inputs":[{"name":"ids","datatype":"INT64","shape":[1,2],"data":[1,2]}]})", 404, "does not exist"},
  };
  for (auto& c : cases) {
    auto r = post(port(), c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.path << " " << c.body.substr(0, 120) << " -> " << r.body;
    EXPECT_NE(r.body.find(c.needle), std::string::npos) << c.path << " " << c.body.substr(0, 120) << " -> " << r.body;
    if (std::string(c.path).rfind("/v1/", 0) == 0 && r.status >= 400) {
      auto j = Json::parse(r.body, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << r.body;
      EXPECT_TRUE(j["error"]["message"].is_string()) << r.body;
      EXPECT_TRUE(j["error"]["type"].is_string()) << r.body;
    }
  }
  EXPECT_EQ(get(port(), "/health/ready").status, 200);
  EXPECT_EQ(post(port(), "/v1/completions", greedy_ids({3, 4}, 2)).status, 200);
}

TEST_F(ServerTest, EmbeddingsFloatAndBase64AgreeAndAreNormalized) {
  Json body = {{"model", "bert"}, {"input", {{1, 5, 9, 2}, {1, 7, 2}}}};
  auto f = post(port(), "/v1/embeddings", body);
  ASSERT_EQ(f.status, 200) << f.body;
  auto j = f.json();
  ASSERT_EQ(j["data"].size(), 2u);
  auto e0 = j["data"][0]["embedding"].get<std::vector<float>>();
  ASSERT_EQ(e0.size(), 64u);
  double norm = 0;
  for (float x : e0) norm += double(x) * x;
  EXPECT_NEAR(norm, 1.0, 1e-4);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 7);
  body["encoding_format"] = "base64";
  auto b = post(port(), "/v1/embeddings", body).json();
  std::string s = b["data"][0]["embedding"];
  EXPECT_EQ(s, base64_floats(e0));
}

// Concurrent clients' embeddings share forwards (the encoder batcher) and each gets
// what it gets alone; /metrics counts the forwards and sequences.
TEST_F(ServerTest, ConcurrentEmbeddingsMatchTheirSequentialResults) {
  const int kClients = 16;
  std::vector<Json> bodies;
  std::vector<std::vector<float>> expected;
  for (int c = 0; c < kClients; ++c) {
    std::vector<int32_t> ids = {1};
    for (int i = 0; i < 2 + c % 7; ++i) ids.push_back(3 + (c * 5 + i * 3) % 40);
    bodies.push_back({{"model", "bert"}, {"input", {ids}}});
    auto r = post(port(), "/v1/embeddings", bodies.back());
    ASSERT_EQ(r.status, 200) << r.body;
    expected.push_back(r.json()["data"][0]["embedding"].get<std::vector<float>>());
  }
  std::vector<std::vector<float>> got(kClients);
  std::vector<int> status(kClients);
  std::vector<std::thread> clients;
  for (int round = 0; round < 3; ++round) {
    clients.clear();
    for (int c = 0; c < kClients; ++c)
      clients.emplace_back([&, c] {
        auto r = post(port(), "/v1/embeddings", bodies[size_t(c)]);
        status[size_t(c)] = r.status;
        if (r.status == 200) got[size_t(c)] = r.json()["data"][0]["embedding"].get<std::vector<float>>();
      });
    for (auto& t : clients) t.join();
    for (int c = 0; c < kClients; ++c) {
      ASSERT_EQ(status[size_t(c)], 200) << "client " << c;
      ASSERT_EQ(got[size_t(c)].size(), expected[size_t(c)].size());
      for (size_t k = 0; k < got[size_t(c)].size(); ++k)
        EXPECT_NEAR(got[size_t(c)][k], expected[size_t(c)][k], 1e-5) << "client " << c << " value " << k;
    }
  }
  const std::string m = get(port(), "/metrics").body;
  for (const char* name : {"kiln_encoder_forwards_total{model=\"bert\"}", "kiln_encoder_sequences_total{model=\"bert\"}",
                           "kiln_encoder_queue_sequences{model=\"bert\"} 0", "kiln_encoder_failed_requests_total{model=\"bert\"} 0"})
    EXPECT_NE(m.find(name), std::string::npos) << name;
  const EncoderBatcherStats st = repo_->find("bert")->batcher->stats();
  EXPECT_GE(st.sequences, 4 * kClients);
  EXPECT_LE(st.forwards, st.sequences);
}

// A client that hangs up while its embedding request is queued: the server notices (the
// whitespace it sends while the request waits fails to write) and withdraws the request,
// so no forward runs for it; the next client, whose request waits as long, gets its
// embedding through the same kind of response (leading whitespace, then the JSON).
TEST(ServerEncoders, AClientThatHangsUpWithdrawsItsQueuedRequest) {
  EncoderBatcherOptions bo;
  bo.max_queue_delay = std::chrono::milliseconds(1500);  // every request waits this long
  ModelRepository repo({}, {}, bo);
  repo.add(fixture("bert"), "bert");
  TestServer srv(repo);
  const Json body = {{"model", "bert"}, {"input", {std::vector<int32_t>{1, 7, 9, 2}}}};
  {
    httplib::Client cli("127.0.0.1", srv.port());
    cli.set_read_timeout(0, 200 * 1000);  // gives up after 200 ms and closes
    auto r = cli.Post("/v1/embeddings", body.dump(), "application/json");
    EXPECT_FALSE(r) << "the client was meant to time out";
  }
  EncoderBatcher& b = *repo.find("bert")->batcher;
  for (int i = 0; i < 100 && b.stats().cancelled_requests == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EncoderBatcherStats st = b.stats();
  EXPECT_EQ(st.cancelled_requests, 1);
  EXPECT_EQ(st.cancelled_sequences, 1);
  EXPECT_EQ(st.forwards, 0);
  auto r = post(srv.port(), "/v1/embeddings", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body.front(), ' ') << "answered after waiting, through the chunked response";
  auto e = r.json()["data"][0]["embedding"].get<std::vector<float>>();
  const auto alone = encode(*repo.find("bert")->model, {{{1, 7, 9, 2}, {}}}, {.hidden = false});
  ASSERT_EQ(e.size(), alone[0].mean_pooled.size());
  double n = 0;
  for (float x : alone[0].mean_pooled) n += double(x) * x;
  for (size_t k = 0; k < e.size(); ++k) EXPECT_NEAR(e[k], alone[0].mean_pooled[k] / std::sqrt(n), 1e-5) << k;
  st = b.stats();
  EXPECT_EQ(st.forwards, 1);
  EXPECT_EQ(st.cancelled_requests, 1);
  const std::string m = get(srv.port(), "/metrics").body;
  EXPECT_NE(m.find("kiln_encoder_cancelled_requests_total{model=\"bert\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("endpoint=\"/v1/embeddings\",status=\"499\""), std::string::npos) << "counted as a hang-up";
}

TEST_F(ServerTest, KserveV2MetadataAndInferOnAClassifier) {
  auto meta = get(port(), "/v2/models/bert");
  ASSERT_EQ(meta.status, 200);
  EXPECT_EQ(meta.json()["outputs"][0]["name"], "logits");
  EXPECT_EQ(get(port(), "/v2/models/bert/ready").status, 200);
  EXPECT_EQ(get(port(), "/v2/models/nope/ready").status, 404);
  Json body = {{"id", "req-1"},
               {"inputs", {{{"name", "input_ids"}, {"datatype", "INT64"}, {"shape", {2, 3}}, {"data", {1, 5, 2, 1, 6, 2}}}}}};
  auto r = post(port(), "/v2/models/bert/infer", body);
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = r.json();
  EXPECT_EQ(j["id"], "req-1");
  EXPECT_EQ(j["outputs"][0]["shape"], Json({2, 3}));
  auto probs = j["outputs"][1]["data"].get<std::vector<float>>();
  EXPECT_NEAR(probs[0] + probs[1] + probs[2], 1.0, 1e-5);
  EXPECT_EQ(j["outputs"][2]["data"].size(), 2u);
}

// `kiln serve` loads its models with ModelOptions::step_tuning off (unless
// --tune-batch-sizes): the repository's options reach each model's backend, the
// tensor-parallel ranks' too, and a model loaded without them keeps the default.
TEST(ServerRepository, StepTuningReachesTheBackend) {
  for (int tp : {1, 2}) {
    ModelOptions mo;
    mo.step_tuning = false;
    mo.tensor_parallel = tp;
    ModelRepository repo(mo, {});
    repo.add(fixture("llama"), "llama");
    Model& m = *repo.find("llama")->model;
    EXPECT_FALSE(m.compile_options().step_tuning) << "tp " << tp;
    for (int r = 1; r < m.tp_world(); ++r) EXPECT_FALSE(m.tp_rank(r).compile_options().step_tuning) << "rank " << r;
  }
  EXPECT_TRUE(Model::load(fixture("llama"))->compile_options().step_tuning);
}

// `kiln serve --tp 2`: the repository loads the model as two tensor-parallel ranks and
// the executor drives both; completions (greedy, n > 1) equal the unsharded model's.
TEST(ServerTensorParallel, CompletionsEqualTheUnshardedModel) {
  ModelOptions mo;
  mo.tensor_parallel = 2;
  ModelRepository repo(mo, {});
  repo.add(fixture("llama"), "llama");
  ASSERT_EQ(repo.find("llama")->model->tp_world(), 2);
  auto one = Model::load(fixture("llama"));
  TestServer srv(repo);
  for (const std::vector<int32_t>& prompt : {std::vector<int32_t>{5, 17, 33, 250, 9, 41}, std::vector<int32_t>{7}}) {
    Json body = greedy_ids(prompt, 8);
    body["n"] = 2;
    auto r = post(srv.port(), "/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    LlmRunner runner(*one);
    auto want = runner.generate_greedy({prompt}, 8).at(0);
    auto j = r.json();
    ASSERT_EQ(j["choices"].size(), 2u);
    for (auto& c : j["choices"]) EXPECT_EQ(c["token_ids"].get<std::vector<int32_t>>(), want);
  }
  // A model whose heads do not split is refused when it is added, naming the heads.
  mo.tensor_parallel = 3;
  ModelRepository bad(mo, {});
  try {
    bad.add(fixture("llama"), "llama");
    FAIL() << "TP=3 over 4 heads was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention heads do not split over 3 ranks"), std::string::npos) << e.what();
  }
}

// `kiln serve --preemption swap` with a pool too small for the load: completions equal
// the runner alone, and /metrics counts the swaps.
TEST(ServerSwap, SwapPreemptionIsExactAndCountedInMetrics) {
  ExecutorOptions eo;
  eo.kv_tokens = 128;  // 8 blocks: 6 requests of up to 56 tokens take turns
  eo.max_step_tokens = 64;
  eo.prefix_caching = false;
  eo.preemption = PreemptionMode::kSwap;
  eo.swap_space_bytes = 1 << 20;
  ModelRepository repo({}, eo);
  repo.add(fixture("llama"), "llama");
  TestServer srv(repo);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    prompts.emplace_back();
    for (int t = 0; t < 24 + 2 * i; ++t) prompts.back().push_back(3 + (i * 37 + t * 11) % 500);
  }
  std::vector<HttpResult> got(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i)
    clients.emplace_back([&, i] { got[i] = post(srv.port(), "/v1/completions", greedy_ids(prompts[i], 20)); });
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(got[i].status, 200) << got[i].body;
    LlmRunner runner(*repo.find("llama")->model);
    EXPECT_EQ(got[i].json()["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
              runner.generate_greedy({prompts[i]}, 20).at(0))
        << "request " << i;
  }
  // The stats a scrape reads trail the last update by one executor turn.
  auto value = [&](const std::string& body, const std::string& name) {
    const std::string key = name + "{model=\"llama\"} ";
    const size_t at = body.find(key);
    return at == std::string::npos ? -1.0 : std::stod(body.substr(at + key.size()));
  };
  std::string body;
  for (int i = 0; i < 200; ++i) {
    body = get(srv.port(), "/metrics").body;
    if (value(body, "kiln_num_requests_running") == 0 && value(body, "kiln_kv_swap_blocks_used") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(value(body, "kiln_kv_swap_blocks_total"), 128);  // 1 MiB of 8 KiB blocks
  EXPECT_GT(value(body, "kiln_kv_swapped_out_total"), 0) << body;
  EXPECT_EQ(value(body, "kiln_kv_swapped_in_total"), value(body, "kiln_kv_swapped_out_total"));
  EXPECT_GT(value(body, "kiln_kv_swap_out_bytes_total"), 0);
  EXPECT_EQ(value(body, "kiln_kv_swap_in_bytes_total"), value(body, "kiln_kv_swap_out_bytes_total"));
  EXPECT_EQ(value(body, "kiln_kv_swap_fallbacks_total"), 0);
  EXPECT_EQ(value(body, "kiln_kv_swap_blocks_used"), 0);
  EXPECT_GE(value(body, "kiln_preemptions_total"), value(body, "kiln_kv_swapped_out_total"));
}

// n above --max-running: a 400 naming n (a request's choices run together), and n up to it runs.
TEST(ServerMaxRunning, NAboveMaxRunningIsA400NamingN) {
  ExecutorOptions eo;
  eo.max_running = 2;
  ModelRepository repo({}, eo);
  repo.add(fixture("llama"), "llama");
  TestServer srv(repo);
  Json body = greedy_ids({3, 4, 5}, 4);
  body["n"] = 3;
  const HttpResult refused = post(srv.port(), "/v1/completions", body);
  EXPECT_EQ(refused.status, 400) << refused.body;
  const Json e = Json::parse(refused.body, nullptr, false);
  EXPECT_EQ(e["error"]["param"], "n") << refused.body;
  EXPECT_NE(refused.body.find("--max-running"), std::string::npos) << refused.body;
  body["n"] = 2;
  const HttpResult ok = post(srv.port(), "/v1/completions", body);
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.json()["choices"].size(), 2u);
}

TEST(ServerAuth, ApiKeysGuardTheApiButNotHealth) {
  ModelRepository repo({}, {});
  repo.add(fixture("llama"), "llama");
  ServerOptions so;
  so.api_keys = {"sk-test"};
  TestServer srv(repo, so);
  auto body = greedy_ids({1, 2, 3}, 2).dump();
  auto r = post(srv.port(), "/v1/completions", body);
  EXPECT_EQ(r.status, 401);
  EXPECT_NE(r.body.find("invalid_api_key"), std::string::npos);
  EXPECT_EQ(post(srv.port(), "/v1/completions", body, "sk-wrong").status, 401);
  EXPECT_EQ(post(srv.port(), "/v1/completions", body, "sk-test").status, 200);
  EXPECT_EQ(get(srv.port(), "/v1/models").status, 401);
  EXPECT_EQ(get(srv.port(), "/health/live").status, 200);
  EXPECT_EQ(get(srv.port(), "/metrics").status, 200);
}

TEST(ServerDrain, InFlightStreamsFinishThenTheListenerStops) {
  ModelRepository repo({}, {});
  repo.add(fixture("llama"), "llama");
  TestServer srv(repo);
  Json body = greedy_ids({1, 2, 3}, 100);
  body["stream"] = true;
  SseResult s;
  std::atomic<bool> answered{false};
  std::thread client([&] {
    s = post_sse(srv.port(), "/v1/completions", body);
    answered = true;
  });
  while (repo.find("llama")->executor->stats().running == 0 && !answered)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  srv.shutdown();
  client.join();
  EXPECT_EQ(s.status, 200);
  EXPECT_TRUE(s.done) << "the stream was cut by shutdown";
  size_t n = 0;
  for (auto& e : s.events) {
    Json j = Json::parse(e);
    for (auto& c : j["choices"]) n += c["token_ids"].size();
  }
  EXPECT_EQ(n, 100u) << s.raw.substr(0, 300);
  EXPECT_EQ(get(srv.port(), "/health/live").status, 0);  // no longer listening
}

// ---- reranking with the real all-MiniLM-L6-v2: as an embedding model and as a cross-encoder ----

// A decoder embedding model (lasttoken pooling) is served as an embedding model:
// /v1/embeddings answers the normalized last-token states of transformers' fixture,
// /v1/models says "embed", and generation routes answer 400.
TEST(DecoderEmbedServer, EmbeddingsAreTheNormalizedLastTokenStates) {
  test::TempDir dir;
  ModelRepository repo({}, {});
  repo.add(kiln::testing::write_decoder_embedding_dir("llama", dir.file("llama-embed")), "llama-embed");
  TestServer srv(repo);
  EXPECT_EQ(get(srv.port(), "/v1/models").json()["data"][0]["kind"], "embed");
  kiln::testing::Reference ref("llama");
  const auto prompts = ref.prompts();
  const auto hidden = ref.f32("hidden_last");
  const int64_t smax = ref.shape("hidden_last")[1], h = ref.shape("hidden_last")[2];
  auto r = post(srv.port(), "/v1/embeddings", Json{{"model", "llama-embed"}, {"input", prompts}});
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = r.json();
  ASSERT_EQ(j["data"].size(), prompts.size());
  for (size_t b = 0; b < prompts.size(); ++b) {
    const float* last = hidden.data() + (int64_t(b) * smax + int64_t(prompts[b].size()) - 1) * h;
    double norm = 0;
    for (int64_t k = 0; k < h; ++k) norm += double(last[k]) * last[k];
    const auto got = j["data"][b]["embedding"].get<std::vector<float>>();
    ASSERT_EQ(got.size(), size_t(h));
    for (int64_t k = 0; k < h; ++k) EXPECT_NEAR(got[size_t(k)], last[k] / std::sqrt(norm), 1e-5) << b << " " << k;
  }
  // dimensions (Matryoshka): the first 16 values, normalized again; out of range is a 400.
  auto d = post(srv.port(), "/v1/embeddings", Json{{"model", "llama-embed"}, {"input", prompts}, {"dimensions", 16}});
  ASSERT_EQ(d.status, 200) << d.body;
  for (size_t b = 0; b < prompts.size(); ++b) {
    const float* last = hidden.data() + (int64_t(b) * smax + int64_t(prompts[b].size()) - 1) * h;
    double norm = 0;
    for (int64_t k = 0; k < 16; ++k) norm += double(last[k]) * last[k];
    const auto got = d.json()["data"][b]["embedding"].get<std::vector<float>>();
    ASSERT_EQ(got.size(), 16u);
    for (int64_t k = 0; k < 16; ++k) EXPECT_NEAR(got[size_t(k)], last[k] / std::sqrt(norm), 1e-5) << b << " " << k;
  }
  for (int dims : {0, 65}) {
    auto bad = post(srv.port(), "/v1/embeddings", Json{{"model", "llama-embed"}, {"input", prompts}, {"dimensions", dims}});
    EXPECT_EQ(bad.status, 400) << bad.body;
    EXPECT_NE(bad.body.find("dimensions"), std::string::npos) << bad.body;
  }
  auto c = post(srv.port(), "/v1/completions", Json{{"model", "llama-embed"}, {"prompt", prompts[0]}});
  EXPECT_EQ(c.status, 400) << c.body;
  EXPECT_NE(c.body.find("an embedding model"), std::string::npos) << c.body;
}

TEST(RerankServer, RanksDocumentsAsTheLibraryDoes) {
  const std::string minilm = real_model("all-minilm-l6-v2");
  if (minilm.empty()) GTEST_SKIP() << "all-MiniLM-L6-v2 not fetched (scripts/fetch_models.sh)";
  test::TempDir dir;
  ModelRepository repo({}, {});
  repo.add(minilm, "minilm");
  repo.add(kiln::testing::write_cross_encoder(minilm, dir.file("ce")), "ce");
  TestServer srv(repo);
  const std::string query = "A man is eating food.";
  const std::vector<std::string> docs = {"A man is eating a piece of bread.", "A monkey is playing drums.",
                                         "The girl is carrying a baby.", "A man is riding a horse."};
  auto models = get(srv.port(), "/v1/models").json();
  EXPECT_EQ(models["data"][0]["kind"], "embed");
  EXPECT_EQ(models["data"][1]["kind"], "rerank");
  for (const char* name : {"minilm", "ce"}) {
    ServedModel& m = *repo.find(name);
    const auto in = rerank_inputs(*m.tokenizer, m.model->info(), query, docs);
    const auto want = rerank_scores(m.model->info(), encode(*m.model, in, {.hidden = false}));
    int64_t tokens = 0;
    for (const auto& x : in) tokens += int64_t(x.tokens.size());
    Json docs_json = Json::array();  // strings and {"text": ...} objects alike
    for (size_t i = 0; i < docs.size(); ++i) docs_json.push_back(i % 2 ? Json{{"text", docs[i]}} : Json(docs[i]));
    auto r = post(srv.port(), "/v1/rerank", Json{{"model", name}, {"query", query}, {"documents", docs_json}});
    ASSERT_EQ(r.status, 200) << r.body;
    const Json j = r.json();
    EXPECT_EQ(j["model"], name);
    EXPECT_EQ(j["usage"]["total_tokens"], tokens);
    ASSERT_EQ(j["results"].size(), docs.size());
    std::vector<bool> seen(docs.size(), false);
    for (size_t k = 0; k < docs.size(); ++k) {
      const Json& res = j["results"][k];
      const size_t i = res["index"];
      ASSERT_LT(i, docs.size());
      seen[i] = true;
      EXPECT_NEAR(res["relevance_score"].get<double>(), want[i], 1e-5) << name << " " << docs[i];
      EXPECT_FALSE(res.contains("document"));
      if (k) EXPECT_LE(res["relevance_score"].get<double>(), j["results"][k - 1]["relevance_score"].get<double>());
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), true), long(docs.size()));
    if (std::string(name) == "minilm") EXPECT_EQ(j["results"][0]["index"], 0) << "the bread sentence first";
    // top_n and return_documents; Cohere's v2 path and the bare one answer alike.
    for (const char* path : {"/v1/rerank", "/v2/rerank", "/rerank"}) {
      auto t = post(srv.port(), path,
                    Json{{"model", name}, {"query", query}, {"documents", docs}, {"top_n", 2}, {"return_documents", true}});
      ASSERT_EQ(t.status, 200) << path << " " << t.body;
      const Json tj = t.json();
      ASSERT_EQ(tj["results"].size(), 2u) << path;
      for (size_t k = 0; k < 2; ++k) {
        EXPECT_EQ(tj["results"][k]["index"], j["results"][k]["index"]) << path;
        EXPECT_EQ(tj["results"][k]["document"]["text"], docs[tj["results"][k]["index"].get<size_t>()]) << path;
      }
    }
  }
  EXPECT_NE(get(srv.port(), "/metrics").body.find("endpoint=\"/v2/rerank\",status=\"200\""), std::string::npos);
}

// ---- with the real SmolLM2-135M-Instruct (text, chat template, stop strings) ----

class RealModelServerTest : public SmolLm2ServerSuite<RealModelServerTest> {};

// chat_template_kwargs (vLLM's extension; Qwen3's enable_thinking) reach the template as
// variables: a template that reads one renders a longer prompt with it set.
TEST_F(RealModelServerTest, ChatTemplateKwargsReachTheTemplate) {
  ServedModel& m = *repo_->find("smollm2");
  auto saved = std::move(m.chat_template);
  m.chat_template = std::make_unique<tok::ChatTemplate>(
      "{% for m in messages %}{{ m.content }}{% endfor %}"
      "{% if enable_thinking is defined and enable_thinking is false %} /no_think thanks{% endif %}");
  Json body = {{"model", "smollm2"}, {"messages", {{{"role", "user"}, {"content", "Hello there"}}}}, {"max_tokens", 1}};
  auto plain = post(srv_->port(), "/v1/chat/completions", body);
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  auto with = post(srv_->port(), "/v1/chat/completions", body);
  m.chat_template = std::move(saved);
  ASSERT_EQ(plain.status, 200) << plain.body;
  ASSERT_EQ(with.status, 200) << with.body;
  EXPECT_GT(with.json()["usage"]["prompt_tokens"].get<int>(), plain.json()["usage"]["prompt_tokens"].get<int>());
}

// --reasoning-parser: a chat template that opens a <think> block at the end of the prompt
// (as DeepSeek-R1's does) makes the whole answer - cut by max_tokens before any </think> -
// reasoning_content, in the body and in the stream's deltas alike; without the opened
// block the answer stays content, with reasoning_content null.
// tool_choice "auto" with --tool-call-parser hermes: the model's output (forced here by a
// grammar to text and a call in Qwen2.5's format) comes back as content and
// message.tool_calls, finish_reason tool_calls; streamed as content deltas, then the call as
// delta.tool_calls pieces as it is written (OpenAI's form: the first with the id, type and
// name, the rest with the next text of the arguments; put together as the openai client
// does, they are the call).
TEST_F(RealModelServerTest, HermesToolCallsAreReadFromTheOutput) {
  ServerOptions so;
  so.tool_parser = ToolParser::kHermes;
  ExecutorOptions eo;  // a repository of its own (see ReasoningParserSplitsThinkingOutput)
  eo.kv_tokens = 4096;
  ModelRepository repo({}, eo);
  repo.add(real_model("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"), "smollm2");
  TestServer srv(repo, so);
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  Json body = {{"model", "smollm2"},
               {"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}}}},
               {"max_tokens", 200},  // the forced text takes the model many small tokens
               {"temperature", 0},
               {"tools", tools},
               {"grammar", R"(root ::= "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>")"}};
  auto r = post(srv.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json choice = r.json()["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.body;
  EXPECT_EQ(choice["message"]["content"], "Let me check.\n");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << r.body;
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
  body["stream"] = true;
  auto s = post_sse(srv.port(), "/v1/chat/completions", body);
  ASSERT_TRUE(s.done);
  std::string content, finish;
  Json calls = Json::array();
  for (auto& e : s.events) {
    const Json ch = Json::parse(e)["choices"][0];
    if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
    if (ch["delta"].contains("tool_calls"))
      for (auto& tc : ch["delta"]["tool_calls"]) calls.push_back(tc);
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(content, "Let me check.\n");
  ASSERT_GE(calls.size(), 2u) << "the call streams in pieces: " << calls.dump();
  EXPECT_TRUE(calls[0]["id"].get<std::string>().starts_with("call_")) << calls.dump();
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  std::string arguments;
  for (auto& piece : calls) {
    EXPECT_EQ(piece["index"], 0);
    if (&piece != &calls[0]) EXPECT_FALSE(piece.contains("id")) << piece.dump();
    arguments += piece["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(arguments, R"({"city": "Paris"})");
  EXPECT_EQ(finish, "tool_calls");

  // Two calls written; parallel_tool_calls false keeps the first, in the body and the stream.
  body["grammar"] = R"(root ::= "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}\n</tool_call>")";
  body.erase("stream");
  auto both = post(srv.port(), "/v1/chat/completions", body);
  ASSERT_EQ(both.status, 200) << both.body;
  EXPECT_EQ(both.json()["choices"][0]["message"]["tool_calls"].size(), 2u) << both.body;
  body["parallel_tool_calls"] = false;
  auto one = post(srv.port(), "/v1/chat/completions", body);
  ASSERT_EQ(one.status, 200) << one.body;
  const Json one_calls = one.json()["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(one_calls.size(), 1u) << one.body;
  EXPECT_EQ(one_calls[0]["function"]["arguments"], R"({"city":"Paris"})");
  body["stream"] = true;
  auto one_stream = post_sse(srv.port(), "/v1/chat/completions", body);
  ASSERT_TRUE(one_stream.done);
  for (auto& e : one_stream.events) {
    const Json ch = Json::parse(e)["choices"][0];
    if (ch["delta"].contains("tool_calls"))
      for (auto& piece : ch["delta"]["tool_calls"]) EXPECT_EQ(piece["index"], 0) << piece.dump();
  }
}

TEST_F(RealModelServerTest, ReasoningParserSplitsThinkingOutput) {
  ServerOptions so;
  so.reasoning_parser = true;
  // A repository of its own: this server's shutdown drains its executors, which the suite's
  // other tests (in the same process) still use.
  ExecutorOptions eo;
  eo.kv_tokens = 4096;
  ModelRepository repo({}, eo);
  repo.add(real_model("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"), "smollm2");
  TestServer srv(repo, so);
  ServedModel& m = *repo.find("smollm2");
  auto saved = std::move(m.chat_template);
  Json body = {{"model", "smollm2"},
               {"messages", {{{"role", "user"}, {"content", "What is the capital of France?"}}}},
               {"max_tokens", 6},
               {"temperature", 0}};
  m.chat_template = std::make_unique<tok::ChatTemplate>(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "<|im_start|>assistant\n<think>\n");
  auto r = post(srv.port(), "/v1/chat/completions", body);
  body["stream"] = true;
  auto s = post_sse(srv.port(), "/v1/chat/completions", body);
  body.erase("stream");
  m.chat_template = std::move(saved);
  auto plain = post(srv.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json msg = r.json()["choices"][0]["message"];
  ASSERT_TRUE(msg["reasoning_content"].is_string()) << msg.dump();
  EXPECT_FALSE(msg["reasoning_content"].get<std::string>().empty());
  EXPECT_EQ(msg["content"], "");
  ASSERT_TRUE(s.done);
  std::string streamed_reasoning, streamed_content;
  for (auto& e : s.events) {
    const Json d = Json::parse(e)["choices"][0]["delta"];
    if (d.contains("reasoning_content")) streamed_reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) streamed_content += d["content"].get<std::string>();
  }
  EXPECT_EQ(streamed_reasoning, msg["reasoning_content"].get<std::string>());
  EXPECT_EQ(streamed_content, "");
  ASSERT_EQ(plain.status, 200) << plain.body;
  const Json pm = plain.json()["choices"][0]["message"];
  EXPECT_TRUE(pm["reasoning_content"].is_null()) << pm.dump();
  EXPECT_NE(pm["content"].get<std::string>().find("Paris"), std::string::npos) << pm.dump();
}

// vLLM's /tokenize and /detokenize on the real model: a prompt's ids are the tokenizer's
// (with and without its special tokens), they decode back to the text, and chat messages
// count the tokens a chat completion of them takes as its prompt.
TEST_F(RealModelServerTest, TokenizeAndDetokenize) {
  const tok::Tokenizer& tk = *repo_->find("smollm2")->tokenizer;
  const std::string text = "The capital of France is Paris.";
  auto t = post(srv_->port(), "/tokenize", Json{{"model", "smollm2"}, {"prompt", text}});
  ASSERT_EQ(t.status, 200) << t.body;
  const Json tj = t.json();
  EXPECT_EQ(tj["tokens"].get<std::vector<int32_t>>(), tk.encode(text));
  EXPECT_EQ(tj["count"], tk.encode(text).size());
  EXPECT_GT(tj["max_model_len"].get<int64_t>(), 0);
  auto plain = post(srv_->port(), "/tokenize", Json{{"model", "smollm2"}, {"prompt", text}, {"add_special_tokens", false}});
  EXPECT_EQ(plain.json()["tokens"].get<std::vector<int32_t>>(), tk.encode(text, false));
  auto d = post(srv_->port(), "/detokenize", Json{{"model", "smollm2"}, {"tokens", tk.encode(text, false)}});
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(d.json()["prompt"], text);
  EXPECT_EQ(post(srv_->port(), "/detokenize", Json{{"model", "smollm2"}, {"tokens", {1, 99999999}}}).status, 400);
  const Json messages = {{{"role", "user"}, {"content", "What is the capital of France?"}}};
  auto m = post(srv_->port(), "/tokenize", Json{{"model", "smollm2"}, {"messages", messages}});
  ASSERT_EQ(m.status, 200) << m.body;
  auto c = post(srv_->port(), "/v1/chat/completions",
                Json{{"model", "smollm2"}, {"messages", messages}, {"max_tokens", 1}, {"temperature", 0}});
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(m.json()["count"], c.json()["usage"]["prompt_tokens"]);
}

// tools and assistant tool_calls reach the chat template as transformers gives them: Qwen2.5's
// template (tests/fixtures/tokenizer) renders the request - tool call arguments sent as
// OpenAI's JSON text - into the prompt transformers rendered from the same conversation.
TEST_F(RealModelServerTest, ToolsAndToolCallsReachTheChatTemplate) {
  std::ifstream in(std::string(KILN_FIXTURES_DIR) + "/tokenizer/chat_templates.json");
  const Json fx = Json::parse(in);
  std::string rendered;
  for (const Json& c : fx["cases"])
    if (c["template"] == "qwen2_5" && c["conversation"] == "tool_call" && c["add_generation_prompt"] == true &&
        c["tools"] == true)
      rendered = c["rendered"];
  ASSERT_FALSE(rendered.empty());
  Json messages = fx["conversations"]["tool_call"];
  for (Json& m : messages)
    if (m.contains("tool_calls"))
      for (Json& call : m["tool_calls"]) call["function"]["arguments"] = call["function"]["arguments"].dump();
  ServedModel& m = *repo_->find("smollm2");
  auto saved = std::move(m.chat_template);
  m.chat_template = std::make_unique<tok::ChatTemplate>(fx["templates"]["qwen2_5"].get<std::string>());
  auto t = post(srv_->port(), "/tokenize", Json{{"model", "smollm2"}, {"messages", messages}, {"tools", fx["tools"]}});
  // tool_choice "auto" (the default with tools) reads calls in the format the chat template
  // shows (--tool-call-parser auto, the default): Qwen2.5's <tool_call>, so hermes. SmolLM2's
  // own template shows none, so there it is refused, naming the flag.
  auto accepted = post(srv_->port(), "/v1/chat/completions",
                       Json{{"model", "smollm2"}, {"messages", messages}, {"tools", fx["tools"]}, {"max_tokens", 1}});
  auto none = post(srv_->port(), "/v1/chat/completions",
                   Json{{"model", "smollm2"}, {"messages", messages}, {"tools", fx["tools"]}, {"tool_choice", "none"},
                        {"max_tokens", 1}});
  m.chat_template = std::move(saved);
  auto refused = post(srv_->port(), "/v1/chat/completions",
                      Json{{"model", "smollm2"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                           {"tools", fx["tools"]}, {"max_tokens", 1}});
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(t.json()["tokens"].get<std::vector<int32_t>>(), m.tokenizer->encode(rendered, false));
  EXPECT_EQ(accepted.status, 200) << accepted.body;
  EXPECT_EQ(refused.status, 400);
  EXPECT_NE(refused.body.find("its chat template shows no format"), std::string::npos) << refused.body;
  EXPECT_NE(refused.body.find("--tool-call-parser"), std::string::npos) << refused.body;
  ASSERT_EQ(none.status, 200) << none.body;
  EXPECT_EQ(none.json()["usage"]["prompt_tokens"], t.json()["count"]);
}

// response_format json_object on the real model: greedy, streamed and not, the content is
// one JSON object (nlohmann's parser takes it) and the choice ends as it closes.
// A constrained chat request's content, asked for whole and streamed (they must agree), its
// finish reason "stop", parsed as JSON (discarded when it does not parse).
Json json_content_both_ways(int port, Json body, const char* what) {
  auto r = post(port, "/v1/chat/completions", body);
  EXPECT_EQ(r.status, 200) << r.body;
  if (r.status != 200) return Json::value_t::discarded;
  const Json choice = r.json()["choices"][0];
  const std::string content = choice["message"]["content"].get<std::string>();
  std::printf("  %s content (%s): %s\n", what, choice["finish_reason"].get<std::string>().c_str(),
              Json(content).dump().c_str());
  EXPECT_EQ(choice["finish_reason"], "stop") << content;
  body["stream"] = true;
  auto s = post_sse(port, "/v1/chat/completions", body);
  EXPECT_TRUE(s.done);
  std::string streamed;
  for (auto& e : s.events) {
    const Json d = Json::parse(e)["choices"][0]["delta"];
    if (d.contains("content")) streamed += d["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, content);
  return Json::parse(content, nullptr, /*allow_exceptions=*/false);
}

TEST_F(RealModelServerTest, JsonObjectResponseFormat) {
  Json body = {{"model", "smollm2"},
               {"messages",
                {{{"role", "user"},
                  {"content", "What is the capital of France? Answer as a JSON object with the key capital."}}}},
               {"max_tokens", 120},
               {"temperature", 0},
               {"response_format", {{"type", "json_object"}}}};
  const Json parsed = json_content_both_ways(srv_->port(), body, "json_object");
  EXPECT_TRUE(parsed.is_object()) << parsed;
}

// Structured outputs on the real model: response_format json_schema (streamed and not), vLLM's
// guided_choice and guided_grammar; the content is a document of its schema or grammar.
TEST_F(RealModelServerTest, JsonSchemaChoiceAndGrammarConstrainTheOutput) {
  const Json schema = Json::parse(R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
      "population": {"type": "integer"}, "river": {"type": ["string", "null"]}},
      "required": ["city", "population"], "additionalProperties": false})");
  Json body = {{"model", "smollm2"},
               {"messages", {{{"role", "user"}, {"content", "Which city is the capital of France? Answer in JSON."}}}},
               {"max_tokens", 80},
               {"temperature", 0},
               {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "city"}, {"schema", schema}}}}}};
  Json parsed = json_content_both_ways(srv_->port(), body, "json_schema");
  ASSERT_TRUE(parsed.is_object()) << parsed;
  EXPECT_TRUE(parsed["city"].is_string()) << parsed;
  EXPECT_TRUE(parsed["population"].is_number_integer()) << parsed;
  for (auto& [key, value] : parsed.items()) EXPECT_TRUE(key == "city" || key == "population" || key == "river") << parsed;

  Json pick = {{"model", "smollm2"},
               {"prompt", "The capital of France is"},
               {"max_tokens", 10},
               {"temperature", 0.8},
               {"seed", 1},
               {"n", 3},
               {"guided_choice", {"Paris", "London", "Lyon \"center\""}}};
  auto c = post(srv_->port(), "/v1/completions", pick);
  ASSERT_EQ(c.status, 200) << c.body;
  for (const Json& ch : c.json()["choices"]) {
    const std::string text = ch["text"];
    EXPECT_TRUE(text == "Paris" || text == "London" || text == "Lyon \"center\"") << text;
    EXPECT_EQ(ch["finish_reason"], "stop");
  }
  pick.erase("guided_choice");
  pick["structured_outputs"] = {{"choice", {"Paris", "London"}}, {"disable_fallback", true}};  // vLLM >= 0.12's form
  auto so = post(srv_->port(), "/v1/completions", pick);
  ASSERT_EQ(so.status, 200) << so.body;
  for (const Json& ch : so.json()["choices"]) EXPECT_TRUE(ch["text"] == "Paris" || ch["text"] == "London") << ch;
  pick.erase("structured_outputs");
  pick["guided_grammar"] = R"(root ::= [A-Z] [a-z]+ " " [0-9]{4})";
  auto g = post(srv_->port(), "/v1/completions", pick);
  ASSERT_EQ(g.status, 200) << g.body;
  for (const Json& ch : g.json()["choices"]) {
    const std::string text = ch["text"];
    if (ch["finish_reason"] != "stop") continue;  // [a-z]+ may run past max_tokens
    ASSERT_GE(text.size(), 7u) << text;
    EXPECT_TRUE(std::isupper(static_cast<unsigned char>(text[0]))) << text;
    EXPECT_EQ(text[text.size() - 5], ' ') << text;
    for (size_t i = text.size() - 4; i < text.size(); ++i) EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(text[i]))) << text;
  }
  // vLLM's guided_regex: the whole text matches (\d, classes, counted repeats, '|').
  pick.erase("guided_grammar");
  pick["guided_regex"] = R"((Paris|Lyon), [A-Z]{2} \d{2,3}\.)";
  auto re = post(srv_->port(), "/v1/completions", pick);
  ASSERT_EQ(re.status, 200) << re.body;
  for (const Json& ch : re.json()["choices"]) {
    const std::string text = ch["text"];
    EXPECT_EQ(ch["finish_reason"], "stop") << text;
    EXPECT_TRUE(std::regex_match(text, std::regex(R"((Paris|Lyon), [A-Z]{2} \d{2,3}\.)"))) << text;
  }
  pick.erase("guided_regex");
  pick["guided_grammar"] = "root ::= missing";
  auto bad = post(srv_->port(), "/v1/completions", pick);
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("cannot constrain decoding"), std::string::npos) << bad.body;
  pick.erase("guided_grammar");
  pick["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "colour"}}}}}};
  bad = post(srv_->port(), "/v1/completions", pick);
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("cannot constrain decoding"), std::string::npos) << bad.body;
}

// A forced tool choice: the output is constrained to the named function's arguments (or an
// array of calls for "required") and comes back as message.tool_calls, content null - in the
// body and as the stream's delta.tool_calls alike (a named function's arguments stream in
// pieces as they are written).
TEST_F(RealModelServerTest, ForcedToolChoiceComesBackAsToolCalls) {
  const Json tools = Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city.",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
      "properties": {"zone": {"type": "string", "maxLength": 24}}, "required": ["zone"], "additionalProperties": false}}}])");
  Json body = {{"model", "smollm2"},
               {"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}}}},
               {"max_tokens", 80},
               {"temperature", 0},
               {"tools", tools},
               {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}};
  auto r = post(srv_->port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json msg = r.json()["choices"][0]["message"];
  std::printf("  named tool call: %s\n", msg.dump().c_str());
  ASSERT_EQ(r.json()["choices"][0]["finish_reason"], "tool_calls") << r.body;
  EXPECT_TRUE(msg["content"].is_null());
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  const Json call = msg["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  const Json args = Json::parse(call["function"]["arguments"].get<std::string>());
  EXPECT_TRUE(args["city"].is_string());
  EXPECT_TRUE(args["unit"] == "celsius" || args["unit"] == "fahrenheit") << args;
  body["stream"] = true;
  auto s = post_sse(srv_->port(), "/v1/chat/completions", body);
  ASSERT_TRUE(s.done);
  Json streamed_calls = Json::array();
  std::string finish;
  for (auto& e : s.events) {
    const Json ch = Json::parse(e)["choices"][0];
    if (ch["delta"].contains("tool_calls"))
      for (auto& tc : ch["delta"]["tool_calls"]) streamed_calls.push_back(tc);
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  ASSERT_GE(streamed_calls.size(), 2u) << streamed_calls.dump();
  EXPECT_EQ(streamed_calls[0]["function"]["name"], "get_weather");
  EXPECT_TRUE(streamed_calls[0]["id"].get<std::string>().starts_with("call_"));
  std::string streamed_args;
  for (auto& piece : streamed_calls) {
    EXPECT_EQ(piece["index"], 0);
    streamed_args += piece["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(Json::parse(streamed_args), args) << streamed_args;
  EXPECT_EQ(finish, "tool_calls");

  body.erase("stream");
  body["tool_choice"] = "required";
  body["parallel_tool_calls"] = false;
  auto req = post(srv_->port(), "/v1/chat/completions", body);
  ASSERT_EQ(req.status, 200) << req.body;
  const Json rmsg = req.json()["choices"][0]["message"];
  std::printf("  required tool calls: %s\n", rmsg.dump().c_str());
  ASSERT_EQ(req.json()["choices"][0]["finish_reason"], "tool_calls") << req.body;
  ASSERT_GE(rmsg["tool_calls"].size(), 1u);
  for (const Json& tc : rmsg["tool_calls"]) {
    const std::string name = tc["function"]["name"];
    EXPECT_TRUE(name == "get_weather" || name == "get_time") << name;
    EXPECT_TRUE(Json::parse(tc["function"]["arguments"].get<std::string>()).is_object());
  }
  // Streamed, the array's calls go out in pieces as they are written: put together by index,
  // as the openai client does, they are the body's calls.
  body["stream"] = true;
  auto rs = post_sse(srv_->port(), "/v1/chat/completions", body);
  body.erase("stream");
  ASSERT_TRUE(rs.done);
  std::vector<Json> joined;
  size_t pieces = 0;
  for (auto& e : rs.events) {
    const Json ch = Json::parse(e)["choices"][0];
    if (!ch["delta"].contains("tool_calls")) continue;
    for (const Json& piece : ch["delta"]["tool_calls"]) {
      const size_t k = piece["index"];
      ++pieces;
      if (k == joined.size()) {
        EXPECT_TRUE(piece.contains("id")) << piece.dump();
        joined.push_back({{"name", piece["function"]["name"]}, {"arguments", ""}});
      }
      ASSERT_LT(k, joined.size());
      joined[k]["arguments"] = joined[k]["arguments"].get<std::string>() + piece["function"]["arguments"].get<std::string>();
    }
  }
  ASSERT_EQ(joined.size(), rmsg["tool_calls"].size());
  EXPECT_GT(pieces, joined.size()) << "the arguments stream in pieces";
  for (size_t k = 0; k < joined.size(); ++k) {
    EXPECT_EQ(joined[k]["name"], rmsg["tool_calls"][k]["function"]["name"]);
    EXPECT_EQ(Json::parse(joined[k]["arguments"].get<std::string>()),
              Json::parse(rmsg["tool_calls"][k]["function"]["arguments"].get<std::string>()));
  }
  body["response_format"] = {{"type", "json_object"}};
  EXPECT_EQ(post(srv_->port(), "/v1/chat/completions", body).status, 400);

  // A pydantic-style tool (its parameters refer to their own $defs, also from inside a
  // definition) after another tool: its $refs still resolve inside the "required" array.
  body.erase("response_format");
  body["tools"] = tools;
  body["tools"].push_back(Json::parse(R"({"type": "function", "function": {"name": "book_trip", "parameters": {
      "$defs": {"City": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
        "country": {"$ref": "#/$defs/Country"}}, "required": ["name", "country"], "additionalProperties": false},
        "Country": {"enum": ["FR", "DE", "IT"]}},
      "type": "object", "properties": {"to": {"$ref": "#/$defs/City"}}, "required": ["to"],
      "additionalProperties": false}}})"));
  body["messages"] = {{{"role", "user"}, {"content", "Book a trip to Paris."}}};
  auto refs = post(srv_->port(), "/v1/chat/completions", body);
  ASSERT_EQ(refs.status, 200) << refs.body;
  const Json refs_msg = refs.json()["choices"][0]["message"];
  std::printf("  required tool calls, a tool with $defs: %s\n", refs_msg.dump().c_str());
  ASSERT_EQ(refs.json()["choices"][0]["finish_reason"], "tool_calls") << refs.body;
  for (const Json& tc : refs_msg["tool_calls"]) {
    const Json args = Json::parse(tc["function"]["arguments"].get<std::string>());
    if (tc["function"]["name"] == "book_trip") {
      EXPECT_TRUE(args["to"]["name"].is_string()) << args;
      EXPECT_TRUE(args["to"]["country"] == "FR" || args["to"]["country"] == "DE" || args["to"]["country"] == "IT")
          << args;
    }
  }
}

TEST_F(RealModelServerTest, ChatStreamingAndNonStreamingAgree) {
  Json body = {{"model", "smollm2"},
               {"messages", {{{"role", "user"}, {"content", "What is the capital of France?"}}}},
               {"max_tokens", 8},
               {"temperature", 0}};
  auto r = post(srv_->port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = r.json();
  std::string content = j["choices"][0]["message"]["content"];
  EXPECT_NE(content.find("Paris"), std::string::npos) << content;
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 10);
  body["stream"] = true;
  auto s = post_sse(srv_->port(), "/v1/chat/completions", body);
  ASSERT_TRUE(s.done);
  std::string streamed;
  bool role = false;
  for (auto& e : s.events) {
    Json c = Json::parse(e)["choices"][0];
    if (c["delta"].contains("role")) role = true;
    if (c["delta"].contains("content")) streamed += c["delta"]["content"].get<std::string>();
  }
  EXPECT_TRUE(role);
  EXPECT_EQ(streamed, content);
}

TEST_F(RealModelServerTest, StopStringsCutTheTextAndSessionsReuseKv) {
  Json body = {{"model", "smollm2"}, {"prompt", "The capital of France is"}, {"max_tokens", 12}, {"temperature", 0}};
  auto full = post(srv_->port(), "/v1/completions", body).json();
  std::string text = full["choices"][0]["text"];
  ASSERT_GT(text.size(), 8u);
  std::string stop = text.substr(text.size() / 2, 3);
  body["stop"] = {stop};
  auto cut = post(srv_->port(), "/v1/completions", body).json();
  EXPECT_EQ(cut["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");

  // Completions logprobs: one entry per token, offsets into the text, top alternatives.
  Json lp = {{"model", "smollm2"}, {"prompt", "The capital of France is"}, {"max_tokens", 4}, {"temperature", 0},
             {"logprobs", 2}};
  auto l = post(srv_->port(), "/v1/completions", lp).json();
  auto& lps = l["choices"][0]["logprobs"];
  ASSERT_EQ(lps["tokens"].size(), 4u) << l.dump();
  EXPECT_EQ(lps["text_offset"][0], 0);
  EXPECT_EQ(lps["text_offset"][1].get<size_t>(), lps["tokens"][0].get<std::string>().size());
  EXPECT_LE(lps["token_logprobs"][0].get<double>(), 0.0);
  EXPECT_EQ(lps["top_logprobs"][0].size(), 2u);

  Json turn = {{"model", "smollm2"},
               {"messages", {{{"role", "user"}, {"content", "Name a color."}}}},
               {"max_tokens", 6}, {"temperature", 0}, {"session_id", "conv-1"}};
  auto t1 = post(srv_->port(), "/v1/chat/completions", turn).json();
  turn["messages"].push_back({{"role", "assistant"}, {"content", t1["choices"][0]["message"]["content"]}});
  turn["messages"].push_back({{"role", "user"}, {"content", "Another one."}});
  auto t2 = post(srv_->port(), "/v1/chat/completions", turn).json();
  EXPECT_GT(t2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 10) << t2.dump();
}

TEST_F(RealModelServerTest, ClientDisconnectCancelsTheRequest) {
  auto before = repo_->find("smollm2")->executor->stats().requests_cancelled;
  Json body = {{"model", "smollm2"}, {"prompt", "Once upon a time"}, {"max_tokens", 200},
               {"temperature", 0}, {"ignore_eos", true}, {"stream", true}};
  auto s = post_sse(srv_->port(), "/v1/completions", body, /*hang_up_after=*/2);
  EXPECT_FALSE(s.done);
  for (int i = 0; i < 200 && repo_->find("smollm2")->executor->stats().requests_cancelled == before; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(repo_->find("smollm2")->executor->stats().requests_cancelled, before + 1);
  EXPECT_EQ(repo_->find("smollm2")->executor->stats().running, 0);
}

}  // namespace
}  // namespace kiln::server
