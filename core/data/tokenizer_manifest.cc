#include "core/data/tokenizer_manifest.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <fstream>

#include "core/data/error.h"
#include "core/util/files.h"
#include "core/util/output_file.h"
#include "nlohmann/json.hpp"

namespace bigmac::data {

std::string TokenizerManifest::Id() const {
  if (kind == "sentencepiece") return kind + "/" + std::to_string(vocab_size) + "/" + model_hash;
  return kind + "/" + std::to_string(vocab_size);
}

std::string BytesHash(const std::string& bytes) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char byte : bytes) {
    hash ^= static_cast<unsigned char>(byte);
    hash *= 0x100000001b3ULL;
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

std::string ReadTokenizerModel(const std::string& path) {
  return ReadDataFile(path, "SentencePiece model", kMaxTokenizerModelBytes);
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
  // Only a name that is not there at all means "no manifest"; anything else (a link to nothing,
  // a fifo, a directory) goes to the checked opener, which names the problem.
  struct stat info;
  if (lstat(path.c_str(), &info) != 0 && errno == ENOENT) return std::nullopt;
  const std::string text = ReadDataFile(path, "tokenizer manifest", kMaxTokenizerManifestBytes);
  TokenizerManifest manifest;
  try {
    const nlohmann::json json = nlohmann::json::parse(text);
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
    std::string model;
    if (std::string problem = util::ResolveInside(dir, manifest.model, &model); !problem.empty())
      throw DataError(path + ": the SentencePiece model it names: " + problem);
    if (const std::string hash = BytesHash(ReadTokenizerModel(model));
        hash != manifest.model_hash) {
      throw DataError(model + ": FNV-1a hash " + hash + " differs from " + manifest.model_hash +
                      " in " + path + " (the shards were encoded with another model)");
    }
    manifest.model_path = model;
  }
  return manifest;
}

}  // namespace bigmac::data
