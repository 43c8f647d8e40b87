// ReasoningSplitter: thinking models' output split into reasoning and content, whole and
// fed a byte at a time (tags cut anywhere by token boundaries), as vLLM's qwen3 and
// deepseek_r1 parsers split it.
#include <gtest/gtest.h>

#include "server/reasoning.h"

namespace kiln::server {
namespace {

struct Split {
  std::string reasoning, content;
};

Split run(const std::string& text, bool opened, size_t piece) {
  ReasoningSplitter s(opened);
  Split out;
  for (size_t i = 0; i < text.size(); i += piece) {
    const auto d = s.feed(std::string_view(text).substr(i, piece));
    out.reasoning += d.reasoning;
    out.content += d.content;
  }
  const auto d = s.finish();
  out.reasoning += d.reasoning;
  out.content += d.content;
  return out;
}

TEST(ReasoningSplitter, SplitsAtTheTagsInAnyPieces) {
  struct Case {
    std::string text;
    bool opened;
    std::string reasoning, content;
  };
  const Case cases[] = {
      // Qwen3 thinking: the output opens the block.
      {"<think>\nLet me add 2 and 2.\n</think>\n\nIt is 4.", false, "\nLet me add 2 and 2.\n", "It is 4."},
      // enable_thinking false: the template closed an empty block, the output is the answer.
      {"It is 4.", false, "", "It is 4."},
      // Leading whitespace before the tag.
      {"\n<think>a</think>b", false, "a", "b"},
      // DeepSeek-R1: the prompt opened the block, the output only closes it.
      {"Adding.\n</think>\n\n4", true, "Adding.\n", "4"},
      // Cut short while thinking (max_tokens): all of it is reasoning.
      {"<think>still thinking", false, "still thinking", ""},
      {"still thinking", true, "still thinking", ""},
      // Text that only starts like the tag is content.
      {"<thin ice", false, "", "<thin ice"},
      {"<", false, "", "<"},
      // A tag later in an answer is the answer's.
      {"Use <think> tags.", false, "", "Use <think> tags."},
      // An unfinished closing tag at the end stays reasoning.
      {"<think>x</thi", false, "x</thi", ""},
      {"", false, "", ""},
  };
  for (const Case& c : cases)
    for (size_t piece : {size_t(1), size_t(2), size_t(3), size_t(1000)}) {
      const Split s = run(c.text, c.opened, piece);
      EXPECT_EQ(s.reasoning, c.reasoning) << "'" << c.text << "' in pieces of " << piece;
      EXPECT_EQ(s.content, c.content) << "'" << c.text << "' in pieces of " << piece;
    }
}

TEST(ReasoningSplitter, PromptOpensReasoning) {
  EXPECT_TRUE(ReasoningSplitter::prompt_opens_reasoning("<|Assistant|><think>\n"));
  EXPECT_TRUE(ReasoningSplitter::prompt_opens_reasoning("<|im_start|>assistant\n<think>"));
  EXPECT_FALSE(ReasoningSplitter::prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(ReasoningSplitter::prompt_opens_reasoning("<|im_start|>assistant\n"));
  EXPECT_FALSE(ReasoningSplitter::prompt_opens_reasoning("say <think> then stop"));
}

}  // namespace
}  // namespace kiln::server
