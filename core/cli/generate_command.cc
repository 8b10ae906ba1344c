// `bigmac generate`: text from a checkpoint of any layout, on one CPU rank.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/cli/commands.h"
#include "core/cli/exit_codes.h"
#include "core/cli/single_rank_model.h"
#include "core/config/errors.h"
#include "core/data/blend.h"
#include "core/data/error.h"
#include "core/data/tokenizer.h"
#include "core/engine/generate.h"
#include "core/layer/plugin_loader.h"
#include "core/util/format.h"

namespace bigmac::cli {

int RunGenerate(const GenerateOptions& options) {
  int64_t step = 0;
  std::string step_dir;
  std::optional<SingleRankModel> model;
  std::unique_ptr<data::Tokenizer> tokenizer;
  try {
    model.emplace(LoadSingleRankModel(options.checkpoint, options.plugins, &step, &step_dir));
    const config::Config& cfg = model->resolved.values();
    tokenizer = data::RecordedTokenizer(model->tokenizer,
                                        options.data_dir.empty()
                                            ? data::DataHome(model->resolved.data, cfg.data().dir())
                                            : options.data_dir,
                                        cfg.model().vocab_size(), "the checkpoint " + step_dir);
  } catch (const checkpoint::CheckpointError& error) {
    return ReportFailure(error.what(), kExitCheckpoint);
  } catch (const config::ConfigError& error) {
    return ReportFailure(std::string("the checkpoint's config is not valid: ") + error.what(),
                         kExitCheckpoint);
  } catch (const layer::PluginError& error) {
    return ReportFailure(error.what(), kExitConfig);
  } catch (const data::DataError& error) {
    return ReportFailure(error.what(), kExitBadData);
  }
  const config::Config& cfg = model->resolved.values();
  const int vocab = cfg.model().vocab_size();
  const int context = cfg.train().seq_length();
  std::vector<int32_t> prompt = tokenizer->Encode(options.prompt);
  if (prompt.empty()) {
    return ReportFailure("--prompt is empty: the model needs at least one token to continue",
                         kExitConfig);
  }
  for (const int32_t token : prompt) {
    if (token >= vocab) {
      return ReportFailure(util::Format("--prompt: token %d (%s) is outside the model's "
                                        "vocabulary (model.vocab_size=%d in %s)",
                                        token, tokenizer->name().c_str(), vocab, step_dir.c_str()),
                           kExitConfig);
    }
  }
  if (prompt.size() > size_t(context)) {
    std::fprintf(stderr,
                 "[generate] the prompt has %zu tokens; the model sees the last %d "
                 "(train.seq_length)\n",
                 prompt.size(), context);
  }
  engine::SampleOptions sample;
  sample.tokens = options.tokens;
  sample.temperature = options.temperature;
  sample.top_k = options.top_k;
  sample.seed = options.seed;
  const auto start = std::chrono::steady_clock::now();
  const engine::Generation generation =
      engine::Generate(prompt, context, vocab, sample, [&](const std::vector<int32_t>& window) {
        return engine::StageLastLogits(*model->stage, window, vocab);
      });
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const std::string text = options.prompt + tokenizer->Decode(generation.tokens);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr,
               "[generate] %s (step %lld, %s): %d tokens, temperature %g, top-k %d, seed %llu; "
               "%.3f nats/token under the model; %.1f ms/token (full forward per token, no KV "
               "cache)\n",
               step_dir.c_str(), static_cast<long long>(step), tokenizer->name().c_str(),
               options.tokens, options.temperature, options.top_k,
               static_cast<unsigned long long>(options.seed), generation.mean_loss,
               ms / std::max(1, options.tokens));
  return kExitOk;
}

}  // namespace bigmac::cli
