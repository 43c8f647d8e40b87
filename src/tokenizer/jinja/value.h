// The value model of kiln's Jinja interpreter: Python-like None/undefined, bool, int,
// float, str, list, dict (insertion-ordered) and callables, with Python's str()/repr()
// formatting so rendered chat templates match jinja2 byte for byte.
// Tested in tests/tokenizer/jinja_test.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace kiln::tok::jinja {

class Value;
using ValueList = std::vector<Value>;
using ValueDict = std::vector<std::pair<std::string, Value>>;  // small, ordered

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
  const Value* get(size_t index, std::string_view name) const;
};
using Function = std::function<Value(const Args&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // undefined
  static Value none();
  Value(bool b);                 // NOLINT
  Value(int64_t i);              // NOLINT
  Value(int i) : Value(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double d);               // NOLINT
  Value(std::string s);          // NOLINT
  Value(const char* s) : Value(std::string(s)) {}  // NOLINT
  Value(ValueList list);         // NOLINT
  Value(ValueDict dict);         // NOLINT
  Value(Function fn);            // NOLINT
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_callable() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return b_; }
  int64_t as_int() const;      // ints, bools and floats (truncated)
  double as_double() const;
  const std::string& as_string() const { return *s_; }
  ValueList& list() const { return *list_; }  // shared: lists/dicts are references, as in Python
  ValueDict& dict() const { return *dict_; }
  const Function& function() const { return *fn_; }

  bool truthy() const;
  // Python's str(x) and repr(x).
  std::string str() const;
  std::string repr() const;
  // json.dumps(x, ensure_ascii=False, indent=indent) as transformers' tojson filter.
  std::string to_json(int indent = -1, bool sort_keys = false) const;

  // Attribute / item lookup; undefined when absent.
  Value get_item(const Value& key) const;
  Value get_attr(const std::string& name) const;
  const Value* dict_find(std::string_view key) const;
  void dict_set(const std::string& key, Value v) const;

  bool equals(const Value& o) const;
  // <0, 0, >0; throws kiln::Error for incomparable kinds.
  int compare(const Value& o) const;
  std::string type_name() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<Function> fn_;
};

// Python float repr (shortest round-trip, "1.0", "1e-05").
std::string format_float(double d);

}  // namespace kiln::tok::jinja
