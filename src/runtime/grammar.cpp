// The parse-stack engine and the token masks (see grammar.h); the GBNF compiler is in
// grammar_gbnf.cpp, the JSON Schema one in json_schema.cpp. Tested in
// tests/runtime/grammar_test.cpp.
//
// A state is a set of stacks of positions. Advancing by a byte keeps the stacks whose top byte
// set holds it, moves past it and normalizes: at the end of an alternative pop to the caller's
// return position, at a rule reference expand into each alternative. A reference that ends its
// alternative pushes no return position (tail call), so right-recursive repetition keeps
// stacks bounded. Frames live in an append-only arena and stacks share their bottoms, so a
// step copies nothing; GrammarState renumbers the arena canonically after each accept(), and
// the token mask walks the vocabulary's trie with the arena as a stack allocator.
#include "runtime/grammar.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <tuple>

#include "core/status.h"
#include "runtime/grammar_internal.h"

namespace kiln {
namespace grammar_detail {

CpRanges cp_normalize(CpRanges r) {
  std::sort(r.begin(), r.end());
  CpRanges out;
  for (auto [a, b] : r) {
    if (!out.empty() && a <= out.back().second + 1) out.back().second = std::max(out.back().second, b);
    else out.push_back({a, b});
  }
  return out;
}

CpRanges cp_complement(const CpRanges& r) {
  CpRanges out;
  char32_t next = 0;
  for (auto [a, b] : r) {
    if (a > next) out.push_back({next, a - 1});
    next = b + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

}  // namespace grammar_detail

namespace {

using grammar_detail::Frame;
using grammar_detail::Head;

// A bound on the work of one byte's step.
constexpr int64_t kMaxStepWork = int64_t(1) << 20;

uint64_t hash_mix(uint64_t a, uint64_t b) {
  uint64_t x = (a ^ 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull + b;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 29);
}
constexpr uint64_t kBottomHash = 0x2545F4914F6CDD1Dull;

}  // namespace

std::string Grammar::dump() const {
  auto byte = [](int b) {
    if (b > 0x20 && b < 0x7F && std::string_view("\\]-^\"").find(char(b)) == std::string_view::npos)
      return std::string(1, char(b));
    static const char* kHex = "0123456789ABCDEF";
    return std::string("\\x") + kHex[b >> 4] + kHex[b & 15];
  };
  std::string out;
  for (size_t r = 0; r < rule_names_.size(); ++r) {
    out += rule_names_[r] + " ::=";
    const auto alts = alternatives(int32_t(r));
    for (size_t a = 0; a < alts.size(); ++a) {
      if (a > 0) out += " |";
      if (element(alts[a]) == kEnd) out += " \"\"";
      for (int32_t pos = alts[a]; element(pos) != kEnd; ++pos) {
        const int32_t e = element(pos);
        if (is_rule(e)) {
          out += " " + rule_names_[size_t(rule_of(e))];
          continue;
        }
        out += " [";
        const ByteSet& s = sets_[size_t(e)];
        for (int b = 0; b < 256;) {
          if (!byte_set_has(s, uint8_t(b))) {
            ++b;
            continue;
          }
          int c = b;
          while (c + 1 < 256 && byte_set_has(s, uint8_t(c + 1))) ++c;
          out += byte(b);
          if (c > b) out.append("-").append(byte(c));
          b = c + 1;
        }
        out += "]";
      }
    }
    out += "\n";
  }
  return out;
}

namespace {

// Advances stacks by one byte within one grammar; frames go to an arena the caller owns.
class Stepper {
 public:
  Stepper(const Grammar& g, std::vector<Frame>& frames) : g_(g), frames_(frames) {}

  // The stacks a document starts in; false when there are too many.
  bool start(std::vector<Head>& out, bool& complete) {
    begin(out);
    for (int32_t alt : g_.alternatives(g_.root())) {
      expand(alt, -1);
      if (failed_) break;
    }
    complete = complete_;
    return !failed_;
  }

  // Expansion steps over every step() and start() so far (GrammarTokenMask's budget).
  int64_t total_work() const { return total_work_ + work_; }
  // The deepest frame any call reached so far.
  int32_t max_depth() const { return max_depth_; }

  // `in` advanced past byte b; false when that makes too many stacks or too much work.
  bool step(std::span<const Head> in, uint8_t b, std::vector<Head>& out, bool& complete) {
    begin(out);
    for (const Head& h : in) {
      if (!byte_set_has(g_.byte_set(g_.element(h.pos)), b)) continue;
      expand(h.pos + 1, h.frame);
      if (failed_) break;
    }
    complete = complete_;
    return !failed_;
  }

 private:
  static constexpr size_t kLinear = 16;  // stack sets up to this size are deduplicated by a scan
  static constexpr size_t kTable = 4 * GrammarState::kMaxStacks;

  void begin(std::vector<Head>& out) {
    out.clear();
    out_ = &out;
    complete_ = failed_ = false;
    total_work_ += work_;
    work_ = 0;
    indexed_ = false;
  }

  uint64_t frame_hash(int32_t f) const { return f < 0 ? kBottomHash : frames_[size_t(f)].hash; }

  // Normalizes the stack (pos, frame): follows ends and references to byte-set tops. The
  // alternatives still to follow wait in todo_, not on the call stack: a chain of rules that
  // match nothing (("" | "a"){0,60000}) nests as deep as it is long.
  void expand(int32_t pos, int32_t frame) {
    todo_.clear();
    for (;;) {
      if (++work_ > kMaxStepWork) {
        failed_ = true;
        return;
      }
      const int32_t e = g_.element(pos);
      if (e == Grammar::kEnd && frame >= 0) {
        pos = frames_[size_t(frame)].ret;
        frame = frames_[size_t(frame)].parent;
        continue;
      }
      if (Grammar::is_rule(e)) {
        int32_t callee = frame;
        bool dropped = false;
        if (g_.element(pos + 1) != Grammar::kEnd) {  // else a tail call: nothing to return to
          const int32_t depth = frame < 0 ? 1 : frames_[size_t(frame)].depth + 1;
          dropped = depth > GrammarState::kMaxDepth;  // too deep: this path is dropped
          max_depth_ = std::max(max_depth_, depth);
          if (!dropped) {
            frames_.push_back({pos + 1, frame, depth, hash_mix(frame_hash(frame), uint64_t(pos + 1))});
            callee = int32_t(frames_.size() - 1);
          }
        }
        if (!dropped) {
          const auto alts = g_.alternatives(Grammar::rule_of(e));
          for (size_t i = alts.size() - 1; i > 0; --i) todo_.push_back({alts[i], callee});
          // Each waiting alternative costs work: past the bound the step fails anyway.
          if (work_ + int64_t(todo_.size()) > kMaxStepWork) {
            failed_ = true;
            return;
          }
          pos = alts[0];
          frame = callee;
          continue;
        }
      } else if (e >= 0) {
        add(pos, frame);
        if (failed_) return;
      } else {
        complete_ = true;  // the end of the root
      }
      if (todo_.empty()) return;
      std::tie(pos, frame) = todo_.back();
      todo_.pop_back();
    }
  }

  bool same_chain(int32_t a, int32_t b) const {
    while (a != b) {
      if (a < 0 || b < 0) return false;
      const Frame& x = frames_[size_t(a)];
      const Frame& y = frames_[size_t(b)];
      if (x.hash != y.hash || x.ret != y.ret) return false;
      a = x.parent;
      b = y.parent;
    }
    return true;
  }

  // Adds a stack unless an equal one is there.
  void add(int32_t pos, int32_t frame) {
    std::vector<Head>& out = *out_;
    const uint64_t h = hash_mix(frame_hash(frame) ^ 0x5851F42D4C957F2Dull, uint64_t(pos));
    auto same = [&](const Head& o) { return o.hash == h && o.pos == pos && same_chain(o.frame, frame); };
    if (out.size() < kLinear) {
      for (const Head& o : out)
        if (same(o)) return;
    } else {
      if (!indexed_) {  // past kLinear stacks: an open-addressing table of indices + 1
        table_.assign(kTable, 0);
        for (size_t i = 0; i < out.size(); ++i) insert(out[i].hash, int32_t(i));
        indexed_ = true;
      }
      for (size_t slot = h & (kTable - 1); table_[slot] != 0; slot = (slot + 1) & (kTable - 1))
        if (same(out[size_t(table_[slot] - 1)])) return;
    }
    if (out.size() >= GrammarState::kMaxStacks) {
      failed_ = true;
      return;
    }
    out.push_back({pos, frame, h});
    if (indexed_) insert(h, int32_t(out.size() - 1));
  }

  void insert(uint64_t h, int32_t index) {
    size_t slot = h & (kTable - 1);
    while (table_[slot] != 0) slot = (slot + 1) & (kTable - 1);
    table_[slot] = index + 1;
  }

  const Grammar& g_;
  std::vector<Frame>& frames_;
  std::vector<Head>* out_ = nullptr;
  bool complete_ = false;
  bool failed_ = false;
  bool indexed_ = false;
  int64_t work_ = 0;
  int64_t total_work_ = 0;  // of the steps before the current one
  int32_t max_depth_ = 0;   // the deepest frame a call reached
  std::vector<int32_t> table_;
  std::vector<std::pair<int32_t, int32_t>> todo_;  // (pos, frame) of alternatives to follow
};

// Past this many frames accept() compacts the arena mid-string (garbage of earlier bytes).
constexpr size_t kCompactFrames = 1 << 16;

}  // namespace

GrammarState::GrammarState(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  KILN_CHECK(grammar_ != nullptr, "GrammarState needs a grammar");
  Stepper stepper(*grammar_, frames_);
  if (!stepper.start(heads_, complete_)) heads_.clear();  // a pathological start accepts nothing
  canonicalize();
}

bool GrammarState::accept(std::string_view bytes) {
  Stepper stepper(*grammar_, frames_);
  std::vector<Head> next;
  bool ok = true;
  for (char c : bytes) {
    bool complete = false;
    if (heads_.empty() || !stepper.step(heads_, uint8_t(c), next, complete) || (next.empty() && !complete)) {
      ok = false;
      break;
    }
    heads_.swap(next);
    complete_ = complete;
    if (frames_.size() > kCompactFrames) canonicalize();
  }
  canonicalize();
  return ok;
}

// Keeps the frames the stacks reach, renumbered depth by depth in order of (parent, return
// position), so equal sets of stacks have equal arrays whatever path led to them.
void GrammarState::canonicalize() {
  std::vector<int32_t> remap(frames_.size(), -2);
  std::vector<int32_t> order;
  for (const Head& h : heads_)
    for (int32_t f = h.frame; f >= 0 && remap[size_t(f)] == -2; f = frames_[size_t(f)].parent) {
      remap[size_t(f)] = -1;
      order.push_back(f);
    }
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return frames_[size_t(a)].depth < frames_[size_t(b)].depth; });
  std::vector<Frame> out;
  out.reserve(order.size());
  std::vector<std::tuple<int32_t, int32_t, int32_t>> level;  // (new parent, ret, old id)
  for (size_t i = 0; i < order.size();) {
    const int32_t depth = frames_[size_t(order[i])].depth;
    level.clear();
    for (; i < order.size() && frames_[size_t(order[i])].depth == depth; ++i) {
      const Frame& f = frames_[size_t(order[i])];
      level.emplace_back(f.parent < 0 ? -1 : remap[size_t(f.parent)], f.ret, order[i]);
    }
    std::sort(level.begin(), level.end());
    for (size_t k = 0; k < level.size(); ++k) {
      auto [parent, ret, old] = level[k];
      if (k == 0 || std::get<0>(level[k - 1]) != parent || std::get<1>(level[k - 1]) != ret)
        out.push_back({ret, parent, depth, frames_[size_t(old)].hash});
      remap[size_t(old)] = int32_t(out.size() - 1);
    }
  }
  for (Head& h : heads_)
    if (h.frame >= 0) h.frame = remap[size_t(h.frame)];
  std::sort(heads_.begin(), heads_.end(),
            [](const Head& a, const Head& b) { return std::tie(a.pos, a.frame) < std::tie(b.pos, b.frame); });
  heads_.erase(std::unique(heads_.begin(), heads_.end(),
                           [](const Head& a, const Head& b) { return a.pos == b.pos && a.frame == b.frame; }),
               heads_.end());
  frames_ = std::move(out);
}

std::string GrammarState::key() const {
  std::string k(1 + 4 + 8 * (heads_.size() + frames_.size()), '\0');
  char* p = k.data();
  *p++ = char(complete_);
  const uint32_t n = uint32_t(heads_.size());
  std::memcpy(p, &n, 4);
  p += 4;
  for (const Head& h : heads_) {
    std::memcpy(p, &h.pos, 4);
    std::memcpy(p + 4, &h.frame, 4);
    p += 8;
  }
  for (const Frame& f : frames_) {
    std::memcpy(p, &f.ret, 4);
    std::memcpy(p + 4, &f.parent, 4);
    p += 8;
  }
  return k;
}

TokenTrie::TokenTrie(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {
  KILN_THROW_IF(pieces_.size() > size_t(std::numeric_limits<int32_t>::max()), kInvalidArgument,
                "a vocabulary of ", pieces_.size(), " tokens is too large for a token trie");
  std::vector<int32_t> order;
  for (size_t id = 0; id < pieces_.size(); ++id)
    if (!pieces_[id].empty()) order.push_back(int32_t(id));
  // char_traits<char> compares as unsigned char, so this is byte order.
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return pieces_[size_t(a)] < pieces_[size_t(b)]; });
  nodes_.push_back({0, 0, 0, 0});
  std::vector<int32_t> path = {0};  // the node at each depth of the previous piece
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& p = pieces_[size_t(id)];
    size_t common = 0;
    if (prev)
      while (common < p.size() && common < prev->size() && p[common] == (*prev)[common]) ++common;
    for (; path.size() > common + 1; path.pop_back()) nodes_[size_t(path.back())].end = int32_t(nodes_.size());
    for (size_t d = common; d < p.size(); ++d) {
      nodes_.push_back({0, 0, 0, uint8_t(p[d])});
      path.push_back(int32_t(nodes_.size() - 1));
    }
    Node& n = nodes_[size_t(path.back())];
    if (n.tokens_begin == n.tokens_end) n.tokens_begin = n.tokens_end = int32_t(ids_.size());
    ids_.push_back(id);
    n.tokens_end = int32_t(ids_.size());
    prev = &p;
  }
  for (; !path.empty(); path.pop_back()) nodes_[size_t(path.back())].end = int32_t(nodes_.size());
}

