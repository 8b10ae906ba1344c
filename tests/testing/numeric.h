#ifndef BIGMAC_TESTS_TESTING_NUMERIC_H_
#define BIGMAC_TESTS_TESTING_NUMERIC_H_

// Seeded random vectors, a scaled error and bitwise equality for the kernel tests. Header-only,
// stateless.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
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

// Central differences (step 1e-5) of `objective` over every element of *x, against `analytic`: a
// line for each of the first five elements where they differ by more than
// tolerance * max(1, |numeric|); empty when every element agrees. *x is restored.
inline std::string FiniteDifferenceMismatches(std::vector<double>* x,
                                              const std::vector<double>& analytic,
                                              const std::function<double()>& objective,
                                              double tolerance) {
  constexpr double kStep = 1e-5;
  std::string mismatches;
  int failures = 0;
  for (size_t i = 0; i < x->size() && failures < 5; ++i) {
    const double saved = (*x)[i];
    (*x)[i] = saved + kStep;
    const double plus = objective();
    (*x)[i] = saved - kStep;
    const double minus = objective();
    (*x)[i] = saved;
    const double numeric = (plus - minus) / (2 * kStep);
    if (std::abs(numeric - analytic[i]) > tolerance * std::max(1.0, std::abs(numeric))) {
      ++failures;
      mismatches += "element " + std::to_string(i) + ": analytic " + std::to_string(analytic[i]) +
                    ", numeric " + std::to_string(numeric) + "\n";
    }
  }
  return mismatches;
}

// Whether a and b hold the same values bit for bit (NaNs included).
template <typename T>
bool BitwiseEqual(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace bigmac::testutil

#endif  // BIGMAC_TESTS_TESTING_NUMERIC_H_
