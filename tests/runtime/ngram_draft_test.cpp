// NgramDrafter on hand-checked histories: no match, matches at each n, the most recent
// occurrence winning, drafts clipped at the history's end, k = 0, and the index kept in
// step as tokens are appended one at a time; against a brute-force rescan on random ones.
#include <gtest/gtest.h>

#include <random>

#include "core/status.h"
#include "runtime/ngram_draft.h"

namespace kiln {
namespace {

using Ids = std::vector<int32_t>;

NgramDrafter drafter_of(const Ids& history, int32_t min_n = 1, int32_t max_n = 3) {
  NgramDrafter d(min_n, max_n);
  d.append(history);
  return d;
}

TEST(NgramDrafter, NoMatchGivesNoDraft) {
  EXPECT_TRUE(drafter_of({}).draft(4).empty());
  EXPECT_TRUE(drafter_of({7}).draft(4).empty());
  NgramDrafter d = drafter_of({1, 2, 3, 4, 5});
  EXPECT_TRUE(d.draft(4).empty()) << "5 never occurred before";
  EXPECT_EQ(d.last_match_n(), 0);
}

TEST(NgramDrafter, ZeroOrNegativeKGivesNoDraft) {
  NgramDrafter d = drafter_of({1, 2, 3, 1, 2});
  EXPECT_TRUE(d.draft(0).empty());
  EXPECT_TRUE(d.draft(-3).empty());
  EXPECT_EQ(d.draft(1), (Ids{3}));
}

TEST(NgramDrafter, LongestSuffixMatchWins) {
  // The suffix [1 2 3] occurred at 0..2 (followed by 9 9) while [2 3] alone also occurred
  // later at 6..7 (followed by 5): n = 3 is tried first and wins.
  NgramDrafter d = drafter_of({1, 2, 3, 9, 9, 4, 2, 3, 5, 1, 2, 3});
  EXPECT_EQ(d.draft(2), (Ids{9, 9}));
  EXPECT_EQ(d.last_match_n(), 3);
}

TEST(NgramDrafter, FallsBackToShorterNgrams) {
  // [8 2 3] never occurred, [2 3] did (at 1..2, followed by 4 5 6).
  NgramDrafter d = drafter_of({1, 2, 3, 4, 5, 6, 8, 2, 3});
  EXPECT_EQ(d.draft(3), (Ids{4, 5, 6}));
  EXPECT_EQ(d.last_match_n(), 2);
  // Only the last token [3] occurred before (at 2, followed by 4 5).
  NgramDrafter e = drafter_of({1, 2, 3, 4, 5, 7, 3});
  EXPECT_EQ(e.draft(2), (Ids{4, 5}));
  EXPECT_EQ(e.last_match_n(), 1);
}

TEST(NgramDrafter, MostRecentOccurrenceWins) {
  // [1 2] at 0..1 (then 3), at 3..4 (then 4), and the suffix: the one at 3..4 is the latest.
  NgramDrafter d = drafter_of({1, 2, 3, 1, 2, 4, 1, 2});
  EXPECT_EQ(d.draft(1), (Ids{4}));
  EXPECT_EQ(d.last_match_n(), 2);
}

TEST(NgramDrafter, DraftsStopAtTheHistoryEnd) {
  // [5 6] at 0..1 is followed by 7 5 6 and then the end: k = 8 gives 3 tokens.
  NgramDrafter d = drafter_of({5, 6, 7, 5, 6});
  EXPECT_EQ(d.draft(8), (Ids{7, 5, 6}));
  // A run of one token: the latest earlier [4 4 4] ends one before the end.
  NgramDrafter r = drafter_of({4, 4, 4, 4, 4});
  EXPECT_EQ(r.draft(8), (Ids{4}));
  EXPECT_EQ(r.last_match_n(), 3);
}

TEST(NgramDrafter, RespectsMinAndMaxN) {
  // Only the last token [3] recurs; with min_n = 2 that is not enough.
  NgramDrafter d = drafter_of({3, 4, 7, 3}, /*min_n=*/2, /*max_n=*/4);
  EXPECT_TRUE(d.draft(4).empty());
  // max_n = 1 looks at the last token only: [9], most recently followed by 1.
  NgramDrafter e = drafter_of({9, 2, 5, 9, 1, 0, 5, 9}, 1, 1);
  EXPECT_EQ(e.draft(2), (Ids{1, 0}));
}

TEST(NgramDrafter, IndexFollowsAppends) {
  NgramDrafter d(1, 3);
  d.append(Ids{10, 11, 12});
  EXPECT_TRUE(d.draft(2).empty());
  d.append(10);
  EXPECT_EQ(d.draft(2), (Ids{11, 12}));
  d.append(11);
  EXPECT_EQ(d.draft(2), (Ids{12, 10}));
  EXPECT_EQ(d.last_match_n(), 2);
  d.append(13);  // [10 11 13]: 13 is new
  EXPECT_TRUE(d.draft(2).empty());
  d.append(10);  // [10] last followed by 11 at position 3..4
  EXPECT_EQ(d.draft(3), (Ids{11, 13, 10}));
  EXPECT_EQ(d.history(), (Ids{10, 11, 12, 10, 11, 13, 10}));
}

TEST(NgramDrafter, RejectsBadSizes) {
  EXPECT_THROW(NgramDrafter(0, 3), Error);
  EXPECT_THROW(NgramDrafter(3, 2), Error);
  EXPECT_THROW(NgramDrafter(1, NgramDrafter::kMaxN + 1), Error);
}

// Transformers' schedule: down by one to 1 after a rejected draft, up by two to the cap
// after a step that kept all.
TEST(NextDraftLength, ShrinksByOneGrowsByTwoWithinBounds) {
  EXPECT_EQ(next_draft_length(8, 8, false), 7);
  EXPECT_EQ(next_draft_length(2, 8, false), 1);
  EXPECT_EQ(next_draft_length(1, 8, false), 1);
  EXPECT_EQ(next_draft_length(1, 8, true), 3);
  EXPECT_EQ(next_draft_length(7, 8, true), 8);
  EXPECT_EQ(next_draft_length(8, 8, true), 8);
  EXPECT_EQ(next_draft_length(1, 1, true), 1);
  // From the cap, three rejections then two full steps come back to it.
  int32_t k = 8;
  for (bool kept : {false, false, false}) k = next_draft_length(k, 8, kept);
  EXPECT_EQ(k, 5);
  for (bool kept : {true, true}) k = next_draft_length(k, 8, kept);
  EXPECT_EQ(k, 8);
}

// The definition, by a rescan: for n = max_n..min_n the latest start s < size - n with
// history[s, s + n) == the last n tokens.
Ids brute_force_draft(const Ids& h, int32_t k, int32_t min_n, int32_t max_n) {
  const int32_t size = int32_t(h.size());
  if (k <= 0) return {};
  for (int32_t n = max_n; n >= min_n; --n) {
    if (n >= size) continue;
    for (int32_t s = size - n - 1; s >= 0; --s)
      if (std::equal(h.begin() + s, h.begin() + s + n, h.end() - n))
        return {h.begin() + s + n, h.begin() + std::min(size, s + n + k)};
  }
  return {};
}

TEST(NgramDrafter, MatchesARescanOnRandomHistories) {
  std::mt19937 rng(7);
  for (int32_t vocab : {2, 5, 40}) {
    NgramDrafter d(1, 4);
    Ids h;
    for (int i = 0; i < 400; ++i) {
      const int32_t t = int32_t(rng() % uint32_t(vocab));
      d.append(t);
      h.push_back(t);
      const int32_t k = int32_t(rng() % 6);
      ASSERT_EQ(d.draft(k), brute_force_draft(h, k, 1, 4)) << "vocab " << vocab << " step " << i << " k " << k;
    }
  }
}

}  // namespace
}  // namespace kiln