const std::string& TokenTrie::piece(int32_t id) const {
  static const std::string kNone;
  return id >= 0 && size_t(id) < pieces_.size() ? pieces_[size_t(id)] : kNone;
}

GrammarTokenMask::GrammarTokenMask(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> vocab,
                                   size_t max_cache_bytes)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  KILN_CHECK(grammar_ && vocab_, "GrammarTokenMask needs a grammar and a vocabulary");
  const size_t set_bytes = (vocab_->vocab_size() + 63) / 64 * 8 + 256;  // + key and bookkeeping
  max_states_ = std::max<size_t>(1, max_cache_bytes / set_bytes);
}

// A depth-first walk of the trie carrying the stacks: a token's shared prefixes are advanced
// once, and a subtree is skipped as soon as no stack takes its byte.
std::vector<uint64_t> GrammarTokenMask::allowed(const GrammarState& state) const {
  std::vector<uint64_t> bits;
  if (!split_walk(state, bits))
    throw_error(ErrorCode::kInvalidArgument, "the grammar's token mask took more than ", kMaxMaskWork,
                " parse-stack steps (too ambiguous)");
  return bits;
}

// A depth-first walk of the trie below `node`, carrying the stacks (`heads` at `node`): a
// token's shared prefixes are advanced once, and a subtree is skipped as soon as no stack
// takes its byte. Sets the bits of the tokens some stack takes whole. With `touched`, a byte
// after which some stack ended its bottom rule (complete: what comes next is below the cut)
// is not followed: its node and byte path go into `touched` instead. False past the budget.
namespace {

// A trie node whose subtree a cut state could not decide, and the bytes leading to it.
struct Touched {
  int32_t node;
  std::string path;
};

bool dfs(const Grammar& grammar, const TokenTrie& vocab, Stepper& stepper, std::vector<Frame>& frames,
         std::vector<Head> heads, int32_t node, std::vector<uint64_t>& bits, std::vector<Touched>* touched) {
  const auto nodes = vocab.nodes();
  const auto ids = vocab.ids();
  const Grammar* grammar_ = &grammar;
  struct Level {
    std::vector<Head> heads;
    ByteSet next{};  // the bytes some stack takes
    int32_t node = 0;
    int32_t child = 0;
    size_t mark = 0;  // the arena's size before this level's step
  };
  auto next_bytes = [&](Level& l) {
    l.next = {};
    for (const Head& h : l.heads) {
      const ByteSet& s = grammar_->byte_set(grammar_->element(h.pos));
      for (size_t w = 0; w < 4; ++w) l.next[w] |= s[w];
    }
  };
  std::vector<Level> levels(1);
  levels[0].heads = std::move(heads);
  levels[0].node = node;
  levels[0].child = node + 1;
  next_bytes(levels[0]);
  std::string path;  // the bytes from `node` to the current level (touched paths)
  size_t d = 0;
  for (;;) {
    if (levels[d].child >= nodes[size_t(levels[d].node)].end) {
      if (d == 0) break;
      frames.resize(levels[d].mark);
      if (touched) path.pop_back();
      --d;
      continue;
    }
    const int32_t c = levels[d].child;
    const TokenTrie::Node& n = nodes[size_t(c)];
    levels[d].child = n.end;
    if (!byte_set_has(levels[d].next, n.byte)) continue;
    if (stepper.total_work() > GrammarTokenMask::kMaxMaskWork) return false;
    if (levels.size() == d + 1) levels.emplace_back();
    Level& up = levels[d];
    Level& down = levels[d + 1];
    down.mark = frames.size();
    bool complete = false;
    const bool stepped = stepper.step(up.heads, n.byte, down.heads, complete);
    if (touched && (!stepped || complete)) {  // the cut state cannot decide this subtree
      touched->push_back({c, path + char(n.byte)});
      frames.resize(down.mark);
      continue;
    }
    if (!stepped || (down.heads.empty() && !complete)) {
      frames.resize(down.mark);
      continue;
    }
    for (int32_t t = n.tokens_begin; t < n.tokens_end; ++t) {
      const auto id = size_t(ids[size_t(t)]);
      bits[id / 64] |= uint64_t(1) << (id % 64);
    }
    if (down.heads.empty() || c + 1 == n.end) {
      frames.resize(down.mark);
      continue;
    }
    down.node = c;
    down.child = c + 1;
    next_bytes(down);
    if (touched) path += char(n.byte);
    ++d;
  }
  return true;
}

}  // namespace

