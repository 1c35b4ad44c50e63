#include "store/schema.h"

#include <array>
#include <vector>

#include "store/sqlite_db.h"
#include "store/step_series.h"

namespace ts::store {

namespace {

// Times are microseconds since the Unix epoch; durations are seconds (REAL). Per-run tables
// reference runs.rid (an integer) rather than the text id to keep the big tables small.
const std::string kV1 = R"SQL(
CREATE TABLE projects (
  name        TEXT PRIMARY KEY,
  spec_json   TEXT NOT NULL,
  created_us  INTEGER NOT NULL,
  updated_us  INTEGER NOT NULL
);
CREATE TABLE runs (
  rid          INTEGER PRIMARY KEY,
  id           TEXT NOT NULL UNIQUE,
  name         TEXT NOT NULL,
  project      TEXT NOT NULL DEFAULT '',
  model_json   TEXT,
  config_json  TEXT,
  config_hash  TEXT NOT NULL DEFAULT '',
  seed         INTEGER NOT NULL DEFAULT 0,
  strategy     TEXT NOT NULL DEFAULT '',
  devices_json TEXT,
  status       TEXT NOT NULL DEFAULT 'created',
  created_us   INTEGER NOT NULL,
  started_us   INTEGER,
  ended_us     INTEGER,
  error        TEXT NOT NULL DEFAULT ''
);
CREATE INDEX runs_by_created ON runs(created_us);
CREATE INDEX runs_by_status ON runs(status);
CREATE TABLE step_metrics (
  run      INTEGER NOT NULL,
  name     TEXT NOT NULL,
  step     INTEGER NOT NULL,
  epoch    INTEGER NOT NULL,
  value    REAL,
  wall_us  INTEGER NOT NULL,
  PRIMARY KEY (run, name, step)
) WITHOUT ROWID;
CREATE TABLE epoch_metrics (
  run      INTEGER NOT NULL,
  epoch    INTEGER NOT NULL,
  name     TEXT NOT NULL,
  value    REAL,
  step     INTEGER NOT NULL,
  wall_us  INTEGER NOT NULL,
  PRIMARY KEY (run, epoch, name)
) WITHOUT ROWID;
CREATE TABLE checkpoints (
  id          INTEGER PRIMARY KEY,
  run         INTEGER NOT NULL,
  step        INTEGER NOT NULL,
  kind        TEXT NOT NULL,
  path        TEXT NOT NULL,
  checksum    TEXT NOT NULL,
  bytes       INTEGER NOT NULL,
  created_us  INTEGER NOT NULL
);
CREATE INDEX checkpoints_by_run ON checkpoints(run, step);
CREATE INDEX checkpoints_by_path ON checkpoints(path);
)SQL";

const std::string kV2 = R"SQL(
ALTER TABLE runs ADD COLUMN model_name TEXT NOT NULL DEFAULT '';
UPDATE runs SET model_name = coalesce(json_extract(model_json, '$.name'), '')
  WHERE model_json IS NOT NULL AND json_valid(model_json);
CREATE INDEX runs_by_model ON runs(model_name);
ALTER TABLE runs ADD COLUMN writer_host TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN writer_pid INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN writer_start TEXT NOT NULL DEFAULT '';
CREATE TABLE run_tags (
  run  INTEGER NOT NULL,
  tag  TEXT NOT NULL,
  PRIMARY KEY (run, tag)
) WITHOUT ROWID;
CREATE INDEX run_tags_by_tag ON run_tags(tag);
CREATE TABLE step_breakdowns (
  run              INTEGER NOT NULL,
  step             INTEGER NOT NULL,
  wall_us          INTEGER NOT NULL,
  worker           TEXT NOT NULL,
  device           TEXT NOT NULL,
  step_s           REAL,
  input_s          REAL,
  forward_s        REAL,
  backward_s       REAL,
  communication_s  REAL,
  optimizer_s      REAL,
  other_s          REAL
);
CREATE INDEX step_breakdowns_by_run ON step_breakdowns(run, step);
CREATE TABLE device_samples (
  run           INTEGER NOT NULL,
  step          INTEGER NOT NULL,
  wall_us       INTEGER NOT NULL,
  worker        TEXT NOT NULL,
  device        TEXT NOT NULL,
  utilisation   REAL,
  process_cpu   REAL,
  per_core      TEXT,
  memory_used   INTEGER NOT NULL,
  memory_total  INTEGER NOT NULL,
  temperature_c REAL,
  power_w       REAL
);
CREATE INDEX device_samples_by_run ON device_samples(run, step);
CREATE TABLE pipeline_samples (
  run             INTEGER NOT NULL,
  step            INTEGER NOT NULL,
  wall_us         INTEGER NOT NULL,
  worker          TEXT NOT NULL,
  stage           TEXT NOT NULL,
  produced        INTEGER NOT NULL,
  busy_s          REAL,
  queue_depth     INTEGER NOT NULL,
  queue_capacity  INTEGER NOT NULL,
  wait_s          REAL,
  parallelism     INTEGER NOT NULL
);
CREATE INDEX pipeline_samples_by_run ON pipeline_samples(run, step);
CREATE TABLE trace_chunks (
  id         INTEGER PRIMARY KEY,
  run        INTEGER NOT NULL,
  start_us   INTEGER NOT NULL,
  end_us     INTEGER NOT NULL,
  spans      INTEGER NOT NULL,
  encoding   TEXT NOT NULL,
  raw_bytes  INTEGER NOT NULL,
  data       BLOB NOT NULL
);
CREATE INDEX trace_chunks_by_run ON trace_chunks(run, start_us);
CREATE TABLE findings (
  id              INTEGER PRIMARY KEY,
  run             INTEGER NOT NULL,
  wall_us         INTEGER NOT NULL,
  step            INTEGER NOT NULL,
  kind            TEXT NOT NULL,
  severity        TEXT NOT NULL,
  message         TEXT NOT NULL,
  recommendation  TEXT NOT NULL,
  first_step      INTEGER NOT NULL,
  last_step       INTEGER NOT NULL
);
CREATE INDEX findings_by_run ON findings(run);
CREATE TABLE run_logs (
  id       INTEGER PRIMARY KEY,
  run      INTEGER NOT NULL,
  wall_us  INTEGER NOT NULL,
  step     INTEGER NOT NULL,
  level    TEXT NOT NULL,
  message  TEXT NOT NULL,
  hint     TEXT NOT NULL DEFAULT '',
  place    TEXT NOT NULL DEFAULT '',
  worker   TEXT NOT NULL DEFAULT ''
);
CREATE INDEX run_logs_by_run ON run_logs(run, id);
CREATE TABLE run_files (
  id          INTEGER PRIMARY KEY,
  run         INTEGER NOT NULL,
  kind        TEXT NOT NULL,
  path        TEXT NOT NULL,
  checksum    TEXT NOT NULL,
  bytes       INTEGER NOT NULL,
  created_us  INTEGER NOT NULL
);
CREATE INDEX run_files_by_run ON run_files(run);
CREATE INDEX run_files_by_path ON run_files(path);
)SQL";

