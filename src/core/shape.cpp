// Shape helpers (see shape.h).
#include "core/shape.h"

#include "core/status.h"

namespace kiln {

bool Shape::is_concrete() const {
  for (auto& d : dims_)
    if (!d.is_concrete()) return false;
  return true;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (auto& d : dims_) {
    KILN_CHECK(d.is_concrete(), "numel of symbolic shape ", str());
    n *= d.value;
  }
  return n;
}

std::vector<int64_t> Shape::values() const {
  std::vector<int64_t> v;
  v.reserve(dims_.size());
  for (auto& d : dims_) {
    KILN_CHECK(d.is_concrete(), "values of symbolic shape ", str());
    v.push_back(d.value);
  }
  return v;
}

std::string Shape::str() const {
  std::string s = "[";
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (i) s += ", ";
    s += dims_[i].str();
  }
  return s + "]";
}

}  // namespace kiln
