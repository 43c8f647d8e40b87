// Tensor parallelism on CUDA: NCCL communicators (one GPU per rank, ranks on threads of
// this process) sum device buffers exactly; the tiny golden decoders sharded over two
// GPUs give one GPU's greedy tokens in f32, and in bf16 (decode steps as CUDA graphs with
// the all-reduces captured) one GPU's logits within the bf16 bound, teacher-forced; a
// TP=2 engine (`kiln build --tp 2`, tuned on the GPUs or built on the CPU) runs over two
// GPUs with the `--tp 2` checkpoint load's tokens; too few GPUs is a clear error, for a
// checkpoint and for a TP engine. Skips without a GPU; the multi-GPU cases skip with one.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <filesystem>
#include <functional>
#include <random>
#include <thread>
#include <unistd.h>

#include "backends/communicator.h"
#include "backends/cuda/cuda_check.h"
#include "builder/builder.h"
#include "core/status.h"
#include "cuda_test_util.h"
#include "runtime/llm_runner.h"
#include "runtime/model.h"

namespace kiln::cuda {
namespace {

using namespace testing;

#define KILN_SKIP_WITHOUT_GPUS(n)                                                                          \
  do {                                                                                                     \
    if (::kiln::cuda_device_count() < (n))                                                                 \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, " << ::kiln::cuda_device_count() << " visible: skipped"; \
  } while (0)

std::vector<std::vector<int32_t>> prompts_for(int64_t vocab) {
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> out;
  for (int len : {5, 17, 33}) {
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) p.push_back(int32_t(rng() % uint32_t(vocab)));
    out.push_back(std::move(p));
  }
  return out;
}

int32_t argmax_of(const std::vector<float>& x) {
  return int32_t(std::max_element(x.begin(), x.end()) - x.begin());
}

// Every rank, on its own thread and GPU, reduces [n] values that are small integers
// (exact in every dtype): the sum must be exact, in place and out of place.
TEST(CudaTensorParallel, NcclAllReduceSumsExactly) {
  KILN_SKIP_WITHOUT_CUDA();
  const int world = std::min(cuda_device_count(), 4);
  auto comms = create_backend("cuda")->make_communicators(world, 0);
  ASSERT_EQ(int(comms.size()), world);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int64_t n = 4099;
    const size_t ranks = static_cast<size_t>(world);
    std::vector<std::vector<float>> got(ranks);
    std::vector<std::exception_ptr> errors(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        try {
          KILN_CUDA_CHECK(cudaSetDevice(r));
          Tensor x(DType::kF32, {n});
          for (int64_t i = 0; i < n; ++i) x.data_as<float>()[i] = float((r + 1) * (i % 7) - 3);
          const Tensor xs = x.to(dt);
          void* d = nullptr;
          KILN_CUDA_CHECK(cudaMalloc(&d, 2 * xs.nbytes()));
          void* d_out = static_cast<char*>(d) + xs.nbytes();
          cudaStream_t s = nullptr;
          KILN_CUDA_CHECK(cudaStreamCreate(&s));
          KILN_CUDA_CHECK(cudaMemcpy(d, xs.data(), xs.nbytes(), cudaMemcpyHostToDevice));
          comms[size_t(r)]->all_reduce_sum_device(d, d_out, n, dt, s);  // out of place
          comms[size_t(r)]->all_reduce_sum_device(d, d, n, dt, s);      // in place
          KILN_CUDA_CHECK(cudaStreamSynchronize(s));
          Tensor a(dt, {n}), b(dt, {n});
          KILN_CUDA_CHECK(cudaMemcpy(a.data(), d, xs.nbytes(), cudaMemcpyDeviceToHost));
          KILN_CUDA_CHECK(cudaMemcpy(b.data(), d_out, xs.nbytes(), cudaMemcpyDeviceToHost));
          cudaStreamDestroy(s);
          cudaFree(d);
          const Tensor af = a.to(DType::kF32), bf = b.to(DType::kF32);
          got[size_t(r)].assign(af.data_as<float>(), af.data_as<float>() + n);
          for (int64_t i = 0; i < n; ++i)
            if (af.data_as<float>()[i] != bf.data_as<float>()[i]) throw std::runtime_error("in place != out of place");
        } catch (...) {
          errors[size_t(r)] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    const float ranks_sum = float(world * (world + 1) / 2);
    for (int r = 0; r < world; ++r)
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[size_t(r)][size_t(i)], ranks_sum * float(i % 7) - 3.0f * float(world))
            << dtype_name(dt) << " rank " << r << " element " << i;
  }
  // Host memory is not what this communicator reduces.
  float h = 1.0f;
  EXPECT_THROW(comms[0]->all_reduce_sum(&h, 1), Error);
}

// Runs fn(rank) on one thread per rank (its device current) and rethrows the first error.
void on_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        KILN_CUDA_CHECK(cudaSetDevice(r));
        fn(r);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// The sums below the peer-to-peer threshold (one-shot kernel) and above it (NCCL), many
// calls in a row (the kernel's epochs and double-buffered staging), and inside a CUDA
// graph replayed with new inputs: every element exact (small integers) on every rank.
TEST(CudaTensorParallel, AllReduceExactAcrossSizesCallsAndGraphReplays) {
  KILN_SKIP_WITHOUT_GPUS(2);
  const int world = std::min(cuda_device_count(), 4);
  auto comms = create_backend("cuda")->make_communicators(world, 0);
  const int64_t bf16_limit = (int64_t(1) << 20) / 2;  // kP2pAllReduceMaxBytes of bf16
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(4099), int64_t(131072), bf16_limit, bf16_limit + 5}) {
      // value(rank, call, i): small integers, exact in bf16 sums of up to 4 ranks.
      auto value = [](int r, int call, int64_t i) { return float((r + 1) * ((i + call) % 5) - 2); };
      auto expect = [&](int call, int64_t i) {
        float sum = 0;
        for (int r = 0; r < world; ++r) sum += value(r, call, i);
        return sum;
      };
      std::vector<std::string> bad(static_cast<size_t>(world));
      on_ranks(world, [&](int r) {
        const size_t es = dtype_size(dt), bytes = size_t(n) * es;
        void *x = nullptr, *y = nullptr;
        KILN_CUDA_CHECK(cudaMalloc(&x, bytes));
        KILN_CUDA_CHECK(cudaMalloc(&y, bytes));
        cudaStream_t s = nullptr;
        KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        auto upload = [&](int call) {
          Tensor h(DType::kF32, {n});
          for (int64_t i = 0; i < n; ++i) h.data_as<float>()[i] = value(r, call, i);
          const Tensor hd = h.to(dt);
          KILN_CUDA_CHECK(cudaMemcpyAsync(x, hd.data(), bytes, cudaMemcpyHostToDevice, s));
          KILN_CUDA_CHECK(cudaStreamSynchronize(s));
        };
        auto check = [&](int call, const char* how) {
          Tensor h(dt, {n});
          KILN_CUDA_CHECK(cudaMemcpy(h.data(), y, bytes, cudaMemcpyDeviceToHost));
          const Tensor f = h.to(DType::kF32);
          for (int64_t i = 0; i < n; ++i)
            if (f.data_as<float>()[i] != expect(call, i) && bad[size_t(r)].empty())
              bad[size_t(r)] = str_cat(dtype_name(dt), " n=", n, " rank ", r, " call ", call, " (", how, ") element ",
                                       i, ": ", f.data_as<float>()[i], " != ", expect(call, i));
        };
        for (int call = 0; call < 5; ++call) {  // eager, back to back
          upload(call);
          comms[size_t(r)]->all_reduce_sum_device(x, y, n, dt, s);
          KILN_CUDA_CHECK(cudaStreamSynchronize(s));
          check(call, "eager");
        }
        cudaGraph_t g = nullptr;
        cudaGraphExec_t ge = nullptr;
        KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        comms[size_t(r)]->all_reduce_sum_device(x, y, n, dt, s);
        comms[size_t(r)]->all_reduce_sum_device(y, y, n, dt, s);  // in place: sum of sums
        KILN_CUDA_CHECK(cudaStreamEndCapture(s, &g));
        KILN_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
        for (int call = 5; call < 9; ++call) {
          upload(call);
          KILN_CUDA_CHECK(cudaGraphLaunch(ge, s));
          KILN_CUDA_CHECK(cudaStreamSynchronize(s));
          Tensor h(dt, {n});
          KILN_CUDA_CHECK(cudaMemcpy(h.data(), y, bytes, cudaMemcpyDeviceToHost));
          const Tensor f = h.to(DType::kF32);
          for (int64_t i = 0; i < n; ++i)
            if (f.data_as<float>()[i] != float(world) * expect(call, i) && bad[size_t(r)].empty())
              bad[size_t(r)] = str_cat(dtype_name(dt), " n=", n, " rank ", r, " graph replay ", call, " element ", i,
                                       ": ", f.data_as<float>()[i], " != ", float(world) * expect(call, i));
        }
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        cudaStreamDestroy(s);
        cudaFree(x);
        cudaFree(y);
      });
      for (auto& b : bad) EXPECT_TRUE(b.empty()) << b;
    }
  }
}

