// Scheduling units (see policy.h).
#include "runtime/scheduler/policy.h"

#include <algorithm>

#include "core/status.h"

namespace kiln {

bool sched_before(const SchedSeq& a, const SchedSeq& b, SchedulePolicy policy) {
  if (policy == SchedulePolicy::kPriority && a.priority != b.priority) return a.priority > b.priority;
  if (a.arrival != b.arrival) return a.arrival < b.arrival;
  return a.key < b.key;
}

void sched_sort(std::vector<SchedSeq>& seqs, SchedulePolicy policy) {
  std::sort(seqs.begin(), seqs.end(),
            [&](const SchedSeq& a, const SchedSeq& b) { return sched_before(a, b, policy); });
}

std::vector<int64_t> capacity_admit(const std::vector<SchedSeq>& waiting, int64_t available_blocks,
                                    int32_t free_slots) {
  std::vector<int64_t> admitted;
  for (const SchedSeq& s : waiting) {
    if (s.slots > free_slots || s.blocks_needed > available_blocks) break;
    available_blocks -= s.blocks_needed;
    free_slots -= s.slots;
    admitted.push_back(s.key);
  }
  return admitted;
}

std::vector<ChunkPlan> micro_batch(const std::vector<SchedSeq>& running, int64_t token_budget) {
  std::vector<ChunkPlan> plan;
  for (const SchedSeq& s : running)
    if (s.decoding && s.pending > 0 && token_budget > 0) {
      plan.push_back({s.key, 1});
      --token_budget;
    }
  for (const SchedSeq& s : running)
    if (!s.decoding && s.pending > 0 && token_budget > 0) {
      int32_t n = int32_t(std::min<int64_t>(s.pending, token_budget));
      plan.push_back({s.key, n});
      token_budget -= n;
    }
  return plan;
}

int64_t preemption_victim(const std::vector<SchedSeq>& running, SchedulePolicy policy) {
  KILN_CHECK(!running.empty(), "preemption with nothing running");
  const SchedSeq* last = &running[0];
  for (const SchedSeq& s : running)
    if (sched_before(*last, s, policy)) last = &s;
  return last->key;
}

bool priority_displaces(const SchedSeq& waiting, const SchedSeq& running) {
  return waiting.priority > running.priority;
}

}  // namespace kiln
