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

#include <cstdint>
#include <string>

namespace ts::store {

// PRAGMA application_id of a TrainStudio run database ("TSRD"), so that another program's SQLite
// file is refused instead of being migrated.
inline constexpr int32_t kApplicationId = 0x54535244;

// The schema version this build reads and writes.
int schemaVersion();

// The SQL of migration `version` (1..schemaVersion()), without the transaction and the
// user_version bump. Tests use it to build a database of an older version.
const std::string& migrationSql(int version);

} // namespace ts::store
