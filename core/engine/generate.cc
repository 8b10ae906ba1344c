#include "core/engine/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace bigmac::engine {
namespace {

// A uniform double in [0, 1) from the top 53 bits of one draw (the same on every platform, unlike
// std::uniform_real_distribution).
double Uniform(std::mt19937_64* rng) { return static_cast<double>((*rng)() >> 11) * 0x1.0p-53; }

// The whole model forward on `window` without targets: the head's logits.
memory::Tensor ForwardLogits(RankModel& stage, const std::vector<int32_t>& window) {
  const layer::MicroBatch mb{1, static_cast<int>(window.size()), window.data(), nullptr, 1.0, 0};
  memory::Tensor activation;
  for (const partition::StageRange& range : stage.ranges())
    activation = stage.ForwardStage(range.stage, mb, std::move(activation), /*keep=*/false);
  return activation;
}

}  // namespace

Pick SampleToken(const float* logits, int vocab, const SampleOptions& options,
                 std::mt19937_64* rng) {
  // log p under the model: the raw logits' log-softmax, in double.
  const double max_logit = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - max_logit);
  const double log_normalizer = max_logit + std::log(sum);
  auto pick = [&](int token) { return Pick{token, double(logits[token]) - log_normalizer}; };

  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  const int keep = options.top_k > 0 ? std::min(options.top_k, vocab) : vocab;
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int a, int b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  if (options.temperature <= 0) return pick(order[0]);
  std::vector<double> weights(keep);
  double total = 0;
  for (int i = 0; i < keep; ++i) {
    weights[i] = std::exp((double(logits[order[i]]) - logits[order[0]]) / options.temperature);
    total += weights[i];
  }
  double u = Uniform(rng) * total;
  for (int i = 0; i < keep; ++i) {
    u -= weights[i];
    if (u < 0) return pick(order[i]);
  }
  return pick(order[keep - 1]);  // rounding left u at or just above 0
}

Generation Generate(const std::vector<int32_t>& prompt, int context, int vocab,
                    const SampleOptions& options, const LastLogitsFn& last_logits,
                    const SharePickFn& share, const StopFn& stop) {
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt has no tokens");
  std::mt19937_64 rng(options.seed);
  std::vector<int32_t> text = prompt;
  Generation generation;
  double loss = 0;
  for (int i = 0; i < options.tokens; ++i) {
    if (stop && stop()) {
      generation.stopped = true;
      break;
    }
    const size_t start = text.size() > size_t(context) ? text.size() - context : 0;
    const std::vector<float> logits =
        last_logits(std::vector<int32_t>(text.begin() + start, text.end()));
    const bool have = !logits.empty();
    const Pick pick = share(have ? SampleToken(logits.data(), vocab, options, &rng) : Pick{}, have);
    text.push_back(pick.token);
    generation.tokens.push_back(pick.token);
    loss -= pick.log_prob;
  }
  const size_t written = generation.tokens.size();
  generation.mean_loss = written > 0 ? loss / static_cast<double>(written) : 0;
  return generation;
}

std::vector<float> LastLogitsRow(const memory::Tensor& logits, int vocab) {
  memory::Tensor wide(logits.device(), logits.shape(), memory::DType::kF32);
  wide.ConvertFrom(logits);
  std::vector<float> all(wide.numel());
  wide.CopyToHost(all.data());
  const int64_t width = logits.shape().back();
  if (width < vocab || all.size() % width != 0) {
    throw std::logic_error("generate: the head's output " + logits.ShapeString() +
                           " is not (positions, >= " + std::to_string(vocab) + ") logits");
  }
  const auto row = all.end() - width;
  return std::vector<float>(row, row + vocab);
}

std::vector<float> StageLastLogits(RankModel& stage, const std::vector<int32_t>& window,
                                   int vocab) {
  return LastLogitsRow(ForwardLogits(stage, window), vocab);
}

double MeanTokenLoss(RankModel& stage, const std::vector<int32_t>& tokens, int context) {
  double loss = 0;
  int64_t scored = 0;
  for (size_t begin = 0; begin + 1 < tokens.size(); begin += context) {
    const int n = static_cast<int>(std::min<size_t>(context, tokens.size() - 1 - begin));
    const layer::MicroBatch mb{1, n, tokens.data() + begin, tokens.data() + begin + 1, 1.0, 0};
    loss += stage.ForwardLoss(mb);
    scored += n;
  }
  return scored > 0 ? loss / scored : 0;
}

}  // namespace bigmac::engine
