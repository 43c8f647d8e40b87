// Tests of the GGUF reader, the dequantizers (against values from the Python gguf
// package in tests/fixtures/frontends/gguf_quants.json) and the HF view, on synthetic
// files, on corrupt input, and on the real SmolLM2 GGUF when it is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/weight_quant.h"
#include "frontends/gguf.h"
#include "frontends/gguf_quants.h"
#include "frontends/gguf_hf.h"
#include "frontends/hf_dir.h"
#include "gguf_writer.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::expect_error;
using test::GgufWriter;
using test::raw_bytes;
using test::TempDir;
using test::write_file;

GgufFile parse(const std::string& bytes, const std::string& label = "test.gguf") {
  auto keep = std::make_shared<std::string>(bytes);
  return GgufFile::from_memory(reinterpret_cast<const uint8_t*>(keep->data()), keep->size(), label,
                               keep);
}

std::string hex_to_bytes(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

nlohmann::json fixture() {
  return read_json_file(std::string(KILN_FIXTURES_DIR) + "/frontends/gguf_quants.json");
}

std::string models_dir() {
  const char* env = std::getenv("KILN_MODELS_DIR");
  return env ? env : std::string(KILN_SOURCE_DIR) + "/.cache/models";
}

TEST(Gguf, MetadataOfEveryType) {
  GgufWriter w;
  w.kv<uint8_t>("u8", 0, 200);
  w.kv<int8_t>("i8", 1, -5);
  w.kv<uint16_t>("u16", 2, 60000);
  w.kv<int16_t>("i16", 3, -300);
  w.kv_u32("u32", 4000000000u);
  w.kv<int32_t>("i32", 5, -7);
  w.kv_f32("f32", 0.5f);
  w.kv<uint8_t>("bool", 7, 1);
  w.kv_string("str", "héllo");
  w.kv<uint64_t>("u64", 10, 1ull << 40);
  w.kv<int64_t>("i64", 11, -(1ll << 40));
  w.kv<double>("f64", 12, 2.25);
  w.kv_strings("strs", {"a", "", "ccc"});
  w.kv_array<int32_t>("ints", 5, {1, -2, 3});
  w.kv_array<float>("floats", 6, {1.5f, -2.f});
  // An array of arrays of strings: [["x"], ["y", "z"]].
  std::string nested;
  GgufWriter::put<uint32_t>(nested, 9);
  GgufWriter::put<uint64_t>(nested, 2);
  for (std::vector<std::string> inner : {std::vector<std::string>{"x"}, {"y", "z"}}) {
    GgufWriter::put<uint32_t>(nested, 8);
    GgufWriter::put<uint64_t>(nested, inner.size());
    for (const auto& s : inner) GgufWriter::put_str(nested, s);
  }
  w.kv_raw("nested", 9, nested);

  GgufFile f = parse(w.bytes());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.keys().size(), 16u);
  EXPECT_EQ(f.get_u32("u8"), 200u);
  EXPECT_EQ(f.get_i64("i8"), -5);
  EXPECT_EQ(f.get_u32("u16"), 60000u);
  EXPECT_EQ(f.get_i64("i16"), -300);
  EXPECT_EQ(f.get_u32("u32"), 4000000000u);
  EXPECT_EQ(f.get_i64("i32"), -7);
  EXPECT_EQ(f.get_f32("f32"), 0.5f);
  EXPECT_TRUE(f.get_bool("bool"));
  EXPECT_EQ(f.get_string("str"), "héllo");
  EXPECT_EQ(f.get_i64("u64"), 1ll << 40);
  EXPECT_EQ(f.get_i64("i64"), -(1ll << 40));
  EXPECT_EQ(f.get_f32("f64"), 2.25f);
  EXPECT_EQ(f.get_array_strings("strs"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f.get_array_i32("ints"), (std::vector<int32_t>{1, -2, 3}));
  EXPECT_EQ(f.get_array_f32("floats"), (std::vector<float>{1.5f, -2.f}));
  EXPECT_EQ(f.get_array_size("ints"), 3u);
  const GgufValue& n = f.value("nested");
  ASSERT_EQ(n.items.size(), 2u);
  EXPECT_EQ(n.items[1].strs, (std::vector<std::string>{"y", "z"}));

  expect_error([&] { f.get_u32("i32"); }, ErrorCode::kInvalidFile, {"'i32'", "i32"});
  expect_error([&] { f.get_string("u8"); }, ErrorCode::kInvalidFile, {"'u8'", "a string"});
  expect_error([&] { f.get_array_strings("ints"); }, ErrorCode::kInvalidFile, {"array of i32"});
  expect_error([&] { f.get_u32("nope"); }, ErrorCode::kNotFound, {"'nope'", "test.gguf"});
}

TEST(Gguf, PlainTensorsRoundTrip) {
  GgufWriter w;
  w.version = 2;
  std::vector<float> a = {0, 1, 2, 3, 4, 5};
  std::vector<uint16_t> h = {f32_to_f16(1.f), f32_to_f16(-2.f)};
  std::vector<uint16_t> b = {f32_to_bf16(3.f), f32_to_bf16(0.25f)};
  w.tensor("a", 0, {3, 2}, raw_bytes(a));  // PyTorch shape [2, 3]
  w.tensor("h", 1, {2}, raw_bytes(h));
  w.tensor("b", 30, {2}, raw_bytes(b));
  GgufFile f = parse(w.bytes());
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensor_info("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.tensor_info("a").ne, (std::vector<int64_t>{3, 2}));
  Tensor ta = f.load("a", DType::kF32);
  EXPECT_EQ(ta.data_as<float>()[4], 4.f);
  EXPECT_EQ(f.load("h", DType::kF16).data_as<uint16_t>()[1], h[1]);
  EXPECT_EQ(f.load("h", DType::kF32).data_as<float>()[1], -2.f);
  EXPECT_EQ(f.load("b", DType::kF32).data_as<float>()[1], 0.25f);
  EXPECT_EQ(GgufFile::natural_dtype(30), DType::kBF16);
  expect_error([&] { f.load("zz", DType::kF32); }, ErrorCode::kNotFound, {"'zz'"});
}

// Every quant type against gguf-py's dequantization of the same random blocks.
TEST(GgufQuants, MatchGgufPy) {
  auto fx = fixture();
  ASSERT_GE(fx["blocks"].size(), 10u);
  for (const auto& b : fx["blocks"]) {
    const std::string type = b["type"];
    const uint32_t id = b["type_id"];
    const std::string bytes = hex_to_bytes(b["hex"]);
    const std::vector<float> want = b["values"].get<std::vector<float>>();
    const GgmlTypeTraits* tr = ggml_type_traits(id);
    ASSERT_NE(tr, nullptr) << type;
    EXPECT_EQ(std::string(tr->name), type);
    ASSERT_EQ(bytes.size() / tr->type_size * size_t(tr->block_size), want.size()) << type;
    // Through a GGUF file, as a [2, n/2] tensor, so the row split is exercised too.
    GgufWriter w;
    w.tensor("t", id, {want.size() / 2, 2}, bytes);
    GgufFile f = parse(w.bytes());
    Tensor t = f.load("t", DType::kF32);
    ASSERT_EQ(size_t(t.numel()), want.size());
    double max_err = 0;
    for (size_t i = 0; i < want.size(); ++i)
      max_err = std::max(max_err, double(std::fabs(t.data_as<float>()[i] - want[i])) /
                                      std::max(1.0, double(std::fabs(want[i]))));
    EXPECT_LE(max_err, 1e-6) << type;
  }
}

TEST(GgufQuants, Q8KByHand) {
  std::string block(292, '\0');
  float d = 0.5f;
  std::memcpy(block.data(), &d, 4);
  for (int j = 0; j < 256; ++j) block[4 + j] = char(int8_t(j - 128));
  std::vector<float> y(256);
  ggml_type_traits(uint32_t(GgmlType::kQ8_K))->to_f32(
      reinterpret_cast<const uint8_t*>(block.data()), y.data(), 256);
  EXPECT_EQ(y[0], -64.f);
  EXPECT_EQ(y[255], 63.5f);
}

// GGUF Q8_0 / Q4_1 tensors (expanded to f32 at load) quantized again as q8 / q4 give
// back the file's own codes, scales and mins: the q8/q4 weights every backend runs
// (core/weight_quant.h) are then exactly the checkpoint's.
TEST(GgufQuants, Q8_0AndQ4_1RequantizeToTheirOwnBlocks) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dd(1e-3f, 1e-2f), mm(-0.1f, 0.0f);
  const int64_t blocks = 24;
  for (bool q4 : {false, true}) {
    std::string bytes;
    std::vector<uint16_t> d16, m16;
    for (int64_t b = 0; b < blocks; ++b) {
      d16.push_back(f32_to_f16(dd(rng)));
      m16.push_back(f32_to_f16(mm(rng)));
      std::string block(q4 ? 20 : 34, '\0');
      std::memcpy(block.data(), &d16.back(), 2);
      if (q4) std::memcpy(block.data() + 2, &m16.back(), 2);
      std::vector<int> c(32);
      for (int j = 0; j < 32; ++j) c[size_t(j)] = q4 ? int(rng() % 16) : int(rng() % 255) - 127;
      const size_t at = rng() % 32;  // the block's extremes, as ggml's quantizer makes them
      c[at] = q4 ? 0 : 127;
      if (q4) c[(at + 1) % 32] = 15;
      for (int j = 0; j < 32; ++j) {
        if (q4) block[4 + size_t(j % 16)] = char(uint8_t(block[4 + size_t(j % 16)]) | uint8_t(j < 16 ? c[size_t(j)] : c[size_t(j)] << 4));
        else block[2 + size_t(j)] = char(int8_t(c[size_t(j)]));
      }
      bytes += block;
    }
    const GgmlTypeTraits* tr = ggml_type_traits(uint32_t(q4 ? GgmlType::kQ4_1 : GgmlType::kQ8_0));
    std::vector<float> w(size_t(blocks * 32));
    tr->to_f32(reinterpret_cast<const uint8_t*>(bytes.data()), w.data(), blocks * 32);
    QuantizedRows q = quantize_rows(w.data(), 1, blocks * 32, q4 ? QuantFormat::kQ4 : QuantFormat::kQ8);
    int same = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      const auto* blk = reinterpret_cast<const uint8_t*>(bytes.data()) + b * (q4 ? 20 : 34);
      bool ok = f16_to_f32(q.scales[size_t(b)]) * q.row_factor[0] == f16_to_f32(d16[size_t(b)]);
      if (q4) ok = ok && f16_to_f32(q.mins[size_t(b)]) * q.row_factor[0] == f16_to_f32(m16[size_t(b)]);
      for (int j = 0; j < 32; ++j) {
        const int want = q4 ? (j < 16 ? blk[4 + j] & 15 : blk[4 + j - 16] >> 4) : int(int8_t(blk[2 + j]));
        ok = ok && quant_code(q.format, q.codes.get(), b * 32 + j) == want;
      }
      same += ok;
    }
    EXPECT_EQ(same, blocks) << (q4 ? "Q4_1" : "Q8_0") << ": blocks whose codes, scale and min came back";
  }
}

