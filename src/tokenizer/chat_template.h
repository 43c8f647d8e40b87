// Chat templates: renders a model's Jinja chat template (tokenizer_config.json /
// GGUF tokenizer.chat_template) the way transformers' apply_chat_template does
// (jinja2 with trim_blocks and lstrip_blocks, raise_exception, strftime_now).
// Tested in tests/tokenizer/chat_template_test.cpp against jinja2 renderings.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tok {

class Tokenizer;

struct ChatMessage {
  std::string role;
  std::string content;
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  std::string bos_token;  // defaults to the tokenizer's in apply_chat_template
  std::string eos_token;
  // Further variables (tools, documents, date_string, enable_thinking, ...).
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // Parses once; kiln::Error kInvalidFile for syntax errors, kUnsupported for
  // constructs the interpreter lacks (the message names the construct).
  explicit ChatTemplate(std::string_view source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // `messages` is a JSON array of {"role": ..., "content": ...} objects (content may
  // be any JSON, e.g. a list of parts). raise_exception() in the template becomes
  // kiln::Error kInvalidArgument carrying its message.
  std::string render(const nlohmann::ordered_json& messages,
                     const ChatTemplateOptions& options) const;
  // The template's text, as given.
  const std::string& source() const { return source_; }

 private:
  struct Parsed;
  std::unique_ptr<Parsed> parsed_;
  std::string source_;
};

nlohmann::ordered_json to_json(const std::vector<ChatMessage>& messages);

// Renders tokenizer.chat_template() with its bos/eos tokens; kiln::Error kNotFound
// when the tokenizer has no template.
std::string apply_chat_template(const Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                                const ChatTemplateOptions& options = {});

}  // namespace kiln::tok
