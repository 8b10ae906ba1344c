#ifndef BIGMAC_CORE_CONFIG_DATA_SPEC_H_
#define BIGMAC_CORE_CONFIG_DATA_SPEC_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace bigmac::config {

// One dataset of data.path and its share of the training samples (the weights, normalized to
// sum to 1 as Megatron normalizes --data-path weights).
struct BlendEntry {
  double weight = 1;
  std::string path;  // as written: a Megatron prefix, a token file, a glob or a directory
};

// Train, validation and test shares of data.split, normalized to sum to 1.
using SplitShares = std::array<double, 3>;

// data.path and data.split, typed once (ResolvedConfig::data).
struct DataSpec {
  std::vector<BlendEntry> blend;     // empty: data.dir is the one dataset
  std::optional<SplitShares> split;  // unset: each dataset's *val* files, else kDefaultSplit
};

// Megatron's default --split.
inline constexpr SplitShares kDefaultSplit = {0.969, 0.030, 0.001};

// data.path: [] (data.dir), [PATH], or [W1, PATH1, W2, PATH2, ...] with every weight a positive
// finite number. Appends each problem (naming the item and the rule) to `problems`.
std::vector<BlendEntry> ParseBlend(const std::vector<std::string>& items,
                                   std::vector<std::string>* problems);

// data.split: up to three non-negative numbers separated by commas or slashes ("969,30,1",
// "969/30/1", "90,10"; missing
// shares are 0), not all zero, with a train share above zero. "" is unset. Appends problems.
std::optional<SplitShares> ParseSplit(const std::string& text, std::vector<std::string>* problems);

// "969,30,1" -> "0.969,0.03,0.001": how the [cfg] log and the resume check print shares.
std::string SplitText(const SplitShares& shares);

// Megatron's division of `count` elements (documents, or tokens) by `shares`: {0, train end,
// validation end, count}. Each boundary is the previous plus round(share x count) (ties to even,
// as Python's round), then all but the first move by the rounding's excess so the last is count.
std::array<int64_t, 4> SplitIndices(const SplitShares& shares, int64_t count);

}  // namespace bigmac::config

#endif  // BIGMAC_CORE_CONFIG_DATA_SPEC_H_
