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

}  // namespace
}  // namespace kiln