// Q8_0 / Q5_0 / Q4_0 / Q4_1 re-laid as kiln q8 / q4 stand for exactly ggml's values, row by row.
TEST(GgufQuants, ExactImagesDequantizeToGgmlsValues) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dd(-2e-2f, 2e-2f), mm(-0.1f, 0.1f);
  const int64_t n = 3, k = 96;
  for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ5_0, GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    const GgmlTypeTraits* tr = ggml_type_traits(uint32_t(t));
    std::string bytes;
    for (int64_t b = 0; b < n * k / 32; ++b) {
      std::string block(tr->type_size, '\0');
      const uint16_t d = f32_to_f16(dd(rng)), m = f32_to_f16(mm(rng));  // Q4_0's d may be negative
      std::memcpy(block.data(), &d, 2);
      if (t == GgmlType::kQ4_1) std::memcpy(block.data() + 2, &m, 2);
      for (size_t j = t == GgmlType::kQ4_1 ? 4 : 2; j < block.size(); ++j) block[j] = char(rng());
      if (t == GgmlType::kQ8_0)
        for (size_t j = 2; j < block.size(); ++j)
          if (uint8_t(block[j]) == 0x80) block[j] = char(0x81);
      bytes += block;
    }
    const auto* src = reinterpret_cast<const uint8_t*>(bytes.data());
    std::optional<QuantizedRows> q = ggml_to_quantized_rows(uint32_t(t), src, n, k);
    ASSERT_TRUE(q.has_value()) << tr->name;
    EXPECT_EQ(q->format, *ggml_exact_quant_format(uint32_t(t)));
    std::vector<float> want(static_cast<size_t>(n * k)), got(static_cast<size_t>(k));
    tr->to_f32(src, want.data(), n * k);
    const size_t rb = quant_row_code_bytes(q->format, k);
    for (int64_t r = 0; r < n; ++r) {
      dequantize_row(q->codes.get() + size_t(r) * rb, q->scales.get() + r * q->groups(),
                     q->mins ? q->mins.get() + r * q->groups() : nullptr, q->row_factor[size_t(r)], k, q->format,
                     got.data());
      for (int64_t i = 0; i < k; ++i)
        // Equal values; bit for bit except Q4_0's zero, d * (8 - 8) = -0 for d < 0 in ggml.
        ASSERT_TRUE(got[size_t(i)] == want[size_t(r * k + i)] &&
                    (want[size_t(r * k + i)] == 0.0f || f32_bits(got[size_t(i)]) == f32_bits(want[size_t(r * k + i)])))
            << tr->name << " row " << r << " i " << i << ": " << got[size_t(i)] << " vs " << want[size_t(r * k + i)];
    }
  }
}

