// Batch assembly throughput (bench/NOTES.md): reads `steps` training batches of `batch` x `seq`
// tokens, as the trainer does (data::BlendedData::TrainBatch), from each data source named on the
// command line, side by side, and prints tokens per second and each source's ratio to the first.
// A source is a data directory (read as data.dir), or --path "SPEC": data.path's value, one
// dataset or weight/dataset pairs ("0.3 web_text_document 0.7 code_text_document").
// Usage: data_throughput SOURCE [SOURCE ...] [--batch N] [--seq N] [--steps N] [--rounds N].
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/config/data_spec.h"
#include "core/data/blend.h"

namespace {

struct Source {
  std::string dir;                 // data.dir, or ""
  std::vector<std::string> items;  // data.path's items
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<Source> sources;
  int batch = 16, seq = 1024, steps = 2000, rounds = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool valued = arg == "--path" || arg == "--batch" || arg == "--seq" || arg == "--steps" ||
                        arg == "--rounds";
    if (valued && i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", arg.c_str());
      return 2;
    }
    if (arg == "--path") {
      Source source;
      std::istringstream items(argv[++i]);
      for (std::string item; items >> item;) source.items.push_back(item);
      sources.push_back(source);
    } else if (arg == "--batch") {
      batch = std::atoi(argv[++i]);
    } else if (arg == "--seq") {
      seq = std::atoi(argv[++i]);
    } else if (arg == "--steps") {
      steps = std::atoi(argv[++i]);
    } else if (arg == "--rounds") {
      rounds = std::atoi(argv[++i]);
    } else if (!arg.empty() && arg[0] != '-') {
      sources.push_back({arg, {}});
    } else {
      std::fprintf(stderr,
                   "usage: %s SOURCE [SOURCE ...] [--batch N] [--seq N] [--steps N] [--rounds N]\n"
                   "  SOURCE: a data directory, or --path \"W1 PREFIX1 W2 PREFIX2 ...\"\n",
                   argv[0]);
      return 2;
    }
  }
  if (sources.empty() || batch < 1 || seq < 1 || steps < 1 || rounds < 1) {
    std::fprintf(stderr,
                 "usage: %s SOURCE [SOURCE ...] [--batch N] [--seq N] [--steps N] [--rounds N]\n",
                 argv[0]);
    return 2;
  }
  // Every source opened once; then rounds of each in turn (the first a warm-up: page faults, the
  // clock ramping), and each source's median round.
  std::vector<std::unique_ptr<bigmac::data::BlendedData>> opened;
  std::vector<double> open_seconds;
  for (const Source& source : sources) {
    try {
      std::vector<std::string> problems;
      bigmac::config::DataSpec spec;
      spec.blend = bigmac::config::ParseBlend(source.items, &problems);
      if (!problems.empty()) {
        std::fprintf(stderr, "bad --path: %s\n", problems.front().c_str());
        return 2;
      }
      const auto open_start = std::chrono::steady_clock::now();
      opened.push_back(std::make_unique<bigmac::data::BlendedData>(
          bigmac::data::BlendedData::Options{source.dir, "*train*.bin", "*val*.bin", spec}));
      opened.back()->CheckFits(seq, std::numeric_limits<int64_t>::max());
      open_seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - open_start).count());
    } catch (const bigmac::data::DataError& error) {
      std::fprintf(stderr, "bad data: %s\n", error.what());
      return 5;
    }
  }
  std::vector<int32_t> tokens(int64_t{batch} * seq), targets(tokens.size());
  std::vector<std::vector<double>> seconds(opened.size());
  std::vector<int64_t> checksums(opened.size());
  for (int round = 0; round <= rounds; ++round) {
    for (size_t i = 0; i < opened.size(); ++i) {
      const bigmac::data::BlendedData& data = *opened[i];
      const bigmac::data::BlendSampler sampler(data.weights(), 1337);
      int64_t checksum = 0;
      const auto start = std::chrono::steady_clock::now();
      for (int step = 0; step < steps; ++step) {
        data.TrainBatch(sampler, int64_t{step} * batch, 1337, step, 0, batch, seq, tokens.data(),
                        targets.data());
        checksum += tokens[step % tokens.size()];
      }
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (round > 0) seconds[i].push_back(s);
      checksums[i] = checksum;
    }
  }
  double first_rate = 0;
  for (size_t i = 0; i < opened.size(); ++i) {
    std::sort(seconds[i].begin(), seconds[i].end());
    const double median = seconds[i][seconds[i].size() / 2];
    const double rate = double(steps) * batch * seq / median;
    if (i == 0) first_rate = rate;
    std::printf(
        "%s: opened and scanned in %.3f s; %d batches of %dx%d in %.4f s (median of %d rounds): "
        "%.3g tokens/s, %.2fx the first (checksum %lld)\n",
        opened[i]->Summary().c_str(), open_seconds[i], steps, batch, seq, median, rounds, rate,
        rate / first_rate, static_cast<long long>(checksums[i]));
  }
  return 0;
}
