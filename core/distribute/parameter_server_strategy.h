#pragma once
// The worker side of ParameterServerStrategy (between-graph, asynchronous): one replica whose
// variables live on the ps tasks. Each step pulls the current values, computes the gradients of
// the mean loss over this worker's rows of the global batch, pushes them and goes on without
// waiting for them to be applied. The trainer takes the steps ps:0 schedules (stepScheduler()),
// not an epoch of its own. Only Strategy::create calls this.

#include <memory>

#include "distribute/strategy.h"

namespace ts {

Result<std::unique_ptr<Strategy>> makeParameterServerStrategy(const StrategyConfig& config,
                                                              std::shared_ptr<const GraphAnalysis> graph,
                                                              const LossSpec& loss);

} // namespace ts