// Q4_K re-laid as kiln q4 keeps every 4-bit code and stands for ggml's values up to the
// f16 rounding of each sub-block's scale d * sc and min -dmin * m (relative <= 2^-11
// each): |kiln - ggml| <= 2^-11 * (|d sc q| + |dmin m|) from that rounding, plus f32
// rounding of ggml's and kiln's sums (<= 2^-24 of each), so <= (2^-11 + 2^-22) * (|d sc q|
// + |dmin m|) per element. Rows mix small, large (d near f16's top) and f16-subnormal d,
// and sub-blocks with sc = 0, m = 0 or both.
TEST(GgufQuants, Q4KImagesKeepCodesAndRoundOnlyScales) {
  std::mt19937 rng(23);
  const int64_t n = 6, k = 768, sb = k / 256;
  const GgmlTypeTraits* tr = ggml_type_traits(uint32_t(GgmlType::kQ4_K));
  std::vector<uint8_t> codes(size_t(n * k)), sc(size_t(n * k / 32)), mn(size_t(n * k / 32));
  std::vector<float> d(size_t(n * sb)), dmin(size_t(n * sb));
  std::string bytes;
  for (int64_t r = 0; r < n; ++r) {
    // Row magnitudes: ordinary, large (d up to 6e4, so d * sc overflows f16 without the
    // row factor), tiny (d f16-subnormal), mixed across super-blocks.
    const float base[] = {1e-4f, 3e4f, 2e-7f, 1e-4f, 5e-3f, 1.0f};
    for (int64_t b = 0; b < sb; ++b) {
      const float lo = base[r] * (r == 3 ? float(1 << (4 * b)) : 1.0f);
      std::uniform_real_distribution<float> mag(lo, 2 * lo);
      const uint16_t d16 = f32_to_f16(mag(rng)), m16 = f32_to_f16(std::min(mag(rng) * 4, 6e4f));
      d[size_t(r * sb + b)] = f16_to_f32(d16);
      dmin[size_t(r * sb + b)] = f16_to_f32(m16);
      uint8_t* c = codes.data() + r * k + b * 256;
      uint8_t* s6 = sc.data() + r * k / 32 + b * 8;
      uint8_t* m6 = mn.data() + r * k / 32 + b * 8;
      for (int e = 0; e < 256; ++e) c[e] = uint8_t(rng() % 16);
      for (int j = 0; j < 8; ++j) {
        s6[j] = uint8_t(rng() % 64);
        m6[j] = uint8_t(rng() % 64);
      }
      s6[b % 8] = 0;            // a sub-block of constant -dmin * m
      m6[(b + 3) % 8] = 0;      // a sub-block without a min
      s6[(b + 5) % 8] = m6[(b + 5) % 8] = 0;  // all zeros
      s6[(b + 6) % 8] = 63;
      m6[(b + 7) % 8] = 63;
      bytes += test::q4_k_block(d16, m16, s6, m6, c);
    }
  }
  const auto* src = reinterpret_cast<const uint8_t*>(bytes.data());
  ASSERT_EQ(bytes.size(), size_t(n * sb) * tr->type_size);
  std::optional<QuantizedRows> q = ggml_to_quantized_rows(uint32_t(GgmlType::kQ4_K), src, n, k);
  ASSERT_TRUE(q.has_value());
  ASSERT_EQ(q->format, QuantFormat::kQ4);
  std::vector<float> want(static_cast<size_t>(n * k)), got(static_cast<size_t>(k));
  tr->to_f32(src, want.data(), n * k);
  const double kBound = std::ldexp(1.0, -11) + std::ldexp(1.0, -22);
  double worst_scale = 0, worst_elem = 0;  // observed relative errors
  int64_t rounded = 0;                     // elements not bit-identical to ggml's
  for (int64_t r = 0; r < n; ++r) {
    const float f = q->row_factor[size_t(r)];
    int e = 0;
    std::frexp(f, &e);
    ASSERT_EQ(f, std::ldexp(1.0f, e - 1)) << "row " << r << ": row factor " << f << " is not a power of two";
    for (int64_t g = 0; g < k / 32; ++g) {
      const double s_true = double(d[size_t((r * k / 32 + g) / 8)]) * sc[size_t(r * k / 32 + g)];
      const double m_true = -double(dmin[size_t((r * k / 32 + g) / 8)]) * mn[size_t(r * k / 32 + g)];
      const double s = double(f16_to_f32(q->scales[size_t(r * k / 32 + g)])) * f;
      const double m = double(f16_to_f32(q->mins[size_t(r * k / 32 + g)])) * f;
      // Stored as normal f16 values (subnormals would lose relative precision).
      ASSERT_TRUE(s == 0 || std::fabs(s / f) >= std::ldexp(1.0, -14)) << "row " << r << " group " << g;
      ASSERT_LE(std::fabs(s - s_true), std::ldexp(std::fabs(s_true), -11)) << "row " << r << " group " << g;
      ASSERT_LE(std::fabs(m - m_true), std::ldexp(std::fabs(m_true), -11)) << "row " << r << " group " << g;
      if (s_true != 0) worst_scale = std::max(worst_scale, std::fabs(s - s_true) / std::fabs(s_true));
    }
    dequantize_row(q->codes.get() + size_t(r * k / 2), q->scales.get() + r * k / 32, q->mins.get() + r * k / 32, f, k,
                   QuantFormat::kQ4, got.data());
    for (int64_t i = 0; i < k; ++i) {
      const int64_t g = r * k / 32 + i / 32;
      ASSERT_EQ(quant_code(QuantFormat::kQ4, q->codes.get() + size_t(r * k / 2), i), codes[size_t(r * k + i)])
          << "row " << r << " element " << i;
      const double a = std::fabs(double(d[size_t(g / 8)]) * sc[size_t(g)] * codes[size_t(r * k + i)]) +
                       double(dmin[size_t(g / 8)]) * mn[size_t(g)];
      const double w = want[size_t(r * k + i)], err = std::fabs(double(got[size_t(i)]) - w);
      ASSERT_LE(err, kBound * a) << "row " << r << " element " << i << ": " << got[size_t(i)] << " vs ggml " << w;
      if (a > 0) worst_elem = std::max(worst_elem, err / a);
      rounded += got[size_t(i)] != want[size_t(r * k + i)];
    }
  }
  // The rounding is real (not every d * sc fits f16) but stays within the bound.
  EXPECT_GT(rounded, 0);
  EXPECT_GT(worst_scale, 0.0);
  std::printf("  Q4_K -> q4: %lld of %lld elements rounded, worst scale error %.3g, worst element error %.3g "
              "of (|d sc q| + |dmin m|) (bound %.3g)\n",
              (long long)rounded, (long long)(n * k), worst_scale, worst_elem, kBound);

  // Requantizing ggml's f32 values instead (the --gguf-requantize path) re-rounds codes.
  QuantizedRows rq = quantize_rows(want.data(), n, k, QuantFormat::kQ4);
  int64_t code_changes = 0;
  for (int64_t i = 0; i < n * k; ++i)
    code_changes += quant_code(QuantFormat::kQ4, rq.codes.get(), i) != codes[size_t(i)];
  std::printf("  requantized path: %lld of %lld codes differ from the file's\n", (long long)code_changes,
              (long long)(n * k));
}

