// FP8 E4M3 scaling shared by quantization and the backends: a tensor x is stored as
// codes q = e4m3(x * inv_scale) with scale = amax / 448, so its largest magnitude
// lands on E4M3's largest finite value; x ≈ decode(q) * scale. The conversions are
// core/dtype.h's (exact, tested in tests/core/fp8_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln {

constexpr float kFp8E4M3Max = 448.0f;

// The 256 codes decoded to f32 (0x7f and 0xff are NaN).
const float* fp8e4m3_table();

// One per-tensor scale and the multiplier that quantizes with it. Every backend
// quantizes as e4m3(x * inv), inv computed here once, so their codes agree bit for bit.
struct Fp8Scale {
  float scale = 1.0f;  // x ≈ decode(q) * scale
  float inv = 1.0f;    // q = e4m3(x * inv)
};
// amax / 448; an amax of 0 (a tensor that is all zeros) or a non-finite one gives 1.
Fp8Scale fp8_scale_for_amax(double amax);

// The weight_scale attribute of a Linear that stores E4M3 weights, checked: a finite value
// > 0, else kInvalidFile naming `who` (e.g. "cpu: fp8 Linear 'x'") and the value.
float fp8_stored_weight_scale(double weight_scale, const std::string& who);
// The scale of a Linear's E4M3 output from its calibrated out_amax attribute, checked the
// same way (kInvalidArgument).
Fp8Scale fp8_out_scale(double out_amax, const std::string& who);

// Quantizes n values with `inv` (saturating at +-448).
void fp8_quantize(const float* x, size_t n, float inv, uint8_t* q);
// Per-tensor: the scale from max |w| over all n values, then the codes.
Fp8Scale fp8_quantize_tensor(const float* w, size_t n, uint8_t* q);
// x rounded through E4M3 with the scale s: y = decode(e4m3(x * s.inv)) * s.scale,
// saturating at +-448 * s.scale (y may be x). The CPU's emulation of a GEMM that writes
// E4M3 output; the GPU's decode multiplies the same decoded code by the same scale.
void fp8_round_trip(const float* x, size_t n, const Fp8Scale& s, float* y);

}  // namespace kiln