// What a state cut above its stacks' common frame takes (GrammarTokenMask::split_walk).
struct GrammarTokenMask::Cut {
  std::vector<uint64_t> bits;    // tokens taken without finishing the cut
  std::vector<Touched> touched;  // where a stack finished it: up to the whole state
  int32_t depth = 0;             // the deepest frame the walk met, counted from the cut
};

bool GrammarTokenMask::walk(const GrammarState& state, std::vector<uint64_t>& bits) const {
  KILN_CHECK(&state.grammar() == grammar_.get(), "a GrammarState of another grammar");
  bits.assign((vocab_->vocab_size() + 63) / 64, 0);
  if (state.heads_.empty()) return true;
  std::vector<Frame> frames = state.frames_;
  Stepper stepper(*grammar_, frames);
  return dfs(*grammar_, *vocab_, stepper, frames, state.heads_, 0, bits, nullptr);
}

// A state's stacks all stand on one frame F (their lowest common frame) inside a JSON string,
// a number, a key - most of a document's states - and it differs from the states at the same
// positions elsewhere in the document only from F down. So its walk is split: the state cut
// at F (F and what is below it replaced by the bottom, depths counted from F, keyed by what is
// above F) is walked once and remembered - the tokens it takes without any stack finishing
// the cut, which the whole state takes alike, and the trie nodes where a stack finished it -
// and only those nodes' subtrees are walked from the whole state. Stacks, their merging and
// the work budget map one to one between the two (the frames above F re-hashed from the
// bottom as the stepper hashes them), so the set is the whole walk's, bit for bit; the
// token-mask tests and the fuzz target check it against trying every piece.
bool GrammarTokenMask::split_walk(const GrammarState& state, std::vector<uint64_t>& bits) const {
  KILN_CHECK(&state.grammar() == grammar_.get(), "a GrammarState of another grammar");
  const auto& heads = state.heads_;
  const auto& fr = state.frames_;
  auto depth = [&](int32_t f) { return f < 0 ? 0 : fr[size_t(f)].depth; };
  int32_t lca = heads.empty() ? -1 : heads[0].frame;
  for (const Head& h : heads) {
    int32_t a = lca, b = h.frame;
    while (a != b && a >= 0 && b >= 0) {
      const int32_t da = depth(a), db = depth(b);
      if (da >= db) a = fr[size_t(a)].parent;
      if (db >= da) b = fr[size_t(b)].parent;
    }
    lca = a == b ? a : -1;
    if (lca < 0) break;
  }
  if (lca < 0) return walk(state, bits);
  const int32_t base = depth(lca);
  // The cut: the frames above the common one, re-hashed from the bottom as the stepper hashes.
  GrammarState cut_state = state;
  cut_state.complete_ = false;
  cut_state.frames_.clear();
  cut_state.heads_.clear();
  std::vector<int32_t> moved(fr.size(), -2);
  std::function<int32_t(int32_t)> move = [&](int32_t f) -> int32_t {
    if (f == lca) return -1;
    if (moved[size_t(f)] != -2) return moved[size_t(f)];
    const int32_t parent = move(fr[size_t(f)].parent);
    const uint64_t below = parent < 0 ? kBottomHash : cut_state.frames_[size_t(parent)].hash;
    cut_state.frames_.push_back(
        {fr[size_t(f)].ret, parent, fr[size_t(f)].depth - base, hash_mix(below, uint64_t(fr[size_t(f)].ret))});
    return moved[size_t(f)] = int32_t(cut_state.frames_.size() - 1);
  };
  for (const Head& h : heads) {
    const int32_t f = move(h.frame);
    const uint64_t below = f < 0 ? kBottomHash : cut_state.frames_[size_t(f)].hash;
    cut_state.heads_.push_back({h.pos, f, hash_mix(below ^ 0x5851F42D4C957F2Dull, uint64_t(h.pos))});
  }
  cut_state.canonicalize();
  const std::string key = "T" + cut_state.key();
  std::shared_ptr<const Cut> cut;
  {
    std::lock_guard lk(mu_);
    if (auto it = cuts_.find(key); it != cuts_.end()) cut = it->second;
  }
  int64_t spent = 0;
  if (!cut) {
    auto fresh = std::make_shared<Cut>();
    fresh->bits.assign((vocab_->vocab_size() + 63) / 64, 0);
    std::vector<Frame> frames = cut_state.frames_;
    Stepper stepper(*grammar_, frames);
    if (!dfs(*grammar_, *vocab_, stepper, frames, cut_state.heads_, 0, fresh->bits, &fresh->touched)) return false;
    spent = stepper.total_work();
    fresh->depth = stepper.max_depth();
    for (const Frame& f : cut_state.frames_) fresh->depth = std::max(fresh->depth, f.depth);
    cut = fresh;
    std::lock_guard lk(mu_);
    // A cut holds a set and its touched paths (tens of KB): a grammar has few distinct ones.
    if (cuts_.size() >= kMaxCuts) cuts_.clear();
    cuts_.emplace(key, cut);
  }
  // Depths count from the cut: at this state's depth a path the cut's walk kept could be
  // too deep (GrammarState::kMaxDepth), and only the whole walk says what is dropped then.
  if (cut->depth + base > GrammarState::kMaxDepth) return walk(state, bits);
  bits = cut->bits;
  // The touched subtrees from the whole state: along the node's path, then below it.
  const auto nodes = vocab_->nodes();
  const auto ids = vocab_->ids();
  std::vector<Frame> frames = state.frames_;
  Stepper stepper(*grammar_, frames);
  std::vector<Head> at, next;
  for (const Touched& t : cut->touched) {
    const size_t mark = frames.size();
    at = heads;
    bool ok = true, complete = false;
    for (char b : t.path) {
      if (!stepper.step(at, uint8_t(b), next, complete) || (next.empty() && !complete)) {
        ok = false;
        break;
      }
      at.swap(next);
    }
    if (ok) {
      const TokenTrie::Node& n = nodes[size_t(t.node)];
      for (int32_t k = n.tokens_begin; k < n.tokens_end; ++k) {
        const auto id = size_t(ids[size_t(k)]);
        bits[id / 64] |= uint64_t(1) << (id % 64);
      }
      if (!at.empty() && t.node + 1 < n.end && !dfs(*grammar_, *vocab_, stepper, frames, at, t.node, bits, nullptr))
        return false;
    }
    frames.resize(mark);
    if (spent + stepper.total_work() > kMaxMaskWork) return false;
  }
  return true;
}

