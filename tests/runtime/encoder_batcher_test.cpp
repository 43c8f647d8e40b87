// EncoderBatcher: concurrent requests share forwards and get what each would get alone;
// the budgets bound every forward; bad inputs fail only their own request; destruction
// runs what is queued. The tiny random BERT classifier of tests/fixtures/models/bert.
#include "runtime/encoder_batcher.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "core/status.h"

namespace kiln {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Model> tiny_bert() { return Model::load(std::string(KILN_FIXTURES_DIR) + "/models/bert"); }

EncoderInput random_input(std::mt19937& rng, int64_t vocab, int min_len, int max_len) {
  EncoderInput in;
  const int n = std::uniform_int_distribution<int>(min_len, max_len)(rng);
  for (int i = 0; i < n; ++i) {
    in.tokens.push_back(std::uniform_int_distribution<int32_t>(1, int32_t(vocab) - 1)(rng));
    in.token_types.push_back(i < n / 2 ? 0 : 1);
  }
  return in;
}

void expect_near(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst = 0, ref = 1e-6;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, double(std::fabs(a[i] - b[i])));
    ref = std::max(ref, double(std::fabs(b[i])));
  }
  EXPECT_LE(worst / ref, 1e-5) << what;
}

void expect_same_as_alone(Model& model, const std::vector<EncoderInput>& in, const std::vector<EncoderOutput>& out,
                          const std::string& tag) {
  ASSERT_EQ(out.size(), in.size()) << tag;
  for (size_t i = 0; i < in.size(); ++i) {
    auto alone = encode(model, {in[i]}, {.hidden = false});
    const std::string what = tag + " input " + std::to_string(i);
    expect_near(out[i].mean_pooled, alone[0].mean_pooled, what + " mean pooled");
    expect_near(out[i].pooled, alone[0].pooled, what + " pooler");
    expect_near(out[i].logits, alone[0].logits, what + " logits");
  }
}

TEST(EncoderBatcher, ConcurrentRequestsShareOneForwardAndMatchEachAlone) {
  auto model = tiny_bert();
  const int kClients = 12;
  std::mt19937 rng(7);
  std::vector<std::vector<EncoderInput>> requests(kClients);
  size_t sequences = 0;
  for (auto& r : requests) {
    const int n = 1 + int(rng() % 3);
    for (int i = 0; i < n; ++i) r.push_back(random_input(rng, model->info().vocab_size, 1, 20));
    sequences += r.size();
  }
  // The batch waits (up to 10 s) until every sequence is queued: one forward for all.
  EncoderBatcherOptions o;
  o.max_batch_sequences = int(sequences);
  o.max_queue_delay = 10s;
  o.encode.hidden = false;
  EncoderBatcher batcher(*model, o);
  std::vector<std::vector<EncoderOutput>> outs(kClients);
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) clients.emplace_back([&, c] { outs[size_t(c)] = batcher.run(requests[size_t(c)]); });
  for (auto& t : clients) t.join();
  for (int c = 0; c < kClients; ++c) expect_same_as_alone(*model, requests[size_t(c)], outs[size_t(c)], "client " + std::to_string(c));
  const EncoderBatcherStats s = batcher.stats();
  EXPECT_EQ(s.forwards, 1);
  EXPECT_EQ(s.sequences, int64_t(sequences));
  EXPECT_EQ(s.largest_batch, int64_t(sequences));
  EXPECT_EQ(s.requests, kClients);
  EXPECT_EQ(s.failed_requests, 0);
  EXPECT_EQ(s.queued, 0);
}

TEST(EncoderBatcher, WithoutADelayManyClientsGetTheirOwnResults) {
  auto model = tiny_bert();
  EncoderBatcherOptions o;
  o.encode.hidden = false;
  EncoderBatcher batcher(*model, o);
  const int kClients = 8, kRounds = 6;
  // The references run after the clients: a model runs one forward at a time, which is
  // why the batcher owns it meanwhile.
  std::vector<std::vector<EncoderInput>> ins(kClients * kRounds);
  std::vector<std::vector<EncoderOutput>> outs(ins.size());
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c)
    clients.emplace_back([&, c] {
      std::mt19937 rng(uint32_t(100 + c));
      for (int r = 0; r < kRounds; ++r) {
        const size_t i = size_t(c * kRounds + r);
        ins[i] = {random_input(rng, model->info().vocab_size, 1, 30)};
        outs[i] = batcher.run(ins[i]);
      }
    });
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < ins.size(); ++i) expect_same_as_alone(*model, ins[i], outs[i], "request " + std::to_string(i));
  const EncoderBatcherStats s = batcher.stats();
  EXPECT_EQ(s.sequences, kClients * kRounds);
  EXPECT_EQ(s.requests, kClients * kRounds);
  EXPECT_LE(s.forwards, kClients * kRounds);
}

