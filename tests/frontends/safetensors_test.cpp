// Tests of the safetensors reader, its WeightSources and HfModelDir: round trips of
// files written here, and every class of corrupt input giving a clear kiln::Error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "frontends/hf_dir.h"
#include "frontends/safetensors.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::expect_error;
using test::raw_bytes;
using test::safetensors_bytes;
using test::TempDir;
using test::write_file;

// Two tensors: "a" f32 [2,3] = 0..5 and "b" f16 [4] = 1,2,3,4; header padded by one
// byte so that the data section is deliberately misaligned.
std::string two_tensor_file() {
  std::vector<float> a = {0, 1, 2, 3, 4, 5};
  std::vector<uint16_t> b;
  for (float x : {1.f, 2.f, 3.f, 4.f}) b.push_back(f32_to_f16(x));
  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"F16","shape":[4],"data_offsets":[24,32]}} )";
  return safetensors_bytes(header, raw_bytes(a) + raw_bytes(b));
}

TEST(Safetensors, RoundTrip) {
  TempDir dir;
  write_file(dir.file("m.safetensors"), two_tensor_file());
  auto f = SafetensorsFile::open(dir.file("m.safetensors"));
  ASSERT_EQ(f.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(f.has("a"));
  EXPECT_FALSE(f.has("__metadata__"));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.info("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.info("b").dtype, DType::kF16);
  EXPECT_EQ(f.info("b").nbytes, 8u);

  Tensor va = f.tensor("a");
  EXPECT_EQ(va.dtype(), DType::kF32);
  float x;
  std::memcpy(&x, static_cast<const char*>(va.data()) + 4 * 5, 4);  // view may be unaligned
  EXPECT_EQ(x, 5.f);

  Tensor cb = f.tensor_copy("b", DType::kF32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(cb.data()) % kTensorAlignment, 0u);
  EXPECT_EQ(cb.data_as<float>()[3], 4.f);
  Tensor ca = f.tensor_copy("a", DType::kBF16);
  EXPECT_EQ(bf16_to_f32(ca.data_as<uint16_t>()[2]), 2.f);
}

TEST(Safetensors, ViewOutlivesFileObject) {
  TempDir dir;
  write_file(dir.file("m.safetensors"), two_tensor_file());
  Tensor v;
  { v = SafetensorsFile::open(dir.file("m.safetensors")).tensor("b"); }
  uint16_t h;
  std::memcpy(&h, v.data(), 2);
  EXPECT_EQ(f16_to_f32(h), 1.f);
}

TEST(Safetensors, FromMemoryAndEmptyTensor) {
  std::string bytes = safetensors_bytes(
      R"({"e":{"dtype":"I32","shape":[0,7],"data_offsets":[0,0]}})", "");
  auto f = SafetensorsFile::from_memory(reinterpret_cast<const uint8_t*>(bytes.data()),
                                        bytes.size(), "mem");
  EXPECT_EQ(f.info("e").nbytes, 0u);
  EXPECT_EQ(f.tensor_copy("e", DType::kI32).numel(), 0);
}

void expect_bad(const std::string& bytes, ErrorCode code, std::vector<std::string> needles) {
  TempDir dir;
  std::string path = dir.file("model.safetensors");
  write_file(path, bytes);
  needles.push_back("model.safetensors");
  expect_error([&] { SafetensorsFile::open(path); }, code, needles);
}

TEST(SafetensorsCorrupt, TooSmall) {
  expect_bad("abc", ErrorCode::kInvalidFile, {"too small"});
}
TEST(SafetensorsCorrupt, Truncated) {
  std::string good = two_tensor_file();
  expect_bad(good.substr(0, good.size() - 4), ErrorCode::kInvalidFile,
             {"tensor 'b'", "data_offsets [24, 32] need 32 bytes", "holds 28", "truncated"});
}
TEST(SafetensorsCorrupt, HeaderLongerThanFile) {
  expect_bad(test::le64(1000) + "{}", ErrorCode::kInvalidFile, {"header length 1000", "2 bytes"});
}
TEST(SafetensorsCorrupt, HugeHeaderLength) {
  expect_bad(test::le64(~0ull) + "{}", ErrorCode::kInvalidFile, {"header length"});
}
TEST(SafetensorsCorrupt, InvalidJson) {
  expect_bad(safetensors_bytes(R"({"a": {"dtype": )", ""), ErrorCode::kInvalidFile,
             {"not valid JSON", "byte"});
}
TEST(SafetensorsCorrupt, HeaderNotObject) {
  expect_bad(safetensors_bytes("[1,2]", ""), ErrorCode::kInvalidFile, {"JSON object"});
}
TEST(SafetensorsCorrupt, OffsetsOutOfRange) {
  expect_bad(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                               std::string(4, '\0')),
             ErrorCode::kInvalidFile, {"tensor 'w'", "[8, 12]", "holds 4"});
}
TEST(SafetensorsCorrupt, BeginAfterEnd) {
  expect_bad(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})",
                               std::string(4, '\0')),
             ErrorCode::kInvalidFile, {"begin after end"});
}
TEST(SafetensorsCorrupt, NumelBytesMismatch) {
  expect_bad(safetensors_bytes(R"({"w":{"dtype":"F16","shape":[3,2],"data_offsets":[0,8]}})",
                               std::string(8, '\0')),
             ErrorCode::kInvalidFile, {"tensor 'w'", "span 8 bytes", "[3, 2]", "need 12"});
}
TEST(SafetensorsCorrupt, UnknownDType) {
  expect_bad(safetensors_bytes(R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})",
                               std::string(1, '\0')),
             ErrorCode::kInvalidFile, {"unknown dtype 'Q4'"});
}
TEST(SafetensorsCorrupt, UnsupportedDType) {
  expect_bad(safetensors_bytes(R"({"w":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}})",
                               std::string(1, '\0')),
             ErrorCode::kUnsupported, {"BOOL"});
}
TEST(SafetensorsCorrupt, NegativeShape) {
  expect_bad(safetensors_bytes(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", ""),
             ErrorCode::kInvalidFile, {"non-negative"});
}
TEST(SafetensorsCorrupt, ShapeOverflow) {
  expect_bad(safetensors_bytes(
                 R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
                 ""),
             ErrorCode::kInvalidFile, {"overflows"});
}
TEST(SafetensorsCorrupt, ZeroDimWithHugeDims) {
  expect_bad(safetensors_bytes(
                 R"({"w":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})",
                 ""),
             ErrorCode::kInvalidFile, {"overflows"});
}
TEST(SafetensorsCorrupt, NumberTooLargeForJson) {
  expect_bad(safetensors_bytes(R"({"w": 7E7777777})", ""), ErrorCode::kInvalidFile,
             {"not valid JSON"});
}
TEST(SafetensorsCorrupt, MissingFields) {
  expect_bad(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1]}})", ""),
             ErrorCode::kInvalidFile, {"data_offsets"});
  expect_bad(safetensors_bytes(R"({"w":3})", ""), ErrorCode::kInvalidFile, {"must be an object"});
}
TEST(Safetensors, MissingTensorAndFile) {
  TempDir dir;
  write_file(dir.file("m.safetensors"), two_tensor_file());
  auto f = SafetensorsFile::open(dir.file("m.safetensors"));
  expect_error([&] { f.info("zzz"); }, ErrorCode::kNotFound, {"zzz", "m.safetensors"});
  expect_error([&] { SafetensorsFile::open(dir.file("nope.safetensors")); }, ErrorCode::kNotFound,
               {"nope.safetensors"});
}

