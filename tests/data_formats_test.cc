// Token file readers on files written here, byte by byte, from the published layouts (llm.c's
// dev/data/data_common.py, Megatron-LM's indexed_dataset.py, docs/data.md), not by the reader's
// code; SentencePiece; and training on llm.c files against BigMac shards of the same tokens.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "core/comm/pipeline_comm.h"
#include "core/config/loader.h"
#include "core/config/resolve.h"
#include "core/data/dataset.h"
#include "core/data/prep.h"
#include "core/data/shard.h"
#include "core/data/tokenizer.h"
#include "core/engine/trainer.h"
#include "tests/testing/run.h"
#include "tests/testing/token_writers.h"

namespace bigmac {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------- independent writers

using testutil::BigMacShard;
using testutil::LlmcFile;
using testutil::Put;
using testutil::RandomTokens;
using testutil::WriteMegatron;

void WriteFile(const std::string& path, const std::string& bytes) {
  testutil::WriteBytes(path, bytes);
}

using testutil::ReadFile;

using testutil::FreshDir;

std::vector<int32_t> AllTokens(const data::TokenDataset& dataset) {
  std::vector<int32_t> out(dataset.size());
  dataset.Gather(0, dataset.size(), out.data());
  return out;
}

std::vector<int32_t> AsInt(const std::vector<uint32_t>& tokens) {
  return std::vector<int32_t>(tokens.begin(), tokens.end());
}

// The DataError message of opening `split` in `dir` and checking it against `model_vocab`.
std::string OpenError(const std::string& dir, int64_t model_vocab = 1 << 20,
                      const std::string& split = "train") {
  try {
    data::TokenDataset(dir, split).CheckFits(8, model_vocab);
  } catch (const data::DataError& error) {
    return error.what();
  }
  return "";
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// ---------------------------------------------------------------- llm.c

TEST(Llmc, ReadsGlobbedUint16AndUint32Shards) {
  for (const bool wide : {false, true}) {
    const std::string dir = FreshDir(wide ? "llmc7" : "llmc1");
    const uint32_t below = wide ? 128256 : 50257;  // Llama 3's and GPT-2's vocabularies
    const auto a = RandomTokens(1000, below, 1), b = RandomTokens(777, below, 2);
    WriteFile(dir + "/fineweb_train_000001.bin", LlmcFile(a, wide));
    WriteFile(dir + "/fineweb_train_000002.bin", LlmcFile(b, wide));
    WriteFile(dir + "/fineweb_val_000000.bin", LlmcFile(RandomTokens(300, below, 3), wide));
    const data::TokenDataset train(dir, "train");
    std::vector<int32_t> expected = AsInt(a);
    expected.insert(expected.end(), b.begin(), b.end());
    EXPECT_EQ(AllTokens(train), expected);
    EXPECT_EQ(train.vocab_size(), *std::max_element(expected.begin(), expected.end()) + 1u);
    EXPECT_HAS(train.description(), "2 llm.c files, 1777 tokens");
    EXPECT_EQ(data::TokenDataset(dir, "val").size(), 300);
    if (wide) EXPECT_GT(train.vocab_size(), 65536u) << "uint32 tokens above 16 bits";
  }
}

TEST(Llmc, RejectsCorruptedTruncatedAndTooLargeVocabulary) {
  const std::string dir = FreshDir("llmc_bad");
  const std::string good = LlmcFile(RandomTokens(100, 50257, 4), false);
  const std::string path = dir + "/x_train.bin";
  std::string version = good;
  version[4] = 7;  // the uint16 magic with the uint32 version
  WriteFile(path, version);
  EXPECT_HAS(OpenError(dir), "x_train.bin: llm.c magic 20240520 with version 7");
  std::string count = good;
  count[11] = static_cast<char>(0x80);  // header[2] < 0
  WriteFile(path, count);
  EXPECT_HAS(OpenError(dir), "x_train.bin: llm.c header[2] (the token count) is -");
  WriteFile(path, good.substr(0, good.size() - 2));
  EXPECT_HAS(OpenError(dir),
             "x_train.bin: the llm.c header promises 100 tokens of 2 bytes "
             "(1224 bytes) but the file has 1222 bytes (truncated)");
  WriteFile(path, good.substr(0, 500));
  EXPECT_HAS(OpenError(dir), "shorter than llm.c's 1024-byte header");
  WriteFile(path, good + "xx");
  EXPECT_HAS(OpenError(dir), "(trailing bytes)");
  WriteFile(path, LlmcFile({5, 19743, 3, 9, 1, 2, 3, 4, 5, 6}, false));
  EXPECT_HAS(OpenError(dir, 256), "x_train.bin: token 19743 at position 1 (the largest)");
  EXPECT_HAS(OpenError(dir, 256), "larger than model.vocab_size=256");
  EXPECT_EQ(OpenError(dir, 19744), "");
}

// ---------------------------------------------------------------- Megatron

TEST(Megatron, ReadsIndexedDatasetsInSequenceOrder) {
  for (const bool wide : {false, true}) {
    const std::string dir = FreshDir(wide ? "megatron32" : "megatron16");
    const auto tokens = RandomTokens(1000, wide ? 100000 : 32000, 5);
    WriteMegatron(dir + "/corpus_train_text_document", tokens, {100, 0, 400, 250, 250}, wide);
    WriteMegatron(dir + "/corpus_val_text_document", RandomTokens(64, 32000, 6), {64}, wide);
    const data::TokenDataset train(dir, "train");
    EXPECT_EQ(AllTokens(train), AsInt(tokens));
    EXPECT_HAS(train.description(), "1 megatron files, 1000 tokens");
    EXPECT_EQ(data::TokenDataset(dir, "val").size(), 64);
  }
}

TEST(Megatron, RejectsCorruptedTruncatedAndTooLargeVocabulary) {
  const std::string dir = FreshDir("megatron_bad");
  const std::string prefix = dir + "/c_train";
  const auto tokens = RandomTokens(200, 1000, 7);
  WriteMegatron(prefix, tokens, {120, 80}, false);
  const std::string idx = ReadFile(prefix + ".idx"), bin = ReadFile(prefix + ".bin");
  EXPECT_EQ(OpenError(dir, 1000), "");

  std::string magic = idx;
  magic[2] = 'X';
  WriteFile(prefix + ".idx", magic);
  EXPECT_HAS(OpenError(dir), "c_train.idx: not a Megatron MMIDIDX index");
  std::string version = idx;
  version[9] = 2;
  WriteFile(prefix + ".idx", version);
  EXPECT_HAS(OpenError(dir), "c_train.idx: MMIDIDX version 2 is not supported");
  std::string dtype = idx;
  dtype[17] = 6;  // float64
  WriteFile(prefix + ".idx", dtype);
  EXPECT_HAS(OpenError(dir), "c_train.idx: dtype code 6 is not a token type");
  std::string pointer = idx;
  pointer[34 + 2 * 4 + 8] = 2;  // the second sequence's pointer: 240 -> 2
  WriteFile(prefix + ".idx", pointer);
  EXPECT_HAS(OpenError(dir),
             "c_train.idx: sequence 1 has length 80 at byte 2; expected a length >= 0 at byte 240");
  WriteFile(prefix + ".idx", idx.substr(0, idx.size() - 8));
  EXPECT_HAS(OpenError(dir), "c_train.idx: 2 sequences and 3 documents do not fit");

  WriteFile(prefix + ".idx", idx);
  WriteFile(prefix + ".bin", bin.substr(0, bin.size() - 2));
  EXPECT_HAS(OpenError(dir), "c_train.bin: " + prefix +
                                 ".idx describes 200 tokens (400 bytes) but the file has 398 "
                                 "bytes (truncated)");
  WriteFile(prefix + ".bin", bin);
  EXPECT_HAS(OpenError(dir, 500), "larger than model.vocab_size=500");
}

// ---------------------------------------------------------------- BigMac shards

TEST(BigMacShard, ReadsHandWrittenShardsOfBothWidths) {
  const std::string dir = FreshDir("bigmac");
  const auto a = RandomTokens(500, 256, 8), b = RandomTokens(300, 256, 9);
  WriteFile(dir + "/train_000.bin", BigMacShard(a, 256, 2));
  WriteFile(dir + "/train_001.bin", BigMacShard(b, 256, 4));
  const data::TokenDataset train(dir, "train");
  std::vector<int32_t> expected = AsInt(a);
  expected.insert(expected.end(), b.begin(), b.end());
  EXPECT_EQ(AllTokens(train), expected);
  EXPECT_EQ(train.vocab_size(), 256u);
  // What prep writes reads back through the same layout.
  data::WriteShard(dir + "/wide.bin", 100000, {99999, 0, 65536});
  EXPECT_EQ(ReadFile(dir + "/wide.bin"), BigMacShard({99999, 0, 65536}, 100000, 4));
}

TEST(BigMacShard, RejectsCorruptedTruncatedAndTooLargeVocabulary) {
  const std::string dir = FreshDir("bigmac_bad");
  const std::string path = dir + "/train_000.bin";
  const std::string good = BigMacShard(RandomTokens(50, 300, 10), 300, 2);
  std::string reserved = good;
  reserved[27] = 1;
  WriteFile(path, reserved);
  EXPECT_HAS(OpenError(dir), "train_000.bin: header byte 27 is not zero");
  std::string width = good;
  width[12] = 3;
  WriteFile(path, width);
  EXPECT_HAS(OpenError(dir), "train_000.bin: 3 bytes per token");
  WriteFile(path, good.substr(0, good.size() - 1));
  EXPECT_HAS(OpenError(dir), "train_000.bin: the header promises 50 tokens");
  WriteFile(path, BigMacShard({1, 2, 3, 299, 4, 5, 6, 7, 8, 9}, 256, 2));
  EXPECT_HAS(OpenError(dir), "token 299 at position 3 is outside the vocabulary of 256");
  WriteFile(path, good);
  EXPECT_HAS(OpenError(dir, 256),
             "train_000.bin: vocabulary 300, larger than model.vocab_size=256");
  WriteFile(dir + "/train_001.bin", BigMacShard({1, 2}, 512, 2));
  EXPECT_HAS(OpenError(dir), "train_001.bin: vocabulary 512 differs from 300");
}

TEST(Formats, UnknownMagicNamesTheFile) {
  const std::string dir = FreshDir("unknown");
  WriteFile(dir + "/train.bin", "GGUF and then some bytes");
  EXPECT_HAS(OpenError(dir), "train.bin: wrong magic: not a token file of a known format");
  EXPECT_HAS(OpenError(dir, 1 << 20, "val"), "no val files matching *val*.bin");
}

// The same tokens as one BigMac shard, three llm.c files and a Megatron dataset: identical
// batches for every key.
TEST(Formats, BatchesDoNotDependOnTheFormatOrTheFileCut) {
  const auto tokens = RandomTokens(5000, 256, 11);
  const std::string bigmac = FreshDir("same_bigmac"), llmc = FreshDir("same_llmc"),
                    megatron = FreshDir("same_megatron");
  WriteFile(bigmac + "/train_000.bin", BigMacShard(tokens, 256, 2));
  for (int part = 0; part < 3; ++part) {
    const auto begin = tokens.begin() + part * 1700,
               end = tokens.begin() + std::min(5000, (part + 1) * 1700);
    WriteFile(llmc + "/d_train_00000" + std::to_string(part) + ".bin",
              LlmcFile(std::vector<uint32_t>(begin, end), part == 1));
  }
  WriteMegatron(megatron + "/d_train", tokens, {1234, 3766}, false);
  const data::TokenDataset a(bigmac, "train"), b(llmc, "train"), c(megatron, "train");
  const int batch = 4, seq = 64;
  std::vector<int32_t> ta(batch * seq), ya(ta.size()), tb(ta.size()), yb(ta.size()), tc(ta.size()),
      yc(ta.size());
  for (int step = 0; step < 20; ++step) {
    a.TrainBatch(7, step, 0, step % 3, batch, seq, ta.data(), ya.data());
    b.TrainBatch(7, step, 0, step % 3, batch, seq, tb.data(), yb.data());
    c.TrainBatch(7, step, 0, step % 3, batch, seq, tc.data(), yc.data());
    ASSERT_EQ(ta, tb);
    ASSERT_EQ(ya, yb);
    ASSERT_EQ(ta, tc);
    ASSERT_EQ(ya, yc);
    a.EvalBatch(step, batch, seq, ta.data(), ya.data());
    b.EvalBatch(step, batch, seq, tb.data(), yb.data());
    ASSERT_EQ(ta, tb);
    ASSERT_EQ(ya, yb);
  }
  for (int i = 0; i + 1 < seq; ++i) EXPECT_EQ(ya[i], ta[i + 1]);
}

// ---------------------------------------------------------------- training and SentencePiece

// English-like text, seeded: words, punctuation, newlines and a few non-ASCII characters.
std::string CorpusText() {
  const char* words[] = {"the",   "pipeline", "stage", "sends", "activations", "to",    "next",
                         "rank",  "and",      "waits", "for",   "gradients",   "while", "optimizer",
                         "steps", "every",    "batch", "naïve", "café"};
  std::string text;
  uint64_t state = 12345;
  for (int i = 0; i < 40000; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    text += words[(state >> 33) % 19];
    text += (i % 11 == 10) ? ".\n" : " ";
  }
  return text;
}

std::string CorpusFile() {
  static const std::string path = testutil::WriteTempFile("corpus.txt", CorpusText());
  return path;
}

std::string Prep(const std::string& name, data::PrepOptions prep) {
  prep.inputs = {CorpusFile()};
  prep.output = testutil::TempDir() + "/" + name;
  prep.val_every = 10;
  prep.block_tokens = 1024;
  fs::remove_all(prep.output);
  data::PrepareShards(prep);
  return prep.output;
}

config::ResolvedConfig SmallRun(const std::string& data_dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {
      "model.num_layers=2",     "model.hidden_size=32", "model.num_heads=2",
      "model.vocab_size=256",   "train.seq_length=16",  "train.micro_batch_size=4",
      "train.max_steps=5",      "train.eval_batches=2", "train.eval_interval=2",
      "train.log_interval=100", "data.dir=" + data_dir};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return config::Resolve(config::LoadConfig("", sets), 1, "test");
}

TEST(Training, LlmcCopyOfTheDataGivesTheSameLosses) {
  const std::string shards = Prep("shards_byte", {});
  const std::string llmc = FreshDir("shards_llmc");
  for (const std::string split : {"train", "val"}) {
    const std::vector<std::string> names = data::ShardsIn(shards);
    std::vector<uint32_t> stream;
    for (const std::string& name : names) {
      if (name.rfind(split, 0) != 0) continue;
      const data::Shard shard = data::ReadShard(shards + "/" + name);
      stream.insert(stream.end(), shard.tokens.begin(), shard.tokens.end());
    }
    // Cut differently from the BigMac shards: two files per split.
    const size_t half = stream.size() / 2 + 17;
    WriteFile(llmc + "/corpus_" + split + "_000000.bin",
              LlmcFile(std::vector<uint32_t>(stream.begin(), stream.begin() + half), false));
    WriteFile(llmc + "/corpus_" + split + "_000001.bin",
              LlmcFile(std::vector<uint32_t>(stream.begin() + half, stream.end()), true));
  }
  const auto quiet = [](const std::string&) {};
  const engine::TrainResult a = engine::TrainSingleRank(SmallRun(shards), quiet);
  const engine::TrainResult b = engine::TrainSingleRank(SmallRun(llmc), quiet);
  ASSERT_EQ(a.train_losses.size(), 5u);
  EXPECT_EQ(a.train_losses, b.train_losses);
  EXPECT_EQ(a.val_losses, b.val_losses);
  EXPECT_EQ(a.final_parameters, b.final_parameters);
}

TEST(SentencePiece, TrainsEncodesAndRoundTripsText) {
  data::PrepOptions prep;
  prep.tokenizer = "sentencepiece";
  prep.vocab_size = 400;
  const std::string dir = Prep("shards_sp", prep);
  const auto manifest = data::ReadTokenizerManifest(dir);
  ASSERT_TRUE(manifest.has_value());
  EXPECT_EQ(manifest->kind, "sentencepiece");
  EXPECT_EQ(manifest->vocab_size, 400u);
  EXPECT_TRUE(fs::exists(dir + "/tokenizer.model"));
  const std::unique_ptr<data::Tokenizer> tokenizer = data::TokenizerFor(dir);
  EXPECT_EQ(tokenizer->name(), "sentencepiece (400 pieces)");

  // Text it has never seen (digits, tabs, CJK, an emoji) comes back exactly.
  const std::string text =
      "  the naïve stage\tsends 42 activations\n\n日本語 🙂 and waits.\n";
  const std::vector<int32_t> ids = tokenizer->Encode(text);
  EXPECT_EQ(tokenizer->Decode(ids), text);
  EXPECT_EQ(tokenizer->Decode({ids[0], 400, ids[1]}),
            tokenizer->Decode({ids[0]}) + "<|400|>" + tokenizer->Decode({ids[1]}));
  int64_t bytes = 0;
  for (int32_t id : ids) bytes += tokenizer->TextBytes(id);
  EXPECT_EQ(bytes, static_cast<int64_t>(text.size()));

  // The shards, put back in block order, decode to the corpus.
  const data::TokenDataset train(dir, "train"), val(dir, "val");
  EXPECT_EQ(train.vocab_size(), 400u);
  const std::vector<int32_t> t = AllTokens(train), v = AllTokens(val);
  std::vector<int32_t> stream;
  size_t ti = 0, vi = 0;
  for (int64_t block = 0; ti < t.size() || vi < v.size(); ++block) {
    const bool held_out = block % 10 == 9;
    const std::vector<int32_t>& from = held_out ? v : t;
    size_t& at = held_out ? vi : ti;
    const size_t n = std::min<size_t>(1024, from.size() - at);
    stream.insert(stream.end(), from.begin() + at, from.begin() + at + n);
    at += n;
  }
  EXPECT_EQ(tokenizer->Decode(stream), CorpusText());
  EXPECT_LT(stream.size() * 2, CorpusText().size()) << "subwords: fewer tokens than bytes";
  EXPECT_EQ(manifest->val_tokens, static_cast<int64_t>(v.size()));
  EXPECT_GT(manifest->val_bytes, manifest->val_tokens * 2);

  // --tokenizer-model: the same model encodes the same shards.
  data::PrepOptions again;
  again.tokenizer = "sentencepiece";
  again.tokenizer_model = dir + "/tokenizer.model";
  const std::string copy = Prep("shards_sp_again", again);
  EXPECT_EQ(ReadFile(copy + "/train_000.bin"), ReadFile(dir + "/train_000.bin"));
  EXPECT_EQ(data::ReadTokenizerManifest(copy)->Id(), manifest->Id());

  // The model is too small for the data's vocabulary: refused before training.
  try {
    engine::TrainSingleRank(SmallRun(dir), [](const std::string&) {});
    FAIL() << "trained a 256-token model on 400-token data";
  } catch (const data::DataError& error) {
    EXPECT_HAS(error.what(), "tokenizer.json: vocabulary 400, larger than model.vocab_size=256");
  }
  // A model file that is not the one the shards were made with.
  WriteFile(copy + "/tokenizer.model", ReadFile(copy + "/tokenizer.model") + "x");
  EXPECT_HAS(OpenError(copy), "tokenizer.model: FNV-1a hash");
}

TEST(SentencePiece, ACheckpointRefusesDataOfAnotherTokenizer) {
  const std::string bytes = Prep("shards_byte_ckpt", {});
  data::PrepOptions prep;
  prep.tokenizer = "sentencepiece";
  prep.vocab_size = 320;
  prep.model_type = "unigram";
  const std::string sp = Prep("shards_sp_ckpt", prep);
  const std::string root = FreshDir("ckpt_tokenizer");
  std::unique_ptr<comm::PipelineComm> comm = comm::MakeLocalPipelineComm();
  engine::TrainOptions options;
  engine::Train(SmallRun(bytes, {"checkpoint.dir=" + root, "model.vocab_size=320"}), *comm,
                options);
  options.resume = "auto";
  try {
    engine::Train(
        SmallRun(sp, {"checkpoint.dir=" + root, "model.vocab_size=320", "train.max_steps=8"}),
        *comm, options);
    FAIL() << "resumed a byte-level model on SentencePiece data";
  } catch (const data::DataError& error) {
    EXPECT_HAS(error.what(), "tokenizer.json: tokenizer sentencepiece/320/");
    EXPECT_HAS(error.what(), "was trained on tokenizer byte/256");
  }
  // The same tokenizer resumes.
  EXPECT_NO_THROW(engine::Train(
      SmallRun(bytes, {"checkpoint.dir=" + root, "model.vocab_size=320", "train.max_steps=8"}),
      *comm, options));
}

}  // namespace
}  // namespace bigmac

