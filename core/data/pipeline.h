#pragma once
// Pipeline: a running tf.data-style input pipeline built from a PipelineSpec, serving batches to
// the Trainer (BatchSource) with live stall accounting.
//
// Threading: the consumer (the trainer's thread) calls startEpoch()/next()/nextElement();
// prefetch, parallel map and parallel interleave stages run worker threads that block on
// condition variables (never spin). cancel() may be called from any thread: every worker stops
// and a blocked next() returns Cancelled promptly (sticky, like InMemoryBatchSource). Starting
// another epoch, or destroying the pipeline, mid-epoch stops and joins the epoch's threads.
//
// Epochs: each startEpoch(e) builds a fresh chain of iterators (as iterating a tf.data dataset
// again does). Seeds: shuffle and random maps draw from (seed, epoch, element key), so the
// element order and augmentation of an epoch are a pure function of the seed, also with
// parallel map (deterministic = true, the default). Data loaded by a source, caches and the
// autotuned settings persist across epochs.
//
// Errors: bad data (a corrupt file, a ragged CSV row, an undecodable image) comes out of next()
// as an Error naming the file and the position; after one, next() keeps returning it until the
// next startEpoch(). With skip_bad_records such records are dropped and counted instead
// (badRecords()).
//
// Accounting: every next() that returns a batch is a step; its wait is the time spent in next()
// and its step time runs until the following next() call. Every spec.windowSteps steps the
// pipeline closes a window (lastWindow()) and, with a bus, publishes one PipelineSampleEvent per
// stage and, when input-bound, a FindingEvent with the verdict.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "data/autotune.h"
#include "data/element.h"
#include "data/pipeline_config.h"
#include "data/pipeline_stats.h"
#include "data/source.h"

namespace ts {

namespace telemetry {
class EventBus;
}

namespace pipeline_detail {
class Stage;
class ChainControl;
class Iterator;
struct Shared;
} // namespace pipeline_detail

// peek()'s error message when the first epoch yields no batch at all.
inline constexpr const char* kNoBatchMessage = "the input pipeline produced no batch";

struct PipelineOptions {
    telemetry::EventBus* bus = nullptr;  // optional: window events go here
    std::string runId;                   // stamped on published events
    telemetry::Lane lane{"local", "", "input"};
    int64_t stepOffset = 0;              // added to the pipeline's step count in event stamps
    Shape featureShape;                  // non-empty: batches' x reshaped to (B, featureShape...)
    // > 0: i32 class-id labels must lie in [0, classCount) (the model's output width). batch()
    // checks each element as it stacks it, so the error names the record (file and line).
    int64_t classCount = 0;
    // > 0: the spec is one worker's auto-sharded pipeline (data/auto_shard.h) and its batches
    // are that worker's share of global batches of this many rows (Batch::localShard).
    int64_t globalBatch = 0;
    // Published once, as an info LogEvent, when the first epoch starts with a bus (how
    // auto-sharding divided the input, for the run's log).
    std::string note;
};

struct StepRecord {
    int64_t step = 0;          // 1-based count of batches served
    double waitSeconds = 0;    // time the consumer spent in next() for it
};

// A tunable setting as it stands now (for the studio and for tests).
struct KnobState {
    std::string stage;
    std::string knob;          // "parallelism" or "buffer_size"
    int64_t value = 0;
    bool autotuned = false;
};

class Pipeline final : public BatchSource {
public:
    ~Pipeline() override;
    Pipeline(const Pipeline&) = delete;
    Pipeline& operator=(const Pipeline&) = delete;

    // Validates the spec and builds the stages; reads no data (sources load on first use, so
    // file errors surface through next()). InvalidArgument names the bad transformation.
    static Result<std::unique_ptr<Pipeline>> create(const PipelineSpec& spec, const PipelineOptions& options = {});

