#ifndef BIGMAC_CORE_CLI_FAULT_ENV_H_
#define BIGMAC_CORE_CLI_FAULT_ENV_H_

#include "core/util/fault_plan.h"

namespace bigmac::cli {

// The fault plan the BIGMAC_TEST_* variables describe (core/util/fault_plan.h names each); unset
// variables inject nothing. The one place that reads them: call it once, at start-up.
util::FaultPlan FaultPlanFromEnvironment();

}  // namespace bigmac::cli

#endif  // BIGMAC_CORE_CLI_FAULT_ENV_H_
