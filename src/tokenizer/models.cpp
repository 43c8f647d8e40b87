// Tokenization models: BPE (HF models/bpe, heap-ordered merges), WordPiece (greedy
// longest match) and llama.cpp's score-driven SentencePiece BPE for GGUF "llama"
// vocabularies. Tested by the golden-id tests and tests/tokenizer/bpe_test.cpp.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <queue>

#include "core/status.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {

bool WordCache::find(std::string_view word, std::vector<int32_t>& out) const {
  auto& shard = shards_[std::hash<std::string_view>{}(word) % kShards];
  std::lock_guard<std::mutex> lock(shard.mu);
  auto it = shard.map.find(std::string(word));
  if (it == shard.map.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void WordCache::insert(std::string_view word, const std::vector<int32_t>& ids) const {
  auto& shard = shards_[std::hash<std::string_view>{}(word) % kShards];
  std::lock_guard<std::mutex> lock(shard.mu);
  // Crude bound on memory: start over when full (HF also caps its cache).
  if (shard.map.size() >= kShardCapacity) shard.map.clear();
  shard.map.emplace(std::string(word), ids);
}

static uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

static void fill_byte_ids(const std::unordered_map<std::string, int32_t>& vocab, int32_t* ids) {
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab.find(name);
    ids[b] = it == vocab.end() ? -1 : it->second;
  }
}

BpeModel::BpeModel(std::unordered_map<std::string, int32_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  merges_.reserve(merges.size());
  const size_t prefix_len = options_.continuing_subword_prefix.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = vocab_.find(a);
    auto ib = vocab_.find(b);
    // With a subword prefix, the merged token drops b's prefix ("##").
    std::string merged = a;
    if (prefix_len && b.compare(0, prefix_len, options_.continuing_subword_prefix) == 0) {
      merged += b.substr(prefix_len);
    } else {
      merged += b;
    }
    auto im = vocab_.find(merged);
    if (ia == vocab_.end() || ib == vocab_.end() || im == vocab_.end()) {
      throw_error(ErrorCode::kInvalidFile, "BPE merge #", rank, " '", a, " ", b,
                  "' uses a token missing from the vocabulary");
    }
    // The first (lowest-rank) occurrence of a pair wins, as in HF.
    merges_.emplace(pair_key(ia->second, ib->second),
                    MergeInfo{static_cast<int32_t>(rank), im->second});
  }
  if (!options_.unk_token.empty()) {
    auto it = vocab_.find(options_.unk_token);
    if (it == vocab_.end()) {
      throw_error(ErrorCode::kInvalidFile, "BPE unk_token '", options_.unk_token,
                  "' is not in the vocabulary");
    }
    unk_id_ = it->second;
  }
  fill_byte_ids(vocab_, byte_ids_);
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (cache_.find(word, out)) return;
  std::vector<int32_t> ids;
  merge_word(word, ids);
  if (word.size() <= 256) cache_.insert(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  // Unknown characters: fused into one unk when fuse_unk, dropped when there is no unk.
  bool last_was_unk = false;
  auto push = [&](int32_t id) {
    const int32_t n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, true});
  };
  std::string piece;
  size_t i = 0;
  while (i < word.size()) {
    char32_t cp;
    size_t n = utf8_decode(word, i, &cp);
    if (n == 0) n = 1;  // callers pass valid UTF-8; stay total regardless
    const bool first = i == 0;
    const bool last = i + n == word.size();
    piece.clear();
    if (!first) piece += options_.continuing_subword_prefix;
    piece.append(word.substr(i, n));
    if (last) piece += options_.end_of_word_suffix;
    i += n;
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      push(it->second);
      last_was_unk = false;
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (size_t k = i - n; k < i; ++k) {
        all = all && byte_ids_[static_cast<unsigned char>(word[k])] >= 0;
      }
      if (all) {
        for (size_t k = i - n; k < i; ++k) push(byte_ids_[static_cast<unsigned char>(word[k])]);
        last_was_unk = false;
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (!(options_.fuse_unk && last_was_unk)) push(unk_id_);
      last_was_unk = true;
    }
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int32_t left) {
    const int32_t right = symbols[static_cast<size_t>(left)].next;
    if (right < 0) return;
    auto it = merges_.find(pair_key(symbols[static_cast<size_t>(left)].id,
                                    symbols[static_cast<size_t>(right)].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.new_id});
  };
  for (int32_t k = 0; k + 1 < static_cast<int32_t>(symbols.size()); ++k) consider(k);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    // Skip stale entries: the pair at this position changed since it was queued.
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (const auto& s : symbols) {
    if (s.alive) out.push_back(s.id);
  }
}

