// DType names, sizes and scalar conversions (see dtype.h).
#include "core/dtype.h"

#include <cmath>

#include "core/status.h"

namespace kiln {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kI8: case DType::kFP8E4M3: case DType::kU8: return 1;
    case DType::kI64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI8: return "i8";
    case DType::kFP8E4M3: return "fp8e4m3";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "?";
}

DType dtype_from_name(std::string_view n) {
  std::string s(n);
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (s == "f32" || s == "float32" || s == "float") return DType::kF32;
  if (s == "f16" || s == "float16" || s == "half" || s == "fp16") return DType::kF16;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  if (s == "i8" || s == "int8") return DType::kI8;
  if (s == "u8" || s == "uint8") return DType::kU8;
  if (s == "fp8e4m3" || s == "f8_e4m3" || s == "float8_e4m3fn" || s == "fp8") return DType::kFP8E4M3;
  if (s == "i32" || s == "int32") return DType::kI32;
  if (s == "i64" || s == "int64") return DType::kI64;
  throw_error(ErrorCode::kUnsupported, "unknown dtype '", n,
              "' (expected one of f32, f16, bf16, i8, u8, fp8e4m3, i32, i64)");
}

bool dtype_is_float(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kFP8E4M3;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);
    // subnormal: value = mant * 2^-24
    float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00);  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to inf
  if (a < 0x38800000u) {
    // subnormal or zero in f16: round a * 2^24 to nearest even integer
    float v = f32_from_bits(a);
    float m = std::nearbyint(v * 16777216.0f);  // default rounding mode is nearest-even
    return uint16_t(sign | uint32_t(m));
  }
  uint32_t exp = (a >> 23) - 112;
  uint32_t mant = a & 0x7fffff;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return uint16_t(sign | h);
}

// E4M3 (OCP FP8 "E4M3FN"): bias 7, no infinities, S.1111.111 the only NaN, 448 the
// largest finite value, subnormals m * 2^-9.
float fp8e4m3_to_f32(uint8_t v) {
  const uint32_t sign = uint32_t(v & 0x80) << 24;
  const uint32_t exp = (v >> 3) & 0xf;
  const uint32_t mant = v & 7;
  if (exp == 15 && mant == 7) return f32_from_bits(sign | 0x7fc00000u);
  if (exp == 0) {
    const float r = float(mant) * (1.0f / 512.0f);  // exact: a 3-bit integer times 2^-9
    return sign ? -r : r;
  }
  return f32_from_bits(sign | ((exp + 120) << 23) | (mant << 20));
}

// Bit arithmetic on the f32 encoding, the same steps as __nv_cvt_float_to_fp8(x,
// __NV_SATFINITE, __NV_E4M3) and the hardware's cvt.rn.satfinite.e4m3x2.f32.
uint8_t f32_to_fp8e4m3(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;               // NaN -> the canonical NaN
  if (a >= 0x43e00000u) return sign | 0x7e;       // |f| >= 448 (and inf): saturate
  const uint32_t e = a >> 23;                     // biased f32 exponent
  if (a >= 0x3c800000u) {                         // |f| >= 2^-6: normal in E4M3
    uint32_t code = ((e - 120) << 3) | ((a >> 20) & 7);
    const uint32_t rest = a & 0xfffffu;           // the 20 bits rounded off
    if (rest > 0x80000u || (rest == 0x80000u && (code & 1))) ++code;  // may carry into the exponent
    return sign | uint8_t(code);
  }
  // Subnormal in E4M3: round |f| / 2^-9 to an integer in [0, 8] (8 is the smallest
  // normal, 0x08). |f| = full * 2^(e - 150) with the implicit bit, so the integer is
  // full >> (141 - e); below 2^-10 (e < 117) everything rounds to zero.
  if (e < 117) return sign;
  const uint32_t full = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 141 - e;                 // 21..24
  uint32_t q = full >> shift;
  const uint32_t rest = full & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (q & 1))) ++q;
  return sign | uint8_t(q);
}

namespace {
double load_as_double(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kFP8E4M3: return fp8e4m3_to_f32(static_cast<const uint8_t*>(p)[i]);
    case DType::kI8: return static_cast<const int8_t*>(p)[i];
    case DType::kU8: return static_cast<const uint8_t*>(p)[i];
    case DType::kI32: return static_cast<const int32_t*>(p)[i];
    case DType::kI64: return double(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}
void store_from_double(void* p, DType t, size_t i, double v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = float(v); break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = f32_to_f16(float(v)); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(float(v)); break;
    case DType::kFP8E4M3: static_cast<uint8_t*>(p)[i] = f32_to_fp8e4m3(float(v)); break;
    case DType::kI8: static_cast<int8_t*>(p)[i] = int8_t(v); break;
    case DType::kU8: static_cast<uint8_t*>(p)[i] = uint8_t(v); break;
    case DType::kI32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
    case DType::kI64: static_cast<int64_t*>(p)[i] = int64_t(v); break;
  }
}
}  // namespace

void dtype_convert(const void* src, DType from, void* dst, DType to, size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * dtype_size(from));
    return;
  }
  // Fast paths for the conversions weight loading and uploads do in bulk: between f32,
  // bf16 and f16 through f32 (which holds every bf16 and f16 value exactly, so the result
  // is the generic path's).
  auto is_float = [](DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; };
  if (is_float(from) && is_float(to)) {
    auto run = [&](auto load, auto store) {
      for (size_t i = 0; i < n; ++i) store(i, load(i));
    };
    auto narrow = [&](auto load) {
      switch (to) {
        case DType::kF32: return run(load, [d = static_cast<float*>(dst)](size_t i, float v) { d[i] = v; });
        case DType::kBF16:
          return run(load, [d = static_cast<uint16_t*>(dst)](size_t i, float v) { d[i] = f32_to_bf16(v); });
        default: return run(load, [d = static_cast<uint16_t*>(dst)](size_t i, float v) { d[i] = f32_to_f16(v); });
      }
    };
    switch (from) {
      case DType::kF32: return narrow([s = static_cast<const float*>(src)](size_t i) { return s[i]; });
      case DType::kBF16: return narrow([s = static_cast<const uint16_t*>(src)](size_t i) { return bf16_to_f32(s[i]); });
      default: return narrow([s = static_cast<const uint16_t*>(src)](size_t i) { return f16_to_f32(s[i]); });
    }
  }
  for (size_t i = 0; i < n; ++i) store_from_double(dst, to, i, load_as_double(src, from, i));
}

}  // namespace kiln