namespace bigmac {
namespace {

// The command line: bad flag combinations exit 2, a SentencePiece prep through the binary (its
// shim found beside the build), and data of a larger vocabulary refused with exit 5.
TEST(DataPrepCli, TokenizerFlagsAndVocabularyRefusal) {
  const std::string corpus = testutil::WriteTempFile("cli_corpus.txt", CorpusText());
  const std::string out = testutil::TempDir() + "/cli_sp";
  fs::remove_all(out);
  const std::string prep = testutil::Bigmac() + " data prep --input " + corpus + " --output " + out;
  testutil::RunResult r = testutil::RunCommand(prep + " --tokenizer sentencepiece", 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_HAS(r.output, "--tokenizer sentencepiece needs --vocab-size N");
  r = testutil::RunCommand(prep + " --vocab-size 300 --tokenizer byte", 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = testutil::RunCommand(prep + " --tokenizer sentencepiece --vocab-size 300 --val-every 10",
                           120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_HAS(r.output, "sentencepiece bpe, trained, vocab 300");
  EXPECT_TRUE(fs::exists(out + "/tokenizer.model"));
  r = testutil::RunCommand(testutil::Bigmac() + " train --config " +
                               testutil::Runfile("configs/tiny.yaml") + " --set data.dir=" + out +
                               " --set train.max_steps=1",
                           120);
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_HAS(r.output, "tokenizer.json: vocabulary 300, larger than model.vocab_size=256");
}

}  // namespace
}  // namespace bigmac
