// The Tokenizer facade: added-token splitting, the encode pipeline, post-processing
// with truncation/padding, decoding and streaming. Loaders live in hf_json.cpp and
// gguf_loader.cpp. Tested in tests/tokenizer/*_test.cpp.
#include "tokenizer/tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>

#include "core/status.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {

// ---------------------------------------------------------------- added tokens

void AddedTokenMatcher::build(const std::vector<AddedToken>& tokens) {
  tokens_ = tokens;
  nodes_.assign(1, Node{});
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const auto& content = tokens_[t].content;
    if (content.empty()) continue;
    int32_t node = 0;
    for (unsigned char c : content) {
      auto it = nodes_[static_cast<size_t>(node)].next.find(c);
      if (it == nodes_[static_cast<size_t>(node)].next.end()) {
        nodes_.push_back(Node{});
        const auto child = static_cast<int32_t>(nodes_.size() - 1);
        nodes_[static_cast<size_t>(node)].next.emplace(c, child);
        node = child;
      } else {
        node = it->second;
      }
    }
    if (nodes_[static_cast<size_t>(node)].token < 0) {
      nodes_[static_cast<size_t>(node)].token = static_cast<int32_t>(t);
    }
  }
}

namespace {
bool is_word_char(char32_t c) { return c == '_' || is_letter(c) || is_number(c); }

char32_t last_char(std::string_view s) {
  if (s.empty()) return 0;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  char32_t cp = 0;
  utf8_decode(s, i, &cp);
  return cp;
}
}  // namespace