TEST(EncoderBatcher, BudgetsBoundEveryForward) {
  auto model = tiny_bert();
  std::mt19937 rng(3);
  {  // 10 sequences, at most 4 a forward: 4 + 4 + 2 (the last after its delay)
    EncoderBatcherOptions o;
    o.max_batch_sequences = 4;
    o.max_queue_delay = 200ms;
    EncoderBatcher batcher(*model, o);
    std::vector<std::vector<EncoderInput>> in(10);
    std::vector<std::future<std::vector<EncoderOutput>>> futs;
    for (auto& r : in) {
      r = {random_input(rng, model->info().vocab_size, 2, 8)};
      futs.push_back(batcher.submit(r));
    }
    std::vector<std::vector<EncoderOutput>> outs;
    for (auto& f : futs) outs.push_back(f.get());  // all done before the references use the model
    for (size_t i = 0; i < in.size(); ++i) expect_same_as_alone(*model, in[i], outs[i], "seq " + std::to_string(i));
    EXPECT_EQ(batcher.stats().forwards, 3);
    EXPECT_EQ(batcher.stats().largest_batch, 4);
  }
  {  // one request of 6 sequences of 10 tokens, at most 25 tokens a forward: 2 + 2 + 2
    EncoderBatcherOptions o;
    o.max_batch_tokens = 25;
    EncoderBatcher batcher(*model, o);
    std::vector<EncoderInput> in;
    for (int i = 0; i < 6; ++i) in.push_back(random_input(rng, model->info().vocab_size, 10, 10));
    expect_same_as_alone(*model, in, batcher.run(in), "token budget");
    EXPECT_EQ(batcher.stats().forwards, 3);
    EXPECT_EQ(batcher.stats().tokens, 60);
    EXPECT_EQ(batcher.stats().requests, 1);
    // A sequence longer than the budget runs alone.
    std::vector<EncoderInput> longer = {random_input(rng, model->info().vocab_size, 40, 40)};
    expect_same_as_alone(*model, longer, batcher.run(longer), "over budget");
    EXPECT_EQ(batcher.stats().forwards, 4);
  }
}

