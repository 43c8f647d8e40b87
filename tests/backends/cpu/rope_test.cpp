// RoPE against (a) an independent emulation of HF Llama's f32 computation, expected
// bit-exact, and (b) a double-precision rotation within f32 rounding; partial rotary_dim.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cpu/kernels/kernels.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

using testing::expect_within;
using testing::random_floats;

TEST(Rope, MatchesHfF32AndDouble) {
  struct Case { int64_t t, heads, head_dim, rotary_dim; };
  for (const Case c : {Case{1, 1, 2, 2}, Case{5, 4, 64, 64}, Case{9, 3, 128, 128}, Case{4, 2, 64, 32},
                       Case{3, 2, 80, 40}}) {
    SCOPED_TRACE(::testing::Message() << "T=" << c.t << " heads=" << c.heads << " head_dim="
                                      << c.head_dim << " rotary_dim=" << c.rotary_dim);
    const int64_t half = c.rotary_dim / 2;
    std::vector<float> inv_freq(half);
    for (int64_t i = 0; i < half; ++i)  // HF: 1 / base^(arange(0, dim, 2) / dim), f32
      inv_freq[i] = 1.0f / std::pow(10000.0f, float(2 * i) / float(c.rotary_dim));
    std::vector<int32_t> pos(c.t);
    for (int64_t i = 0; i < c.t; ++i) pos[i] = int32_t(i * 397 % 4099);  // large positions too
    auto x = random_floats(c.t * c.heads * c.head_dim, 3);
    std::vector<float> y = x;
    rope(y.data(), c.t, c.heads, c.head_dim, c.rotary_dim, pos.data(), inv_freq.data());

    std::vector<float> hf(x.size());
    std::vector<double> exact(x.size()), tol(x.size());
    for (int64_t t = 0; t < c.t; ++t)
      for (int64_t h = 0; h < c.heads; ++h) {
        const float* v = x.data() + (t * c.heads + h) * c.head_dim;
        const int64_t o = (t * c.heads + h) * c.head_dim;
        for (int64_t i = 0; i < c.head_dim; ++i) hf[o + i] = v[i], exact[o + i] = v[i], tol[o + i] = 1e-30;
        for (int64_t i = 0; i < half; ++i) {
          const float th = float(pos[t]) * inv_freq[i];
          const float cs = std::cos(th), sn = std::sin(th);
          const float a = v[i] * cs, b = v[i + half] * sn, d = v[i + half] * cs, e = v[i] * sn;
          hf[o + i] = a - b;
          hf[o + i + half] = d + e;
          const double thd = double(th);  // θ as HF rounds it; cos/sin exact from there
          exact[o + i] = v[i] * std::cos(thd) - v[i + half] * std::sin(thd);
          exact[o + i + half] = v[i + half] * std::cos(thd) + v[i] * std::sin(thd);
          tol[o + i] = tol[o + i + half] = 4e-7;
        }
      }
    EXPECT_EQ(y, hf);
    expect_within(y, exact, tol, "rope vs double");
  }
}

}  // namespace
}  // namespace kiln::cpu
