// WeightSource over one safetensors file or a sharded HF checkpoint (see weight_source.h).
#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "core/status.h"
#include "frontends/safetensors.h"
#include "frontends/weight_source.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// The file's own bytes, when they are aligned for the dtype (the format lets the data
// section start at any offset).
std::optional<Tensor> aligned_view(const SafetensorsFile& f, const std::string& name) {
  Tensor t = f.tensor(name);
  if (reinterpret_cast<uintptr_t>(t.data()) % dtype_size(t.dtype()) != 0) return std::nullopt;
  return t;
}

class SafetensorsSource final : public WeightSource {
 public:
  explicit SafetensorsSource(SafetensorsFile f) : file_(std::move(f)) {}
  std::vector<std::string> names() const override { return file_.names(); }
  bool has(const std::string& name) const override { return file_.has(name); }
  TensorInfo info(const std::string& name) const override { return file_.info(name); }
  Tensor load(const std::string& name, DType want) const override {
    return file_.tensor_copy(name, want);
  }
  std::optional<Tensor> view(const std::string& name) const override { return aligned_view(file_, name); }
  std::string describe() const override { return "safetensors '" + file_.path() + "'"; }

 private:
  SafetensorsFile file_;
};

class ShardedSource final : public WeightSource {
 public:
  ShardedSource(std::string index_path, std::vector<SafetensorsFile> shards,
                std::map<std::string, size_t> where)
      : index_path_(std::move(index_path)), shards_(std::move(shards)), where_(std::move(where)) {}

  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    out.reserve(where_.size());
    for (const auto& [name, shard] : where_) out.push_back(name);
    return out;
  }
  bool has(const std::string& name) const override { return where_.count(name) != 0; }
  TensorInfo info(const std::string& name) const override { return shard(name).info(name); }
  Tensor load(const std::string& name, DType want) const override {
    return shard(name).tensor_copy(name, want);
  }
  std::optional<Tensor> view(const std::string& name) const override { return aligned_view(shard(name), name); }
  std::string describe() const override {
    return "sharded safetensors '" + index_path_ + "' (" + std::to_string(shards_.size()) +
           " shards)";
  }

 private:
  const SafetensorsFile& shard(const std::string& name) const {
    auto it = where_.find(name);
    if (it == where_.end())
      throw_error(ErrorCode::kNotFound, index_path_, ": weight_map has no tensor named '", name,
                  "'");
    return shards_[it->second];
  }

  std::string index_path_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, size_t> where_;  // tensor name -> index into shards_
};

}  // namespace

std::unique_ptr<WeightSource> open_safetensors_source(const std::string& path) {
  return std::make_unique<SafetensorsSource>(SafetensorsFile::open(path));
}

std::unique_ptr<WeightSource> open_sharded_safetensors_source(const std::string& index_path) {
  using nlohmann::json;
  const std::string& p = index_path;
  std::string text = read_text_file(p);
  json index;
  try {
    index = json::parse(text);
  } catch (const json::parse_error& e) {
    throw_error(ErrorCode::kInvalidFile, p, ": not valid JSON (byte ", e.byte, "): ", e.what());
  } catch (const json::exception& e) {
    throw_error(ErrorCode::kInvalidFile, p, ": not valid JSON: ", e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw_error(ErrorCode::kInvalidFile, p,
                ": expected a JSON object with a 'weight_map' object (tensor name -> shard file)");
  const fs::path dir = fs::path(p).parent_path();
  std::vector<SafetensorsFile> shards;
  std::map<std::string, size_t> shard_index;  // shard file name -> index into shards
  std::map<std::string, size_t> where;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      throw_error(ErrorCode::kInvalidFile, p, ": weight_map['", it.key(),
                  "'] must be a shard file name, found ", it.value().type_name());
    const std::string file = it.value().get<std::string>();
    // Shards are siblings of the index; refuse paths that would escape the model dir.
    fs::path rel(file);
    if (file.empty() || rel.is_absolute() ||
        std::any_of(rel.begin(), rel.end(), [](const fs::path& c) { return c == ".."; }))
      throw_error(ErrorCode::kInvalidFile, p, ": weight_map['", it.key(), "'] names shard '",
                  file, "', which is not a file name inside the model directory");
    auto s = shard_index.find(file);
    if (s == shard_index.end()) {
      const std::string shard_path = (dir / rel).string();
      if (!fs::exists(shard_path))
        throw_error(ErrorCode::kNotFound, p, ": shard '", file, "' (holding tensor '", it.key(),
                    "') does not exist at '", shard_path, "' (incomplete download?)");
      shards.push_back(SafetensorsFile::open(shard_path));
      s = shard_index.emplace(file, shards.size() - 1).first;
    }
    if (!shards[s->second].has(it.key()))
      throw_error(ErrorCode::kInvalidFile, p, ": weight_map puts tensor '", it.key(),
                  "' in shard '", file, "', but that shard has no such tensor");
    where.emplace(it.key(), s->second);
  }
  return std::make_unique<ShardedSource>(p, std::move(shards), std::move(where));
}

}  // namespace kiln
