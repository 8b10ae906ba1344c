#include "tests/testing/dump.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace bigmac::testutil {

Dump ReadDump(const std::string& dir) {
  Dump dump;
  std::ifstream losses(dir + "/losses.txt");
  for (double loss; losses >> loss;) dump.losses.push_back(loss);
  if (!std::filesystem::exists(dir)) return dump;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".f32") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::vector<float> values(std::filesystem::file_size(entry.path()) / sizeof(float));
    in.read(reinterpret_cast<char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(float)));
    dump.layers[entry.path().filename().string()] = std::move(values);
  }
  return dump;
}

DumpDifference CompareDumps(const Dump& reference, const Dump& run, size_t steps) {
  DumpDifference d;
  if (run.losses.size() != steps)
    d.problems.push_back(std::to_string(run.losses.size()) + " losses, not " +
                         std::to_string(steps));
  for (size_t i = 0; i < std::min(run.losses.size(), reference.losses.size()); ++i) {
    d.loss = std::max(d.loss, std::fabs(run.losses[i] - reference.losses[i]) /
                                  std::max(1.0, std::fabs(reference.losses[i])));
  }
  if (run.layers.size() != reference.layers.size())
    d.problems.push_back(std::to_string(run.layers.size()) + " layer files, not " +
                         std::to_string(reference.layers.size()) + " (every layer_id once)");
  for (const auto& [name, values] : reference.layers) {
    auto it = run.layers.find(name);
    if (it == run.layers.end()) {
      d.problems.push_back(name + " missing");
      continue;
    }
    if (it->second.size() != values.size())
      d.problems.push_back(name + ": " + std::to_string(it->second.size()) + " weights, not " +
                           std::to_string(values.size()));
    for (size_t i = 0; i < std::min(values.size(), it->second.size()); ++i) {
      d.weight = std::max(d.weight, std::fabs(double(it->second[i]) - values[i]) /
                                        std::max(1.0, std::fabs(double(values[i]))));
    }
  }
  return d;
}

}  // namespace bigmac::testutil
