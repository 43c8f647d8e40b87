// Jinja values with Python semantics for truthiness, equality, ordering, str(),
// repr() and json.dumps. Tested in tests/tokenizer/jinja_test.cpp.
#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/status.h"
#include "tokenizer/unicode.h"

namespace kiln::tok::jinja {

const Value* Args::get(size_t index, std::string_view name) const {
  for (const auto& [k, v] : named) {
    if (k == name) return &v;
  }
  return index < positional.size() ? &positional[index] : nullptr;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::kInt), i_(i) {}
Value::Value(double d) : kind_(Kind::kFloat), d_(d) {}
Value::Value(std::string s) : kind_(Kind::kString), s_(std::make_shared<const std::string>(std::move(s))) {}
Value::Value(ValueList list) : kind_(Kind::kList), list_(std::make_shared<ValueList>(std::move(list))) {}
Value::Value(ValueDict dict) : kind_(Kind::kDict), dict_(std::make_shared<ValueDict>(std::move(dict))) {}
Value::Value(Function fn) : kind_(Kind::kFunction), fn_(std::make_shared<Function>(std::move(fn))) {}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList l;
      for (const auto& e : j) l.push_back(from_json(e));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), from_json(it.value()));
      return Value(std::move(d));
    }
    default: return Value();
  }
}

int64_t Value::as_int() const {
  if (kind_ == Kind::kInt) return i_;
  if (kind_ == Kind::kBool) return b_ ? 1 : 0;
  if (kind_ == Kind::kFloat) return static_cast<int64_t>(d_);
  throw_error(ErrorCode::kInvalidArgument, "chat template: expected a number, got ", type_name());
}

double Value::as_double() const {
  if (kind_ == Kind::kFloat) return d_;
  return static_cast<double>(as_int());
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return d_ != 0;
    case Kind::kString: return !s_->empty();
    case Kind::kList: return !list_->empty();
    case Kind::kDict: return !dict_->empty();
    case Kind::kFunction: return true;
  }
  return false;
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's repr layout: fixed notation when the
  // decimal exponent is in [-4, 16), else d.ddde+XX.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  std::string out;
  if (s[0] == '-') {
    out = "-";
    s.erase(0, 1);
  }
  const size_t e = s.find('e');
  const int exp10 = std::stoi(s.substr(e + 1));
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 >= 0) {
      const size_t int_len = static_cast<size_t>(exp10) + 1;
      if (digits.size() <= int_len) {
        out += digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    } else {
      out += "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char eb[16];
  std::snprintf(eb, sizeof(eb), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out + eb;
}

static std::string py_quote(const std::string& s) {
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = use_double ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_to_cps(s)) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<char32_t>(q)) {
      out += '\\';
      out += q;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else {
      utf8_append(out, c);
    }
  }
  out += q;
  return out;
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kString: return *s_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return b_ ? "True" : "False";
    case Kind::kInt: return std::to_string(i_);
    case Kind::kFloat: return format_float(d_);
    case Kind::kString: return py_quote(*s_);
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].repr();
      }
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < dict_->size(); ++i) {
        if (i) out += ", ";
        out += py_quote((*dict_)[i].first) + ": " + (*dict_)[i].second.repr();
      }
      return out + "}";
    }
    case Kind::kFunction: return "<function>";
  }
  return "";
}

static std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

static void to_json_rec(const Value& v, int indent, bool sort_keys, int depth, std::string& out) {
  const std::string nl = indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * (depth + 1)), ' ') : "";
  const std::string nl_end = indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * depth), ' ') : "";
  const std::string sep = indent >= 0 ? "," : ", ";
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : format_float(d);
      return;
    }
    case Value::Kind::kString: out += json_quote(v.as_string()); return;
    case Value::Kind::kList: {
      if (v.list().empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i) out += sep;
        out += nl;
        to_json_rec(v.list()[i], indent, sort_keys, depth + 1, out);
      }
      out += nl_end + "]";
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict().empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict()) items.push_back(&kv);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += "{";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += sep;
        out += nl + json_quote(items[i]->first) + ": ";
        to_json_rec(items[i]->second, indent, sort_keys, depth + 1, out);
      }
      out += nl_end + "}";
      return;
    }
    case Value::Kind::kFunction:
      throw_error(ErrorCode::kInvalidArgument, "chat template: tojson cannot serialize a function");
  }
}

