// The environment switch parser (core/env_switch.h): what a switch accepts, and the error
// naming the variable for anything else.
#include <gtest/gtest.h>

#include <string>

#include "core/env_switch.h"
#include "core/status.h"

namespace kiln {
namespace {

// The message of the error parse() throws, or "" when it throws none.
template <typename F>
std::string error_of(F&& parse) {
  try {
    (void)parse();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(EnvSwitch, DefaultOnSwitch) {
  EXPECT_TRUE(env_switch_value("KILN_X", nullptr, "on", "off"));
  EXPECT_TRUE(env_switch_value("KILN_X", "", "on", "off"));
  EXPECT_TRUE(env_switch_value("KILN_X", "1", "on", "off"));
  EXPECT_FALSE(env_switch_value("KILN_X", "0", "on", "off"));
  const std::string e = error_of([] { return env_switch_value("KILN_X", "yes", "the fast way", "the slow way"); });
  EXPECT_NE(e.find("KILN_X='yes'"), std::string::npos) << e;
  EXPECT_NE(e.find("expected 1, the default: the fast way, or 0: the slow way"), std::string::npos) << e;
}

TEST(EnvSwitch, DefaultOffSwitch) {
  EXPECT_FALSE(env_switch_off_value("KILN_X", nullptr, "off", "on"));
  EXPECT_FALSE(env_switch_off_value("KILN_X", "", "off", "on"));
  EXPECT_FALSE(env_switch_off_value("KILN_X", "0", "off", "on"));
  EXPECT_TRUE(env_switch_off_value("KILN_X", "1", "off", "on"));
  const std::string e = error_of(
      [] { return env_switch_off_value("KILN_X", "yes", "the slow way", "the fast way"); });
  EXPECT_NE(e.find("KILN_X='yes'"), std::string::npos) << e;
  EXPECT_NE(e.find("expected 0, the default: the slow way, or 1: the fast way"), std::string::npos)
      << e;
}

TEST(EnvSwitch, AutoSetting) {
  EXPECT_EQ(env_auto_value("KILN_X", nullptr, "a", "on", "off"), EnvAuto::kAuto);
  EXPECT_EQ(env_auto_value("KILN_X", "", "a", "on", "off"), EnvAuto::kAuto);
  EXPECT_EQ(env_auto_value("KILN_X", "auto", "a", "on", "off"), EnvAuto::kAuto);
  EXPECT_EQ(env_auto_value("KILN_X", "1", "a", "on", "off"), EnvAuto::kOn);
  EXPECT_EQ(env_auto_value("KILN_X", "0", "a", "on", "off"), EnvAuto::kOff);
  const std::string e =
      error_of([] { return env_auto_value("KILN_X", "2", "by size", "always", "never"); });
  EXPECT_NE(e.find("KILN_X='2'"), std::string::npos) << e;
  EXPECT_NE(e.find("expected auto, the default: by size; 1: always; 0: never"), std::string::npos)
      << e;
}

TEST(EnvSwitch, Count) {
  EXPECT_EQ(env_count_value("KILN_N", nullptr, 32, 0, 64, "rows"), 32);
  EXPECT_EQ(env_count_value("KILN_N", "", 32, 0, 64, "rows"), 32);
  EXPECT_EQ(env_count_value("KILN_N", "0", 32, 0, 64, "rows"), 0);
  EXPECT_EQ(env_count_value("KILN_N", "64", 32, 0, 64, "rows"), 64);
  for (const char* bad : {"65", "-1", "8x", "x", " 8", "1e3", "99999999999999999999"}) {
    const std::string e =
        error_of([&] { return env_count_value("KILN_N", bad, 32, 0, 64, "token rows"); });
    EXPECT_NE(e.find(std::string("KILN_N='") + bad + "'"), std::string::npos) << e;
    EXPECT_NE(e.find("expected an integer in [0, 64]: token rows; unset: 32"), std::string::npos)
        << e;
  }
}

}  // namespace
}  // namespace kiln
