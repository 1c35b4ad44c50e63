#pragma once
// Exports of a stored run: metrics as CSV, spans as a Chrome trace, the final weights as
// safetensors. Each names the run and the file in its errors.

#include <ostream>
#include <string>

#include "common/result.h"
#include "store/run_store.h"

namespace ts::store {

// One row per step: wall_time (Unix seconds), step, epoch, then one column per metric ("loss"
// first, the rest by name). A metric missing at a step is an empty cell. RFC 4180 quoting.
Status exportStepMetricsCsv(RunStore& store, const std::string& runId, std::ostream& out);
// One row per epoch: epoch, step, wall_time, then one column per epoch metric.
Status exportEpochMetricsCsv(RunStore& store, const std::string& runId, std::ostream& out);

// The run's spans (and counters), device samples, step metrics and run state changes as a Chrome
// Trace Event file (opens in Perfetto / chrome://tracing), written atomically. Returns the
// number of spans written.
Result<std::size_t> exportChromeTrace(RunStore& store, const std::string& runId, const std::string& path);

// The run's final weights: its "final" checkpoint, else the latest, checked against its recorded
// checksum. NotFound names the run when it has none.
Result<Checkpoint> finalCheckpoint(RunStore& store, const std::string& runId);

// Copies the run's final weights (finalCheckpoint) to `path`. Returns the checkpoint used.
Result<Checkpoint> exportFinalWeights(RunStore& store, const std::string& runId, const std::string& path);

} // namespace ts::store
