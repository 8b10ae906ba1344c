#ifndef BIGMAC_CORE_DATA_BLEND_H_
#define BIGMAC_CORE_DATA_BLEND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config/data_spec.h"
#include "core/data/dataset.h"
#include "core/data/error.h"

namespace bigmac::data {

// Which dataset each training sample of a blend comes from. Sample i (its global index in the
// run: earlier steps' samples, then this step's in global micro-batch and row order) takes the
// dataset whose share of [0, 1) holds frac(x0 + i * phi), phi = the golden ratio's fraction and
// x0 drawn from the seed: a low-discrepancy (Weyl) sequence, so every prefix of n samples holds
// each dataset's weight x n samples to within a few, and a sample's dataset is a function of its
// index alone (any layout, any resume point). Exact integer arithmetic (2^-64 units).
class BlendSampler {
 public:
  // `weights` sum to 1 (config::ParseBlend normalizes them).
  BlendSampler(const std::vector<double>& weights, uint64_t seed);

  int size() const { return static_cast<int>(ends_.size()); }
  // The weights of BlendEntries(spec, dir), seeded with `seed`.
  static BlendSampler Of(const std::vector<config::BlendEntry>& entries, uint64_t seed);
  int DatasetOf(int64_t sample) const;
  // Adds to `counts` (one per dataset) the samples [begin, end) of each dataset.
  void Count(int64_t begin, int64_t end, std::vector<int64_t>* counts) const;

 private:
  std::vector<uint64_t> ends_;  // dataset d owns [ends_[d-1], ends_[d]); the last owns the rest
  uint64_t start_ = 0;
};

// Where training stands in the data: the global index of the next sample and the samples each
// dataset gave so far. Checkpoints keep it (Manifest.data), so a resume continues every dataset
// exactly, under any layout.
struct DataPosition {
  int64_t next_sample = 0;
  std::vector<int64_t> samples;  // per dataset
};

// One dataset of the run, opened and divided into its splits.
struct BlendDataset {
  std::string name;  // short, unique in the run: the path's last part (for metrics and logs)
  std::string path;  // as data.path (or data.dir) names it
  double weight = 1;
  std::string division;                      // how its splits were made, for the log
  std::unique_ptr<TokenDataset> stream;      // the training stream (the whole one when split)
  std::unique_ptr<TokenDataset> val_stream;  // its *val* files, when those are its validation
  TokenRange train, val, test;
};

// The run's datasets as (weight, path): data.path's, else data.dir with weight 1.
std::vector<config::BlendEntry> BlendEntries(const config::DataSpec& spec, const std::string& dir);

// The datasets' short names, unique in the run (metrics keys, TensorBoard tags, logs): each
// path's last part less ".bin", with "#2", "#3" after repeats.
std::vector<std::string> DatasetNames(const std::vector<config::BlendEntry>& entries);

// The directory whose tokenizer.json describes the run's data: data.dir, else the first
// dataset's (its own directory, or the one holding its files).
std::string DataHome(const config::DataSpec& spec, const std::string& dir);

// The datasets of data.path (or data.dir), each opened, checked and divided into train,
// validation and test ranges (docs/data.md): by data.split, else by its *val* files when it has
// them, else by config::kDefaultSplit. The files stay mapped for its lifetime.
class BlendedData {
 public:
  struct Options {
    std::string dir;          // data.dir: the dataset when spec.blend is empty
    std::string train_files;  // data.train_files: the glob a directory's training files match
    std::string val_files;    // data.val_files
    config::DataSpec spec;
  };
  // Throws DataError naming the dataset (and file) at fault: not found, empty, a split with no
  // tokens for training, vocabularies that differ.
  explicit BlendedData(const Options& options);
  BlendedData(const BlendedData&) = delete;
  BlendedData& operator=(const BlendedData&) = delete;

  int size() const { return static_cast<int>(datasets_.size()); }
  const BlendDataset& dataset(int d) const { return datasets_[d]; }
  std::vector<double> weights() const;
  // The largest vocabulary the datasets need, and its source.
  int64_t vocab_size() const;
  // "data/fortunes/*train*.bin (...)" or "3 datasets blended: ...", for the model line.
  std::string Summary() const;
  // A line per dataset: weight, division, and each split's documents and tokens.
  std::vector<std::string> Describe() const;

  // How the run would use each dataset's splits, as start-up warnings (SplitWarnings for its own
  // *val* files, else the validation windows that repeat).
  std::vector<std::string> Warnings(int seq, int batch, int eval_batches) const;

  // Throws DataError unless every dataset's training and validation ranges hold a window of
  // seq + 1 tokens and its vocabulary fits `model_vocab`.
  void CheckFits(int seq, int64_t model_vocab) const;

  // Row `row` of global micro-batch `micro_batch` at `step` is sample `first_sample` +
  // micro_batch x batch + row; its dataset is the sampler's, its window is keyed as
  // TokenDataset::TrainBatch keys it (so one dataset reads exactly what it always read).
  void TrainBatch(const BlendSampler& sampler, int64_t first_sample, uint64_t seed, int64_t step,
                  int micro_batch, int batch, int seq, int32_t* tokens, int32_t* targets) const;

 private:
  std::vector<BlendDataset> datasets_;
};

}  // namespace bigmac::data

#endif  // BIGMAC_CORE_DATA_BLEND_H_