// Step metrics packed, one row per run, metric and batch of up to kStepBlockSamples steps
// (step_series.h). step1 and last_wall_us answer "the run's last step, and when" from one index
// entry; samples counts without decoding.
const std::string kV3 = R"SQL(
CREATE TABLE step_series (
  id            INTEGER PRIMARY KEY,
  run           INTEGER NOT NULL,
  name          TEXT NOT NULL,
  step0         INTEGER NOT NULL,
  step1         INTEGER NOT NULL,
  samples       INTEGER NOT NULL,
  last_wall_us  INTEGER NOT NULL,
  data          BLOB NOT NULL
);
CREATE INDEX step_series_by_start ON step_series(run, name, step0);
CREATE INDEX step_series_by_end ON step_series(run, name, step1);
)SQL";

const std::array<const std::string*, 3> kMigrations = {&kV1, &kV2, &kV3};

Status packStepMetrics(sql::Db& db)
{
    TS_ASSIGN(sql::Stmt rows, db.prepare("SELECT run, name, step, epoch, value, wall_us FROM step_metrics ORDER BY run, name, step"));
    TS_ASSIGN(sql::Stmt ins, db.prepare("INSERT INTO step_series (run, name, step0, step1, samples, last_wall_us, data) "
                                        "VALUES (?, ?, ?, ?, ?, ?, ?)"));
    int64_t run = 0;
    std::string name;
    std::vector<StepSample> block;
    std::string blob;
    auto write = [&]() -> Status {
        if (block.empty()) return okStatus();
        blob.clear();
        encodeStepSamples(block.data(), block.size(), blob);
        ins.bind(1, run).bind(2, name).bind(3, block.front().step).bind(4, block.back().step)
            .bind(5, static_cast<int64_t>(block.size())).bind(6, block.back().wallUs).bindBlob(7, blob.data(), blob.size());
        block.clear();
        return ins.run();
    };
    while (true) {
        TS_ASSIGN(bool row, rows.step());
        if (!row) break;
        const int64_t r = rows.int64(0);
        std::string n = rows.text(1);
        if (r != run || n != name || block.size() >= kStepBlockSamples) {
            TS_TRY(write());
            run = r;
            name = std::move(n);
        }
        block.push_back({rows.int64(2), rows.int64(3), rows.int64(5), rows.real(4)});
    }
    TS_TRY(write());
    return db.exec("DELETE FROM step_metrics");
}

} // namespace

int schemaVersion() { return static_cast<int>(kMigrations.size()); }

const std::string& migrationSql(int version)
{
    static const std::string empty;
    if (version < 1 || version > schemaVersion()) return empty;
    return *kMigrations[static_cast<std::size_t>(version - 1)];
}

Status migrateData(sql::Db& db, int version)
{
    if (version == 3) return packStepMetrics(db);
    return okStatus();
}

} // namespace ts::store