void AddedTokenMatcher::split(std::string_view text, bool normalized_pass, bool parse_special,
                              std::vector<Segment>& out) const {
  size_t emitted = 0;  // end of the last emitted segment
  size_t pos = 0;
  while (pos < text.size()) {
    // Longest token starting at pos (the trie walk gives all prefixes).
    int32_t best = -1;
    size_t best_len = 0;
    int32_t node = 0;
    for (size_t k = pos; k < text.size(); ++k) {
      const auto& next = nodes_[static_cast<size_t>(node)].next;
      auto it = next.find(static_cast<unsigned char>(text[k]));
      if (it == next.end()) break;
      node = it->second;
      const int32_t t = nodes_[static_cast<size_t>(node)].token;
      if (t >= 0) {
        const auto& tok = tokens_[static_cast<size_t>(t)];
        if (tok.normalized == normalized_pass && (parse_special || !tok.special)) {
          best = t;
          best_len = k + 1 - pos;
        }
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const auto& tok = tokens_[static_cast<size_t>(best)];
    size_t start = pos, stop = pos + best_len;
    if (tok.single_word) {
      const bool start_ok = start == 0 || !is_word_char(last_char(text.substr(0, start)));
      char32_t next_cp = 0;
      if (stop < text.size()) utf8_decode(text, stop, &next_cp);
      const bool stop_ok = stop == text.size() || !is_word_char(next_cp);
      if (!start_ok || !stop_ok) {
        ++pos;
        continue;
      }
    }
    if (tok.lstrip) {
      while (start > emitted) {
        size_t b = start - 1;
        while (b > emitted && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
        char32_t cp = 0;
        if (!utf8_decode(text, b, &cp) || !is_whitespace(cp)) break;
        start = b;
      }
    }
    if (tok.rstrip) {
      char32_t cp;
      size_t n;
      while (stop < text.size() && (n = utf8_decode(text, stop, &cp)) && is_whitespace(cp)) stop += n;
    }
    if (start > emitted) out.push_back({text.substr(emitted, start - emitted), -1});
    out.push_back({text.substr(start, stop - start), tok.id});
    emitted = pos = stop;
  }
  if (emitted < text.size()) out.push_back({text.substr(emitted), -1});
}

// ---------------------------------------------------------------- impl helpers

size_t PostProcessor::added_tokens(bool is_pair) const {
  size_t n = 0;
  for (const auto& item : is_pair ? pair : single) {
    if (!item.is_sequence) n += item.ids.size();
  }
  return n;
}

void TokenizerImpl::finalize() {
  for (const auto& t : added_tokens) {
    if (t.id < 0) throw_error(ErrorCode::kInvalidFile, "added token '", t.content, "' has no id");
    if (static_cast<size_t>(t.id) >= vocab.size()) vocab.resize(static_cast<size_t>(t.id) + 1);
    vocab[static_cast<size_t>(t.id)] = t.content;
  }
  token_ids.clear();
  token_ids.reserve(vocab.size());
  for (size_t i = 0; i < vocab.size(); ++i) {
    if (!vocab[i].empty()) token_ids.emplace(vocab[i], static_cast<int32_t>(i));
  }
  special.assign(vocab.size(), 0);
  added.assign(vocab.size(), 0);
  std::vector<AddedToken> matchable = added_tokens;
  for (auto& t : matchable) {
    added[static_cast<size_t>(t.id)] = 1;
    if (t.special) special[static_cast<size_t>(t.id)] = 1;
    // Tokens matched after normalization are looked for in normalized form.
    if (t.normalized) {
      for (const auto& n : normalizers) t.content = n->normalize(t.content);
    }
  }
  matcher.build(matchable);
  auto find_id = [&](const std::string& s) { return s.empty() ? -1 : find(s); };
  if (bos_id < 0) bos_id = find_id(bos_token);
  if (eos_id < 0) eos_id = find_id(eos_token);
  if (bos_id >= 0 && bos_token.empty()) bos_token = vocab[static_cast<size_t>(bos_id)];
  if (eos_id >= 0 && eos_token.empty()) eos_token = vocab[static_cast<size_t>(eos_id)];
  if (eos_id >= 0) stop_ids.push_back(eos_id);
  for (const char* name : {"<|im_end|>", "<|eot_id|>", "<|end_of_turn|>", "<end_of_turn>",
                           "<|endoftext|>", "<|eom_id|>", "<|end|>"}) {
    const int32_t id = find(name);
    if (id >= 0 && special[static_cast<size_t>(id)] &&
        std::find(stop_ids.begin(), stop_ids.end(), id) == stop_ids.end()) {
      stop_ids.push_back(id);
    }
  }
}

int32_t TokenizerImpl::find(std::string_view token) const {
  auto it = token_ids.find(std::string(token));
  return it == token_ids.end() ? -1 : it->second;
}

namespace {

void encode_text(const TokenizerImpl& impl, std::string_view text, bool parse_special,
                 std::vector<int32_t>& ids) {
  utf8_require_valid(text, "text to encode");
  if (impl.spm) {
    std::vector<int> out;
    const auto status = impl.spm->Encode(std::string(text), &out);
    if (!status.ok()) {
      throw_error(ErrorCode::kInvalidArgument, "sentencepiece encode failed: ", status.ToString());
    }
    ids.insert(ids.end(), out.begin(), out.end());
    return;
  }
  std::vector<AddedTokenMatcher::Segment> raw, norm;
  impl.matcher.split(text, false, parse_special, raw);
  std::vector<std::string> pieces;
  for (const auto& seg : raw) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string normalized(seg.text);
    for (const auto& n : impl.normalizers) normalized = n->normalize(std::move(normalized));
    norm.clear();
    impl.matcher.split(normalized, true, parse_special, norm);
    for (const auto& sub : norm) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
        continue;
      }
      const bool first_segment = seg.text.data() == text.data() && sub.text.data() == normalized.data();
      pieces.assign(1, std::string(sub.text));
      for (const auto& p : impl.pre_tokenizers) p->pre_tokenize(pieces, first_segment);
      for (const auto& p : pieces) impl.model->tokenize(p, ids);
    }
  }
}

// HF's TruncationStrategy::LongestFirst for one or two sequences.
void truncate_longest_first(std::vector<int32_t>& a, std::vector<int32_t>* b, size_t max_len) {
  if (!b) {
    if (a.size() > max_len) a.resize(max_len);
    return;
  }
  if (a.size() + b->size() <= max_len) return;
  size_t n1 = a.size(), n2 = b->size();
  const bool swap = n1 > n2;
  if (swap) std::swap(n1, n2);
  n2 = n1 > max_len ? n1 : std::max(n1, max_len - n1);
  if (n1 + n2 > max_len) {
    n1 = max_len / 2;
    n2 = n1 + max_len % 2;
  }
  if (swap) std::swap(n1, n2);
  a.resize(std::min(a.size(), n1));
  b->resize(std::min(b->size(), n2));
}

Encoding assemble(const TokenizerImpl& impl, std::vector<int32_t> a, std::vector<int32_t>* b,
                  const EncodeOptions& opt) {
  const bool is_pair = b != nullptr;
  const auto& tmpl = is_pair ? impl.post.pair : impl.post.single;
  const bool use_template = opt.add_special && !tmpl.empty();
  if (opt.max_length > 0) {
    const size_t extra = use_template ? impl.post.added_tokens(is_pair) : 0;
    truncate_longest_first(a, b, opt.max_length > extra ? opt.max_length - extra : 0);
  }
  Encoding e;
  auto append = [&](const std::vector<int32_t>& ids, int32_t type) {
    e.ids.insert(e.ids.end(), ids.begin(), ids.end());
    e.type_ids.insert(e.type_ids.end(), ids.size(), type);
  };
  if (use_template) {
    for (const auto& item : tmpl) {
      if (item.is_sequence) {
        append(item.sequence == 0 ? a : *b, item.type_id);
      } else {
        append(item.ids, item.type_id);
      }
    }
  } else {
    append(a, 0);
    if (b) append(*b, 1);
  }
  e.attention_mask.assign(e.ids.size(), 1);
  if (opt.pad_to > e.ids.size()) {
    const size_t n = opt.pad_to - e.ids.size();
    e.ids.insert(e.ids.end(), n, std::max(impl.pad_id, 0));
    e.type_ids.insert(e.type_ids.end(), n, 0);
    e.attention_mask.insert(e.attention_mask.end(), n, 0);
  }
  return e;
}

}  // namespace

