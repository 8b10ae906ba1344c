#ifndef BIGMAC_CORE_ENGINE_GENERATE_H_
#define BIGMAC_CORE_ENGINE_GENERATE_H_

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "core/engine/rank_model.h"
#include "core/memory/tensor.h"

namespace bigmac::engine {

// How `bigmac generate` and train.sample_interval pick tokens (docs/generate.md).
struct SampleOptions {
  int tokens = 64;           // new tokens to write
  double temperature = 1.0;  // divides the logits; 0: always the most likely token
  int top_k = 0;             // draw among the k most likely tokens; 0: the whole vocabulary
  uint64_t seed = 1;         // the draws' random stream: the same seed, the same text
};

// One picked token and its log-probability under the model's own distribution (softmax of the
// raw logits, before temperature and top-k), which is what the training loss measures.
struct Pick {
  int32_t token = 0;
  double log_prob = 0;
};

// Picks from one position's `vocab` logits: keeps the top_k largest (ties: the lower id),
// softmax(logits / temperature) over them, one uniform draw from `rng`; the largest logit at
// temperature 0. Deterministic for a given rng state on every platform.
Pick SampleToken(const float* logits, int vocab, const SampleOptions& options,
                 std::mt19937_64* rng);

// The logits of the last position of `window` (vocab floats), or empty on a pipeline rank that
// does not hold the head.
using LastLogitsFn = std::function<std::vector<float>(const std::vector<int32_t>& window)>;
// Makes the head rank's pick every rank's: (this rank's pick, whether it made one) -> the pick.
using SharePickFn = std::function<Pick(const Pick& local, bool have)>;

// Whether to stop before the next token (a stop signal during a training sample). It must give
// the same answer on every rank that runs the forward together.
using StopFn = std::function<bool()>;

struct Generation {
  std::vector<int32_t> tokens;  // the new tokens only
  double mean_loss = 0;         // mean -log p of those tokens under the model, nats per token
  bool stopped = false;         // `stop` ended it before options.tokens
};

// Autoregressive sampling without a KV cache: for each new token the model runs forward again on
// the latest `context` tokens (the position embedding's length), so each token costs one forward
// of up to `context` positions; `stop` is asked before each. `prompt` must not be empty.
Generation Generate(
    const std::vector<int32_t>& prompt, int context, int vocab, const SampleOptions& options,
    const LastLogitsFn& last_logits,
    const SharePickFn& share = [](const Pick& pick, bool) { return pick; },
    const StopFn& stop = nullptr);

// The last row of the head's (positions, width) output when run without targets, as host floats:
// its first `vocab` columns (a backend may pad the width).
std::vector<float> LastLogitsRow(const memory::Tensor& logits, int vocab);

// On one rank holding the whole model (pp = 1): the last position's logits of `window`.
std::vector<float> StageLastLogits(RankModel& stage, const std::vector<int32_t>& window, int vocab);

// The mean per-token loss (nats) of `tokens[1:]` given the tokens before each, on one rank holding
// the whole model; at most `context` tokens at once (longer texts are scored in windows).
double MeanTokenLoss(RankModel& stage, const std::vector<int32_t>& tokens, int context);

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_GENERATE_H_