// f32 on the GPU is a precise mode (no TF32, f32 all-reduce): two GPUs give one GPU's
// greedy tokens.
TEST(CudaTensorParallel, TwoGpusGiveOneGpusGreedyTokensF32) {
  KILN_SKIP_WITHOUT_GPUS(2);
  for (std::string family : {"llama", "qwen2", "gpt2"}) {
    const std::string dir = fixtures_dir() + "/models/" + family;
    auto one = Model::load(dir, {.backend = "cuda", .weight_dtype = "f32"});
    auto two = Model::load(dir, {.backend = "cuda", .weight_dtype = "f32", .tensor_parallel = 2});
    ASSERT_EQ(two->tp_world(), 2);
    const auto prompts = prompts_for(one->info().vocab_size);
    std::vector<std::vector<int32_t>> want, got;
    {
      LlmRunner r1(*one);
      want = r1.generate_greedy(prompts, 12);
      LlmRunner r2(*two);
      got = r2.generate_greedy(prompts, 12);
    }
    for (size_t b = 0; b < prompts.size(); ++b) EXPECT_EQ(got[b], want[b]) << family << " f32 prompt " << b;
    std::printf("  %s f32 TP=2 greedy tokens %s TP=1's\n", family.c_str(), got == want ? "equal" : "DIFFER from");
  }
}

