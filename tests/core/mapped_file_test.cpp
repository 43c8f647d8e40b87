// MappedFile maps files read-only and reports missing files clearly.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/mapped_file.h"
#include "core/status.h"

namespace kiln {

TEST(MappedFile, MapsContents) {
  auto path = std::filesystem::temp_directory_path() / "kiln_mapped_file_test.bin";
  { std::ofstream(path, std::ios::binary) << "hello kiln"; }
  auto f = MappedFile::open(path.string());
  EXPECT_EQ(f->size(), 10u);
  EXPECT_EQ(f->view(), "hello kiln");
  std::filesystem::remove(path);
}

TEST(MappedFile, MissingFileIsNotFound) {
  try {
    MappedFile::open("/nonexistent/kiln/file.bin");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/kiln/file.bin"), std::string::npos);
  }
}

}  // namespace kiln