// --- sharded checkpoints and HF directories ---

void write_sharded(const TempDir& dir) {
  std::vector<float> a = {1, 2}, b = {3, 4, 5};
  write_file(dir.file("model-00001-of-00002.safetensors"),
             safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                               raw_bytes(a)));
  write_file(dir.file("model-00002-of-00002.safetensors"),
             safetensors_bytes(R"({"b":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})",
                               raw_bytes(b)));
  write_file(dir.file("model.safetensors.index.json"),
             R"({"metadata":{"total_size":20},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
             R"("b":"model-00002-of-00002.safetensors"}})");
  write_file(dir.file("config.json"), R"({"model_type":"llama","hidden_size":8})");
}

TEST(Sharded, LoadsAcrossShards) {
  TempDir dir;
  write_sharded(dir);
  auto src = open_sharded_safetensors_source(dir.file("model.safetensors.index.json"));
  EXPECT_EQ(src->names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(src->info("b").shape, (std::vector<int64_t>{3}));
  Tensor b = src->load("b", DType::kF16);
  EXPECT_EQ(f16_to_f32(b.data_as<uint16_t>()[2]), 5.f);
  EXPECT_NE(src->describe().find("2 shards"), std::string::npos);
}

TEST(Sharded, MissingShard) {
  TempDir dir;
  write_sharded(dir);
  std::filesystem::remove(dir.file("model-00002-of-00002.safetensors"));
  expect_error([&] { open_sharded_safetensors_source(dir.file("model.safetensors.index.json")); },
               ErrorCode::kNotFound, {"model-00002-of-00002.safetensors", "'b'", "does not exist"});
}

TEST(Sharded, TensorNotInShard) {
  TempDir dir;
  write_sharded(dir);
  write_file(dir.file("model.safetensors.index.json"),
             R"({"weight_map":{"b":"model-00001-of-00002.safetensors"}})");
  expect_error([&] { open_sharded_safetensors_source(dir.file("model.safetensors.index.json")); },
               ErrorCode::kInvalidFile, {"'b'", "no such tensor"});
}

TEST(Sharded, PathEscape) {
  TempDir dir;
  write_sharded(dir);
  write_file(dir.file("model.safetensors.index.json"), R"({"weight_map":{"b":"../x.safetensors"}})");
  expect_error([&] { open_sharded_safetensors_source(dir.file("model.safetensors.index.json")); },
               ErrorCode::kInvalidFile, {"../x.safetensors"});
}

TEST(HfDir, OpensShardedDir) {
  TempDir dir;
  write_sharded(dir);
  auto m = HfModelDir::open(dir.path());
  EXPECT_EQ(m.config["model_type"], "llama");
  EXPECT_TRUE(m.weights->has("a"));
  EXPECT_EQ(m.weights->load("a", DType::kF32).data_as<float>()[1], 2.f);
}

TEST(HfDir, OpensSingleFileDir) {
  TempDir dir;
  write_file(dir.file("model.safetensors"), two_tensor_file());
  write_file(dir.file("config.json"), R"({"model_type":"bert"})");
  auto m = HfModelDir::open(dir.path());
  EXPECT_EQ(m.weights->names().size(), 2u);
  EXPECT_NE(m.weights->describe().find("model.safetensors"), std::string::npos);
}

TEST(HfDir, MissingConfig) {
  TempDir dir;
  write_file(dir.file("model.safetensors"), two_tensor_file());
  expect_error([&] { HfModelDir::open(dir.path()); }, ErrorCode::kNotFound, {"config.json"});
}

TEST(HfDir, InvalidConfig) {
  TempDir dir;
  write_file(dir.file("model.safetensors"), two_tensor_file());
  write_file(dir.file("config.json"), "{\"model_type\": \"llama\",\n  \"hidden_size\": }");
  expect_error([&] { HfModelDir::open(dir.path()); }, ErrorCode::kInvalidFile,
               {"config.json", "byte"});
}

TEST(HfDir, PytorchBinUnsupported) {
  TempDir dir;
  write_file(dir.file("config.json"), "{}");
  write_file(dir.file("pytorch_model.bin"), "PK");
  expect_error([&] { HfModelDir::open(dir.path()); }, ErrorCode::kUnsupported,
               {"safetensors"});
}

TEST(HfDir, NoWeights) {
  TempDir dir;
  write_file(dir.file("config.json"), "{}");
  expect_error([&] { HfModelDir::open(dir.path()); }, ErrorCode::kNotFound, {"model.safetensors"});
}

TEST(HfDir, RealMiniLm) {
  const char* env = std::getenv("KILN_MODELS_DIR");
  std::string root = env ? env : std::string(KILN_SOURCE_DIR) + "/.cache/models";
  std::string dir = root + "/all-minilm-l6-v2";
  if (!std::filesystem::exists(dir + "/model.safetensors"))
    GTEST_SKIP() << "no " << dir << " (set KILN_MODELS_DIR)";
  auto m = HfModelDir::open(dir);
  EXPECT_EQ(m.config["model_type"], "bert");
  ASSERT_FALSE(m.weights->names().empty());
  for (const auto& n : m.weights->names()) {
    Tensor t = m.weights->load(n, DType::kF32);
    EXPECT_EQ(t.shape(), m.weights->info(n).shape) << n;
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_TRUE(std::isfinite(t.data_as<float>()[i])) << n;
  }
}

}  // namespace
}  // namespace kiln
