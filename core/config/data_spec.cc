#include "core/config/data_spec.h"

#include <cmath>
#include <cstdlib>

#include "core/util/format.h"

namespace bigmac::config {
namespace {

// A whole-string finite number, or nullopt.
std::optional<double> Number(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

std::vector<BlendEntry> ParseBlend(const std::vector<std::string>& items,
                                   std::vector<std::string>* problems) {
  std::vector<BlendEntry> blend;
  if (items.empty()) return blend;
  if (items.size() == 1) {
    if (Number(items[0])) {
      problems->push_back("data.path=[" + items[0] +
                          "]: a weight with no dataset after it (data.path is PATH, or "
                          "W1 PATH1 W2 PATH2 ...)");
      return {};
    }
    return {{1.0, items[0]}};
  }
  if (items.size() % 2 != 0) {
    problems->push_back("data.path has " + std::to_string(items.size()) +
                        " items: a blend is weight/dataset pairs (W1 PATH1 W2 PATH2 ...), so an "
                        "even number");
    return {};
  }
  double total = 0;
  const size_t before = problems->size();
  for (size_t i = 0; i < items.size(); i += 2) {
    const std::optional<double> weight = Number(items[i]);
    const std::string where = "data.path[" + std::to_string(i) + "]='" + items[i] + "'";
    if (!weight) {
      problems->push_back(where + " (the weight of " + items[i + 1] +
                          "): not a number; a blend is weight/dataset pairs");
    } else if (!std::isfinite(*weight) || *weight <= 0) {
      problems->push_back(where + " (the weight of " + items[i + 1] +
                          "): weights must be positive finite numbers");
    } else {
      total += *weight;
      blend.push_back({*weight, items[i + 1]});
    }
  }
  if (problems->size() != before) return {};
  if (!std::isfinite(total)) {
    problems->push_back("data.path: the weights' sum is not finite");
    return {};
  }
  for (BlendEntry& entry : blend) entry.weight /= total;
  return blend;
}

std::optional<SplitShares> ParseSplit(const std::string& text, std::vector<std::string>* problems) {
  if (text.empty()) return std::nullopt;
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find_first_of(",/", start);  // Megatron reads 969/30/1 too
    std::string part = text.substr(start, comma == std::string::npos ? comma : comma - start);
    const size_t first = part.find_first_not_of(' '), last = part.find_last_not_of(' ');
    parts.push_back(first == std::string::npos ? "" : part.substr(first, last - first + 1));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  const std::string where = "data.split='" + text + "'";
  if (parts.size() > 3) {
    problems->push_back(where + ": at most three shares (train,validation,test)");
    return std::nullopt;
  }
  SplitShares shares = {0, 0, 0};
  double total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::optional<double> share = Number(parts[i]);
    if (!share || !std::isfinite(*share) || *share < 0) {
      problems->push_back(where + ": '" + parts[i] +
                          "' is not a share; shares are non-negative numbers, e.g. 969,30,1");
      return std::nullopt;
    }
    shares[i] = *share;
    total += *share;
  }
  if (!(total > 0) || !std::isfinite(total)) {
    problems->push_back(where + ": the shares add up to " + util::Format("%g", total) +
                        "; they must add up to a positive number");
    return std::nullopt;
  }
  if (shares[0] == 0) {
    problems->push_back(where + ": the train share is 0, so nothing would be trained on");
    return std::nullopt;
  }
  for (double& share : shares) share /= total;
  return shares;
}

std::string SplitText(const SplitShares& shares) {
  return util::Format("%g", shares[0]) + "," + util::Format("%g", shares[1]) + "," +
         util::Format("%g", shares[2]);
}

std::array<int64_t, 4> SplitIndices(const SplitShares& shares, int64_t count) {
  std::array<int64_t, 4> at = {0, 0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    at[i + 1] = at[i] + static_cast<int64_t>(std::nearbyint(shares[i] * double(count)));
  }
  const int64_t excess = at[3] - count;
  for (int i = 1; i < 4; ++i) at[i] -= excess;
  return at;
}

}  // namespace bigmac::config