WordPieceModel::WordPieceModel(std::unordered_map<std::string, int32_t> vocab,
                               std::string unk_token, std::string prefix,
                               size_t max_input_chars_per_word)
    : vocab_(std::move(vocab)), prefix_(std::move(prefix)), max_chars_(max_input_chars_per_word) {
  auto it = vocab_.find(unk_token);
  if (it == vocab_.end()) {
    throw_error(ErrorCode::kInvalidFile, "WordPiece unk_token '", unk_token,
                "' is not in the vocabulary");
  }
  unk_id_ = it->second;
}

void WordPieceModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  // Character boundaries, so substrings never cut a UTF-8 sequence.
  std::vector<size_t> bounds;
  size_t i = 0;
  while (i < word.size()) {
    bounds.push_back(i);
    char32_t cp;
    i += std::max<size_t>(1, utf8_decode(word, i, &cp));
  }
  bounds.push_back(word.size());
  const size_t nchars = bounds.size() - 1;
  if (nchars > max_chars_) {
    out.push_back(unk_id_);
    return;
  }
  const size_t mark = out.size();
  std::string candidate;
  size_t start = 0;
  while (start < nchars) {
    size_t end = nchars;
    int32_t found = -1;
    while (start < end) {
      candidate.clear();
      if (start > 0) candidate += prefix_;
      candidate.append(word.substr(bounds[start], bounds[end] - bounds[start]));
      auto it = vocab_.find(candidate);
      if (it != vocab_.end()) {
        found = it->second;
        break;
      }
      --end;
    }
    if (found < 0) {  // the whole word becomes [UNK]
      out.resize(mark);
      out.push_back(unk_id_);
      return;
    }
    out.push_back(found);
    start = end;
  }
}

SpmScoreModel::SpmScoreModel(const std::vector<std::string>& tokens,
                             const std::vector<float>& scores, int32_t unk_id)
    : scores_(scores), unk_id_(unk_id) {
  for (size_t i = 0; i < tokens.size(); ++i) vocab_.emplace(tokens[i], static_cast<int32_t>(i));
  scores_.resize(tokens.size(), 0.0f);
  fill_byte_ids(vocab_, byte_ids_);
}

void SpmScoreModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  // Symbols start as single characters; repeatedly merge the adjacent pair whose
  // concatenation is a token with the highest score (ties: leftmost), as llama.cpp.
  struct Symbol {
    size_t begin, len;
    int32_t prev, next;
  };
  std::vector<Symbol> symbols;
  size_t i = 0;
  while (i < word.size()) {
    char32_t cp;
    const size_t n = std::max<size_t>(1, utf8_decode(word, i, &cp));
    const int32_t k = static_cast<int32_t>(symbols.size());
    symbols.push_back({i, std::min(n, word.size() - i), k - 1, k + 1});
    i += n;
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  struct Bigram {
    float score;
    int32_t left;
    size_t size;
    bool operator<(const Bigram& o) const {
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<Bigram> queue;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[static_cast<size_t>(left)].next;
    if (right < 0) return;
    const auto& l = symbols[static_cast<size_t>(left)];
    const auto& r = symbols[static_cast<size_t>(right)];
    auto it = vocab_.find(std::string(word.substr(l.begin, l.len + r.len)));
    if (it == vocab_.end()) return;
    queue.push({scores_[static_cast<size_t>(it->second)], left, l.len + r.len});
  };
  for (int32_t k = 0; k + 1 < static_cast<int32_t>(symbols.size()); ++k) consider(k);
  while (!queue.empty()) {
    const Bigram top = queue.top();
    queue.pop();
    auto& l = symbols[static_cast<size_t>(top.left)];
    if (l.len == 0 || l.next < 0) continue;
    auto& r = symbols[static_cast<size_t>(l.next)];
    if (l.len + r.len != top.size) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<size_t>(r.next)].prev = top.left;
    consider(l.prev);
    consider(top.left);
  }
  for (int32_t k = 0; k >= 0; k = symbols[static_cast<size_t>(k)].next) {
    const auto& s = symbols[static_cast<size_t>(k)];
    auto it = vocab_.find(std::string(word.substr(s.begin, s.len)));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      continue;
    }
    for (size_t b = s.begin; b < s.begin + s.len; ++b) {
      const int32_t id = byte_ids_[static_cast<unsigned char>(word[b])];
      if (id >= 0) {
        out.push_back(id);
      } else if (unk_id_ >= 0) {
        out.push_back(unk_id_);
      }
    }
  }
}

}  // namespace kiln::tok