std::string Value::to_json(int indent, bool sort_keys) const {
  std::string out;
  to_json_rec(*this, indent, sort_keys, 0, out);
  return out;
}

const Value* Value::dict_find(std::string_view key) const {
  if (kind_ != Kind::kDict) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Value::dict_set(const std::string& key, Value v) const {
  for (auto& [k, old] : *dict_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  dict_->emplace_back(key, std::move(v));
}

Value Value::get_item(const Value& key) const {
  if (kind_ == Kind::kDict) {
    if (key.is_string()) {
      const Value* v = dict_find(key.as_string());
      return v ? *v : Value();
    }
    if (key.is_number() || key.kind() == Kind::kBool || key.is_none()) {
      const std::string k = key.str();
      const Value* v = dict_find(k);
      return v ? *v : Value();
    }
    return Value();
  }
  if ((kind_ == Kind::kList || kind_ == Kind::kString) && (key.kind() == Kind::kInt || key.kind() == Kind::kBool)) {
    int64_t i = key.as_int();
    if (kind_ == Kind::kList) {
      const auto n = static_cast<int64_t>(list_->size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      return (*list_)[static_cast<size_t>(i)];
    }
    const auto cps = utf8_to_cps(*s_);
    const auto n = static_cast<int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();
    return Value(utf8_encode(cps[static_cast<size_t>(i)]));
  }
  return Value();
}

Value Value::get_attr(const std::string& name) const {
  if (kind_ == Kind::kDict) {
    const Value* v = dict_find(name);
    return v ? *v : Value();
  }
  return Value();
}

bool Value::equals(const Value& o) const {
  if (is_number() || kind_ == Kind::kBool) {
    if (!(o.is_number() || o.kind_ == Kind::kBool)) return false;
    if (kind_ == Kind::kFloat || o.kind_ == Kind::kFloat) return as_double() == o.as_double();
    return as_int() == o.as_int();
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return *s_ == *o.s_;
    case Kind::kList:
      if (list_->size() != o.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].equals((*o.list_)[i])) return false;
      }
      return true;
    case Kind::kDict:
      if (dict_->size() != o.dict_->size()) return false;
      for (const auto& [k, v] : *dict_) {
        const Value* ov = o.dict_find(k);
        if (!ov || !v.equals(*ov)) return false;
      }
      return true;
    case Kind::kFunction: return fn_ == o.fn_;
    default: return false;
  }
}

int Value::compare(const Value& o) const {
  if ((is_number() || kind_ == Kind::kBool) && (o.is_number() || o.kind_ == Kind::kBool)) {
    const double a = as_double(), b = o.as_double();
    return a < b ? -1 : a > b ? 1 : 0;
  }
  if (is_string() && o.is_string()) return s_->compare(*o.s_) < 0 ? -1 : *s_ == *o.s_ ? 0 : 1;
  if (is_list() && o.is_list()) {
    for (size_t i = 0; i < std::min(list_->size(), o.list_->size()); ++i) {
      const int c = (*list_)[i].compare((*o.list_)[i]);
      if (c) return c;
    }
    return list_->size() < o.list_->size() ? -1 : list_->size() > o.list_->size() ? 1 : 0;
  }
  throw_error(ErrorCode::kInvalidArgument, "chat template: cannot order ", type_name(), " and ",
              o.type_name());
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "none";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "string";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kFunction: return "function";
  }
  return "?";
}

}  // namespace kiln::tok::jinja
