// `kiln generate`: greedy continuation of a prompt (text through the model's own
// tokenizer, or raw token ids), streamed as it decodes, with timing on stderr; optionally
// constrained to a JSON Schema, a GBNF grammar or a regex (runtime/grammar.h), or sped up
// by prompt-lookup drafts (--lookup, runtime/ngram_draft.h): the same output on the CPU
// backend, whose rows do not depend on the step's row count.
#include <chrono>
#include <cstdio>

#include "commands.h"
#include "core/status.h"
#include "core/mapped_file.h"
#include "runtime/grammar.h"
#include "runtime/llm_runner.h"
#include "runtime/model_tokenizer.h"
#include "runtime/ngram_draft.h"
#include "tokenizer/chat_template.h"

namespace kiln::cli {

namespace {

struct GenerateArgs {
  ModelArgs model;
  std::string prompt;
  std::string ids;
  int max_tokens = 64;
  bool ignore_eos = false;
  bool print_ids = false;
  bool random_weights = false;  // -m is a config.json: real shapes, seeded random weights
  bool quiet = false;
  bool chat = false;
  std::string system;
  double kv_fraction = 0;
  std::string json_schema;  // a schema's JSON text, or @FILE
  std::string grammar;      // GBNF text, or @FILE
  std::string regex;        // a regex the whole output matches
  int lookup = 0;           // prompt-lookup drafts per step; 0: off
  int lookup_min_n = LookupDecodeOptions{}.min_n, lookup_max_n = LookupDecodeOptions{}.max_n;
};

// "@path" reads the file; anything else is the text itself.
std::string text_or_file(const std::string& s) { return !s.empty() && s[0] == '@' ? read_text_file(s.substr(1)) : s; }

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int run_generate(const GenerateArgs& a) {
  auto t_load = std::chrono::steady_clock::now();
  auto model = a.random_weights ? load_random_model(a.model.model, model_options(a.model), a.model.quant)
                                : load_model(a.model);
  llm_require_decoder(*model);
  auto tokenizer = a.random_weights ? std::nullopt : load_model_tokenizer(*model);
  double load_s = seconds_since(t_load);

  std::vector<int32_t> prompt;
  if (!a.ids.empty()) {
    prompt = parse_ids(a.ids);
  } else {
    if (!tokenizer)
      throw_error(ErrorCode::kInvalidArgument, "'", a.model.model,
                  "' has no tokenizer; pass token ids with --ids");
    if (a.chat) {
      // The prompt is one user turn rendered by the model's own chat template.
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
      messages.push_back({{"role", "user"}, {"content", a.prompt}});
      prompt = tokenizer->encode(tok::apply_chat_template(*tokenizer, messages), false);
    } else {
      prompt = tokenizer->encode(a.prompt);
    }
  }
  if (prompt.empty()) throw_error(ErrorCode::kInvalidArgument, "the prompt encodes to no tokens");
  for (int32_t id : prompt)
    if (id < 0 || id >= model->info().vocab_size)
      throw_error(ErrorCode::kOutOfRange, "token id ", id, " is outside the vocabulary (",
                  model->info().vocab_size, ")");
  std::vector<int32_t> stops;
  if (!a.ignore_eos) {
    if (tokenizer) stops = tokenizer->stop_ids();
    else if (model->info().eos_token_id >= 0) stops.push_back(int32_t(model->info().eos_token_id));
  }

  LlmRunnerOptions ro;
  ro.max_total_tokens = int64_t(prompt.size()) + a.max_tokens + 16;
  ro.kv_cache_fraction = a.kv_fraction;  // then max_total_tokens caps the pool
  LlmRunner runner(*model, ro);
  std::optional<tok::StreamDecoder> stream;
  if (tokenizer && !a.print_ids) {
    stream.emplace(*tokenizer);
    if (!a.quiet && !a.chat) std::fputs(a.prompt.c_str(), stdout);
  }
  // Constrained decoding: the row masked to the tokens that continue the document; end
  // tokens only where it is complete; the output ends where nothing can follow.
  std::optional<GrammarState> doc;
  std::optional<GrammarTokenMask> mask;
  std::shared_ptr<const TokenTrie> trie;
  if (!a.json_schema.empty() || !a.grammar.empty() || !a.regex.empty()) {
    if (!tokenizer)
      throw_error(ErrorCode::kInvalidArgument, "--json-schema, --grammar and --regex need a model with a tokenizer");
    std::shared_ptr<const Grammar> g;
    if (!a.json_schema.empty()) {
      const auto schema = nlohmann::ordered_json::parse(text_or_file(a.json_schema), nullptr, false);
      if (schema.is_discarded()) throw_error(ErrorCode::kInvalidArgument, "--json-schema is not valid JSON");
      g = grammar_from_json_schema(schema);
    } else if (!a.regex.empty()) {
      g = grammar_from_regex(a.regex);
    } else {
      g = grammar_from_gbnf(text_or_file(a.grammar));
    }
    trie = std::make_shared<const TokenTrie>(token_pieces(*tokenizer));
    doc.emplace(g);
    mask.emplace(g, trie);
  }
  std::vector<int32_t> out;
  auto t_start = std::chrono::steady_clock::now();
  double prefill_s = 0;
  // Prints the token just pushed to `out` as it comes.
  auto print_token = [&](int32_t next) {
    if (stream) std::fputs(stream->put(next).c_str(), stdout);
    else std::printf("%s%d", out.size() > 1 ? " " : "", next);
    std::fflush(stdout);
  };
  std::optional<LookupDecodeStats> lookup;
  if (a.lookup > 0) {
    LookupDecodeOptions lo;
    lo.num_draft = a.lookup;
    lo.min_n = a.lookup_min_n;
    lo.max_n = a.lookup_max_n;
    lo.top_logits = model->backend().name() != "cpu";  // whole rows are already in host memory there
    lo.max_step_tokens = ro.max_step_tokens;
    lookup = generate_greedy_lookup(runner, prompt, a.max_tokens, stops, lo, [&](int32_t next) {
      out.push_back(next);
      if (out.size() == 1) prefill_s = seconds_since(t_start);
      if (std::find(stops.begin(), stops.end(), next) == stops.end()) print_token(next);
    }).stats;
  }
  const int32_t seq = lookup ? -1 : runner.add_sequence(prompt);
  while (!lookup && int(out.size()) < a.max_tokens) {
    auto res = runner.step();
    if (out.empty()) prefill_s = seconds_since(t_start);
    std::vector<float>& row = res.at(0).logits;
    if (doc) {
      const int64_t kept = mask->apply(*doc, row, stops);
      if (kept < 0)
        throw_error(ErrorCode::kInvalidArgument, "the grammar is too ambiguous to constrain decoding with (a token "
                    "mask took more than ", GrammarTokenMask::kMaxMaskWork, " parse-stack steps)");
      if (kept == 0) break;  // nothing continues the document, nor may it end
    }
    int32_t next = argmax(row.data(), int64_t(row.size()));
    out.push_back(next);
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) break;
    if (doc && !doc->accept(trie->piece(next))) break;
    print_token(next);
    if (doc && doc->complete() && !doc->can_continue()) break;
    runner.append_tokens(seq, {next});
  }
  if (stream) std::fputs(stream->flush().c_str(), stdout);
  std::printf("\n");
  std::fflush(stdout);
  double total_s = seconds_since(t_start);
  if (!a.quiet) {
    double decode_s = total_s - prefill_s;
    size_t decoded = out.size() > 1 ? out.size() - 1 : 0;
    std::fprintf(stderr,
                 "[kiln] load %.2f s | prompt %zu tokens: %.1f ms (%.1f tok/s) | %zu generated: "
                 "%.1f ms/token (%.1f tok/s)\n",
                 load_s, prompt.size(), prefill_s * 1e3, double(prompt.size()) / prefill_s,
                 out.size(), decoded ? decode_s * 1e3 / double(decoded) : 0.0,
                 decoded ? double(decoded) / decode_s : 0.0);
    if (lookup)
      std::fprintf(stderr,
                   "[kiln] lookup %d: drafted %lld, accepted %lld (%.1f%%) | %lld decode steps (%.2f tokens/step)\n",
                   a.lookup, (long long)lookup->drafted, (long long)lookup->accepted, 100 * lookup->acceptance(),
                   (long long)lookup->steps, lookup->steps ? double(decoded) / double(lookup->steps) : 0.0);
  }
  return 0;
}

}  // namespace

