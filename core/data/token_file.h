#ifndef BIGMAC_CORE_DATA_TOKEN_FILE_H_
#define BIGMAC_CORE_DATA_TOKEN_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

namespace bigmac::data {

// The token file formats BigMac reads (docs/data.md has the byte layouts).
enum class TokenFormat {
  kBigMac,    // "BMTK" shard from `bigmac data prep`
  kLlmc,      // llm.c: 256 x int32 header, magic 20240520 (uint16) or 20240801 (uint32)
  kMegatron,  // Megatron-LM MMIDIDX: tokens in X.bin, the index in X.idx beside it
};

// "bigmac", "llm.c", "megatron".
const char* TokenFormatName(TokenFormat format);

// A read-only memory map of a whole file; unmapped when destroyed. Throws DataError naming the
// file if it cannot be opened or mapped.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
};

// One token file of any format, memory-mapped (nothing is read into memory whole) and checked:
// magic, version, token width, and that the file's size is exactly what its header (or index)
// promises. Tokens are little-endian unsigned integers of `width` bytes (2 or 4).
class TokenFile {
 public:
  // Detects the format: `path`.idx beside a .bin with Megatron's magic, else the first bytes of
  // `path`. Throws DataError naming the file and the problem.
  explicit TokenFile(const std::string& path);

  const std::string& path() const { return path_; }
  TokenFormat format() const { return format_; }
  int64_t size() const { return count_; }
  int width() const { return width_; }
  // The vocabulary the header declares (BigMac shards), or 0 when the format has none.
  uint32_t declared_vocab() const { return declared_vocab_; }

  uint32_t at(int64_t i) const {
    const unsigned char* p = tokens_ + i * width_;
    return width_ == 2
               ? uint32_t{p[0]} | uint32_t{p[1]} << 8
               : uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
  }
  // Megatron's documents (the index's document count less one), or -1 for a format without
  // documents. DocumentStart(d): the position of document d's first token; d == documents() gives
  // the end of the file.
  int64_t documents() const { return documents_; }
  int64_t DocumentStart(int64_t d) const;

  // Copies tokens [begin, begin + n) as int32.
  void Copy(int64_t begin, int64_t n, int32_t* out) const;

  // The largest token and its position (one pass over the map). For an empty file, 0 and -1.
  // Throws DataError naming a negative token of a signed format (Megatron's int32).
  struct Largest {
    uint32_t token = 0;
    int64_t position = -1;
  };
  Largest LargestToken() const;

 private:
  void OpenBigMac();
  void OpenLlmc();
  void OpenMegatron(const std::string& index_path);

  std::string path_;
  TokenFormat format_ = TokenFormat::kBigMac;
  std::shared_ptr<MappedFile> map_;
  const unsigned char* tokens_ = nullptr;
  int64_t count_ = 0;
  int width_ = 2;
  uint32_t declared_vocab_ = 0;
  bool signed_tokens_ = false;  // Megatron's int32 (dtype code 4); the others are unsigned
  // Megatron: the index stays mapped for DocumentStart.
  std::shared_ptr<MappedFile> index_map_;
  const unsigned char* pointers_ = nullptr;   // int64 byte pointer of each sequence
  const unsigned char* doc_index_ = nullptr;  // int64 first sequence of each document
  int64_t sequences_ = 0;
  int64_t documents_ = -1;
};

}  // namespace bigmac::data

#endif  // BIGMAC_CORE_DATA_TOKEN_FILE_H_