// ---------------------------------------------------------------- Tokenizer

Tokenizer::Tokenizer(std::shared_ptr<const TokenizerImpl> impl) : impl_(std::move(impl)) {
  KILN_CHECK(impl_ != nullptr, "Tokenizer needs an implementation");
}

Tokenizer Tokenizer::from_hf_json(std::string_view tokenizer_json,
                                  std::string_view tokenizer_config_json) {
  return Tokenizer(load_hf_json(tokenizer_json, tokenizer_config_json));
}

Tokenizer Tokenizer::from_gguf(const GgufTokenizerData& data) { return Tokenizer(load_gguf(data)); }

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  EncodeOptions opt;
  opt.add_special = add_special;
  return encode_full(text, opt).ids;
}

Encoding Tokenizer::encode_full(std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> a;
  encode_text(*impl_, text, options.parse_special, a);
  return assemble(*impl_, std::move(a), nullptr, options);
}

Encoding Tokenizer::encode_pair(std::string_view first, std::string_view second,
                                const EncodeOptions& options) const {
  std::vector<int32_t> a, b;
  encode_text(*impl_, first, options.parse_special, a);
  encode_text(*impl_, second, options.parse_special, b);
  return assemble(*impl_, std::move(a), &b, options);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const auto& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl.vocab.size()) continue;  // HF drops unknown ids
    if (skip_special && impl.special[static_cast<size_t>(id)]) continue;
    tokens.push_back(impl.vocab[static_cast<size_t>(id)]);
  }
  if (impl.spm) {
    std::vector<int> spm_ids;
    for (int32_t id : ids) {
      if (id < 0 || static_cast<size_t>(id) >= impl.vocab.size()) continue;
      if (skip_special && impl.special[static_cast<size_t>(id)]) continue;
      spm_ids.push_back(id);
    }
    std::string out;
    const auto status = impl.spm->Decode(spm_ids, &out);
    if (!status.ok()) {
      throw_error(ErrorCode::kInvalidArgument, "sentencepiece decode failed: ", status.ToString());
    }
    return out;
  }
  if (!impl.decoder_present) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  for (const auto& d : impl.decoders) d->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id) const {
  const auto& impl = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= impl.vocab.size()) return {};
  const std::string& t = impl.vocab[static_cast<size_t>(id)];
  if (impl.added[static_cast<size_t>(id)]) return t;
  // Decode the token alone but without the lossy UTF-8 step, so byte tokens keep
  // their raw byte: map byte-level chars back, and <0xAB> to its byte.
  std::vector<std::string> tokens{t};
  for (const auto& d : impl.decoders) d->decode_chain(tokens);
  std::string piece;
  for (const auto& s : tokens) piece += s;
  if (piece.find("\xEF\xBF\xBD") != std::string::npos) {
    // The chain replaced a partial sequence; recover the raw bytes.
    std::string raw;
    bool ok = true;
    size_t i = 0;
    char32_t cp;
    while (i < t.size() && ok) {
      const size_t n = utf8_decode(t, i, &cp);
      const int b = n ? unicode_to_byte(cp) : -1;
      ok = b >= 0;
      raw.push_back(static_cast<char>(b));
      i += n ? n : 1;
    }
    if (ok) return raw;
    if (t.size() == 6 && t.compare(0, 3, "<0x") == 0) {
      return std::string(1, static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
    }
  }
  return piece;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->vocab.size()) return {};
  return impl_->vocab[static_cast<size_t>(id)];
}

