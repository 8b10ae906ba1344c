#include "core/data/tokenizer_manifest.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/data/error.h"
#include "core/util/output_file.h"
#include "nlohmann/json.hpp"

namespace bigmac::data {

std::string TokenizerManifest::Id() const {
  if (kind == "sentencepiece") return kind + "/" + std::to_string(vocab_size) + "/" + model_hash;
  return kind + "/" + std::to_string(vocab_size);
}

std::string FileHash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot open the tokenizer model");
  uint64_t hash = 0xcbf29ce484222325ULL;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof(buffer)) || in.gcount() > 0) {
    for (std::streamsize i = 0; i < in.gcount(); ++i) {
      hash ^= static_cast<unsigned char>(buffer[i]);
      hash *= 0x100000001b3ULL;
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

void WriteTokenizerManifest(const std::string& dir, const TokenizerManifest& manifest) {
  nlohmann::ordered_json json = {{"format", 1},
                                 {"tokenizer", manifest.kind},
                                 {"vocab_size", manifest.vocab_size},
                                 {"id", manifest.Id()}};
  if (manifest.kind == "sentencepiece") {
    json["model"] = manifest.model;
    json["model_fnv1a64"] = manifest.model_hash;
  }
  json["train_tokens"] = manifest.train_tokens;
  json["val_tokens"] = manifest.val_tokens;
  json["val_bytes"] = manifest.val_bytes;
  const std::string path = dir + "/" + kTokenizerManifest;
  if (std::string problem = util::WriteWholeFile(path, json.dump(2) + "\n"); !problem.empty())
    throw util::OutputError("cannot write the tokenizer manifest: " + problem);
}

std::optional<TokenizerManifest> ReadTokenizerManifest(const std::string& dir) {
  const std::string path = dir + "/" + kTokenizerManifest;
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return std::nullopt;
  std::ifstream in(path);
  if (!in) throw DataError(path + ": cannot open the tokenizer manifest");
  TokenizerManifest manifest;
  try {
    const nlohmann::json json = nlohmann::json::parse(in);
    manifest.kind = json.at("tokenizer").get<std::string>();
    // Read signed and bounded: -1 must not wrap to 4294967295 (nor 2^40 to its low bits).
    const nlohmann::json& vocab = json.at("vocab_size");
    if (!vocab.is_number_integer() || vocab.get<int64_t>() < 1 ||
        vocab.get<int64_t>() > kMaxTokenizerVocab) {
      throw DataError(path + ": vocab_size " + vocab.dump() + " must be an integer in [1, " +
                      std::to_string(kMaxTokenizerVocab) + "]");
    }
    manifest.vocab_size = static_cast<uint32_t>(vocab.get<int64_t>());
    manifest.train_tokens = json.value("train_tokens", int64_t{0});
    manifest.val_tokens = json.value("val_tokens", int64_t{0});
    manifest.val_bytes = json.value("val_bytes", int64_t{0});
    if (manifest.kind == "sentencepiece") {
      manifest.model = json.at("model").get<std::string>();
      manifest.model_hash = json.at("model_fnv1a64").get<std::string>();
    }
  } catch (const nlohmann::json::exception& problem) {
    throw DataError(path + ": not a tokenizer manifest: " + problem.what());
  }
  if (manifest.kind != "byte" && manifest.kind != "sentencepiece") {
    throw DataError(path + ": tokenizer \"" + manifest.kind +
                    "\" is not one this build knows (byte, sentencepiece)");
  }
  if (manifest.kind == "sentencepiece") {
    const std::string model = dir + "/" + manifest.model;
    if (!std::filesystem::exists(model, error)) {
      throw DataError(path + ": names the SentencePiece model " + manifest.model +
                      ", which is not in " + dir);
    }
    if (const std::string hash = FileHash(model); hash != manifest.model_hash) {
      throw DataError(model + ": FNV-1a hash " + hash + " differs from " + manifest.model_hash +
                      " in " + path + " (the shards were encoded with another model)");
    }
  }
  return manifest;
}

}  // namespace bigmac::data
