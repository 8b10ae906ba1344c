// A plugin built for a future ABI version: the host must refuse it before registering anything.
#define BIGMAC_PLUGIN_ABI_VERSION 3
#include "plugins/bigmac_plugin.h"

namespace {
void* NoLayer(const void*) { return nullptr; }
bool Register(bigmac_registry* registry) {
  return bigmac::plugin::RegisterLayer(registry, "future_block", "cpu", &NoLayer);
}
}  // namespace

BIGMAC_PLUGIN(Register)