int64_t GrammarTokenMask::apply(const GrammarState& state, std::span<float> logits, std::span<const int32_t> ends) {
  const std::string key = state.key();
  Bits bits;
  {
    std::lock_guard lk(mu_);
    if (auto it = sets_.find(key); it != sets_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      bits = it->second->second;
    }
  }
  if (!bits) {
    std::vector<uint64_t> set;
    if (!split_walk(state, set)) return -1;
    bits = std::make_shared<const std::vector<uint64_t>>(std::move(set));
    std::lock_guard lk(mu_);
    if (!sets_.count(key)) {
      lru_.emplace_front(key, bits);
      sets_[key] = lru_.begin();
      for (; sets_.size() > max_states_; lru_.pop_back()) sets_.erase(lru_.back().first);
    }
  }
  std::vector<std::pair<int32_t, float>> kept_ends;
  if (state.complete())
    for (int32_t id : ends)
      if (id >= 0 && size_t(id) < logits.size()) kept_ends.emplace_back(id, logits[size_t(id)]);
  // A word of 64 tokens at a time: inside a string nearly all are allowed, at structural
  // positions nearly none, so most words are all ones or all zeros.
  constexpr float kOff = -std::numeric_limits<float>::infinity();
  const size_t n = std::min(vocab_->vocab_size(), logits.size());
  int64_t kept = 0;
  for (size_t base = 0; base < n; base += 64) {
    const size_t len = std::min<size_t>(64, n - base);
    uint64_t w = (*bits)[base / 64];
    if (len < 64) w &= (uint64_t(1) << len) - 1;
    kept += std::popcount(w);
    if (w == (len == 64 ? ~uint64_t(0) : (uint64_t(1) << len) - 1)) continue;
    float* x = logits.data() + base;
    if (w == 0) {
      std::fill(x, x + len, kOff);
      continue;
    }
    for (size_t i = 0; i < len; ++i)
      if (!(w >> i & 1)) x[i] = kOff;
  }
  std::fill(logits.begin() + std::ptrdiff_t(n), logits.end(), kOff);  // ids past the vocabulary
  for (auto [id, x] : kept_ends) {
    kept += std::isinf(logits[size_t(id)]) && x != kOff;
    logits[size_t(id)] = x;
  }
  return kept;
}

size_t GrammarTokenMask::cached_states() const {
  std::lock_guard lk(mu_);
  return sets_.size();
}

}  // namespace kiln