int32_t Tokenizer::token_to_id(std::string_view token) const { return impl_->find(token); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() &&
         impl_->special[static_cast<size_t>(id)];
}

int32_t Tokenizer::bos_id() const { return impl_->bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->eos_id; }
int32_t Tokenizer::pad_id() const { return impl_->pad_id; }
int32_t Tokenizer::unk_id() const { return impl_->unk_id; }
std::vector<int32_t> Tokenizer::stop_ids() const { return impl_->stop_ids; }
size_t Tokenizer::vocab_size() const { return impl_->vocab.size(); }
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

// ---------------------------------------------------------------- StreamDecoder

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

void StreamDecoder::reset() {
  ids_.clear();
  prefix_.clear();
  prefix_ids_ = 0;
}

// HF's DecodeStream scheme: decode a window that starts at the previous release
// point, and release what it adds once it no longer ends in U+FFFD (an incomplete
// byte sequence). Starting the window at a release point keeps decoders that look at
// neighbours (ByteFallback runs, Metaspace's first-token rule, WordPiece's "##")
// seeing the same context as a full decode.
std::string StreamDecoder::put(int32_t id) {
  ids_.push_back(id);
  const std::string text = tokenizer_->decode(ids_, skip_special_);
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  if (text.size() <= prefix_.size() ||
      (text.size() >= 3 && std::string_view(text).substr(text.size() - 3) == kReplacement)) {
    return {};
  }
  std::string fresh = fresh_text(text);
  const size_t window = ids_.size() - prefix_ids_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_ids_));
  prefix_ = tokenizer_->decode(ids_, skip_special_);
  prefix_ids_ = window;
  return fresh;
}

// What `text` adds to the released prefix. A decoder whose output for earlier tokens
// changes with later ones (ByteFallback turns a whole invalid byte run into U+FFFDs)
// can break the prefix; then only the part after the common prefix, cut at a
// character boundary, is released (HF's DecodeStream errors out instead).
std::string StreamDecoder::fresh_text(const std::string& text) const {
  if (text.compare(0, prefix_.size(), prefix_) == 0) return text.substr(prefix_.size());
  size_t common = 0;
  while (common < prefix_.size() && common < text.size() && prefix_[common] == text[common]) ++common;
  while (common > 0 && (static_cast<unsigned char>(text[common]) & 0xC0) == 0x80) --common;
  return utf8_lossy(std::string_view(text).substr(common));
}

std::string StreamDecoder::flush() {
  const std::string text = tokenizer_->decode(ids_, skip_special_);
  std::string rest = text.size() > prefix_.size() ? fresh_text(text) : std::string();
  reset();
  return rest;
}

}  // namespace kiln::tok
