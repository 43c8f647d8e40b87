// Jinja builtins used by chat templates: filters (trim, tojson, default, map, ...),
// tests (defined, string, ...), Python string/dict methods and globals (range,
// namespace, raise_exception, strftime_now). Unknown names are kiln::Error
// kUnsupported naming the filter/test/method. Tested in tests/tokenizer/jinja_test.cpp.
#include <algorithm>
#include <cmath>
#include <ctime>

#include "core/status.h"
#include "tokenizer/jinja/evaluator.h"
#include "tokenizer/unicode.h"

namespace kiln::tok::jinja {
namespace {

[[noreturn]] void fail(int line, const std::string& what) {
  throw_error(ErrorCode::kInvalidArgument, "chat template line ", line, ": ", what);
}

const std::string& need_string(const Value& v, const char* what, int line) {
  if (!v.is_string()) fail(line, std::string(what) + " expects a string, got " + v.type_name());
  return v.as_string();
}

// Python's str.strip family: `chars` absent = Unicode whitespace.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  const auto cps = utf8_to_cps(s);
  std::vector<char32_t> set;
  const bool custom = chars && chars->is_string();
  if (custom) set = utf8_to_cps(chars->as_string());
  auto strip_it = [&](char32_t c) {
    return custom ? std::find(set.begin(), set.end(), c) != set.end() : is_whitespace(c);
  };
  size_t b = 0, e = cps.size();
  if (left) while (b < e && strip_it(cps[b])) ++b;
  if (right) while (e > b && strip_it(cps[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) utf8_append(out, cps[i]);
  return out;
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (!sep || sep->is_none() || sep->is_undefined()) {  // whitespace runs, no empties
    const auto cps = utf8_to_cps(s);
    std::string cur;
    bool in_word = false;
    for (size_t i = 0; i < cps.size(); ++i) {
      if (is_whitespace(cps[i]) && (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit)) {
        if (in_word) out.push_back(cur), cur.clear();
        in_word = false;
      } else {
        if (!in_word && maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
          // Remainder keeps its inner whitespace but not leading.
          std::string rest;
          for (size_t k = i; k < cps.size(); ++k) utf8_append(rest, cps[k]);
          out.push_back(py_strip(rest, nullptr, false, true));
          return out;
        }
        utf8_append(cur, cps[i]);
        in_word = true;
      }
    }
    if (in_word) out.push_back(cur);
    return out;
  }
  const std::string& d = sep->as_string();
  if (d.empty()) throw_error(ErrorCode::kInvalidArgument, "chat template: split() separator is empty");
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t pos = s.find(d, start);
    if (pos == std::string::npos) break;
    out.push_back(s.substr(start, pos - start));
    start = pos + d.size();
  }
  out.push_back(s.substr(start));
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) return s;
  std::string out;
  size_t start = 0;
  int64_t n = 0;
  for (size_t pos = s.find(from); pos != std::string::npos && (count < 0 || n < count);
       pos = s.find(from, start), ++n) {
    out.append(s, start, pos - start);
    out += to;
    start = pos + from.size();
  }
  out.append(s, start);
  return out;
}

std::string capitalize(const std::string& s) {
  const std::string lower = unicode_lower(s);
  const auto cps = utf8_to_cps(lower);
  if (cps.empty()) return lower;
  std::string out = unicode_upper(utf8_encode(cps[0]));
  for (size_t i = 1; i < cps.size(); ++i) utf8_append(out, cps[i]);
  return out;
}

std::string title(const std::string& s) {
  std::string out;
  bool prev_letter = false;
  for (char32_t c : utf8_to_cps(s)) {
    const std::string ch = utf8_encode(c);
    out += prev_letter ? unicode_lower(ch) : unicode_upper(ch);
    prev_letter = is_letter(c);
  }
  return out;
}

Value attribute_of(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = numeric ? cur.get_item(Value(static_cast<int64_t>(std::stoll(part)))) : cur.get_item(Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

ValueList select_items(const Value& input, const Args& args, bool by_attr, bool keep, int line) {
  ValueList out;
  for (const auto& item : iterate(input, line)) {
    Value subject = item;
    size_t test_at = 0;
    if (by_attr) {
      if (args.positional.empty()) fail(line, "selectattr/rejectattr need an attribute name");
      subject = attribute_of(item, args.positional[0].str());
      test_at = 1;
    }
    bool r;
    if (args.positional.size() <= test_at) {
      r = subject.truthy();
    } else {
      Args targs;
      targs.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(test_at) + 1,
                              args.positional.end());
      r = apply_test(args.positional[test_at].str(), subject, targs, line);
    }
    if (r == keep) out.push_back(item);
  }
  return out;
}

}  // namespace

Value apply_filter(const std::string& name, const Value& in, const Args& args, int line) {
  auto arg = [&](size_t i, const char* n) { return args.get(i, n); };
  if (name == "trim") return Value(py_strip(in.str(), arg(0, "chars"), true, true));
  if (name == "length" || name == "count") {
    if (in.is_string()) return Value(static_cast<int64_t>(utf8_to_cps(in.as_string()).size()));
    if (in.is_list()) return Value(static_cast<int64_t>(in.list().size()));
    if (in.is_dict()) return Value(static_cast<int64_t>(in.dict().size()));
    if (in.is_undefined()) return Value(int64_t{0});
    fail(line, "length of a " + in.type_name());
  }
  if (name == "tojson") {
    const Value* indent = arg(0, "indent");
    const Value* sort = arg(99, "sort_keys");
    return Value(in.to_json(indent && indent->is_number() ? static_cast<int>(indent->as_int()) : -1,
                            sort && sort->truthy()));
  }
  if (name == "upper") return Value(unicode_upper(in.str()));
  if (name == "lower") return Value(unicode_lower(in.str()));
  if (name == "capitalize") return Value(capitalize(in.str()));
  if (name == "title") return Value(title(in.str()));
  if (name == "string") return Value(in.str());
  if (name == "safe" || name == "e" || name == "escape") {
    if (name == "safe") return in;
    // HTML escaping, as jinja2's escape filter.
    std::string out;
    for (char c : in.str()) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out += c;
      }
    }
    return Value(out);
  }
  if (name == "default" || name == "d") {
    const Value* dflt = arg(0, "default_value");
    const Value* boolean = arg(1, "boolean");
    const bool use_default = in.is_undefined() || (boolean && boolean->truthy() && !in.truthy());
    return use_default ? (dflt ? *dflt : Value(std::string())) : in;
  }
  if (name == "first" || name == "last") {
    const ValueList items = iterate(in, line);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    const Value* sep = arg(0, "d");
    const Value* attr = arg(1, "attribute");
    std::string out;
    bool first = true;
    for (const auto& item : iterate(in, line)) {
      if (!first && sep) out += sep->str();
      first = false;
      out += attr ? attribute_of(item, attr->str()).str() : item.str();
    }
    return Value(out);
  }
  if (name == "replace") {
    if (args.positional.size() < 2) fail(line, "replace needs two arguments");
    const Value* count = arg(2, "count");
    return Value(replace_all(in.str(), args.positional[0].str(), args.positional[1].str(),
                             count ? count->as_int() : -1));
  }
  if (name == "int") {
    if (in.is_number() || in.kind() == Value::Kind::kBool) return Value(in.as_int());
    try {
      return Value(static_cast<int64_t>(std::stoll(in.str())));
    } catch (const std::exception&) {
      const Value* d = arg(0, "default");
      return d ? *d : Value(int64_t{0});
    }
  }
  if (name == "float") {
    if (in.is_number()) return Value(in.as_double());
    try {
      return Value(std::stod(in.str()));
    } catch (const std::exception&) {
      return Value(0.0);
    }
  }
  if (name == "abs") return in.kind() == Value::Kind::kFloat ? Value(std::fabs(in.as_double())) : Value(static_cast<int64_t>(std::llabs(in.as_int())));
  if (name == "round") {
    const Value* prec = arg(0, "precision");
    const double p = std::pow(10.0, prec ? static_cast<double>(prec->as_int()) : 0.0);
    return Value(std::round(in.as_double() * p) / p);
  }
  if (name == "list") return Value(iterate(in, line));
  if (name == "reverse") {
    if (in.is_string()) {
      auto cps = utf8_to_cps(in.as_string());
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) utf8_append(out, *it);
      return Value(out);
    }
    ValueList l = iterate(in, line);
    std::reverse(l.begin(), l.end());
    return Value(std::move(l));
  }
  if (name == "unique") {
    ValueList out;
    for (const auto& v : iterate(in, line)) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return o.equals(v); })) out.push_back(v);
    }
    return Value(std::move(out));
  }
  if (name == "sort") {
    ValueList l = iterate(in, line);
    const Value* rev = arg(0, "reverse");
    const Value* attr = arg(2, "attribute");
    std::stable_sort(l.begin(), l.end(), [&](const Value& a, const Value& b) {
      return attr ? attribute_of(a, attr->str()).compare(attribute_of(b, attr->str())) < 0 : a.compare(b) < 0;
    });
    if (rev && rev->truthy()) std::reverse(l.begin(), l.end());
    return Value(std::move(l));
  }
  if (name == "items" || name == "dictsort") {
    if (!in.is_dict()) return Value(ValueList{});
    ValueList out;
    for (const auto& [k, v] : in.dict()) out.emplace_back(ValueList{Value(k), v});
    if (name == "dictsort") {
      std::stable_sort(out.begin(), out.end(), [](const Value& a, const Value& b) {
        return a.list()[0].compare(b.list()[0]) < 0;
      });
    }
    return Value(std::move(out));
  }
  if (name == "map") {
    ValueList out;
    const Value* attr = arg(99, "attribute");
    for (const auto& item : iterate(in, line)) {
      if (attr) {
        Value v = attribute_of(item, attr->str());
        const Value* d = arg(99, "default");
        out.push_back(v.is_undefined() && d ? *d : v);
      } else {
        if (args.positional.empty()) fail(line, "map needs a filter name or attribute=");
        Args rest;
        rest.positional.assign(args.positional.begin() + 1, args.positional.end());
        out.push_back(apply_filter(args.positional[0].str(), item, rest, line));
      }
    }
    return Value(std::move(out));
  }
  if (name == "select") return Value(select_items(in, args, false, true, line));
  if (name == "reject") return Value(select_items(in, args, false, false, line));
  if (name == "selectattr") return Value(select_items(in, args, true, true, line));
  if (name == "rejectattr") return Value(select_items(in, args, true, false, line));
  if (name == "indent") {
    const Value* width = arg(0, "width");
    const Value* first = arg(1, "first");
    const Value* blank = arg(2, "blank");
    const std::string pad = width && width->is_string() ? width->as_string()
                                                        : std::string(static_cast<size_t>(width ? width->as_int() : 4), ' ');
    const auto lines = py_split(in.str(), nullptr, -1);
    std::string s = in.str(), out;
    size_t start = 0;
    bool first_line = true;
    while (true) {
      const size_t nl = s.find('\n', start);
      const std::string ln = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
      const bool indent_it = first_line ? (first && first->truthy()) : (!ln.empty() || (blank && blank->truthy()));
      out += (indent_it ? pad : "") + ln;
      if (nl == std::string::npos) break;
      out += '\n';
      start = nl + 1;
      first_line = false;
    }
    return Value(out);
  }
  if (name == "wordcount") return Value(static_cast<int64_t>(py_split(in.str(), nullptr, -1).size()));
  if (name == "batch" || name == "slice" || name == "groupby" || name == "format" ||
      name == "urlencode" || name == "xmlattr" || name == "pprint") {
    throw_error(ErrorCode::kUnsupported, "chat template line ", line, ": filter '", name,
                "' is not supported by kiln's Jinja interpreter");
  }
  throw_error(ErrorCode::kUnsupported, "chat template line ", line, ": unknown filter '", name, "'");
}

