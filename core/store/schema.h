#pragma once
// The run database's schema, as numbered migrations. PRAGMA user_version holds the number of the
// last migration applied; each migration runs in its own transaction together with the
// user_version bump, so a crash leaves the database at one version or the next, never between.
//
// Policy: migrations only add (tables, columns, indexes, back-filled values); they never drop or
// rename. That is what lets an older TrainStudio open a newer database read-only.
//
// Version history:
//   1  projects, runs, step and epoch metrics, checkpoints
//   2  run tags, model name column (back-filled from the model snapshot), writer identity for
//      crash detection, step breakdowns, device and pipeline samples, trace chunks, advisor
//      findings, log lines, other run files
//   3  step metrics packed: step_series holds one row per run, metric and batch of steps (see
//      step_series.h); the step_metrics rows move there (the table stays, empty, so an older
//      build still opens a newer database read-only; it shows its runs without step metrics)

#include <cstdint>
#include <string>

#include "common/result.h"

namespace ts::store {

namespace sql {
class Db;
}

// PRAGMA application_id of a TrainStudio run database ("TSRD"), so that another program's SQLite
// file is refused instead of being migrated.
inline constexpr int32_t kApplicationId = 0x54535244;

// The schema version this build reads and writes.
int schemaVersion();

// The SQL of migration `version` (1..schemaVersion()), without the transaction and the
// user_version bump. Tests use it to build a database of an older version.
const std::string& migrationSql(int version);

// What migration `version` does after its SQL, in the same transaction, where SQL alone cannot
// (schema 3 encodes the step metrics into blobs). Nothing for the other versions.
Status migrateData(sql::Db& db, int version);

} // namespace ts::store
