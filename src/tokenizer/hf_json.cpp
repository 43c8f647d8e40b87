// Builds a TokenizerImpl from HF tokenizer.json (+ tokenizer_config.json). Every node
// is type-checked: a malformed or unsupported file is a kiln::Error naming the JSON
// path, never a crash. Tested in tests/tokenizer/hf_json_test.cpp and the fuzz target
// fuzz/tokenizer_json_fuzz.cpp.
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& where, std::string_view expected, const json& found) {
  throw_error(ErrorCode::kInvalidFile, "tokenizer.json: ", where, ": expected ", expected,
              ", found ", found.type_name());
}

const json* member(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::string get_string(const json& j, const char* key, const std::string& where,
                       std::string fallback = {}) {
  const json* v = member(j, key);
  if (!v) return fallback;
  if (!v->is_string()) bad(where + "." + key, "a string", *v);
  return v->get<std::string>();
}

bool get_bool(const json& j, const char* key, const std::string& where, bool fallback) {
  const json* v = member(j, key);
  if (!v) return fallback;
  if (!v->is_boolean()) bad(where + "." + key, "a boolean", *v);
  return v->get<bool>();
}

int64_t get_int(const json& j, const char* key, const std::string& where, int64_t fallback) {
  const json* v = member(j, key);
  if (!v) return fallback;
  if (!v->is_number_integer()) bad(where + "." + key, "an integer", *v);
  return v->get<int64_t>();
}

const json& get_array(const json& j, const char* key, const std::string& where) {
  const json* v = member(j, key);
  if (!v || !v->is_array()) bad(where + "." + key, "an array", v ? *v : json());
  return *v;
}

// Ids index dense tables, so a file may not name absurd ids (a hostile 2^30 would
// allocate gigabytes before anything else could fail).
constexpr int64_t kMaxTokenId = (1 << 24) - 1;

int32_t checked_id(int64_t id, const std::string& where) {
  if (id < 0 || id > kMaxTokenId) {
    throw_error(ErrorCode::kInvalidFile, "tokenizer.json: ", where, ": token id ", id,
                " is out of range");
  }
  return static_cast<int32_t>(id);
}

std::unordered_map<std::string, int32_t> read_vocab(const json& model, size_t& max_id) {
  const json* v = member(model, "vocab");
  if (!v || !v->is_object()) bad("model.vocab", "an object of token -> id", v ? *v : json());
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(v->size());
  for (auto it = v->begin(); it != v->end(); ++it) {
    if (!it.value().is_number_integer()) bad("model.vocab[" + it.key() + "]", "an integer", it.value());
    const int32_t id = checked_id(it.value().get<int64_t>(), "model.vocab");
    utf8_require_valid(it.key(), "a vocabulary token");
    vocab.emplace(it.key(), id);
    max_id = std::max(max_id, static_cast<size_t>(id) + 1);
  }
  if (max_id > 2 * vocab.size() + 1024) {
    throw_error(ErrorCode::kInvalidFile, "tokenizer.json: model.vocab has ", vocab.size(),
                " tokens but ids up to ", max_id - 1, " (expected dense ids)");
  }
  return vocab;
}

std::string pattern_of(const json& node, const std::string& where, bool* is_regex) {
  const json* p = member(node, "pattern");
  if (!p) bad(where + ".pattern", "an object", json());
  if (p->is_string()) {  // older files
    *is_regex = false;
    return p->get<std::string>();
  }
  if (const json* s = member(*p, "String"); s && s->is_string()) {
    *is_regex = false;
    return s->get<std::string>();
  }
  if (const json* r = member(*p, "Regex"); r && r->is_string()) {
    *is_regex = true;
    return r->get<std::string>();
  }
  bad(where + ".pattern", "{\"String\": ...} or {\"Regex\": ...}", *p);
}

// Escapes a literal for RE2.
std::string regex_quote(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || (c & 0x80))) out += '\\';
    out += c;
  }
  return out;
}

