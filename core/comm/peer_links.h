#ifndef BIGMAC_CORE_COMM_PEER_LINKS_H_
#define BIGMAC_CORE_COMM_PEER_LINKS_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/device/device_spans.h"
#include "core/memory/tensor.h"

namespace bigmac::comm {

// Message tags: activations and gradients by (stage, micro-batch), and the tied weight's exchange.
// Tags stay below 32768 (MPI guarantees no more); equal tags between one pair of ranks are matched
// in order, which the schedules preserve.
int ActivationTag(int stage, int microbatch);
int GradientTag(int stage, int microbatch);
inline constexpr int kTiedGradientTag = 16384;
inline constexpr int kTiedWeightTag = 16385;

// A tensor to send; the links own it until it is delivered.
struct Outgoing {
  memory::Tensor tensor;
  int peer = 0;
  int tag = 0;
  std::string what;
};

// A tensor to receive: where from, what it must be (checked), and the device it goes to.
struct Incoming {
  int peer = 0;
  int tag = 0;
  std::vector<int64_t> shape;
  memory::DType dtype = memory::DType::kF32;
  device::Device* device = nullptr;
  std::string what;
};

// One message in flight, for the trace: a send from its post to its observed delivery, a receive
// from the post of its data to its observed arrival. `in_compute`: the end was observed by the
// progress a compute loop runs (core/util/compute_progress.h), so the message moved while this rank
// computed.
struct MessageSpan {
  std::string name;
  std::chrono::steady_clock::time_point start;
  std::chrono::steady_clock::time_point end;
  bool in_compute = false;
};

// The pipeline's point-to-point tensors: sends, receives and batched exchanges with the other
// ranks of this rank's pipeline (peers are pp ranks). Tensors of any dtype travel; the receiver
// states the dtype and shape it expects, and a mismatch is a TransportError. Owned by the
// transport (PipelineComm); the devices outlive it. Call from the thread that initialised MPI.
class PeerLinks {
 public:
  PeerLinks() = default;
  PeerLinks(const PeerLinks&) = delete;
  PeerLinks& operator=(const PeerLinks&) = delete;
  virtual ~PeerLinks() = default;

  // Non-blocking: the links keep `tensor` (no copy on the CPU) until it is delivered.
  virtual void Send(memory::Tensor tensor, int peer, int tag, const std::string& what) = 0;
  // Waits up to the deadline for the message, then checks its dtype and shape against the
  // expected ones. Throws DeadlineError or TransportError.
  virtual memory::Tensor Receive(int peer, int tag, const std::vector<int64_t>& shape,
                                 memory::DType dtype, device::Device* device,
                                 const std::string& what) = 0;
  // One batched exchange with neighbours: every send and every receive is posted before any is
  // waited for (NCCL's ncclGroupStart/End; an ncclSend blocks until its peer posts the receive,
  // so sends and receives issued one by one can deadlock). Returns the received tensors in the
  // order of `receives`. The default posts the sends, then waits for each receive, which is
  // the same thing for links whose sends never block.
  virtual std::vector<memory::Tensor> Exchange(std::vector<Outgoing> sends,
                                               const std::vector<Incoming>& receives);
  // Announces a receive that a later Receive (or Exchange) will ask for, so that links may start
  // moving it before (MPI: once its header has arrived, Progress posts its data). Every expected
  // receive must be received; equal (peer, tag) pairs in the order they will be received.
  // Default: nothing.
  virtual void Expect(const Incoming& /*receive*/) {}
  // Receives announced and not yet received.
  virtual size_t expected_receives() const { return 0; }
  // After a failure between an Expect and its Receive: forgets the announced receives, so that a
  // later Receive with the same (peer, tag) cannot take their messages. Returns how many had their
  // data posted already (their buffers stay with the links, which MPI may still write).
  virtual size_t ForgetExpected() { return 0; }
  // Waits (with the deadline) until every send has been delivered.
  virtual void FinishSends() = 0;
  // Moves sends and expected receives in flight along without blocking. Default: nothing.
  virtual void Progress() {}
  // Where links with streams of their own (NCCL) time their operations for the trace's device
  // track (null: nowhere). `spans` outlives the links' use of it.
  virtual void set_device_spans(device::DeviceSpans* /*spans*/) {}

  // Payload bytes of activations and gradients sent to pipeline neighbours so far (tags below
  // kTiedGradientTag), the traffic bf16 halves.
  int64_t activation_bytes_sent() const { return activation_bytes_sent_; }

  // Whether links that time their messages (MPI) keep a MessageSpan per message (default off).
  void set_record_messages(bool on) { record_messages_ = on; }
  // The spans of the messages completed since the last call.
  std::vector<MessageSpan> TakeMessageSpans() {
    std::vector<MessageSpan> spans;
    spans.swap(message_spans_);
    return spans;
  }

 protected:
  // Implementations call this for every tensor they send.
  void CountSent(int tag, int64_t bytes) {
    if (tag < kTiedGradientTag) activation_bytes_sent_ += bytes;
  }
  // And this for every message they see complete, while recording.
  bool record_messages() const { return record_messages_; }
  void AddMessageSpan(MessageSpan span) { message_spans_.push_back(std::move(span)); }

 private:
  int64_t activation_bytes_sent_ = 0;
  bool record_messages_ = false;
  std::vector<MessageSpan> message_spans_;
};

// One process, one rank: sends to oneself are queued, by tag.
class LocalLinks : public PeerLinks {
 public:
  void Send(memory::Tensor tensor, int peer, int tag, const std::string& what) override;
  memory::Tensor Receive(int peer, int tag, const std::vector<int64_t>& shape, memory::DType dtype,
                         device::Device* device, const std::string& what) override;
  void FinishSends() override {}

 private:
  std::map<int, std::deque<memory::Tensor>> queues_;
};

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_PEER_LINKS_H_
