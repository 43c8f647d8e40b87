// LocalCommunicator: all-reduce between threads through a shared staging area (see
// communicator.h). Two barriers per call: after every rank posted its pointer, and
// after every rank copied the sum out, so a rank cannot overwrite its buffer while
// another still reads it.
#include "backends/communicator.h"

#include <cstring>

#include "core/status.h"

namespace kiln {

class LocalGroup {
 public:
  explicit LocalGroup(int world) : world_(world), ptrs_(size_t(world), nullptr), sizes_(size_t(world), 0) {}

  void all_reduce_sum(int rank, float* data, int64_t n) {
    ptrs_[size_t(rank)] = data;
    sizes_[size_t(rank)] = n;
    barrier();
    for (int r = 0; r < world_; ++r)
      KILN_CHECK(sizes_[size_t(r)] == n, "all_reduce: rank ", r, " passed ", sizes_[size_t(r)],
                 " elements, rank ", rank, " passed ", n);
    // Each rank sums its own slice of the vector in rank order into scratch; then all
    // copy the whole result. Summing in a fixed order keeps the ranks bit-identical.
    if (rank == 0) scratch_.resize(size_t(n));
    barrier();
    const int64_t per = (n + world_ - 1) / world_;
    const int64_t b = std::min(n, per * rank), e = std::min(n, b + per);
    for (int64_t i = b; i < e; ++i) {
      float s = 0.0f;
      for (int r = 0; r < world_; ++r) s += ptrs_[size_t(r)][i];
      scratch_[size_t(i)] = s;
    }
    barrier();
    std::memcpy(data, scratch_.data(), size_t(n) * sizeof(float));
    barrier();
  }

 private:
  void barrier() {
    std::unique_lock<std::mutex> lk(mu_);
    const uint64_t gen = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lk, [&] { return generation_ != gen; });
  }

  const int world_;
  std::vector<float*> ptrs_;
  std::vector<int64_t> sizes_;
  std::vector<float> scratch_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

void Communicator::all_reduce_sum_device(const void*, void*, int64_t, DType, void*) {
  throw_error(ErrorCode::kUnsupported, "this tensor-parallel communicator joins host memory only; a GPU "
              "backend's ranks need its device communicator (NCCL)");
}

namespace {
class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank, int world)
      : group_(std::move(group)), rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  void all_reduce_sum(float* data, int64_t n) override {
    if (world_ > 1) group_->all_reduce_sum(rank_, data, n);
  }

 private:
  std::shared_ptr<LocalGroup> group_;
  int rank_, world_;
};
}  // namespace

std::vector<std::shared_ptr<Communicator>> make_local_communicators(int world_size) {
  KILN_THROW_IF(world_size < 1, kInvalidArgument, "tensor parallel world size must be >= 1, got ",
                world_size);
  auto group = std::make_shared<LocalGroup>(world_size);
  std::vector<std::shared_ptr<Communicator>> out;
  for (int r = 0; r < world_size; ++r) out.push_back(std::make_shared<LocalCommunicator>(group, r, world_size));
  return out;
}

}  // namespace kiln
