#include "core/comm/pipeline_comm.h"

#include <stdexcept>
#include <utility>

namespace bigmac::comm {

std::string DescribeTensor(memory::DType dtype, const std::vector<int64_t>& shape) {
  std::string text = memory::DTypeName(dtype) + "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

PipelineComm::PipelineComm(Parts parts) : parts_(std::move(parts)) {
  if (!parts_.links || !parts_.world || !parts_.pp || !parts_.dp || !parts_.tp)
    throw std::logic_error("PipelineComm: a part is missing");
}

PipelineComm::~PipelineComm() {
  // The parts before what they share.
  parts_.links.reset();
  parts_.tp.reset();
  parts_.dp.reset();
  parts_.pp.reset();
  parts_.world.reset();
}

void PipelineComm::Progress() {
  links().Progress();
  for (Group* group : {&world(), &pp(), &dp(), &tp()}) group->Progress();
}

void PipelineComm::set_device_spans(device::DeviceSpans* spans) {
  links().set_device_spans(spans);
  for (Group* group : {&world(), &pp(), &dp(), &tp()}) group->set_device_spans(spans);
}

std::unique_ptr<PipelineComm> MakeLocalPipelineComm(std::unique_ptr<Group> dp) {
  PipelineComm::Parts parts;
  parts.links = std::make_unique<LocalLinks>();
  parts.world = std::make_unique<LocalGroup>("world");
  parts.pp = std::make_unique<LocalGroup>("pp");
  parts.dp = dp ? std::move(dp) : std::make_unique<LocalGroup>("dp");
  parts.tp = std::make_unique<LocalGroup>("tp");
  return std::make_unique<PipelineComm>(std::move(parts));
}

}  // namespace bigmac::comm
