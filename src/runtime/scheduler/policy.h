// The executor's scheduling decisions as small pure units over plain structs, so each
// is unit-tested with fakes (tests/runtime/scheduler_test.cpp): the order of requests
// (FCFS or priority), the capacity scheduler (which waiting sequences fit in the free
// KV blocks), the micro-batch scheduler (decodes plus prefill chunks within a token
// budget) and the preemption victim (the least important running sequence).
#pragma once

#include <cstdint>
#include <vector>

namespace kiln {

enum class SchedulePolicy { kFcfs, kPriority };

// What the schedulers see of one sequence.
struct SchedSeq {
  int64_t key = 0;        // the caller's handle
  int32_t priority = 0;   // larger runs first under kPriority
  int64_t arrival = 0;    // submission order (kept across preemption)
  int32_t pending = 0;    // tokens to feed: the rest of the prompt, or 1 when decoding
  bool decoding = false;  // has produced a token (its pending token is a sampled one)
  int32_t blocks_needed = 0;  // capacity: new KV blocks to hold all its pending tokens
  // capacity: running slots it takes once admitted; n for the one sequence of an n > 1
  // request that has not forked yet, since its other choices join it after the prefill.
  int32_t slots = 1;
};

// True when `a` should be served before `b`.
bool sched_before(const SchedSeq& a, const SchedSeq& b, SchedulePolicy policy);
void sched_sort(std::vector<SchedSeq>& seqs, SchedulePolicy policy);

// Capacity scheduler: the keys of the waiting sequences (sorted by sched_sort) to admit,
// in order, while their blocks fit in `available_blocks` and their slots in `free_slots`.
// Stops at the first that does not fit either (no overtaking: a large request at the
// head, or an n > 1 one waiting for n slots, is not starved by small ones behind it).
std::vector<int64_t> capacity_admit(const std::vector<SchedSeq>& waiting, int64_t available_blocks,
                                    int32_t free_slots);

struct ChunkPlan {
  int64_t key = 0;
  int32_t tokens = 0;
};

// Micro-batch scheduler over running sequences (sorted by sched_sort): every decoding
// sequence feeds its one token first (keeping inter-token latency flat), then prefills
// take chunks of their prompts from what is left of `token_budget`.
std::vector<ChunkPlan> micro_batch(const std::vector<SchedSeq>& running, int64_t token_budget);

// The running sequence to preempt when blocks run out: the one served last.
int64_t preemption_victim(const std::vector<SchedSeq>& running, SchedulePolicy policy);

// Priority policy: whether a waiting sequence that does not fit may preempt `running`
// (strictly higher priority only, so equal priorities never thrash).
bool priority_displaces(const SchedSeq& waiting, const SchedSeq& running);

}  // namespace kiln