void add_normalizer(TokenizerImpl& impl, const json& n, const std::string& where, int depth) {
  if (depth > 16) throw_error(ErrorCode::kInvalidFile, "tokenizer.json: ", where, " nests too deeply");
  const std::string type = get_string(n, "type", where);
  if (type == "Sequence") {
    const json& list = get_array(n, "normalizers", where);
    for (size_t i = 0; i < list.size(); ++i) {
      add_normalizer(impl, list[i], where + ".normalizers[" + std::to_string(i) + "]", depth + 1);
    }
  } else if (type == "BertNormalizer") {
    const bool lower = get_bool(n, "lowercase", where, true);
    const bool strip = get_bool(n, "strip_accents", where, lower);  // null follows lowercase
    impl.normalizers.push_back(make_bert_normalizer(get_bool(n, "clean_text", where, true),
                                                    get_bool(n, "handle_chinese_chars", where, true),
                                                    strip, lower));
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    impl.normalizers.push_back(make_unicode_normalizer(type));
  } else if (type == "Lowercase") {
    impl.normalizers.push_back(make_lowercase_normalizer());
  } else if (type == "StripAccents") {
    impl.normalizers.push_back(make_strip_accents_normalizer());
  } else if (type == "Replace") {
    bool is_regex = false;
    std::string pattern = pattern_of(n, where, &is_regex);
    impl.normalizers.push_back(
        make_replace_normalizer(std::move(pattern), is_regex, get_string(n, "content", where)));
  } else if (type == "Prepend") {
    impl.normalizers.push_back(make_prepend_normalizer(get_string(n, "prepend", where)));
  } else if (type == "Strip") {
    impl.normalizers.push_back(make_strip_normalizer(get_bool(n, "strip_left", where, true),
                                                     get_bool(n, "strip_right", where, true)));
  } else {
    throw_error(ErrorCode::kUnsupported, "tokenizer.json: ", where, ": normalizer type '", type,
                "' is not supported (supported: Sequence, BertNormalizer, NFC, NFD, NFKC, NFKD, "
                "Lowercase, StripAccents, Replace, Prepend, Strip)");
  }
}

void add_pre_tokenizer(TokenizerImpl& impl, const json& p, const std::string& where, int depth) {
  if (depth > 16) throw_error(ErrorCode::kInvalidFile, "tokenizer.json: ", where, " nests too deeply");
  const std::string type = get_string(p, "type", where);
  if (type == "Sequence") {
    const json& list = get_array(p, "pretokenizers", where);
    for (size_t i = 0; i < list.size(); ++i) {
      add_pre_tokenizer(impl, list[i], where + ".pretokenizers[" + std::to_string(i) + "]", depth + 1);
    }
  } else if (type == "ByteLevel") {
    impl.pre_tokenizers.push_back(make_byte_level_pre_tokenizer(
        get_bool(p, "add_prefix_space", where, true), get_bool(p, "use_regex", where, true)));
  } else if (type == "Split") {
    bool is_regex = false;
    std::string pattern = pattern_of(p, where, &is_regex);
    if (!is_regex) pattern = regex_quote(pattern);
    const std::string behavior = get_string(p, "behavior", where, "Isolated");
    if (behavior != "Isolated" && behavior != "Removed") {
      throw_error(ErrorCode::kUnsupported, "tokenizer.json: ", where, ": Split behavior '",
                  behavior, "' is not supported (supported: Isolated, Removed)");
    }
    impl.pre_tokenizers.push_back(make_regex_split_pre_tokenizer(
        pattern, behavior == "Removed", get_bool(p, "invert", where, false)));
  } else if (type == "Digits") {
    impl.pre_tokenizers.push_back(
        make_digits_pre_tokenizer(get_bool(p, "individual_digits", where, false)));
  } else if (type == "BertPreTokenizer") {
    impl.pre_tokenizers.push_back(make_bert_pre_tokenizer());
  } else if (type == "WhitespaceSplit") {
    impl.pre_tokenizers.push_back(make_whitespace_split_pre_tokenizer());
  } else if (type == "Punctuation") {
    impl.pre_tokenizers.push_back(make_punctuation_pre_tokenizer());
  } else if (type == "Metaspace") {
    std::string scheme = get_string(p, "prepend_scheme", where, "");
    if (scheme.empty()) scheme = get_bool(p, "add_prefix_space", where, true) ? "always" : "never";
    impl.pre_tokenizers.push_back(make_metaspace_pre_tokenizer(
        get_string(p, "replacement", where, "\xE2\x96\x81"), scheme, get_bool(p, "split", where, true)));
  } else {
    throw_error(ErrorCode::kUnsupported, "tokenizer.json: ", where, ": pre-tokenizer type '", type,
                "' is not supported (supported: Sequence, ByteLevel, Split, Digits, "
                "BertPreTokenizer, WhitespaceSplit, Punctuation, Metaspace)");
  }
}