Runner add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "continue a prompt with a decoder model (greedy)");
  add_model_options(cmd, a->model);
  auto* p = cmd->add_option("-p,--prompt", a->prompt, "prompt text (uses the model's tokenizer)");
  auto* i = cmd->add_option("--ids", a->ids, "prompt as token ids, e.g. \"1,2,3\" (no tokenizer needed)");
  p->excludes(i);
  cmd->add_option("-n,--max-tokens", a->max_tokens, "tokens to generate")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", a->ignore_eos, "keep generating past end-of-sequence tokens");
  cmd->add_flag("--print-ids", a->print_ids, "print generated token ids instead of text");
  cmd->add_flag("--random-weights", a->random_weights,
                "-m is a config.json: its real shapes with seeded random weights (no tokenizer: use --ids), e.g. to "
                "compare --tp or --backend runs of a large shape");
  cmd->add_flag("--chat", a->chat, "wrap the prompt as a user turn in the model's chat template");
  cmd->add_option("-s,--system", a->system, "system prompt (with --chat)");
  cmd->add_flag("-q,--quiet", a->quiet, "print only the generated continuation");
  add_kv_fraction_option(cmd, a->kv_fraction);
  add_kv_dtype_option(cmd, a->model.kv_cache_dtype, a->model.kv_calib, a->model.kv_rotate);
  auto* js = cmd->add_option("--json-schema", a->json_schema,
                             "constrain the output to a JSON document of this schema (its JSON text, or @FILE)");
  auto* gr = cmd->add_option("--grammar", a->grammar,
                             "constrain the output to this GBNF grammar (llama.cpp's syntax; text or @FILE)")
                 ->excludes(js);
  cmd->add_option("--regex", a->regex,
                  "constrain the output to text that matches this regex whole (JSON Schema's pattern subset: "
                  "classes, groups, '|', quantifiers; '.' is any character but a line break)")
      ->excludes(js)
      ->excludes(gr);
  cmd->add_option("--lookup", a->lookup,
                  "prompt-lookup speculative decoding: up to K draft tokens a step, copied from where the last "
                  "few tokens occurred before in the prompt or output, verified in one step (the output is "
                  "greedy decoding's on the cpu backend; on cuda a verify step's GEMMs round differently from a "
                  "one-token step's, so a near-tie may go the other way); 0: off")
      ->capture_default_str();
  cmd->add_option("--lookup-min-n", a->lookup_min_n,
                  "with --lookup: the shortest n-gram matched (1 drafts on free text too, where few drafts hold)")
      ->capture_default_str();
  cmd->add_option("--lookup-max-n", a->lookup_max_n, "with --lookup: the longest n-gram matched (tried first)")
      ->capture_default_str();
  return [a, cmd] {
    if (a->prompt.empty() && a->ids.empty())
      throw_error(ErrorCode::kInvalidArgument, "generate needs --prompt TEXT or --ids IDS");
    if (a->lookup < 0 || a->lookup > kMaxLookupDrafts)
      throw_error(ErrorCode::kInvalidArgument, "--lookup takes 0 (off) to ", kMaxLookupDrafts, " draft tokens a step, got ",
                  a->lookup, " (4-8 is typical)");
    if (a->lookup_min_n < 1 || a->lookup_max_n < a->lookup_min_n || a->lookup_max_n > NgramDrafter::kMaxN)
      throw_error(ErrorCode::kInvalidArgument, "--lookup-min-n and --lookup-max-n need 1 <= min <= max <= ",
                  NgramDrafter::kMaxN, ", got ", a->lookup_min_n, " and ", a->lookup_max_n);
    if (a->lookup > 0 && (!a->json_schema.empty() || !a->grammar.empty() || !a->regex.empty()))
      throw_error(ErrorCode::kInvalidArgument, "--lookup cannot be combined with ",
                  !a->json_schema.empty() ? "--json-schema" : !a->grammar.empty() ? "--grammar" : "--regex",
                  ": constrained decoding takes one token a step (drop --lookup or the constraint)");
    (void)cmd;
    return run_generate(*a);
  };
}

}  // namespace kiln::cli
