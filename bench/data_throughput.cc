// Batch assembly throughput of data::TokenDataset (bench/NOTES.md): reads `steps` training batches
// of `batch` x `seq` tokens from the train split of a data directory, as the trainer does, and
// prints tokens per second. Usage: data_throughput DIR [batch seq steps].
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/data/dataset.h"

int main(int argc, char** argv) {
  if (argc != 2 && argc != 5) {
    std::fprintf(stderr, "usage: %s DIR [batch seq steps]\n", argv[0]);
    return 2;
  }
  const int batch = argc == 5 ? std::atoi(argv[2]) : 16;
  const int seq = argc == 5 ? std::atoi(argv[3]) : 1024;
  const int steps = argc == 5 ? std::atoi(argv[4]) : 2000;
  try {
    const auto open_start = std::chrono::steady_clock::now();
    const bigmac::data::TokenDataset dataset(argv[1], "train");
    const double open_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - open_start).count();
    std::vector<int32_t> tokens(int64_t{batch} * seq), targets(tokens.size());
    int64_t checksum = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int step = 0; step < steps; ++step) {
      dataset.TrainBatch(1337, step, 0, 0, batch, seq, tokens.data(), targets.data());
      checksum += tokens[step % tokens.size()];
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "%s: opened and scanned in %.3f s; %d batches of %dx%d in %.3f s: %.3g tokens/s "
        "(checksum %lld)\n",
        dataset.description().c_str(), open_s, steps, batch, seq, s,
        double(steps) * batch * seq / s, static_cast<long long>(checksum));
    return 0;
  } catch (const bigmac::data::DataError& error) {
    std::fprintf(stderr, "bad data: %s\n", error.what());
    return 5;
  }
}
