#include "core/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/data/error.h"
#include "core/data/shard.h"
#include "core/util/files.h"

namespace bigmac::data {
namespace {

uint64_t LittleEndian(const unsigned char* at, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{at[i]} << (8 * i);
  return value;
}

// llm.c's magics and versions (dev/data/data_common.py): GPT-2 tokens as uint16, Llama 3's as
// uint32.
constexpr int32_t kLlmcMagic16 = 20240520;
constexpr int32_t kLlmcMagic32 = 20240801;
constexpr int kLlmcHeaderBytes = 256 * 4;

// Megatron-LM's MMIDIDX index (megatron/core/datasets/indexed_dataset.py): magic, version 1,
// dtype code, sequence and document counts, then int32 lengths, int64 byte pointers and int64
// document indices.
constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int kMegatronHeaderBytes = 9 + 8 + 1 + 8 + 8;

// A two's-complement field (Megatron's int64 pointers and document indices), so that a negative
// value is printed as one and not as its unsigned wrap-around.
int64_t SignedLittleEndian(const unsigned char* at, int bytes) {
  const uint64_t value = LittleEndian(at, bytes);
  const int shift = 64 - 8 * bytes;
  return static_cast<int64_t>(value << shift) >> shift;
}

std::string Describe(uint64_t bytes) { return std::to_string(bytes) + " bytes"; }

}  // namespace

const char* TokenFormatName(TokenFormat format) {
  switch (format) {
    case TokenFormat::kBigMac:
      return "bigmac";
    case TokenFormat::kLlmc:
      return "llm.c";
    case TokenFormat::kMegatron:
      return "megatron";
  }
  return "?";
}

MappedFile::MappedFile(const std::string& path) {
  const int fd = OpenDataFile(path, "token file", &size_);
  if (size_ > 0) {
    void* at = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (at == MAP_FAILED) {
      const int error = errno;
      close(fd);
      throw DataError(path + ": cannot memory-map the token file: " + util::OsReason(error));
    }
    data_ = static_cast<const unsigned char*>(at);
  }
  close(fd);  // the map keeps the file
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(const_cast<unsigned char*>(data_), size_);
}

TokenFile::TokenFile(const std::string& path) : path_(path) {
  const std::filesystem::path bin(path);
  std::filesystem::path index = bin;
  index.replace_extension(".idx");
  std::error_code error;
  if (bin.extension() == ".bin" && std::filesystem::exists(index, error)) {
    OpenMegatron(index.string());
    return;
  }
  map_ = std::make_shared<MappedFile>(path);
  if (map_->size() >= 4 && std::memcmp(map_->data(), kShardMagic, 4) == 0) {
    OpenBigMac();
    return;
  }
  const int32_t magic = map_->size() >= 4 ? static_cast<int32_t>(LittleEndian(map_->data(), 4)) : 0;
  if (magic == kLlmcMagic16 || magic == kLlmcMagic32) {
    OpenLlmc();
    return;
  }
  throw DataError(path + ": wrong magic: not a token file of a known format (" +
                  Describe(map_->size()) +
                  "; a BigMac shard starts with \"BMTK\", an llm.c file with the int32 magic " +
                  std::to_string(kLlmcMagic16) + " or " + std::to_string(kLlmcMagic32) +
                  ", a Megatron .bin has its MMIDIDX .idx beside it)");
}

void TokenFile::OpenBigMac() {
  format_ = TokenFormat::kBigMac;
  const unsigned char* bytes = map_->data();
  const uint64_t size = map_->size();
  if (size < kShardHeaderBytes) {
    throw DataError(path_ + ": " + Describe(size) + " is shorter than the " +
                    std::to_string(kShardHeaderBytes) +
                    "-byte shard header (truncated, or not a shard)");
  }
  const uint32_t version = static_cast<uint32_t>(LittleEndian(bytes + 4, 4));
  if (version != kShardVersion) {
    throw DataError(path_ + ": shard version " + std::to_string(version) +
                    " is not supported (this build reads " + std::to_string(kShardVersion) + ")");
  }
  declared_vocab_ = static_cast<uint32_t>(LittleEndian(bytes + 8, 4));
  if (declared_vocab_ == 0) {
    throw DataError(path_ +
                    ": vocabulary 0 in the shard header (every token would be outside it; "
                    "`bigmac data prep` writes the tokenizer's vocabulary size there)");
  }
  const uint32_t width = static_cast<uint32_t>(LittleEndian(bytes + 12, 4));
  if (width != 2 && width != 4) {
    throw DataError(path_ + ": " + std::to_string(width) +
                    " bytes per token; a shard holds 2 or 4");
  }
  width_ = static_cast<int>(width);
  for (int i = 24; i < kShardHeaderBytes; ++i) {
    if (bytes[i] != 0) {
      throw DataError(path_ + ": header byte " + std::to_string(i) +
                      " is not zero (bytes 24-31 are reserved); not a shard of this version");
    }
  }
  const uint64_t count = LittleEndian(bytes + 16, 8);
  // Compared in tokens, so a count near 2^64 cannot wrap around into a plausible byte size.
  const uint64_t body = size - kShardHeaderBytes;
  if (count != body / width || body % width != 0) {
    throw DataError(path_ + ": the header promises " + std::to_string(count) + " tokens" +
                    (count < (uint64_t{1} << 60)
                         ? " (" + Describe(kShardHeaderBytes + count * width) + ")"
                         : "") +
                    " but the file has " + Describe(size) +
                    (count > body / width ? " (truncated)" : " (trailing bytes)"));
  }
  tokens_ = bytes + kShardHeaderBytes;
  count_ = static_cast<int64_t>(count);
}

void TokenFile::OpenLlmc() {
  format_ = TokenFormat::kLlmc;
  const unsigned char* bytes = map_->data();
  const uint64_t size = map_->size();
  if (size < kLlmcHeaderBytes) {
    throw DataError(path_ + ": " + Describe(size) + " is shorter than llm.c's " +
                    std::to_string(kLlmcHeaderBytes) + "-byte header (truncated)");
  }
  const int32_t magic = static_cast<int32_t>(LittleEndian(bytes, 4));
  const int32_t version = static_cast<int32_t>(LittleEndian(bytes + 4, 4));
  const int32_t expected = magic == kLlmcMagic16 ? 1 : 7;
  if (version != expected) {
    throw DataError(path_ + ": llm.c magic " + std::to_string(magic) + " with version " +
                    std::to_string(version) + "; that magic goes with version " +
                    std::to_string(expected) + " (corrupted header)");
  }
  width_ = magic == kLlmcMagic16 ? 2 : 4;
  const int32_t count = static_cast<int32_t>(LittleEndian(bytes + 8, 4));
  if (count < 0) {
    throw DataError(path_ + ": llm.c header[2] (the token count) is " + std::to_string(count) +
                    " (corrupted header)");
  }
  const uint64_t expected_size = kLlmcHeaderBytes + uint64_t(count) * width_;
  if (size != expected_size) {
    throw DataError(path_ + ": the llm.c header promises " + std::to_string(count) + " tokens of " +
                    std::to_string(width_) + " bytes (" + Describe(expected_size) +
                    ") but the file has " + Describe(size) +
                    (size < expected_size ? " (truncated)" : " (trailing bytes)"));
  }
  tokens_ = bytes + kLlmcHeaderBytes;
  count_ = count;
}

void TokenFile::OpenMegatron(const std::string& index_path) {
  format_ = TokenFormat::kMegatron;
  index_map_ = std::make_shared<MappedFile>(index_path);
  const unsigned char* idx = index_map_->data();
  const uint64_t idx_size = index_map_->size();
  if (idx_size < kMegatronHeaderBytes || std::memcmp(idx, kMegatronMagic, 9) != 0) {
    throw DataError(index_path + ": not a Megatron MMIDIDX index (" + Describe(idx_size) +
                    "; it starts with the 9 bytes \"MMIDIDX\\0\\0\"), yet it sits beside " + path_);
  }
  const uint64_t version = LittleEndian(idx + 9, 8);
  if (version != 1) {
    throw DataError(index_path + ": MMIDIDX version " + std::to_string(version) +
                    " is not supported (this build reads 1)");
  }
  const int code = idx[17];
  // Megatron's DType codes: 8 = uint16, 4 = int32 (its choices for token ids).
  if (code != 8 && code != 4) {
    throw DataError(index_path + ": dtype code " + std::to_string(code) +
                    " is not a token type this reader takes (8 = uint16, 4 = int32)");
  }
  width_ = code == 8 ? 2 : 4;
  signed_tokens_ = code == 4;
  const uint64_t sequences = LittleEndian(idx + 18, 8);
  const uint64_t documents = LittleEndian(idx + 26, 8);
  const uint64_t room = idx_size - kMegatronHeaderBytes;
  // Bounded before multiplying, so a corrupted count cannot wrap around.
  const bool counts_fit =
      sequences <= room / 12 && documents <= room / 8 && sequences * 12 + documents * 8 <= room;
  const uint64_t tables = counts_fit ? sequences * 12 + documents * 8 : 0;
  // Multimodal indices add one int8 mode per sequence after the document indices.
  if (!counts_fit || (room != tables && room != tables + sequences)) {
    throw DataError(index_path + ": " + std::to_string(sequences) + " sequences and " +
                    std::to_string(documents) + " documents do not fit its " + Describe(idx_size) +
                    " (truncated or corrupted index)");
  }
  const unsigned char* lengths = idx + kMegatronHeaderBytes;
  const unsigned char* pointers = lengths + sequences * 4;
  const unsigned char* doc_index = pointers + sequences * 8;
  // The reader treats the .bin as one stream of tokens in sequence order: the pointers must
  // tile it, as Megatron's builder writes them.
  uint64_t offset = 0;
  for (uint64_t s = 0; s < sequences; ++s) {
    const int64_t length = SignedLittleEndian(lengths + 4 * s, 4);
    const int64_t pointer = SignedLittleEndian(pointers + 8 * s, 8);
    if (length < 0 || pointer < 0 || uint64_t(pointer) != offset) {
      throw DataError(index_path + ": sequence " + std::to_string(s) + " has length " +
                      std::to_string(length) + " at byte " + std::to_string(pointer) +
                      "; expected a length >= 0 at byte " + std::to_string(offset) +
                      " (sequences tile the .bin in order)");
    }
    offset += uint64_t(length) * width_;
  }
  int64_t previous = 0;
  for (uint64_t d = 0; d < documents; ++d) {
    const int64_t at = SignedLittleEndian(doc_index + 8 * d, 8);
    if ((d == 0 && at != 0) || at < previous || uint64_t(at) > sequences) {
      throw DataError(index_path + ": document index " + std::to_string(d) + " is " +
                      std::to_string(at) + "; document indices rise from 0 to the " +
                      std::to_string(sequences) + " sequences");
    }
    previous = at;
  }
  if (documents > 0 && uint64_t(previous) != sequences) {
    throw DataError(index_path + ": the last document index is " + std::to_string(previous) +
                    ", not the sequence count " + std::to_string(sequences));
  }
  map_ = std::make_shared<MappedFile>(path_);
  if (map_->size() != offset) {
    throw DataError(path_ + ": " + index_path + " describes " + std::to_string(offset / width_) +
                    " tokens (" + Describe(offset) + ") but the file has " +
                    Describe(map_->size()) +
                    (map_->size() < offset ? " (truncated)" : " (trailing bytes)"));
  }
  tokens_ = map_->data();
  count_ = static_cast<int64_t>(offset / width_);
  pointers_ = pointers;
  doc_index_ = doc_index;
  sequences_ = static_cast<int64_t>(sequences);
  documents_ = documents > 0 ? static_cast<int64_t>(documents) - 1 : -1;
}

int64_t TokenFile::DocumentStart(int64_t d) const {
  if (documents_ < 0 || d >= documents_) return count_;
  const int64_t sequence = SignedLittleEndian(doc_index_ + 8 * d, 8);
  if (sequence >= sequences_) return count_;
  return SignedLittleEndian(pointers_ + 8 * sequence, 8) / width_;
}

void TokenFile::Copy(int64_t begin, int64_t n, int32_t* out) const {
  const unsigned char* p = tokens_ + begin * width_;
  if (width_ == 2) {
    for (int64_t i = 0; i < n; ++i) out[i] = int32_t{p[2 * i]} | int32_t{p[2 * i + 1]} << 8;
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const unsigned char* q = p + 4 * i;
      out[i] = static_cast<int32_t>(uint32_t{q[0]} | uint32_t{q[1]} << 8 | uint32_t{q[2]} << 16 |
                                    uint32_t{q[3]} << 24);
    }
  }
}

TokenFile::Largest TokenFile::LargestToken() const {
  Largest largest;
  for (int64_t i = 0; i < count_; ++i) {
    const uint32_t token = at(i);
    if (largest.position < 0 || token > largest.token) largest = {token, i};
  }
  // Megatron's int32 tokens are signed: the largest unsigned pattern is then the most negative
  // token, named as the negative number it is (not its wrap-around) and refused.
  if (signed_tokens_ && largest.position >= 0 && static_cast<int32_t>(largest.token) < 0) {
    throw DataError(path_ + ": token " + std::to_string(static_cast<int32_t>(largest.token)) +
                    " at position " + std::to_string(largest.position) +
                    " is negative (the file's tokens are int32; a token id is >= 0)");
  }
  return largest;
}

}  // namespace bigmac::data
