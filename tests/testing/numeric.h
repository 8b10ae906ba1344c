#ifndef BIGMAC_TESTS_TESTING_NUMERIC_H_
#define BIGMAC_TESTS_TESTING_NUMERIC_H_

// Seeded random vectors and a scaled error for the kernel tests. Header-only, stateless.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace bigmac::testutil {

// n values uniform in [-bound, bound), the same for the same seed.
template <typename T>
std::vector<T> Random(int64_t n, uint64_t seed, double bound = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-bound, bound);
  std::vector<T> x(n);
  for (T& v : x) v = static_cast<T>(uniform(rng));
  return x;
}

template <typename T>
double MaxAbs(const std::vector<T>& x) {
  double m = 0;
  for (T v : x) m = std::max(m, std::abs(static_cast<double>(v)));
  return m;
}

// max |a - b| / max(1, max |b|); infinite if either side has a NaN.
template <typename T>
double ScaledError(const std::vector<T>& a, const std::vector<T>& b) {
  double err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (!(diff == diff)) return std::numeric_limits<double>::infinity();
    err = std::max(err, diff);
  }
  return err / std::max(1.0, MaxAbs(b));
}

}  // namespace bigmac::testutil

#endif  // BIGMAC_TESTS_TESTING_NUMERIC_H_
