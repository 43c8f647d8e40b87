// Shapes whose dimensions are concrete or symbolic ("T", "batch"). The IR carries
// symbolic shapes; runtime tensors are always concrete. Tested in tests/core/shape_test.cpp.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace kiln {

struct Dim {
  int64_t value = -1;  // >= 0 when concrete
  std::string sym;     // non-empty when symbolic

  Dim() = default;
  Dim(int64_t v) : value(v) {}  // NOLINT: dims read naturally as integers
  Dim(int v) : value(v) {}      // NOLINT
  Dim(const char* s) : sym(s) {}  // NOLINT
  Dim(std::string s) : sym(std::move(s)) {}  // NOLINT
  bool is_concrete() const { return sym.empty(); }
  bool operator==(const Dim& o) const { return value == o.value && sym == o.sym; }
  std::string str() const { return sym.empty() ? std::to_string(value) : sym; }
};

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<Dim> dims) : dims_(dims) {}
  explicit Shape(std::vector<Dim> dims) : dims_(std::move(dims)) {}
  static Shape concrete(const std::vector<int64_t>& dims) {
    Shape s;
    for (auto d : dims) s.dims_.emplace_back(d);
    return s;
  }

  size_t rank() const { return dims_.size(); }
  const Dim& operator[](size_t i) const { return dims_[i]; }
  Dim& operator[](size_t i) { return dims_[i]; }
  const Dim& back() const { return dims_.back(); }
  const std::vector<Dim>& dims() const { return dims_; }
  void push_back(Dim d) { dims_.push_back(std::move(d)); }
  bool is_concrete() const;
  // Product of concrete dims; KILN_CHECKs that every dim is concrete.
  int64_t numel() const;
  std::vector<int64_t> values() const;
  std::string str() const;  // "[T, 768]"
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }

 private:
  std::vector<Dim> dims_;
};

}  // namespace kiln