    Status startEpoch(int64_t epoch) override;
    // The next batch (the pipeline must contain batch()): Batch::x the f32 features (reshaped to
    // options.featureShape if set), Batch::y the labels (i32 class ids or f32 rows).
    // InvalidArgument, naming the fix, if the elements are not batches of f32 features with labels.
    Result<std::optional<Batch>> next() override;
    // Batches per epoch when known (after the source has been read once), else -1.
    int64_t batchesPerEpoch() const override;
    int64_t examplesPerEpoch() const override;
    // True when a repeat without a count makes the pipeline endless: an epoch never ends.
    bool endless() const;
    void cancel() override;
    Batch emptyShard() const override;
    const std::string& note() const { return m_options.note; }
    // Before the first epoch: what to publish (PipelineOptions::note).
    void setNote(std::string note) { m_options.note = std::move(note); }

    // Where window events go, and the run id they carry; for a pipeline built before its run
    // was recorded. Consumer thread, between steps.
    void setTelemetry(telemetry::EventBus* bus, std::string runId)
    {
        m_options.bus = bus;
        m_options.runId = std::move(runId);
    }

    // The next raw element (no batch() needed), with the same accounting as next().
    Result<std::optional<Element>> nextElement();

    // The first batch of epoch 0, served by a separate short-lived chain; does not count as a
    // step. For checks before training (shapes, label range); loads the sources.
    Result<Batch> peek();

    // Cumulative counters now (any thread).
    PipelineSnapshot snapshot() const;
    // The last closed window of spec().windowSteps steps, if any.
    std::optional<PipelineWindow> lastWindow() const;
    // The window from `since` to now (e.g. a whole epoch).
    PipelineWindow windowSince(const PipelineSnapshot& since) const;
    StepRecord lastStep() const;
    std::vector<KnobState> knobs() const;
    std::vector<std::string> stageNames() const;

    int64_t badRecords() const;
    // The first bad-record messages (at most 20), when skip_bad_records drops them.
    std::vector<std::string> badRecordMessages() const;

    const PipelineSpec& spec() const { return m_spec; }

private:
    Pipeline() = default;
    Result<std::optional<Element>> pull();
    void stopChain();
    void stopNextChain();
    void warmNextEpoch();
    // Builds the chain of `epoch` (its async stages start at once). Null root on failure.
    std::pair<std::shared_ptr<pipeline_detail::ChainControl>, Result<std::unique_ptr<pipeline_detail::Iterator>>>
    buildChain(int64_t epoch);
    void afterStep(double waitSeconds);
    void closeWindow();
    void maybeTune();

    PipelineSpec m_spec;
    PipelineOptions m_options;
    std::shared_ptr<pipeline_detail::Shared> m_shared;
    std::vector<std::unique_ptr<pipeline_detail::Stage>> m_stages;  // source first
    bool m_hasBatch = false;
    bool m_batchDropsRemainder = false;  // the (first) batch transformation's drop_remainder

    // The current epoch's chain. m_chainMutex guards the pointers against cancel() from other
    // threads; the consumer thread alone pulls from m_root.
    mutable std::mutex m_chainMutex;
    std::shared_ptr<pipeline_detail::ChainControl> m_chain;
    std::unique_ptr<pipeline_detail::Iterator> m_root;
    // The next epoch's chain, built as soon as this epoch ends so that its prefetch and
    // parallel stages (and a shuffle buffer behind them) fill while the trainer validates and
    // before it asks: like a tf.data iterator over shuffle().repeat(), no cold start per epoch.
    std::shared_ptr<pipeline_detail::ChainControl> m_nextChain;
    std::unique_ptr<pipeline_detail::Iterator> m_nextRoot;
    int64_t m_nextEpoch = -1;
    int64_t m_epoch = 0;
    bool m_started = false;
    bool m_notePublished = false;
    std::optional<Error> m_failed;
    std::atomic<bool> m_cancelled{false};

    // Step accounting (consumer thread; published through atomics-free copies under m_statsMutex).
    mutable std::mutex m_statsMutex;
    int64_t m_steps = 0;           // steps closed
    int64_t m_served = 0;          // batches served
    double m_waitTotal = 0, m_stepTotal = 0;
    double m_openWait = 0;         // wait of the step still open
    double m_openStart = -1;       // when the open step's next() began (steady seconds), -1: none
    StepRecord m_lastStep;
    PipelineSnapshot m_windowStart;
    std::optional<PipelineWindow> m_lastWindow;

    // AUTOTUNE
    std::unique_ptr<Autotuner> m_tuner;
    PipelineSnapshot m_tuneStart;
};

} // namespace ts
