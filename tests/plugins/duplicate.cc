// A plugin that claims a built-in layer type's name.
#include "plugins/bigmac_plugin.h"

namespace {
void* NoLayer(const void*) { return nullptr; }
bool Register(bigmac_registry* registry) {
  return bigmac::plugin::RegisterLayer(registry, "gpt_block", "cpu", &NoLayer);
}
}  // namespace

BIGMAC_PLUGIN(Register)