// Q4_K rows that no single row factor can hold in f16's normal range, non-finite d or
// dmin, and K not a multiple of the super-block have no image.
TEST(GgufQuants, Q4KRowsOutOfF16RangeHaveNoImage) {
  const uint8_t one[8] = {1, 1, 1, 1, 1, 1, 1, 1}, zero[8] = {};
  uint8_t codes[256];
  for (int e = 0; e < 256; ++e) codes[e] = uint8_t(e % 16);
  const auto q4k = [](const std::string& bytes, int64_t n, int64_t k) {
    return ggml_to_quantized_rows(uint32_t(GgmlType::kQ4_K), reinterpret_cast<const uint8_t*>(bytes.data()), n, k);
  };
  const uint16_t big = f32_to_f16(60000.0f), tiny = 1 /* 2^-24 */, inf = 0x7c00;
  // Scales 6e4 and 2^-24 in one row: 2^40 apart, more than f16's normal range (2^30).
  const std::string wide = test::q4_k_block(big, 0, one, zero, codes) + test::q4_k_block(tiny, 0, one, zero, codes);
  EXPECT_FALSE(q4k(wide, 1, 512));
  // The same two super-blocks in two rows: each row picks its own factor.
  std::optional<QuantizedRows> two = q4k(wide, 2, 256);
  ASSERT_TRUE(two.has_value());
  EXPECT_NE(two->row_factor[0], two->row_factor[1]);
  // A wide row through a min: dmin large, d tiny.
  EXPECT_FALSE(q4k(test::q4_k_block(tiny, big, one, one, codes), 1, 256));
  EXPECT_FALSE(q4k(test::q4_k_block(inf, 0, one, zero, codes), 1, 256));
  EXPECT_FALSE(q4k(test::q4_k_block(0, inf, zero, zero, codes), 1, 256));
  // All-zero scales and mins: an exact image of zeros.
  std::optional<QuantizedRows> z = q4k(test::q4_k_block(big, big, zero, zero, codes), 1, 256);
  ASSERT_TRUE(z.has_value());
  std::vector<float> out(256);
  dequantize_row(z->codes.get(), z->scales.get(), z->mins.get(), z->row_factor[0], 256, QuantFormat::kQ4, out.data());
  for (float v : out) ASSERT_EQ(v, 0.0f);
  expect_error([&] { q4k(wide, 2, 128); }, ErrorCode::kInvalidArgument, {"Q4_K", "256", "K=128"});
}

// Types with no q8/q4 image of their codes (5/6-bit codes with a min or 16-element
// sub-blocks, 2/3-bit codes) are
// requantized to q8: the bits quantize_rows gives ggml's dequantization of each row (what
// --weight-dtype q8 makes of the f32 weight), each value within half a q8 step of ggml's.
TEST(GgufQuants, FiveAndSixBitTypesAreRequantizedToQ8) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dd(1e-3f, 2e-2f);
  struct Case {
    GgmlType type;
    std::vector<size_t> f16_at;  // offsets of the block's f16 d / dmin fields
  };
  const Case cases[] = {{GgmlType::kQ5_1, {0, 2}}, {GgmlType::kQ2_K, {80, 82}}, {GgmlType::kQ3_K, {108}},
                        {GgmlType::kQ5_K, {0, 2}}, {GgmlType::kQ6_K, {208}}};
  const int64_t n = 3, k = 512;
  for (const Case& c : cases) {
    const GgmlTypeTraits* tr = ggml_type_traits(uint32_t(c.type));
    ASSERT_TRUE(ggml_requantized_to_q8(uint32_t(c.type))) << tr->name;
    EXPECT_EQ(ggml_kept_quant_format(uint32_t(c.type)), QuantFormat::kQ8) << tr->name;
    EXPECT_FALSE(ggml_exact_quant_format(uint32_t(c.type)).has_value()) << tr->name;
    std::string bytes;
    for (int64_t b = 0; b < n * k / tr->block_size; ++b) {
      std::string block(tr->type_size, '\0');
      for (char& ch : block) ch = char(rng());
      for (size_t at : c.f16_at) {
        const uint16_t d = f32_to_f16(dd(rng));
        std::memcpy(block.data() + at, &d, 2);
      }
      bytes += block;
    }
    const auto* src = reinterpret_cast<const uint8_t*>(bytes.data());
    std::vector<float> want(size_t(n * k));
    tr->to_f32(src, want.data(), n * k);
    const QuantizedRows ref = quantize_rows(want.data(), n, k, QuantFormat::kQ8);
    std::optional<QuantizedRows> q = ggml_to_quantized_rows(uint32_t(c.type), src, n, k);
    ASSERT_TRUE(q.has_value()) << tr->name;
    ASSERT_EQ(q->format, QuantFormat::kQ8);
    EXPECT_EQ(std::memcmp(q->codes.get(), ref.codes.get(), size_t(n * k)), 0) << tr->name;
    EXPECT_EQ(std::memcmp(q->scales.get(), ref.scales.get(), size_t(n * q->groups()) * 2), 0) << tr->name;
    EXPECT_EQ(std::memcmp(q->row_factor.get(), ref.row_factor.get(), size_t(n) * 4), 0) << tr->name;
    std::vector<float> got(static_cast<size_t>(k));
    for (int64_t r = 0; r < n; ++r) {
      dequantize_row(q->codes.get() + size_t(r * k), q->scales.get() + r * q->groups(), nullptr,
                     q->row_factor[size_t(r)], k, QuantFormat::kQ8, got.data());
      for (int64_t i = 0; i < k; ++i) {
        const float step = f16_to_f32(q->scales[size_t(r * q->groups() + i / 32)]) * q->row_factor[size_t(r)];
        ASSERT_LE(std::fabs(got[size_t(i)] - want[size_t(r * k + i)]), 0.5f * step * (1 + 1e-5f))
            << tr->name << " row " << r << " i " << i;
      }
    }
    // A row holding a non-finite value has no image (it then loads as f32, as before).
    std::string bad = bytes;
    const uint16_t inf = 0x7c00;
    std::memcpy(bad.data() + c.f16_at[0], &inf, 2);
    EXPECT_FALSE(ggml_to_quantized_rows(uint32_t(c.type), reinterpret_cast<const uint8_t*>(bad.data()), n, k))
        << tr->name;
  }
}

// ggml_to_quantized_image writes the bytes quant_rows_to_image makes of
// ggml_to_quantized_rows, for every kept type (exact, nearly exact, requantized), and has
// no image where the rows have none.
TEST(GgufQuants, ImagesAreTheRowsLaidOut) {
  std::mt19937 rng(21);
  const int64_t n = 5, k = 256;
  for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ5_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ4_K,
                     GgmlType::kQ5_1, GgmlType::kQ6_K}) {
    const GgmlTypeTraits* tr = ggml_type_traits(uint32_t(t));
    std::string bytes(size_t(n * k / tr->block_size) * tr->type_size, '\0');
    for (char& c : bytes) c = char(rng());
    for (size_t b = 0; b < bytes.size(); b += tr->type_size)  // small finite f16 d / dmin fields
      for (size_t at : t == GgmlType::kQ6_K   ? std::vector<size_t>{208}
                       : t == GgmlType::kQ8_0 || t == GgmlType::kQ5_0 || t == GgmlType::kQ4_0 ? std::vector<size_t>{0}
                                                                                           : std::vector<size_t>{0, 2}) {
        const uint16_t d = f32_to_f16(1e-3f * float(1 + rng() % 100));
        std::memcpy(bytes.data() + b + at, &d, 2);
      }
    if (t == GgmlType::kQ8_0)
      for (size_t b = 0; b < bytes.size(); b += 34)
        for (size_t j = 2; j < 34; ++j)
          if (uint8_t(bytes[b + j]) == 0x80) bytes[b + j] = 0;
    const auto* src = reinterpret_cast<const uint8_t*>(bytes.data());
    std::optional<QuantizedRows> q = ggml_to_quantized_rows(uint32_t(t), src, n, k);
    std::optional<Tensor> img = ggml_to_quantized_image(uint32_t(t), src, n, k);
    ASSERT_TRUE(q.has_value()) << tr->name;
    ASSERT_TRUE(img.has_value()) << tr->name;
    std::vector<uint8_t> want(size_t(n) * quant_image_row_bytes(q->format, k));
    quant_rows_to_image(*q, want.data());
    ASSERT_EQ(img->nbytes(), want.size()) << tr->name;
    EXPECT_EQ(std::memcmp(img->data(), want.data(), want.size()), 0) << tr->name;
  }
  std::string q8(34 * 8, '\0');
  q8[2 + 7] = char(0x80);  // code -128: no image
  EXPECT_FALSE(ggml_to_quantized_image(uint32_t(GgmlType::kQ8_0), reinterpret_cast<const uint8_t*>(q8.data()), 1, 256));
  EXPECT_FALSE(ggml_to_quantized_image(uint32_t(GgmlType::kF16), reinterpret_cast<const uint8_t*>(q8.data()), 1, 32));
}

