// A plugin whose entry point registers nothing.
#include "plugins/bigmac_plugin.h"

namespace {
bool Register(bigmac_registry*) { return true; }
}  // namespace

BIGMAC_PLUGIN(Register)