bool apply_test(const std::string& name, const Value& v, const Args& args, int line) {
  const Value* a0 = args.get(0, "value");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == Value::Kind::kInt;
  if (name == "float") return v.kind() == Value::Kind::kFloat;
  if (name == "boolean") return v.kind() == Value::Kind::kBool;
  if (name == "true") return v.kind() == Value::Kind::kBool && v.as_bool();
  if (name == "false") return v.kind() == Value::Kind::kBool && !v.as_bool();
  if (name == "mapping") return v.is_dict();
  if (name == "sequence") return v.is_list() || v.is_string() || v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_string() || v.is_dict();
  if (name == "callable") return v.is_callable();
  if (name == "even" || name == "odd") {
    if (v.kind() != Value::Kind::kInt) fail(line, "'" + name + "' test needs an integer");
    return (v.as_int() % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    if (!a0 || a0->as_int() == 0) fail(line, "divisibleby needs a non-zero number");
    return v.as_int() % a0->as_int() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") return a0 && v.equals(*a0);
  if (name == "ne" || name == "!=") return !(a0 && v.equals(*a0));
  if (name == "lower") return v.is_string() && unicode_lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && unicode_upper(v.as_string()) == v.as_string();
  if (name == "in") {
    if (!a0) fail(line, "'in' test needs a container");
    if (a0->is_string()) return v.is_string() && a0->as_string().find(v.as_string()) != std::string::npos;
    for (const auto& x : iterate(*a0, line)) {
      if (x.equals(v)) return true;
    }
    return false;
  }
  if (name == "gt" || name == "lt" || name == "ge" || name == "le") {
    if (!a0) fail(line, "'" + name + "' test needs an argument");
    const int c = v.compare(*a0);
    return name == "gt" ? c > 0 : name == "lt" ? c < 0 : name == "ge" ? c >= 0 : c <= 0;
  }
  throw_error(ErrorCode::kUnsupported, "chat template line ", line, ": unknown test '", name, "'");
}

bool call_method(const Value& self, const std::string& name, const Args& args, int line, Value* out) {
  const Value* a0 = args.get(0, "");
  const Value* a1 = args.get(1, "");
  if (self.is_string()) {
    const std::string& s = self.as_string();
    if (name == "strip") return *out = Value(py_strip(s, a0, true, true)), true;
    if (name == "lstrip") return *out = Value(py_strip(s, a0, true, false)), true;
    if (name == "rstrip") return *out = Value(py_strip(s, a0, false, true)), true;
    if (name == "upper") return *out = Value(unicode_upper(s)), true;
    if (name == "lower") return *out = Value(unicode_lower(s)), true;
    if (name == "title") return *out = Value(title(s)), true;
    if (name == "capitalize") return *out = Value(capitalize(s)), true;
    if (name == "startswith" || name == "endswith") {
      if (!a0) fail(line, name + "() needs an argument");
      ValueList options = a0->is_list() ? a0->list() : ValueList{*a0};
      for (const auto& o : options) {
        const std::string& p = need_string(o, name.c_str(), line);
        const bool hit = name == "startswith" ? s.compare(0, p.size(), p) == 0
                                              : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
        if (hit) return *out = Value(true), true;
      }
      return *out = Value(false), true;
    }
    if (name == "split" || name == "rsplit") {
      const Value* maxsplit = args.get(1, "maxsplit");
      if (name == "rsplit" && maxsplit && maxsplit->as_int() >= 0) {
        throw_error(ErrorCode::kUnsupported, "chat template line ", line, ": rsplit with maxsplit");
      }
      ValueList parts;
      for (auto& p : py_split(s, args.get(0, "sep"), maxsplit ? maxsplit->as_int() : -1)) parts.emplace_back(std::move(p));
      return *out = Value(std::move(parts)), true;
    }
    if (name == "replace") {
      if (!a0 || !a1) fail(line, "replace() needs two arguments");
      const Value* count = args.get(2, "count");
      return *out = Value(replace_all(s, a0->str(), a1->str(), count ? count->as_int() : -1)), true;
    }
    if (name == "find" || name == "count") {
      if (!a0) fail(line, name + "() needs an argument");
      const std::string& needle = need_string(*a0, name.c_str(), line);
      if (name == "find") {
        const size_t pos = s.find(needle);
        return *out = Value(pos == std::string::npos ? int64_t{-1} : static_cast<int64_t>(utf8_to_cps(s.substr(0, pos)).size())), true;
      }
      int64_t n = 0;
      if (!needle.empty()) {
        for (size_t pos = s.find(needle); pos != std::string::npos; pos = s.find(needle, pos + needle.size())) ++n;
      }
      return *out = Value(n), true;
    }
    if (name == "join") {
      std::string joined;
      bool first = true;
      for (const auto& v : iterate(a0 ? *a0 : Value(), line)) {
        if (!first) joined += s;
        first = false;
        joined += v.str();
      }
      return *out = Value(joined), true;
    }
    if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
      const auto cps = utf8_to_cps(s);
      bool r = !cps.empty();
      for (char32_t c : cps) {
        r = r && (name == "isdigit" ? is_number(c) : name == "isspace" ? is_whitespace(c)
                  : name == "isalpha" ? is_letter(c) : (is_letter(c) || is_number(c)));
      }
      return *out = Value(r), true;
    }
    return false;
  }
  if (self.is_dict()) {
    if (name == "items") {
      ValueList items;
      for (const auto& [k, v] : self.dict()) items.emplace_back(ValueList{Value(k), v});
      return *out = Value(std::move(items)), true;
    }
    if (name == "keys" || name == "values") {
      ValueList items;
      for (const auto& [k, v] : self.dict()) items.push_back(name == "keys" ? Value(k) : v);
      return *out = Value(std::move(items)), true;
    }
    if (name == "get") {
      if (!a0) fail(line, "get() needs a key");
      const Value v = self.get_item(*a0);
      return *out = v.is_undefined() ? (a1 ? *a1 : Value::none()) : v, true;
    }
    return false;
  }
  if (self.is_list()) {
    if (name == "index" && a0) {
      for (size_t i = 0; i < self.list().size(); ++i) {
        if (self.list()[i].equals(*a0)) return *out = Value(static_cast<int64_t>(i)), true;
      }
      fail(line, "list.index(x): x not in list");
    }
    if (name == "count" && a0) {
      int64_t n = 0;
      for (const auto& v : self.list()) n += v.equals(*a0);
      return *out = Value(n), true;
    }
  }
  return false;
}

ValueDict builtin_globals() {
  ValueDict g;
  g.emplace_back("range", Value(Function([](const Args& a) {
    int64_t start = 0, stop = 0, step = 1;
    if (a.positional.size() == 1) {
      stop = a.positional[0].as_int();
    } else if (a.positional.size() >= 2) {
      start = a.positional[0].as_int();
      stop = a.positional[1].as_int();
      if (a.positional.size() >= 3) step = a.positional[2].as_int();
    }
    if (step == 0) throw_error(ErrorCode::kInvalidArgument, "chat template: range() step is zero");
    ValueList out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() > 1'000'000) throw_error(ErrorCode::kInvalidArgument, "chat template: range() too long");
      out.emplace_back(i);
    }
    return Value(std::move(out));
  })));
  auto make_dict = [](const Args& a) {
    Value ns{ValueDict{}};
    for (const auto& p : a.positional) {
      if (p.is_dict()) {
        for (const auto& [k, v] : p.dict()) ns.dict_set(k, v);
      }
    }
    for (const auto& [k, v] : a.named) ns.dict_set(k, v);
    return ns;
  };
  g.emplace_back("namespace", Value(Function(make_dict)));
  g.emplace_back("dict", Value(Function(make_dict)));
  g.emplace_back("raise_exception", Value(Function([](const Args& a) -> Value {
    throw_error(ErrorCode::kInvalidArgument, "chat template raised an exception: ",
                a.positional.empty() ? std::string() : a.positional[0].str());
  })));
  g.emplace_back("strftime_now", Value(Function([](const Args& a) {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const std::string fmt = a.positional.empty() ? "%Y-%m-%d" : a.positional[0].str();
    const size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
    return Value(std::string(buf, n));
  })));
  return g;
}

}  // namespace kiln::tok::jinja