void add_decoder(TokenizerImpl& impl, const json& d, const std::string& where, int depth) {
  if (depth > 16) throw_error(ErrorCode::kInvalidFile, "tokenizer.json: ", where, " nests too deeply");
  const std::string type = get_string(d, "type", where);
  if (type == "Sequence") {
    const json& list = get_array(d, "decoders", where);
    for (size_t i = 0; i < list.size(); ++i) {
      add_decoder(impl, list[i], where + ".decoders[" + std::to_string(i) + "]", depth + 1);
    }
  } else if (type == "ByteLevel") {
    impl.decoders.push_back(make_byte_level_decoder());
  } else if (type == "WordPiece") {
    impl.decoders.push_back(make_wordpiece_decoder(get_string(d, "prefix", where, "##"),
                                                   get_bool(d, "cleanup", where, true)));
  } else if (type == "Metaspace") {
    std::string scheme = get_string(d, "prepend_scheme", where, "");
    if (scheme.empty()) scheme = get_bool(d, "add_prefix_space", where, true) ? "always" : "never";
    impl.decoders.push_back(
        make_metaspace_decoder(get_string(d, "replacement", where, "\xE2\x96\x81"), scheme));
  } else if (type == "Replace") {
    bool is_regex = false;
    std::string pattern = pattern_of(d, where, &is_regex);
    if (is_regex) {
      throw_error(ErrorCode::kUnsupported, "tokenizer.json: ", where,
                  ": Replace decoder with a regex pattern is not supported");
    }
    impl.decoders.push_back(make_replace_decoder(std::move(pattern), get_string(d, "content", where)));
  } else if (type == "ByteFallback") {
    impl.decoders.push_back(make_byte_fallback_decoder());
  } else if (type == "Fuse") {
    impl.decoders.push_back(make_fuse_decoder());
  } else if (type == "Strip") {
    const int64_t start = get_int(d, "start", where, 0);
    const int64_t stop = get_int(d, "stop", where, 0);
    if (start < 0 || stop < 0) throw_error(ErrorCode::kInvalidFile, "tokenizer.json: ", where, ": negative Strip count");
    impl.decoders.push_back(make_strip_decoder(get_string(d, "content", where, " "),
                                               static_cast<size_t>(start), static_cast<size_t>(stop)));
  } else if (type == "BPEDecoder") {
    impl.decoders.push_back(make_bpe_suffix_decoder(get_string(d, "suffix", where, "</w>")));
  } else {
    throw_error(ErrorCode::kUnsupported, "tokenizer.json: ", where, ": decoder type '", type,
                "' is not supported (supported: Sequence, ByteLevel, WordPiece, Metaspace, "
                "Replace, ByteFallback, Fuse, Strip, BPEDecoder)");
  }
}

// [token, id] pairs as in BertProcessing / RobertaProcessing.
TemplateItem special_item(const json& node, const char* key, const std::string& where) {
  const json* v = member(node, key);
  if (!v || !v->is_array() || v->size() != 2 || !(*v)[1].is_number_integer()) {
    bad(where + "." + key, "[token, id]", v ? *v : json());
  }
  TemplateItem item;
  item.ids.push_back(checked_id((*v)[1].get<int64_t>(), where));
  return item;
}

std::vector<TemplateItem> read_template(const json& list, const json& specials,
                                        const std::string& where) {
  if (!list.is_array()) bad(where, "an array", list);
  std::vector<TemplateItem> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    TemplateItem item;
    if (const json* seq = member(list[i], "Sequence")) {
      item.is_sequence = true;
      const std::string id = get_string(*seq, "id", w);
      if (id != "A" && id != "B") throw_error(ErrorCode::kInvalidFile, "tokenizer.json: ", w, ": sequence id must be A or B");
      item.sequence = id == "A" ? 0 : 1;
      item.type_id = static_cast<int32_t>(get_int(*seq, "type_id", w, 0));
    } else if (const json* sp = member(list[i], "SpecialToken")) {
      const std::string id = get_string(*sp, "id", w);
      item.type_id = static_cast<int32_t>(get_int(*sp, "type_id", w, 0));
      const json* entry = member(specials, id.c_str());
      if (!entry) throw_error(ErrorCode::kInvalidFile, "tokenizer.json: ", w, ": special token '", id, "' is not defined in special_tokens");
      for (const auto& x : get_array(*entry, "ids", w)) {
        if (!x.is_number_integer()) bad(w + ".ids", "integers", x);
        item.ids.push_back(checked_id(x.get<int64_t>(), w));
      }
    } else {
      bad(w, "{\"Sequence\": ...} or {\"SpecialToken\": ...}", list[i]);
    }
    out.push_back(std::move(item));
  }
  return out;
}

