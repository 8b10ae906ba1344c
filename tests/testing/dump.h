#ifndef BIGMAC_TESTS_TESTING_DUMP_H_
#define BIGMAC_TESTS_TESTING_DUMP_H_

// What `bigmac train --dump DIR` writes (per-step losses and every layer_id's full weights), read
// back and compared between two runs, for the equivalence tests.

#include <map>
#include <string>
#include <vector>

namespace bigmac::testutil {

struct Dump {
  std::vector<double> losses;                        // losses.txt, one per step
  std::map<std::string, std::vector<float>> layers;  // layer_<id>.f32 -> weights
};

// `dir`'s dump (empty parts where files are missing).
Dump ReadDump(const std::string& dir);

// Largest |a-b| / max(1, |a|) over the losses and over every weight of `run` against
// `reference`; `problems` lists a step count other than `steps`, a missing layer file, or a
// layer of another size.
struct DumpDifference {
  double loss = 0;
  double weight = 0;
  std::vector<std::string> problems;
};
DumpDifference CompareDumps(const Dump& reference, const Dump& run, size_t steps);

}  // namespace bigmac::testutil

#endif  // BIGMAC_TESTS_TESTING_DUMP_H_
