// Splitting thinking models' output into reasoning and content (see reasoning.h).
#include "server/reasoning.h"

#include <algorithm>

namespace kiln::server {

namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// The length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

ReasoningSplitter::ReasoningSplitter(bool prompt_opened_reasoning)
    : state_(prompt_opened_reasoning ? State::kReasoning : State::kStart) {}

bool ReasoningSplitter::prompt_opens_reasoning(std::string_view prompt) {
  const size_t open = prompt.rfind(kOpen);
  if (open == std::string_view::npos) return false;
  const size_t close = prompt.rfind(kClose);
  if (close != std::string_view::npos && close > open) return false;
  // Only whitespace may follow the opening tag: the generation continues inside it.
  return std::all_of(prompt.begin() + std::ptrdiff_t(open + kOpen.size()), prompt.end(), is_space);
}

ReasoningSplitter::Delta ReasoningSplitter::feed(std::string_view text) {
  held_.append(text);
  return drain(false);
}

ReasoningSplitter::Delta ReasoningSplitter::finish() { return drain(true); }

ReasoningSplitter::Delta ReasoningSplitter::drain(bool final) {
  Delta d;
  for (;;) {
    switch (state_) {
      case State::kStart: {
        const size_t lead = size_t(std::find_if_not(held_.begin(), held_.end(), is_space) - held_.begin());
        const std::string_view rest = std::string_view(held_).substr(lead);
        if (rest.substr(0, kOpen.size()) == kOpen) {  // opened: reasoning follows the tag
          held_.erase(0, lead + kOpen.size());
          state_ = State::kReasoning;
          continue;
        }
        if (!final && kOpen.substr(0, rest.size()) == rest) return d;  // may still become <think>
        state_ = State::kContent;
        continue;
      }
      case State::kReasoning: {
        const size_t close = held_.find(kClose);
        if (close != std::string::npos) {
          d.reasoning += held_.substr(0, close);
          held_.erase(0, close + kClose.size());
          state_ = State::kAfterReasoning;
          continue;
        }
        const size_t keep = final ? 0 : partial_tag_suffix(held_, kClose);
        d.reasoning += held_.substr(0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return d;
      }
      case State::kAfterReasoning: {  // the newlines between </think> and the answer go
        const size_t lead = size_t(std::find_if(held_.begin(), held_.end(),
                                                [](char c) { return c != '\n' && c != '\r'; }) - held_.begin());
        held_.erase(0, lead);
        if (held_.empty() && !final) return d;
        state_ = State::kContent;
        continue;
      }
      case State::kContent:
        d.content += held_;
        held_.clear();
        return d;
    }
  }
}

}  // namespace kiln::server
