// ChatTemplate: parse once, render per request. Tested in
// tests/tokenizer/chat_template_test.cpp.
#include "tokenizer/chat_template.h"

#include "core/status.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/evaluator.h"
#include "tokenizer/tokenizer.h"

namespace kiln::tok {

struct ChatTemplate::Parsed {
  jinja::NodeList nodes;
};

ChatTemplate::ChatTemplate(std::string_view source) : parsed_(std::make_unique<Parsed>()), source_(source) {
  parsed_->nodes = jinja::parse_template(source);
}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& messages,
                                 const ChatTemplateOptions& options) const {
  if (!messages.is_array()) {
    throw_error(ErrorCode::kInvalidArgument, "chat messages must be a JSON array, got ",
                messages.type_name());
  }
  jinja::ValueDict globals = jinja::builtin_globals();
  auto put = [&](const std::string& k, jinja::Value v) {
    for (auto& [name, old] : globals) {
      if (name == k) {
        old = std::move(v);
        return;
      }
    }
    globals.emplace_back(k, std::move(v));
  };
  put("messages", jinja::Value::from_json(messages));
  put("add_generation_prompt", jinja::Value(options.add_generation_prompt));
  put("bos_token", jinja::Value(options.bos_token));
  put("eos_token", jinja::Value(options.eos_token));
  if (options.extra.is_object()) {
    for (auto it = options.extra.begin(); it != options.extra.end(); ++it) {
      put(it.key(), jinja::Value::from_json(it.value()));
    }
  }
  jinja::Context ctx(globals);
  std::string out;
  jinja::exec(parsed_->nodes, ctx, out);
  return out;
}

nlohmann::ordered_json to_json(const std::vector<ChatMessage>& messages) {
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (const auto& m : messages) j.push_back({{"role", m.role}, {"content", m.content}});
  return j;
}

std::string apply_chat_template(const Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                                const ChatTemplateOptions& options) {
  if (tokenizer.chat_template().empty()) {
    throw_error(ErrorCode::kNotFound, "the tokenizer has no chat template "
                "(tokenizer_config.json chat_template / GGUF tokenizer.chat_template)");
  }
  ChatTemplateOptions opt = options;
  if (opt.bos_token.empty()) opt.bos_token = tokenizer.bos_token();
  if (opt.eos_token.empty()) opt.eos_token = tokenizer.eos_token();
  return ChatTemplate(tokenizer.chat_template()).render(messages, opt);
}

}  // namespace kiln::tok
