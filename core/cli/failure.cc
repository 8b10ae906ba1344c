#include "core/cli/failure.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <new>

#include "core/checkpoint/checkpoint.h"
#include "core/cli/exit_codes.h"
#include "core/comm/pipeline_comm.h"
#include "core/data/error.h"
#include "core/device/device.h"
#include "core/engine/trainer.h"
#include "core/memory/allocator.h"
#include "core/util/format.h"
#include "core/util/output_file.h"

namespace bigmac::cli {

Failure CurrentFailure(const std::string& bad_alloc_hint) {
  try {
    throw;
  } catch (const util::OutputError& error) {
    return {kExitOutput, error.what()};
  } catch (const std::filesystem::filesystem_error& error) {
    std::string paths = error.path1().string();
    if (!error.path2().empty()) paths += " -> " + error.path2().string();
    return {kExitOutput, paths + ": " + error.code().message() + " (" + error.what() + ")"};
  } catch (const data::DataError& error) {
    // A data file (a tokenizer, shards), wherever it is found: its name and the problem.
    return {kExitBadData, error.what()};
  } catch (const memory::OutOfMemoryError& error) {
    return {kExitOutOfMemory, error.what()};
  } catch (const std::bad_alloc&) {
    // Host buffers (batches, staging) come from the system, not the device allocator.
    return {kExitOutOfMemory,
            "out of memory: a host allocation failed (std::bad_alloc); " + bad_alloc_hint};
  } catch (const engine::NumericalError& error) {
    return {kExitNumerical, error.what(), error.reported()};
  } catch (const comm::DeadlineError& error) {
    return {kExitTimeout, std::string(error.what()) + "; stopping the job"};
  } catch (const checkpoint::CheckpointError& error) {
    return {kExitCheckpoint, std::string("checkpoint: ") + error.what()};
  } catch (const device::DeviceError& error) {
    return {kExitDevice, error.what()};
  } catch (const comm::TransportError& error) {
    return {kExitFailure, error.what()};
  } catch (const std::exception& error) {
    return {kExitFailure, std::string("internal error: ") + error.what()};
  } catch (...) {
    return {kExitFailure, "internal error: an exception of unknown type"};
  }
}

int ReportCurrentFailure(const std::string& prefix, const std::string& bad_alloc_hint) {
  const Failure failure = CurrentFailure(bad_alloc_hint);
  if (failure.reported) return failure.code;
  // Safe on a terminal (a message may quote a binary file), its lines kept.
  std::string text;
  for (size_t begin = 0; begin <= failure.message.size();) {
    const size_t end = std::min(failure.message.find('\n', begin), failure.message.size());
    text += (begin ? "\n" : "") + util::Printable(failure.message.substr(begin, end - begin));
    begin = end + 1;
  }
  std::fprintf(stderr, "%s%s\n", prefix.c_str(), text.c_str());
  return failure.code;
}

}  // namespace bigmac::cli