TEST(GgufQuants, InexactBlocksAndTypesHaveNoImage) {
  EXPECT_FALSE(ggml_exact_quant_format(uint32_t(GgmlType::kQ4_K)).has_value());
  EXPECT_EQ(ggml_kept_quant_format(uint32_t(GgmlType::kQ4_K)), QuantFormat::kQ4);  // nearly exact
  EXPECT_EQ(ggml_kept_quant_format(uint32_t(GgmlType::kQ4_1)), QuantFormat::kQ4);
  EXPECT_FALSE(ggml_exact_quant_format(uint32_t(GgmlType::kQ5_1)).has_value());
  EXPECT_FALSE(ggml_kept_quant_format(uint32_t(GgmlType::kF16)).has_value());
  EXPECT_FALSE(ggml_kept_quant_format(uint32_t(GgmlType::kQ8_K)).has_value());
  std::string q8(34, '\0');
  q8[2 + 7] = char(0x80);  // code -128
  EXPECT_FALSE(ggml_to_quantized_rows(uint32_t(GgmlType::kQ8_0), reinterpret_cast<const uint8_t*>(q8.data()), 1, 32));
  std::string q40(18, '\0');
  const uint16_t big = f32_to_f16(30000.0f);  // -8d overflows f16
  std::memcpy(q40.data(), &big, 2);
  EXPECT_FALSE(ggml_to_quantized_rows(uint32_t(GgmlType::kQ4_0), reinterpret_cast<const uint8_t*>(q40.data()), 1, 32));
  std::string k6(210, '\0');  // zeros: requantized to q8 zeros
  std::optional<QuantizedRows> z6 =
      ggml_to_quantized_rows(uint32_t(GgmlType::kQ6_K), reinterpret_cast<const uint8_t*>(k6.data()), 1, 256);
  ASSERT_TRUE(z6.has_value());
  for (int i = 0; i < 256; ++i) ASSERT_EQ(quant_code(QuantFormat::kQ8, z6->codes.get(), i), 0);
  std::string q41(20 * 2, '\0');
  expect_error([&] { ggml_to_quantized_rows(uint32_t(GgmlType::kQ4_1), reinterpret_cast<const uint8_t*>(q41.data()), 1, 48); },
               ErrorCode::kInvalidArgument, {"Q4_1", "K=48"});
}

// --- corrupt input ---

std::string one_tensor_file() {
  GgufWriter w;
  w.kv_string("general.architecture", "llama");
  std::vector<float> a(8, 1.f);
  w.tensor("w", 0, {8}, raw_bytes(a));
  return w.bytes();
}

void expect_bad(const std::string& bytes, ErrorCode code, std::vector<std::string> needles) {
  needles.push_back("bad.gguf");
  expect_error([&] { parse(bytes, "bad.gguf"); }, code, needles);
}

template <typename T>
void poke(std::string& s, size_t at, T v) {
  std::memcpy(s.data() + at, &v, sizeof(T));
}

TEST(GgufCorrupt, BadMagic) {
  std::string s = one_tensor_file();
  s[0] = 'X';
  expect_bad(s, ErrorCode::kInvalidFile, {"not a GGUF file"});
  expect_bad("GG", ErrorCode::kInvalidFile, {"not a GGUF file"});
}
TEST(GgufCorrupt, BadVersion) {
  std::string s = one_tensor_file();
  poke<uint32_t>(s, 4, 7);
  expect_bad(s, ErrorCode::kInvalidFile, {"version 7"});
  poke<uint32_t>(s, 4, 1);
  expect_bad(s, ErrorCode::kUnsupported, {"version 1"});
}
TEST(GgufCorrupt, AbsurdCounts) {
  std::string s = one_tensor_file();
  poke<uint64_t>(s, 8, 1ull << 60);  // tensor count
  expect_bad(s, ErrorCode::kInvalidFile, {"1152921504606846976 tensors"});
  s = one_tensor_file();
  poke<uint64_t>(s, 16, 1ull << 60);  // kv count
  expect_bad(s, ErrorCode::kInvalidFile, {"metadata entries"});
}
TEST(GgufCorrupt, AbsurdStringLength) {
  std::string s = one_tensor_file();
  poke<uint64_t>(s, 24, 1ull << 60);  // length of the first key
  expect_bad(s, ErrorCode::kInvalidFile, {"length of 1152921504606846976"});
}
TEST(GgufCorrupt, AbsurdArrayCount) {
  GgufWriter w;
  std::string v;
  GgufWriter::put<uint32_t>(v, 8);
  GgufWriter::put<uint64_t>(v, 1ull << 60);
  w.kv_raw("tokenizer.ggml.tokens", 9, v);
  expect_bad(w.bytes(), ErrorCode::kInvalidFile, {"tokenizer.ggml.tokens", "1152921504606846976"});
}
TEST(GgufCorrupt, UnknownValueType) {
  GgufWriter w;
  w.kv<uint32_t>("k", 99, 0);
  expect_bad(w.bytes(), ErrorCode::kInvalidFile, {"'k'", "unknown type 99"});
}
TEST(GgufCorrupt, DeepNesting) {
  GgufWriter w;
  std::string v;
  for (int i = 0; i < 20; ++i) {
    GgufWriter::put<uint32_t>(v, 9);
    GgufWriter::put<uint64_t>(v, 1);
  }
  GgufWriter::put<uint32_t>(v, 4);
  GgufWriter::put<uint64_t>(v, 0);
  w.kv_raw("deep", 9, v);
  expect_bad(w.bytes(), ErrorCode::kInvalidFile, {"nests arrays"});
}
TEST(GgufCorrupt, UnknownTensorType) {
  GgufWriter w;
  w.tensor("w", 77, {4}, std::string(16, '\0'));
  expect_bad(w.bytes(), ErrorCode::kUnsupported, {"tensor 'w'", "ggml type 77"});
}
TEST(GgufCorrupt, TooManyDims) {
  GgufWriter w;
  w.tensor("w", 0, {1, 1, 1, 1, 1}, std::string(4, '\0'));
  expect_bad(w.bytes(), ErrorCode::kInvalidFile, {"5 dimensions"});
}
TEST(GgufCorrupt, ZeroDimWithHugeDims) {
  GgufWriter w;
  w.tensor("w", 0, {0, 1ull << 40, 1ull << 40}, "");
  expect_bad(w.bytes(), ErrorCode::kInvalidFile, {"tensor 'w'", "overflows"});
}
TEST(GgufCorrupt, RowNotMultipleOfBlock) {
  GgufWriter w;
  w.tensor("w", 8, {31}, std::string(34, '\0'));
  expect_bad(w.bytes(), ErrorCode::kInvalidFile, {"31 elements", "Q8_0 block size 32"});
}
TEST(GgufCorrupt, TruncatedTensorData) {
  std::string s = one_tensor_file();
  expect_bad(s.substr(0, s.size() - 4), ErrorCode::kInvalidFile,
             {"tensor 'w'", "[0, 32)", "holds 28", "truncated"});
}
TEST(GgufCorrupt, MisalignedOffset) {
  GgufWriter w;
  w.tensor("w", 0, {1}, std::string(4, '\0'));
  std::string s = w.bytes();
  // The offset is the last 8 bytes of the tensor info, right before the padding.
  const size_t info_end = 24 + 8 + 1 + 4 + 8 + 4 + 8;
  poke<uint64_t>(s, info_end - 8, 4);
  expect_bad(s, ErrorCode::kInvalidFile, {"offset 4", "alignment 32"});
}
TEST(GgufCorrupt, BadAlignment) {
  GgufWriter w;
  w.kv_u32("general.alignment", 48);
  expect_bad(w.bytes(), ErrorCode::kInvalidFile, {"general.alignment", "48"});
}
TEST(GgufCorrupt, DuplicateKey) {
  GgufWriter w;
  w.kv_u32("a", 1);
  w.kv_u32("a", 2);
  expect_bad(w.bytes(), ErrorCode::kInvalidFile, {"'a' appears twice"});
}
// Every prefix of a valid file is a clean error (or, past the header, still valid).
TEST(GgufCorrupt, EveryPrefix) {
  const std::string s = one_tensor_file();
  for (size_t n = 0; n < s.size(); ++n) {
    try {
      parse(s.substr(0, n));
      ADD_FAILURE() << "prefix of " << n << " bytes parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("test.gguf"), std::string::npos);
    }
  }
}

