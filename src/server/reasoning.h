// Reasoning output of "thinking" models (Qwen3, DeepSeek-R1, QwQ): the text between
// <think> and </think> is the model's reasoning, the rest its answer. With `kiln serve
// --reasoning-parser think` chat responses carry them apart, as vLLM's qwen3 and
// deepseek_r1 parsers and DeepSeek's API do: message.reasoning_content and
// message.content, and in streams delta.reasoning_content before delta.content.
// Tested in tests/server/reasoning_test.cpp.
#pragma once

#include <string>
#include <string_view>

namespace kiln::server {

// Splits one choice's generated text, fed in pieces as they stream. The output is
// reasoning when it opens with <think> (after whitespace), or from the start when the
// prompt already opened it (a chat template that ends the prompt with "<think>\n", as
// DeepSeek-R1's does); reasoning ends at </think>, and the newlines after it are dropped
// (Qwen3's template strips them from history). Otherwise the whole output is content. A
// piece that might be the start of a tag is held back until the next piece decides it;
// finish() releases what is held.
class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(bool prompt_opened_reasoning = false);
  struct Delta {
    std::string reasoning, content;
  };
  Delta feed(std::string_view text);
  Delta finish();
  // Whether the rendered prompt ends inside an opened <think> block.
  static bool prompt_opens_reasoning(std::string_view prompt);

 private:
  enum class State { kStart, kReasoning, kAfterReasoning, kContent };
  Delta drain(bool final);
  State state_;
  std::string held_;
};

}  // namespace kiln::server