// bf16, decode steps as CUDA graphs (NCCL all-reduces captured): teacher-forced along one
// GPU's greedy tokens, every step's logits within the bf16 model bound, and where the
// argmax differs it is a near-tie.
TEST(CudaTensorParallel, TwoGpusMatchOneGpuBf16) {
  KILN_SKIP_WITHOUT_GPUS(2);
  for (std::string family : {"llama", "qwen2", "gpt2"}) {
    const std::string dir = fixtures_dir() + "/models/" + family;
    auto one = Model::load(dir, {.backend = "cuda", .weight_dtype = "bf16"});
    auto two = Model::load(dir, {.backend = "cuda", .weight_dtype = "bf16", .tensor_parallel = 2});
    const auto prompts = prompts_for(one->info().vocab_size);
    std::vector<std::vector<int32_t>> want;
    {
      LlmRunner r1(*one);
      want = r1.generate_greedy(prompts, 12);
    }
    const int64_t v = one->info().vocab_size;
    for (size_t i = 0; i < prompts.size(); ++i) {
      LlmRunner r1(*one, {.block_size = 4}), r2(*two, {.block_size = 4});
      const int32_t s1 = r1.add_sequence(prompts[i]), s2 = r2.add_sequence(prompts[i]);
      int equal = 0;
      double worst = 0;
      for (size_t step = 0; step < want[i].size(); ++step) {
        auto o1 = r1.step(), o2 = r2.step();
        ASSERT_EQ(o1.size(), 1u);
        ASSERT_EQ(o2.size(), 1u);
        const std::vector<float>& l1 = o1[0].logits;
        const std::vector<float>& l2 = o2[0].logits;
        ASSERT_EQ(int64_t(l2.size()), v);
        const Diff d = diff(Tensor::view(const_cast<float*>(l2.data()), DType::kF32, {v}),
                            Tensor::view(const_cast<float*>(l1.data()), DType::kF32, {v}));
        worst = std::max(worst, d.rel());
        const int32_t a1 = argmax_of(l1), a2 = argmax_of(l2);
        if (a1 == a2) {
          ++equal;
        } else {
          EXPECT_LE((double(l1[size_t(a1)]) - double(l1[size_t(a2)])) / d.max_ref, 2e-2)
              << family << " prompt " << i << " step " << step << ": TP=2 argmax " << a2 << " vs TP=1's " << a1
              << " is not a near-tie";
        }
        r1.append_tokens(s1, {want[i][step]});
        r2.append_tokens(s2, {want[i][step]});
      }
      std::printf("  %s bf16 TP=2 prompt %zu: argmax equal at %d of %zu teacher-forced steps, worst logits rel %.3g\n",
                  family.c_str(), i, equal, want[i].size(), worst);
      EXPECT_LE(worst, 6e-2) << family << " prompt " << i;
    }
  }
}