// --- the HF view ---

// A llama GGUF with 2 layers of width 8, 2 heads (head_dim 4) and 1 KV head; q rows
// hold their own row index so the un-permutation can be read off directly; `rope_freqs`:
// its rope_freqs.weight (Llama 3's per-frequency divisors).
std::string tiny_llama(bool with_output, const std::vector<float>& rope_freqs = {1.0f, 2.5f}) {
  GgufWriter w;
  w.kv_string("general.architecture", "llama");
  w.kv_u32("llama.embedding_length", 8);
  w.kv_u32("llama.feed_forward_length", 16);
  w.kv_u32("llama.block_count", 1);
  w.kv_u32("llama.attention.head_count", 2);
  w.kv_u32("llama.attention.head_count_kv", 1);
  w.kv_u32("llama.context_length", 128);
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.kv_f32("llama.rope.freq_base", 10000.f);
  w.kv_string("llama.rope.scaling.type", "linear");
  w.kv_f32("llama.rope.scaling.factor", 2.f);
  w.kv_strings("tokenizer.ggml.tokens", {"a", "b", "c", "d"});
  w.kv_u32("tokenizer.ggml.bos_token_id", 1);
  w.kv_u32("tokenizer.ggml.eos_token_id", 2);
  auto rows = [](int n, int width) {
    std::vector<float> v;
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < width; ++c) v.push_back(float(r));
    return raw_bytes(v);
  };
  w.tensor("token_embd.weight", 0, {8, 4}, rows(4, 8));
  w.tensor("blk.0.attn_q.weight", 0, {8, 8}, rows(8, 8));
  w.tensor("blk.0.attn_k.weight", 0, {8, 4}, rows(4, 8));
  w.tensor("blk.0.attn_v.weight", 0, {8, 4}, rows(4, 8));
  w.tensor("blk.0.ffn_gate.weight", 0, {8, 16}, rows(16, 8));
  w.tensor("output_norm.weight", 0, {8}, rows(1, 8));
  w.tensor("rope_freqs.weight", 0, {uint64_t(rope_freqs.size())}, raw_bytes(rope_freqs));
  if (with_output) w.tensor("output.weight", 0, {8, 4}, rows(4, 8));
  return w.bytes();
}

TEST(GgufHf, LlamaConfig) {
  GgufFile f = parse(tiny_llama(false));
  auto c = gguf_to_hf_config(f);
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["hidden_size"], 8);
  EXPECT_EQ(c["intermediate_size"], 16);
  EXPECT_EQ(c["num_hidden_layers"], 1);
  EXPECT_EQ(c["num_attention_heads"], 2);
  EXPECT_EQ(c["num_key_value_heads"], 1);
  EXPECT_EQ(c["head_dim"], 4);
  EXPECT_EQ(c["max_position_embeddings"], 128);
  EXPECT_EQ(c["vocab_size"], 4);
  EXPECT_EQ(float(c["rms_norm_eps"].get<double>()), 1e-5f);
  EXPECT_EQ(c["rope_theta"], 10000.0);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_EQ(c["rope_scaling"]["rope_type"], "linear");
  EXPECT_EQ(c["rope_scaling"]["factor"], 2.0);
  // Llama 3's scaling as llama.cpp's converter stores it: per-frequency divisors.
  EXPECT_EQ(c[kRopeFreqFactorsConfigKey], (nlohmann::json{1.0, 2.5}));
  EXPECT_EQ(c["bos_token_id"], 1);
  EXPECT_EQ(c["eos_token_id"], 2);
  EXPECT_EQ(gguf_to_hf_config(parse(tiny_llama(true)))["tie_word_embeddings"], false);
}

// A rope_freqs.weight that does not hold one positive divisor per rotary frequency.
TEST(GgufHf, BadRopeFreqs) {
  auto with = [](std::vector<float> v) { return gguf_to_hf_config(parse(tiny_llama(false, v))); };
  expect_error([&] { with({1.0f, 2.0f, 3.0f}); }, ErrorCode::kInvalidFile, {"rope_freqs.weight", "3 frequency factors", "expected 2"});
  expect_error([&] { with({1.0f, 0.0f}); }, ErrorCode::kInvalidFile, {"rope_freqs.weight[1]", "positive"});
  expect_error([&] { with({1.0f, NAN}); }, ErrorCode::kInvalidFile, {"rope_freqs.weight[1]"});
}

// The rotary rows of each head reordered (2d + j -> j * half + d), the others kept; an odd or
// oversized rotary count is an error naming it.
TEST(GgufHf, UnpermuteRowsOfARotaryPrefix) {
  Tensor t(DType::kF32, {12});  // 2 heads of 6 rows, 4 of them rotary
  for (int i = 0; i < 12; ++i) t.data_as<float>()[i] = float(i);
  const Tensor u = gguf_unpermute_rows(t, 2, 4);
  EXPECT_EQ(std::vector<float>(u.data_as<float>(), u.data_as<float>() + 12),
            (std::vector<float>{0, 2, 1, 3, 4, 5, 6, 8, 7, 9, 10, 11}));
  expect_error([&] { gguf_unpermute_rows(t, 2, 3); }, ErrorCode::kInvalidFile, {"3 rotary rows", "heads of 6"});
  expect_error([&] { gguf_unpermute_rows(t, 2, 8); }, ErrorCode::kInvalidFile, {"8 rotary rows"});
}