void read_post_processor(TokenizerImpl& impl, const json& p, const std::string& where, int depth) {
  if (depth > 16) throw_error(ErrorCode::kInvalidFile, "tokenizer.json: ", where, " nests too deeply");
  const std::string type = get_string(p, "type", where);
  if (type == "Sequence") {
    const json& list = get_array(p, "processors", where);
    for (size_t i = 0; i < list.size(); ++i) {
      read_post_processor(impl, list[i], where + ".processors[" + std::to_string(i) + "]", depth + 1);
    }
  } else if (type == "TemplateProcessing") {
    const json* specials = member(p, "special_tokens");
    const json empty = json::object();
    if (const json* single = member(p, "single")) {
      impl.post.single = read_template(*single, specials ? *specials : empty, where + ".single");
    }
    if (const json* pair = member(p, "pair")) {
      impl.post.pair = read_template(*pair, specials ? *specials : empty, where + ".pair");
    }
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    const TemplateItem cls = special_item(p, "cls", where);
    TemplateItem sep = special_item(p, "sep", where);
    TemplateItem a{true, 0, {}, 0};
    TemplateItem b{true, 1, {}, type == "BertProcessing" ? 1 : 0};
    impl.post.single = {cls, a, sep};
    TemplateItem sep_b = sep;
    sep_b.type_id = b.type_id;
    if (type == "BertProcessing") {
      impl.post.pair = {cls, a, sep, b, sep_b};
    } else {
      impl.post.pair = {cls, a, sep, sep, b, sep};
    }
  } else if (type == "ByteLevel") {
    // Only adjusts offsets, which kiln does not track.
  } else {
    throw_error(ErrorCode::kUnsupported, "tokenizer.json: ", where, ": post-processor type '",
                type, "' is not supported (supported: TemplateProcessing, BertProcessing, "
                "RobertaProcessing, ByteLevel, Sequence)");
  }
}

void read_model(TokenizerImpl& impl, const json& model) {
  const std::string type = get_string(model, "type", "model", "");
  size_t size = 0;
  if (type == "BPE" || (type.empty() && member(model, "merges"))) {
    auto vocab = read_vocab(model, size);
    std::vector<std::pair<std::string, std::string>> merges;
    if (const json* m = member(model, "merges")) {
      if (!m->is_array()) bad("model.merges", "an array", *m);
      merges.reserve(m->size());
      for (size_t i = 0; i < m->size(); ++i) {
        const json& e = (*m)[i];
        if (e.is_string()) {  // "a b"
          const std::string s = e.get<std::string>();
          const size_t sp = s.find(' ', 1);
          if (sp == std::string::npos) {
            throw_error(ErrorCode::kInvalidFile, "tokenizer.json: model.merges[", i, "] '", s,
                        "' is not two tokens separated by a space");
          }
          merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
          merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
        } else {
          bad("model.merges[" + std::to_string(i) + "]", "\"a b\" or [\"a\", \"b\"]", e);
        }
      }
    }
    BpeOptions opt;
    opt.unk_token = get_string(model, "unk_token", "model");
    opt.continuing_subword_prefix = get_string(model, "continuing_subword_prefix", "model");
    opt.end_of_word_suffix = get_string(model, "end_of_word_suffix", "model");
    opt.fuse_unk = get_bool(model, "fuse_unk", "model", false);
    opt.byte_fallback = get_bool(model, "byte_fallback", "model", false);
    opt.ignore_merges = get_bool(model, "ignore_merges", "model", false);
    impl.vocab.assign(size, std::string());
    for (const auto& [t, id] : vocab) impl.vocab[static_cast<size_t>(id)] = t;
    if (!opt.unk_token.empty()) impl.unk_id = vocab.count(opt.unk_token) ? vocab[opt.unk_token] : -1;
    impl.model = std::make_unique<BpeModel>(std::move(vocab), merges, std::move(opt));
  } else if (type == "WordPiece") {
    auto vocab = read_vocab(model, size);
    impl.vocab.assign(size, std::string());
    for (const auto& [t, id] : vocab) impl.vocab[static_cast<size_t>(id)] = t;
    const std::string unk = get_string(model, "unk_token", "model", "[UNK]");
    impl.unk_id = vocab.count(unk) ? vocab[unk] : -1;
    const int64_t max_chars = get_int(model, "max_input_chars_per_word", "model", 100);
    impl.model = std::make_unique<WordPieceModel>(
        std::move(vocab), unk, get_string(model, "continuing_subword_prefix", "model", "##"),
        static_cast<size_t>(std::max<int64_t>(0, max_chars)));
  } else {
    throw_error(ErrorCode::kUnsupported, "tokenizer.json: model type '", type,
                "' is not supported (supported: BPE, WordPiece)");
  }
}

