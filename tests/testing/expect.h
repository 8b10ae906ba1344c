#ifndef BIGMAC_TESTS_TESTING_EXPECT_H_
#define BIGMAC_TESTS_TESTING_EXPECT_H_

#include <gtest/gtest.h>

#include <string>

namespace bigmac::testutil {

// A gtest failure, showing the whole text, unless `text` contains `fragment`.
inline void ExpectContains(const std::string& text, const std::string& fragment) {
  EXPECT_NE(text.find(fragment), std::string::npos) << "missing '" << fragment << "' in:\n" << text;
}

}  // namespace bigmac::testutil

#endif  // BIGMAC_TESTS_TESTING_EXPECT_H_