TEST(EncoderBatcher, BadInputsFailOnlyTheirOwnRequest) {
  auto model = tiny_bert();
  const int64_t vocab = model->info().vocab_size;
  EncoderBatcherOptions o;
  o.max_batch_sequences = 2;
  o.max_queue_delay = 10s;  // the good and the bad request share a forward
  EncoderBatcher batcher(*model, o);
  auto expect_rejected = [&](std::vector<EncoderInput> in, const std::string& needle) {
    try {
      batcher.submit(std::move(in));
      ADD_FAILURE() << "accepted an input that should fail with '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_rejected({EncoderInput{}}, "input 0 is empty");
  expect_rejected({EncoderInput{{1, 2}, {}}, EncoderInput{{1, int32_t(vocab)}, {}}}, "input 1: token id");
  expect_rejected({EncoderInput{{1, -3}, {}}}, "outside the vocabulary");
  expect_rejected({EncoderInput{{1, 2, 3}, {0, 1}}}, "2 token types for 3 tokens");
  EncoderInput too_long;
  too_long.tokens.assign(size_t(model->info().max_positions + 1), 5);
  expect_rejected({too_long}, "at most");
  // A token type past the model's table passes the checks and fails in the forward it
  // shares: the batcher re-runs each request alone, so only that one fails.
  std::mt19937 rng(11);
  std::vector<EncoderInput> good = {random_input(rng, vocab, 3, 9)};
  EncoderInput bad = random_input(rng, vocab, 3, 9);
  bad.token_types.back() = 1000;
  auto fut_good = batcher.submit(good);
  auto fut_bad = batcher.submit({bad});
  EXPECT_THROW(fut_bad.get(), Error);
  expect_same_as_alone(*model, good, fut_good.get(), "good neighbour");
  const EncoderBatcherStats s = batcher.stats();
  EXPECT_EQ(s.requests, 2);
  EXPECT_EQ(s.failed_requests, 1);
  // And it keeps serving (two requests fill the next forward at once).
  auto again = batcher.submit(good);
  auto now = batcher.run(good);
  auto before = again.get();
  expect_same_as_alone(*model, good, now, "after the failure");
  expect_same_as_alone(*model, good, before, "after the failure");
}

TEST(EncoderBatcher, QueueLimitAndShutdown) {
  auto model = tiny_bert();
  std::mt19937 rng(5);
  std::vector<EncoderInput> in = {random_input(rng, model->info().vocab_size, 4, 4),
                                  random_input(rng, model->info().vocab_size, 4, 4)};
  std::future<std::vector<EncoderOutput>> queued;
  {
    EncoderBatcherOptions o;
    o.max_queued_sequences = 3;
    o.max_queue_delay = 60s;  // nothing runs before the destructor
    EncoderBatcher batcher(*model, o);
    queued = batcher.submit(in);
    try {
      batcher.submit(in);
      ADD_FAILURE() << "a full queue accepted more";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
      EXPECT_NE(std::string(e.what()).find("queue is full"), std::string::npos) << e.what();
    }
  }  // the destructor runs what is queued at once
  ASSERT_EQ(queued.wait_for(0s), std::future_status::ready);
  expect_same_as_alone(*model, in, queued.get(), "drained at shutdown");
}

// A decoder's requests batch as an encoder's (decoder embedding models: their last
// token's final hidden state, as encode() computes it); bad budgets are refused.
TEST(EncoderBatcher, BatchesDecodersAndRejectsBadOptions) {
  auto gpt2 = Model::load(std::string(KILN_FIXTURES_DIR) + "/models/gpt2");
  {
    EncoderBatcher b(*gpt2);
    const std::vector<EncoderInput> in = {{{5, 6, 7, 8}, {}}, {{9, 10}, {}}};
    auto got = b.submit(in).get();
    auto want = encode(*gpt2, in);
    ASSERT_EQ(got.size(), 2u);
    for (size_t i = 0; i < 2; ++i) EXPECT_EQ(got[i].embedding, want[i].embedding) << i;
  }
  auto bert = tiny_bert();
  EncoderBatcherOptions o;
  o.max_batch_tokens = 0;
  EXPECT_THROW({ EncoderBatcher b(*bert, o); }, Error);
}

// cancel(): a queued request leaves the queue and its future fails with kCancelled; the
// others run as if it had never come; a finished or unknown id is refused; a batch
// whose every sequence was withdrawn while it waited runs no forward.
TEST(EncoderBatcher, CancelledRequestsLeaveTheQueue) {
  auto model = tiny_bert();
  std::mt19937 rng(11);
  EncoderBatcherOptions o;
  o.max_queue_delay = 400ms;  // what is queued waits: cancelled while it does
  o.encode.hidden = false;
  EncoderBatcher batcher(*model, o);
  std::vector<EncoderInput> a = {random_input(rng, model->info().vocab_size, 3, 9),
                                 random_input(rng, model->info().vocab_size, 3, 9)};
  std::vector<EncoderInput> b = {random_input(rng, model->info().vocab_size, 3, 9)};
  EncoderJob ja = batcher.submit_job(a), jb = batcher.submit_job(b);
  EXPECT_NE(ja.id, jb.id);
  EXPECT_TRUE(batcher.cancel(ja.id));
  EXPECT_FALSE(batcher.cancel(ja.id)) << "already withdrawn";
  ASSERT_EQ(ja.result.wait_for(0s), std::future_status::ready) << "a request with nothing running fails at once";
  try {
    ja.result.get();
    ADD_FAILURE() << "a cancelled request returned outputs";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCancelled) << e.what();
  }
  std::vector<EncoderOutput> out = jb.result.get();
  EncoderBatcherStats s = batcher.stats();
  EXPECT_EQ(s.forwards, 1);
  EXPECT_EQ(s.sequences, 1);
  EXPECT_EQ(s.requests, 2);
  EXPECT_EQ(s.cancelled_requests, 1);
  EXPECT_EQ(s.cancelled_sequences, 2);
  EXPECT_EQ(s.failed_requests, 0);
  EXPECT_FALSE(batcher.cancel(jb.id)) << "already completed";
  EXPECT_FALSE(batcher.cancel(987654)) << "never submitted";
  expect_same_as_alone(*model, b, out, "the request left in the queue");

  // Everything queued withdrawn while the batch waits: no forward, and the batcher
  // serves the next request.
  EncoderJob jc = batcher.submit_job(a);
  EXPECT_TRUE(batcher.cancel(jc.id));
  std::this_thread::sleep_for(600ms);
  EXPECT_EQ(batcher.stats().forwards, 1);
  expect_same_as_alone(*model, b, batcher.run(b), "after an emptied batch");
  s = batcher.stats();
  EXPECT_EQ(s.forwards, 2);
  EXPECT_EQ(s.cancelled_requests, 2);
  EXPECT_EQ(s.queued, 0);
}

// A request cancelled while a forward runs one of its sequences fails with kCancelled
// once that forward ends; its other sequences never run.
TEST(EncoderBatcher, CancelDuringAForwardSettlesWhenItEnds) {
  auto model = tiny_bert();
  std::mt19937 rng(12);
  EncoderBatcherOptions o;
  o.max_batch_sequences = 1;  // one sequence a forward: the rest stay queued
  o.encode.hidden = false;
  EncoderBatcher batcher(*model, o);
  std::vector<EncoderInput> many;
  for (int i = 0; i < 64; ++i) many.push_back(random_input(rng, model->info().vocab_size, 20, 40));
  EncoderJob j = batcher.submit_job(many);
  while (batcher.stats().running == 0 && batcher.stats().forwards == 0) std::this_thread::yield();
  ASSERT_TRUE(batcher.cancel(j.id));
  try {
    j.result.get();
    ADD_FAILURE() << "a cancelled request returned outputs";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCancelled) << e.what();
  }
  const EncoderBatcherStats s = batcher.stats();
  EXPECT_EQ(s.cancelled_requests, 1);
  EXPECT_EQ(s.requests, 1);
  EXPECT_GE(s.cancelled_sequences, 1);
  EXPECT_EQ(s.sequences + s.cancelled_sequences, 64) << "every sequence ran or was dropped, once";
  EXPECT_EQ(s.queued, 0);
}

}  // namespace
}  // namespace kiln