// A special token in tokenizer_config.json: "tok" or {"content": "tok", ...}.
std::string config_token(const json& config, const char* key) {
  const json* v = member(config, key);
  if (!v) return {};
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object()) return get_string(*v, "content", std::string("tokenizer_config.") + key);
  return {};
}

}  // namespace

std::shared_ptr<const TokenizerImpl> load_hf_json(std::string_view tokenizer_json,
                                                  std::string_view config_json) {
  json root, config;
  try {
    root = json::parse(tokenizer_json);
    if (!config_json.empty()) config = json::parse(config_json);
  } catch (const json::exception& e) {
    throw_error(ErrorCode::kInvalidFile, "tokenizer JSON does not parse: ", e.what());
  }
  if (!root.is_object()) bad("<root>", "an object", root);
  auto impl = std::make_shared<TokenizerImpl>();
  const json* model = member(root, "model");
  if (!model) bad("model", "an object", json());
  read_model(*impl, *model);
  if (const json* added = member(root, "added_tokens")) {
    if (!added->is_array()) bad("added_tokens", "an array", *added);
    for (size_t i = 0; i < added->size(); ++i) {
      const std::string w = "added_tokens[" + std::to_string(i) + "]";
      const json& a = (*added)[i];
      AddedToken t;
      t.content = get_string(a, "content", w);
      utf8_require_valid(t.content, "an added token");
      t.id = checked_id(get_int(a, "id", w, -1), w);
      t.special = get_bool(a, "special", w, false);
      t.lstrip = get_bool(a, "lstrip", w, false);
      t.rstrip = get_bool(a, "rstrip", w, false);
      t.single_word = get_bool(a, "single_word", w, false);
      t.normalized = get_bool(a, "normalized", w, !t.special);
      if (static_cast<size_t>(t.id) > impl->vocab.size() + 2 * added->size() + 1024) {
        throw_error(ErrorCode::kInvalidFile, "tokenizer.json: ", w, ": id ", t.id,
                    " is far beyond the vocabulary (", impl->vocab.size(), " tokens)");
      }
      impl->added_tokens.push_back(std::move(t));
    }
  }
  if (const json* n = member(root, "normalizer")) add_normalizer(*impl, *n, "normalizer", 0);
  if (const json* p = member(root, "pre_tokenizer")) add_pre_tokenizer(*impl, *p, "pre_tokenizer", 0);
  if (const json* d = member(root, "decoder")) {
    impl->decoder_present = true;
    add_decoder(*impl, *d, "decoder", 0);
  }
  if (const json* p = member(root, "post_processor")) read_post_processor(*impl, *p, "post_processor", 0);
  for (const auto* items : {&impl->post.single, &impl->post.pair}) {
    for (const auto& item : *items) {
      if (item.is_sequence && item.sequence == 1 && items == &impl->post.single) {
        throw_error(ErrorCode::kInvalidFile, "tokenizer.json: the single template uses $B");
      }
    }
  }

  if (config.is_object()) {
    impl->bos_token = config_token(config, "bos_token");
    impl->eos_token = config_token(config, "eos_token");
    const std::string pad = config_token(config, "pad_token");
    const std::string unk = config_token(config, "unk_token");
    if (const json* t = member(config, "chat_template")) {
      if (t->is_string()) {
        impl->chat_template = t->get<std::string>();
      } else if (t->is_array()) {  // [{"name": "default", "template": ...}, ...]
        for (const auto& e : *t) {
          if (get_string(e, "name", "tokenizer_config.chat_template") == "default") {
            impl->chat_template = get_string(e, "template", "tokenizer_config.chat_template");
          }
        }
      }
    }
    impl->finalize();
    if (!pad.empty()) impl->pad_id = impl->find(pad);
    if (!unk.empty() && impl->find(unk) >= 0) impl->unk_id = impl->find(unk);
  } else {
    impl->finalize();
  }
  // BERT-style files name their specials only in the post-processor.
  if (impl->pad_id < 0) {
    if (const json* pad = member(root, "padding")) impl->pad_id = static_cast<int32_t>(get_int(*pad, "pad_id", "padding", -1));
  }
  if (impl->pad_id < 0) impl->pad_id = impl->find("[PAD]");
  for (const auto* items : {&impl->post.single, &impl->post.pair}) {
    for (const auto& item : *items) {
      for (int32_t id : item.ids) {
        if (static_cast<size_t>(id) >= impl->vocab.size()) {
          throw_error(ErrorCode::kInvalidFile, "tokenizer.json: post_processor uses token id ", id,
                      " but the vocabulary has ", impl->vocab.size(), " tokens");
        }
      }
    }
  }
  return impl;
}

}  // namespace kiln::tok
