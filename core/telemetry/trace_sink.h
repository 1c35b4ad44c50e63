#pragma once
// TraceFileSink: writes a run's Chrome trace from the telemetry bus (spans, device samples,
// step metrics as counters, run state changes) — what `trainstudio-cli train --trace FILE` uses.
// Contract:
//  - Subscribes at construction (create()) and drains on its own thread, so the training
//    threads only pay for the bus's queue copy; a full queue drops spans (counted in dropped(),
//    and written into the trace's metadata so a reader knows the timeline has holes).
//  - finish() drains what is left, unsubscribes and writes the file (temporary file renamed into
//    place). Call it after the run's publishers have stopped (Trainer::fit returned).
//  - Errors: create() fails if the file cannot be written; finish() returns write errors.

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "telemetry/bus.h"
#include "telemetry/chrome_trace.h"
#include "telemetry/drain_thread.h"

namespace ts::telemetry {

class TraceFileSink {
public:
    static Result<std::unique_ptr<TraceFileSink>> create(EventBus& bus, const std::string& path,
                                                         std::size_t capacity = 1 << 16);
    ~TraceFileSink();
    TraceFileSink(const TraceFileSink&) = delete;
    TraceFileSink& operator=(const TraceFileSink&) = delete;

    void setMetadata(const std::string& key, const std::string& value);
    Status finish();
    uint64_t dropped() const { return m_sub ? m_sub->dropped() : 0; }
    std::size_t spans() const { return m_spans.load(std::memory_order_relaxed); }

private:
    TraceFileSink() = default;
    void add(const std::vector<Event>& events);
    std::unique_ptr<ChromeTraceWriter> m_writer;
    std::shared_ptr<Subscription> m_sub;
    std::mutex m_writerMutex;  // the sink thread adds, finish()/setMetadata from the owner
    std::atomic<std::size_t> m_spans{0};
    std::unique_ptr<DrainThread> m_drain;
    bool m_finished = false;
};

} // namespace ts::telemetry
