// `kiln chat`: an interactive, streaming conversation with a decoder model, rendered
// through the model's own chat template. The conversation's KV cache is kept between
// turns: each turn re-renders the whole conversation, and only the tokens past the
// cached prefix are prefilled.
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "core/status.h"
#include "runtime/llm_runner.h"
#include "runtime/model_tokenizer.h"
#include "tokenizer/chat_template.h"

namespace kiln::cli {

namespace {

struct ChatArgs {
  ModelArgs model;
  std::string system;
  int max_tokens = 256;
  int context = 4096;
  double kv_fraction = 0;
};

int run_chat(const ChatArgs& a) {
  auto model = load_model(a.model);
  auto tokenizer = load_model_tokenizer(*model);
  if (!tokenizer) throw_error(ErrorCode::kInvalidArgument, "'", a.model.model, "' has no tokenizer");
  if (tokenizer->chat_template().empty())
    throw_error(ErrorCode::kUnsupported, "'", a.model.model, "' has no chat template");
  const int64_t ctx = std::min<int64_t>(a.context, model->info().max_positions);
  LlmRunnerOptions ro;
  ro.max_total_tokens = ctx + 64;
  ro.kv_cache_fraction = a.kv_fraction;  // then the context caps the pool
  LlmRunner runner(*model, ro);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  std::vector<int32_t> cached;  // tokens whose K/V the sequence holds
  int32_t seq = -1;
  const auto stops = tokenizer->stop_ids();
  std::fprintf(stderr, "kiln chat: %s (%s). Type a message; an empty line or EOF ends.\n",
               a.model.model.c_str(), model->info().family.c_str());
  std::string line;
  while (true) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line.empty()) break;
    messages.push_back({{"role", "user"}, {"content", line}});
    std::string prompt = tok::apply_chat_template(*tokenizer, messages);
    std::vector<int32_t> ids = tokenizer->encode(prompt, /*add_special=*/false);
    if (int64_t(ids.size()) + a.max_tokens > ctx)
      throw_error(ErrorCode::kOutOfRange, "the conversation (", ids.size(),
                  " tokens) no longer fits the context of ", ctx, " tokens");
    // Reuse the cached prefix when the new rendering extends it; else start over.
    size_t common = 0;
    while (common < cached.size() && common < ids.size() && cached[common] == ids[common]) ++common;
    if (seq < 0 || common < cached.size() || common == ids.size()) {
      if (seq >= 0) runner.remove_sequence(seq);
      seq = runner.add_sequence(ids);
      cached = ids;
    } else {
      runner.append_tokens(seq, {ids.begin() + int64_t(common), ids.end()});
      cached = ids;
    }
    tok::StreamDecoder stream(*tokenizer);
    std::vector<int32_t> reply;
    while (int(reply.size()) < a.max_tokens) {
      auto out = runner.step();
      int32_t next = argmax(out.at(0).logits.data(), int64_t(out[0].logits.size()));
      if (std::find(stops.begin(), stops.end(), next) != stops.end()) break;
      reply.push_back(next);
      std::fputs(stream.put(next).c_str(), stdout);
      std::fflush(stdout);
      runner.append_tokens(seq, {next});
      cached.push_back(next);
    }
    std::fputs(stream.flush().c_str(), stdout);
    std::printf("\n");
    std::fflush(stdout);
    messages.push_back({{"role", "assistant"}, {"content", tokenizer->decode(reply)}});
  }
  return 0;
}

}  // namespace

Runner add_chat(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* cmd = app.add_subcommand("chat", "interactive streaming chat using the model's chat template");
  add_model_options(cmd, a->model);
  cmd->add_option("-s,--system", a->system, "system prompt");
  cmd->add_option("-n,--max-tokens", a->max_tokens, "tokens per reply")->capture_default_str();
  cmd->add_option("-c,--context", a->context, "context length in tokens")->capture_default_str();
  add_kv_fraction_option(cmd, a->kv_fraction);
  add_kv_dtype_option(cmd, a->model.kv_cache_dtype, a->model.kv_calib, a->model.kv_rotate);
  return [a] { return run_chat(*a); };
}

}  // namespace kiln::cli