// More ranks than GPUs from the first device: kUnsupported, naming the devices.
TEST(CudaTensorParallel, TooFewGpusIsAClearError) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::string dir = fixtures_dir() + "/models/llama";
  try {
    Model::load(dir, {.backend = "cuda", .weight_dtype = "bf16", .tensor_parallel = 2, .device = cuda_device_count() - 1});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("one GPU per rank"), std::string::npos) << e.what();
  }
}

// A TP=2 engine of `fixture` built for `backend` (cuda: built on GPUs 0 and 1; cpu:
// portable, no GPU needed), in a scratch file.
std::string build_tp2_engine(const std::string& fixture, const std::string& backend, const std::string& dtype) {
  const auto dir = std::filesystem::temp_directory_path() / ("kiln_cuda_tp_engine_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  BuildOptions o;
  o.model = fixtures_dir() + "/models/" + fixture;
  o.output = (dir / (fixture + "-" + backend + "-" + dtype + ".kiln")).string();
  o.backend = backend;
  o.weight_dtype = dtype;
  o.tensor_parallel = 2;
  o.tune = backend == "cuda";
  build_engine(o);
  return o.output;
}

// The engine runs over two GPUs with no --tp, with the `--tp 2` checkpoint load's (and so,
// in f32, one GPU's) greedy tokens, whether it was built for the GPUs or portably on the
// CPU (the CUDA backend times its cuBLASLt algorithms when a rank compiles, not in the builder).
TEST(CudaTensorParallel, TpEngineRunsOverTwoGpusWithTheCheckpointsTokens) {
  KILN_SKIP_WITHOUT_GPUS(2);
  for (std::string family : {"llama", "qwen2", "gpt2"}) {
    const std::string dir = fixtures_dir() + "/models/" + family;
    auto checkpoint = Model::load(dir, {.backend = "cuda", .weight_dtype = "f32", .tensor_parallel = 2});
    const auto prompts = prompts_for(checkpoint->info().vocab_size);
    std::vector<std::vector<int32_t>> want;
    {
      LlmRunner r(*checkpoint);
      want = r.generate_greedy(prompts, 12);
    }
    for (std::string built_for : {"cuda", "cpu"}) {
      auto engine = Model::load(build_tp2_engine(family, built_for, "f32"), {.backend = "cuda"});
      ASSERT_EQ(engine->tp_world(), 2);
      LlmRunner r(*engine);
      auto got = r.generate_greedy(prompts, 12);
      for (size_t b = 0; b < prompts.size(); ++b)
        EXPECT_EQ(got[b], want[b]) << family << " engine built for " << built_for << ", prompt " << b;
      std::printf("  %s f32 TP=2 engine (built for %s) greedy tokens %s the --tp 2 checkpoint's\n", family.c_str(),
                  built_for.c_str(), got == want ? "equal" : "DIFFER from");
    }
  }
}

// A TP=2 engine (built on the CPU) loaded from the last GPU: the same clear error as a
// checkpoint with --tp 2 there, before any rank compiles.
TEST(CudaTensorParallel, TpEngineOnTooFewGpusIsAClearError) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::string path = build_tp2_engine("llama", "cpu", "f32");
  try {
    Model::load(path, {.backend = "cuda", .device = cuda_device_count() - 1});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("one GPU per rank"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln::cuda
