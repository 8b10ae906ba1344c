// A plugin built for ABI version 1 (before backends and the device seam): the host must refuse
// it, saying what changed, before registering anything.
#define BIGMAC_PLUGIN_ABI_VERSION 1
#include "plugins/bigmac_plugin.h"

namespace {
void* NoLayer(const void*) { return nullptr; }
bool Register(bigmac_registry* registry) {
  return bigmac::plugin::RegisterLayer(registry, "old_block", "cpu", &NoLayer);
}
}  // namespace

BIGMAC_PLUGIN(Register)