TEST(GgufHf, LlamaNamesAndPermutation) {
  auto file = std::make_shared<const GgufFile>(parse(tiny_llama(true)));
  GgufWeightSource src(file);
  EXPECT_TRUE(src.has("model.embed_tokens.weight"));
  EXPECT_TRUE(src.has("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_TRUE(src.has("model.norm.weight"));
  EXPECT_TRUE(src.has("lm_head.weight"));
  EXPECT_TRUE(src.has("rope_freqs.weight"));  // no HF counterpart: kept under its GGUF name
  EXPECT_EQ(src.gguf_name("model.layers.0.self_attn.v_proj.weight"), "blk.0.attn_v.weight");
  EXPECT_EQ(src.info("model.layers.0.mlp.gate_proj.weight").shape, (std::vector<int64_t>{16, 8}));
  // head_dim 4, half 2: HF row h*4 + j*2 + d comes from GGUF row h*4 + 2*d + j.
  Tensor q = src.load("model.layers.0.self_attn.q_proj.weight", DType::kF32);
  std::vector<float> got;
  for (int r = 0; r < 8; ++r) got.push_back(q.data_as<float>()[r * 8]);
  EXPECT_EQ(got, (std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7}));
  Tensor k = src.load("model.layers.0.self_attn.k_proj.weight", DType::kF16);  // one KV head
  std::vector<float> gk;
  for (int r = 0; r < 4; ++r) gk.push_back(f16_to_f32(k.data_as<uint16_t>()[r * 8 + 3]));
  EXPECT_EQ(gk, (std::vector<float>{0, 2, 1, 3}));
  Tensor v = src.load("model.layers.0.self_attn.v_proj.weight", DType::kF32);  // untouched
  EXPECT_EQ(v.data_as<float>()[8], 1.f);
  expect_error([&] { src.load("model.layers.9.mlp.up_proj.weight", DType::kF32); },
               ErrorCode::kNotFound, {"model.layers.9.mlp.up_proj.weight"});
}

TEST(GgufHf, Gpt2TransposesConv1D) {
  GgufWriter w;
  w.kv_string("general.architecture", "gpt2");
  w.kv_u32("gpt2.embedding_length", 2);
  w.kv_u32("gpt2.block_count", 1);
  w.kv_u32("gpt2.attention.head_count", 1);
  w.kv_u32("gpt2.context_length", 16);
  w.kv_f32("gpt2.attention.layer_norm_epsilon", 1e-5f);
  std::vector<float> qkv = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};  // [out 6, in 2]
  w.tensor("blk.0.attn_qkv.weight", 0, {2, 6}, raw_bytes(qkv));
  w.tensor("token_embd.weight", 0, {2, 3}, raw_bytes(std::vector<float>(6, 0.f)));
  auto file = std::make_shared<const GgufFile>(parse(w.bytes()));
  auto c = gguf_to_hf_config(*file);
  EXPECT_EQ(c["model_type"], "gpt2");
  EXPECT_EQ(c["n_embd"], 2);
  EXPECT_EQ(c["vocab_size"], 3);
  GgufWeightSource src(file);
  EXPECT_EQ(src.info("h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{2, 6}));
  Tensor t = src.load("h.0.attn.c_attn.weight", DType::kF32);
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(t.data_as<float>()[1], 2.f);  // HF [in, out][0][1] = GGUF [out, in][1][0]
  EXPECT_TRUE(src.has("wte.weight"));
}

// Gemma GGUFs as llama.cpp reads them: the 27B shapes (46 / 62 layers) scale attention by
// (hidden / heads)^-1/2, the others by head_dim^-1/2; Gemma 3's layers slide five in six
// (every sixth global) unless the file says otherwise, its local RoPE base defaults to 1e4;
// Gemma 2's window and soft-caps default to 4096, 50 and 30; a per-layer pattern of the
// wrong length is an error.
TEST(GgufHf, GemmaConfig) {
  auto gemma = [](const std::string& arch, uint32_t layers, std::function<void(GgufWriter&)> extra = {}) {
    GgufWriter w;
    w.kv_string("general.architecture", arch);
    w.kv_u32(arch + ".embedding_length", 64);
    w.kv_u32(arch + ".block_count", layers);
    w.kv_u32(arch + ".attention.head_count", 4);
    w.kv_u32(arch + ".attention.head_count_kv", 2);
    w.kv_u32(arch + ".attention.key_length", 32);
    w.kv_u32(arch + ".feed_forward_length", 128);
    w.kv_u32(arch + ".vocab_size", 10);
    if (extra) extra(w);
    return gguf_to_hf_config(parse(w.bytes()));
  };
  auto g3 = gemma("gemma3", 12, [](GgufWriter& w) { w.kv_u32("gemma3.attention.sliding_window", 512); });
  EXPECT_EQ(g3["model_type"], "gemma3_text");
  EXPECT_EQ(g3["query_pre_attn_scalar"], 32);
  EXPECT_EQ(g3["sliding_window"], 512);
  EXPECT_EQ(g3["layer_types"][4], "sliding_attention");
  EXPECT_EQ(g3["layer_types"][5], "full_attention");
  EXPECT_EQ(g3["layer_types"][11], "full_attention");
  EXPECT_EQ(g3["rope_parameters"]["sliding_attention"]["rope_theta"], 10000.0);
  EXPECT_EQ(g3["rope_parameters"]["full_attention"]["rope_theta"], 1000000.0);
  EXPECT_FALSE(g3.contains("final_logit_softcapping"));
  EXPECT_EQ(g3[kNormsOnePlusConfigKey], true);
  EXPECT_EQ(gemma("gemma3", 62)["query_pre_attn_scalar"], 16);  // 27B: hidden / heads
  EXPECT_TRUE(gemma("gemma3", 2)["sliding_window"].is_null());  // no window key: every layer global
  auto g2 = gemma("gemma2", 4);
  EXPECT_EQ(g2["model_type"], "gemma2");
  EXPECT_EQ(g2["sliding_window"], 4096);
  EXPECT_EQ(g2["layer_types"], (nlohmann::json{"sliding_attention", "full_attention", "sliding_attention",
                                                "full_attention"}));
  EXPECT_EQ(g2["attn_logit_softcapping"], 50.0);
  EXPECT_EQ(g2["final_logit_softcapping"], 30.0);
  EXPECT_EQ(gemma("gemma2", 46)["query_pre_attn_scalar"], 16);
  expect_error(
      [&] {
        gemma("gemma3", 3, [](GgufWriter& w) {
          w.kv_u32("gemma3.attention.sliding_window", 8);
          w.kv_array("gemma3.attention.sliding_window_pattern", 7, std::vector<uint8_t>{1, 0});
        });
      },
      ErrorCode::kInvalidFile, {"sliding_window_pattern", "3 bools"});
  expect_error([&] { gemma("gemma2", 2, [](GgufWriter& w) { w.kv_f32("gemma2.rope.freq_base_swa", 5e4f); }); },
               ErrorCode::kUnsupported, {"freq_base_swa"});
  // A corrupt layer count is an error, not billions of per-layer entries (found by fuzzing).
  expect_error([&] { gemma("gemma3", 4000000000u); }, ErrorCode::kInvalidFile, {"block_count", "4000000000"});
}

// Phi-3 as llama.cpp's converter writes it (Phi-3.5-mini's shape, scaled down): the
// rotary dims as partial_rotary_factor, a window of 0 as none, LongRoPE from the
// rope_factors_* tensors and the rope.scaling keys; malformed ones name what is wrong.
TEST(GgufHf, Phi3Config) {
  auto phi3 = [](std::function<void(GgufWriter&)> extra = {}) {
    GgufWriter w;
    w.kv_string("general.architecture", "phi3");
    w.kv_u32("phi3.embedding_length", 64);
    w.kv_u32("phi3.block_count", 2);
    w.kv_u32("phi3.attention.head_count", 4);
    w.kv_u32("phi3.attention.head_count_kv", 4);
    w.kv_u32("phi3.feed_forward_length", 128);
    w.kv_u32("phi3.vocab_size", 10);
    w.kv_u32("phi3.context_length", 1024);
    w.kv_u32("phi3.rope.scaling.original_context_length", 256);
    w.kv_u32("phi3.attention.sliding_window", 0);
    if (extra) extra(w);
    return gguf_to_hf_config(parse(w.bytes()));
  };
  auto factors = [](GgufWriter& w, const char* name, std::vector<float> v) {
    w.tensor(name, 0, {uint64_t(v.size())}, std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
  };
  auto plain = phi3([](GgufWriter& w) { w.kv_u32("phi3.rope.dimension_count", 12); });
  EXPECT_EQ(plain["model_type"], "phi3");
  EXPECT_DOUBLE_EQ(plain["partial_rotary_factor"].get<double>(), 0.75);
  EXPECT_TRUE(plain["sliding_window"].is_null());
  EXPECT_EQ(plain["max_position_embeddings"], 1024);
  EXPECT_EQ(plain["original_max_position_embeddings"], 256);
  EXPECT_FALSE(plain.contains("rope_scaling"));
  auto lr = phi3([&](GgufWriter& w) {
    w.kv_f32("phi3.rope.scaling.attn_factor", 1.25f);
    factors(w, "rope_factors_short.weight", {1, 1, 1, 1, 1, 1, 1, 1});
    factors(w, "rope_factors_long.weight", {1, 2, 3, 4, 5, 6, 7, 8});
  });
  EXPECT_EQ(lr["rope_scaling"]["type"], "longrope");
  EXPECT_EQ(lr["rope_scaling"]["long_factor"][7], 8.0);
  EXPECT_EQ(lr["rope_scaling"]["attention_factor"], 1.25);
  EXPECT_EQ(lr["rope_scaling"]["original_max_position_embeddings"], 256);
  expect_error([&] { phi3([&](GgufWriter& w) { factors(w, "rope_factors_long.weight", {1, 2, 3, 4, 5, 6, 7, 8}); }); },
               ErrorCode::kInvalidFile, {"rope_factors_short.weight", "only the long"});
  expect_error(
      [&] {
        phi3([&](GgufWriter& w) {
          factors(w, "rope_factors_short.weight", {1, 1, 1});
          factors(w, "rope_factors_long.weight", {1, 2, 3});
        });
      },
      ErrorCode::kInvalidFile, {"rope_factors_short.weight", "3 factors", "expected 8"});
  expect_error([&] { phi3([](GgufWriter& w) { w.kv_u32("phi3.rope.dimension_count", 17); }); }, ErrorCode::kInvalidFile,
               {"rope.dimension_count 17", "head dim 16"});
}

TEST(GgufHf, UnsupportedArchitecture) {
  GgufWriter w;
  w.kv_string("general.architecture", "mamba");
  expect_error([&] { gguf_to_hf_config(parse(w.bytes())); }, ErrorCode::kUnsupported,
               {"mamba", "llama"});
}

TEST(GgufHf, HfModelDirOpensGguf) {
  TempDir dir;
  write_file(dir.file("tiny.gguf"), tiny_llama(false));
  auto m = HfModelDir::open(dir.path());  // no config.json: the one GGUF is used
  EXPECT_EQ(m.config["model_type"], "llama");
  EXPECT_TRUE(m.weights->has("model.layers.0.self_attn.q_proj.weight"));
  auto m2 = HfModelDir::open(dir.file("tiny.gguf"));
  EXPECT_NE(m2.weights->describe().find("tiny.gguf"), std::string::npos);
}

// --- the real SmolLM2-135M-Instruct Q4_1 GGUF (Q8_0 embeddings, Q4_1, F32) ---

std::string smollm2_path() {
  return models_dir() + "/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(GgufReal, SmolLM2MatchesGgufPy) {
  if (!std::filesystem::exists(smollm2_path())) GTEST_SKIP() << "no " << smollm2_path();
  GgufFile f = GgufFile::open(smollm2_path());
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.get_array_strings("tokenizer.ggml.tokens").size(), 49152u);
  const auto real = fixture()["real"];
  ASSERT_EQ(real.size(), 4u) << "regenerate with tests/frontends/gen_gguf_fixtures.py";
  for (const auto& r : real) {
    const std::string name = r["name"];
    Tensor t = f.load(name, DType::kF32);
    EXPECT_EQ(t.shape(), r["shape"].get<std::vector<int64_t>>()) << name;
    const float* p = t.data_as<float>();
    auto row0 = r["row0"].get<std::vector<float>>();
    auto last = r["row_last"].get<std::vector<float>>();
    for (size_t i = 0; i < row0.size(); ++i) ASSERT_EQ(p[i], row0[i]) << name << " [" << i << "]";
    for (size_t i = 0; i < last.size(); ++i)
      ASSERT_EQ(p[t.numel() - 64 + int64_t(i)], last[i]) << name;
  }
}

// Against transformers' own GGUF loading (tests/fixtures/models/smollm2/reference.json).
TEST(GgufReal, SmolLM2MatchesTransformers) {
  const std::string ref_path = std::string(KILN_FIXTURES_DIR) + "/models/smollm2/reference.json";
  if (!std::filesystem::exists(smollm2_path())) GTEST_SKIP() << "no " << smollm2_path();
  if (!std::filesystem::exists(ref_path)) GTEST_SKIP() << "no " << ref_path;
  auto ref = read_json_file(ref_path);
  auto m = HfModelDir::open(smollm2_path());
  for (const char* k : {"hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                        "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
                        "eos_token_id", "rope_theta", "rms_norm_eps"}) {
    // GGUF stores these as f32; kiln writes the shortest decimal of that f32 ("1e-05")
    // where transformers writes the f32 widened to double: equal as f32.
    if (m.config[k].is_number_float() || ref["derived_config"][k].is_number_float())
      EXPECT_EQ(m.config[k].get<float>(), ref["derived_config"][k].get<float>()) << k;
    else
      EXPECT_EQ(m.config[k], ref["derived_config"][k]) << k;
  }
  int checked = 0;
  for (const auto& e : ref["gguf_fingerprint"]) {
    const std::string hf = e["hf_name"];
    ASSERT_TRUE(m.weights->has(hf)) << hf;
    Tensor t = m.weights->load(hf, DType::kF32);
    EXPECT_EQ(t.shape(), e["hf_shape"].get<std::vector<int64_t>>()) << hf;
    double sum = 0, abs_sum = 0;
    const float* p = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) sum += p[i], abs_sum += std::fabs(p[i]);
    EXPECT_NEAR(abs_sum, e["hf_abs_sum"].get<double>(), 1e-6 * abs_sum) << hf;
    EXPECT_NEAR(sum, e["hf_sum"].get<double>(), 1e-6 * abs_sum) << hf;
    if (e.contains("hf[:2,:4]")) {
      const auto& corner = e["hf[:2,:4]"];
      for (int r = 0; r < 2; ++r)
        for (int c = 0; c < 4; ++c)
          EXPECT_EQ(p[r * t.dim(1) + c], corner[r][c].get<float>()) << hf << " [" << r << "," << c << "]";
    }
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

}  // namespace
}  // namespace kiln
