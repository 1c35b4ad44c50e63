// StepSchedule: ps:0's hand-out of a parameter-server run's steps (TF's ClusterCoordinator
// scheduling): epochs over every worker's steps, a lost worker's steps going to the others,
// epoch sizes learned from workers whose data length shows only after a pass, resuming from a
// backup's snapshot, and many workers claiming at once.

#include <QtTest>

#include <atomic>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "distribute/step_schedule.h"

using namespace ts;

class TestStepSchedule : public QObject {
    Q_OBJECT
private slots:
    void handsOutEveryStepOnce();
    void waitsForHeldStepsAtTheEnd();
    void lostWorkersStepsGoToOthers();
    void readmittedWorkerTakesStepsAgain();
    void learnsUnknownEpochSizes();
    void maxStepsEndsTheRun();
    void refusesWhatAWorkerDoesNotHold();
    void resumesFromASnapshot();
    void snapshotRoundTrips();
    void handsOutBlocks();
    void concurrentClaims();
};

namespace {

ScheduleConfig schedule(int workers, int64_t epochs, int64_t maxSteps, int64_t maxBlock)
{
    ScheduleConfig c;
    c.workers = workers;
    c.epochs = epochs;
    c.maxSteps = maxSteps;
    c.maxBlock = maxBlock;
    return c;
}

// One claim telling at most one outcome (the tests' usual case).
Result<StepGrant> claimOne(StepSchedule& s, const std::string& worker, int64_t batches, const StepOutcome* done, std::vector<EpochDone>* epochs)
{
    return s.claim(worker, batches, done ? std::vector<StepOutcome>{*done} : std::vector<StepOutcome>{}, epochs);
}

StepOutcome outcome(int64_t step, double loss = 1.0, int64_t correct = 1, int64_t count = 2)
{
    return StepOutcome{step, loss * static_cast<double>(count), correct, count};
}

} // namespace

// Worker `first` checks in (it waits for the others), `second` checks in and gets step 1, then
// `first` asks again and gets step 2.
void checkIn(StepSchedule& s, std::vector<EpochDone>* epochs, const std::string& first, int64_t firstBatches, const std::string& second,
             int64_t secondBatches, StepGrant* a, StepGrant* b)
{
    auto w = claimOne(s, first, firstBatches, nullptr, epochs);
    QVERIFY(w.ok());
    QCOMPARE(int(w->kind), int(StepGrant::Kind::Wait));
    auto gb = claimOne(s, second, secondBatches, nullptr, epochs);
    auto ga = claimOne(s, first, firstBatches, nullptr, epochs);
    QVERIFY(ga.ok() && gb.ok());
    QCOMPARE(int(gb->kind), int(StepGrant::Kind::Step));
    QCOMPARE(gb->step, int64_t(1));
    QCOMPARE(ga->step, int64_t(2));
    *a = *ga;
    *b = *gb;
}

void TestStepSchedule::handsOutEveryStepOnce()
{
    // Two workers with 3 and 2 batches per pass: an epoch is 5 steps, the run 2 epochs.
    StepSchedule s(schedule(2, 2, 0, 1));
    std::vector<EpochDone> epochs;
    StepGrant a, b;
    checkIn(s, &epochs, "worker:0", 3, "worker:1", 2, &a, &b);
    QCOMPARE(b.stepsPerEpoch, int64_t(5));
    QCOMPARE(b.totalSteps, int64_t(10));
    // worker:0 is fast: it takes steps 3..10 while worker:1 still trains step 1.
    std::vector<int64_t> got;
    StepOutcome done = outcome(a.step);
    for (;;) {
        auto g = claimOne(s, "worker:0", 3, &done, &epochs);
        QVERIFY(g.ok());
        if (g->kind != StepGrant::Kind::Step) {
            QCOMPARE(int(g->kind), int(StepGrant::Kind::Wait));  // step 1 is still held
            break;
        }
        got.push_back(g->step);
        QCOMPARE(g->epoch, (g->step - 1) / 5 + 1);
        QCOMPARE(g->stepInEpoch, (g->step - 1) % 5 + 1);
        done = outcome(g->step, 0.5);
    }
    QCOMPARE(got, (std::vector<int64_t>{3, 4, 5, 6, 7, 8, 9, 10}));
    // Epoch 1 waits for step 1; epoch 2 is complete already but told after it.
    QVERIFY(epochs.empty());
    const StepOutcome one = outcome(1, 3.0, 0, 4);
    auto end = claimOne(s, "worker:1", 2, &one, &epochs);
    QVERIFY(end.ok());
    QCOMPARE(int(end->kind), int(StepGrant::Kind::Done));
    QCOMPARE(epochs.size(), std::size_t(2));
    QCOMPARE(epochs[0].epoch, int64_t(1));
    QCOMPARE(epochs[0].lastStep, int64_t(5));
    QCOMPARE(epochs[0].tally.steps, int64_t(5));
    // Steps 2..5: 2 examples each (loss 1, 0.5, 0.5, 0.5); step 1: 4 examples of loss 3.
    QCOMPARE(epochs[0].tally.count, int64_t(12));
    QCOMPARE(epochs[0].tally.lossSum, 2.0 + 3 * 1.0 + 12.0);
    QCOMPARE(epochs[0].tally.correct, int64_t(4));
    QCOMPARE(epochs[1].epoch, int64_t(2));
    QCOMPARE(epochs[1].tally.steps, int64_t(5));
    QCOMPARE(epochs[1].lastStep, int64_t(10));
    QCOMPARE(s.completed(), int64_t(10));
}

void TestStepSchedule::waitsForHeldStepsAtTheEnd()
{
    StepSchedule s(schedule(2, 1, 0, 1));
    StepGrant a, b;
    checkIn(s, nullptr, "worker:0", 1, "worker:1", 1, &a, &b);
    const StepOutcome done = outcome(a.step);
    auto w = claimOne(s, "worker:0", 1, &done, nullptr);
    QVERIFY(w.ok());
    QCOMPARE(int(w->kind), int(StepGrant::Kind::Wait));
    auto again = claimOne(s, "worker:0", 1, nullptr, nullptr);
    QCOMPARE(int(again->kind), int(StepGrant::Kind::Wait));
    const StepOutcome last = outcome(b.step);
    auto d = claimOne(s, "worker:1", 1, &last, nullptr);
    QCOMPARE(int(d->kind), int(StepGrant::Kind::Done));
    QCOMPARE(int(claimOne(s, "worker:0", 1, nullptr, nullptr)->kind), int(StepGrant::Kind::Done));
}

void TestStepSchedule::lostWorkersStepsGoToOthers()
{
    StepSchedule s(schedule(2, 1, 0, 1));
    std::vector<EpochDone> epochs;
    StepGrant a, b;
    checkIn(s, &epochs, "worker:0", 2, "worker:1", 2, &a, &b);  // worker:1 holds step 1, then dies
    s.release("worker:1");
    StepOutcome done = outcome(a.step);
    std::vector<int64_t> got;
    for (;;) {
        auto g = claimOne(s, "worker:0", 2, &done, &epochs);
        QVERIFY(g.ok());
        if (g->kind == StepGrant::Kind::Done) break;
        QCOMPARE(int(g->kind), int(StepGrant::Kind::Step));
        got.push_back(g->step);
        done = outcome(g->step);
    }
    QCOMPARE(got, (std::vector<int64_t>{1, 3, 4}));  // the lost step first
    QCOMPARE(epochs.size(), std::size_t(1));
    QCOMPARE(epochs[0].tally.steps, int64_t(4));
    // The lost worker's later claims (it came back after it was given up) are refused.
    const StepOutcome late = outcome(1);
    auto refused = claimOne(s, "worker:1", 2, &late, nullptr);
    QVERIFY(!refused.ok());
    QVERIFY2(refused.error().message.find("worker:1 was released") != std::string::npos, refused.error().message.c_str());
    QCOMPARE(s.completed(), int64_t(4));
    // A worker lost before it checked in does not hold the others back.
    StepSchedule t(schedule(3, 1, 0, 1));
    QCOMPARE(int(claimOne(t, "worker:0", 1, nullptr, nullptr)->kind), int(StepGrant::Kind::Wait));
    QCOMPARE(int(claimOne(t, "worker:1", 1, nullptr, nullptr)->kind), int(StepGrant::Kind::Wait));
    t.release("worker:2");
    auto first = claimOne(t, "worker:1", 1, nullptr, nullptr);
    QCOMPARE(int(first->kind), int(StepGrant::Kind::Step));
    QCOMPARE(first->stepsPerEpoch, int64_t(2));
}

// A lost worker whose daemon came back is started anew and readmitted: it claims steps again
// (the step it held went to the other meanwhile), and every step is still trained once.
void TestStepSchedule::readmittedWorkerTakesStepsAgain()
{
    StepSchedule s(schedule(2, 2, 0, 1));  // 2 workers x 3 batches: 6 steps an epoch, 12 in all
    std::vector<EpochDone> epochs;
    StepGrant a, b;
    checkIn(s, &epochs, "worker:0", 3, "worker:1", 3, &a, &b);  // worker:1 holds step 1, then dies
    s.release("worker:1");
    std::map<int64_t, std::string> trainedBy;
    auto g0 = claimOne(s, "worker:0", 3, nullptr, &epochs);
    QCOMPARE(g0->step, int64_t(1));  // the lost step first
    trainedBy[a.step] = "worker:0";
    StepOutcome done0 = outcome(a.step);
    std::vector<StepOutcome> doneBoth = {done0, outcome(g0->step)};
    trainedBy[g0->step] = "worker:0";
    auto next0 = s.claim("worker:0", 3, doneBoth, &epochs);
    QVERIFY(next0.ok());
    trainedBy[next0->step] = "worker:0";
    // Still released: refused.
    QVERIFY(!claimOne(s, "worker:1", 3, nullptr, nullptr).ok());
    s.readmit("worker:1");
    s.readmit("worker:1");  // twice is once
    // The new task checks in with no outcomes and gets the next step; then both share the rest.
    auto g1 = claimOne(s, "worker:1", 3, nullptr, &epochs);
    QVERIFY2(g1.ok(), g1.ok() ? "" : g1.error().message.c_str());
    QCOMPARE(int(g1->kind), int(StepGrant::Kind::Step));
    QCOMPARE(g1->step, next0->step + 1);
    trainedBy[g1->step] = "worker:1";
    // Each worker reports its last step with its next claim (once: after a Wait it has none).
    std::optional<StepOutcome> last0 = outcome(next0->step), last1 = outcome(g1->step);
    bool more0 = true, more1 = true;
    auto turn = [&](const std::string& worker, std::optional<StepOutcome>& last, bool& more) {
        auto g = claimOne(s, worker, 3, last ? &*last : nullptr, &epochs);
        QVERIFY2(g.ok(), g.ok() ? "" : g.error().message.c_str());
        last.reset();
        more = g->kind != StepGrant::Kind::Done;
        if (g->kind != StepGrant::Kind::Step) return;
        QVERIFY(!trainedBy.count(g->step));
        trainedBy[g->step] = worker;
        last = outcome(g->step);
    };
    while (more0 || more1) {
        if (more1) turn("worker:1", last1, more1);
        if (more0) turn("worker:0", last0, more0);
    }
    QCOMPARE(trainedBy.size(), std::size_t(12));
    QCOMPARE(s.completed(), int64_t(12));
    QCOMPARE(epochs.size(), std::size_t(2));
    int byWorker1 = 0;
    for (const auto& [step, w] : trainedBy) byWorker1 += w == "worker:1";
    QVERIFY2(byWorker1 >= 3, qPrintable(QString::number(byWorker1)));

    // A worker lost before it ever checked in, readmitted once the epoch's size is fixed, holds
    // nobody back while its new task starts.
    StepSchedule t(schedule(3, 1, 0, 1));
    QCOMPARE(int(claimOne(t, "worker:0", 2, nullptr, nullptr)->kind), int(StepGrant::Kind::Wait));
    t.release("worker:2");
    QCOMPARE(int(claimOne(t, "worker:1", 2, nullptr, nullptr)->kind), int(StepGrant::Kind::Step));
    t.readmit("worker:2");
    QCOMPARE(int(claimOne(t, "worker:0", 2, nullptr, nullptr)->kind), int(StepGrant::Kind::Step));
    auto late = claimOne(t, "worker:2", 2, nullptr, nullptr);
    QVERIFY2(late.ok(), late.ok() ? "" : late.error().message.c_str());
    QCOMPARE(int(late->kind), int(StepGrant::Kind::Step));
}

void TestStepSchedule::learnsUnknownEpochSizes()
{
    // worker:1 reads a CSV file: its length shows after its first pass.
    StepSchedule s(schedule(2, 2, 0, 1));
    std::vector<EpochDone> epochs;
    StepGrant a, b;
    checkIn(s, &epochs, "worker:0", 3, "worker:1", -1, &a, &b);
    QCOMPARE(b.stepsPerEpoch, int64_t(-1));
    QCOMPARE(b.epoch, int64_t(1));
    StepOutcome d0 = outcome(a.step), d1 = outcome(b.step);
    // Until worker:1 knows, steps keep coming (no end is known).
    for (int i = 0; i < 3; ++i) {
        auto g = claimOne(s, "worker:0", 3, &d0, &epochs);
        QVERIFY(g.ok() && g->kind == StepGrant::Kind::Step);
        QCOMPARE(g->totalSteps, int64_t(-1));
        d0 = outcome(g->step);
    }
    QVERIFY(epochs.empty());
    // Its pass had 4 batches: an epoch is 7 steps; steps 1..4 have an outcome, 5 is held.
    auto g = claimOne(s, "worker:1", 4, &d1, &epochs);
    QVERIFY(g.ok() && g->kind == StepGrant::Kind::Step);
    QCOMPARE(g->stepsPerEpoch, int64_t(7));
    QCOMPARE(g->totalSteps, int64_t(14));
    QCOMPARE(g->step, int64_t(6));
    QVERIFY(epochs.empty());
    const StepOutcome d6 = outcome(6);
    auto h = claimOne(s, "worker:1", 4, &d6, &epochs);
    QVERIFY(h.ok());
    QCOMPARE(h->step, int64_t(7));
    QVERIFY(epochs.empty());  // step 5 still held
    auto i = claimOne(s, "worker:0", 3, &d0, &epochs);  // step 5's outcome
    QVERIFY(i.ok());
    QVERIFY(epochs.empty());  // step 7 held by worker:1
    const StepOutcome d7 = outcome(7);
    QVERIFY(claimOne(s, "worker:1", 4, &d7, &epochs).ok());
    QCOMPARE(epochs.size(), std::size_t(1));
    QCOMPARE(epochs[0].tally.steps, int64_t(7));
}

void TestStepSchedule::maxStepsEndsTheRun()
{
    // 10 epochs of 4 steps, but max_steps 6: the run ends after step 6, mid-epoch 2.
    StepSchedule s(schedule(1, 10, 6, 1));
    std::vector<EpochDone> epochs;
    std::optional<StepOutcome> done;
    int64_t last = 0;
    for (;;) {
        auto g = claimOne(s, "worker:0", 4, done ? &*done : nullptr, &epochs);
        QVERIFY(g.ok());
        if (g->kind == StepGrant::Kind::Done) break;
        QCOMPARE(g->totalSteps, int64_t(6));
        last = g->step;
        done = outcome(g->step);
    }
    QCOMPARE(last, int64_t(6));
    QCOMPARE(epochs.size(), std::size_t(2));
    QCOMPARE(epochs[1].tally.steps, int64_t(2));  // the run's last, partial epoch
    QCOMPARE(epochs[1].lastStep, int64_t(6));
}

void TestStepSchedule::refusesWhatAWorkerDoesNotHold()
{
    StepSchedule s(schedule(2, 1, 0, 1));
    StepGrant a, b;
    checkIn(s, nullptr, "worker:0", 2, "worker:1", 2, &a, &b);
    const StepOutcome notHeld = outcome(b.step);
    auto wrong = claimOne(s, "worker:0", 2, &notHeld, nullptr);
    QVERIFY(!wrong.ok());
    QVERIFY2(wrong.error().message.find("worker:0 reported step 1, which it does not hold") != std::string::npos, wrong.error().message.c_str());
    auto stranger = claimOne(s, "worker:7", 2, nullptr, nullptr);
    QVERIFY(!stranger.ok());
    QVERIFY2(stranger.error().message.find("worker:7 is not one of the run's 2 workers") != std::string::npos, stranger.error().message.c_str());
}

void TestStepSchedule::resumesFromASnapshot()
{
    // A backup after 7 steps of 4-step epochs (2 workers x 2 batches), 3 of them in epoch 2.
    ScheduleConfig c = schedule(2, 3, 0, 1);
    c.completed = 7;
    c.epochSoFar = StepTally{3, 6.0, 3, 6, 1.5};
    StepSchedule s(c);
    std::vector<EpochDone> epochs;
    QCOMPARE(int(claimOne(s, "worker:0", 2, nullptr, &epochs)->kind), int(StepGrant::Kind::Wait));
    auto b = claimOne(s, "worker:1", 2, nullptr, &epochs);
    auto a = claimOne(s, "worker:0", 2, nullptr, &epochs);
    QVERIFY(a.ok() && b.ok());
    QCOMPARE(b->step, int64_t(8));
    QCOMPARE(b->epoch, int64_t(2));
    QCOMPARE(b->stepInEpoch, int64_t(4));
    QCOMPARE(a->step, int64_t(9));
    QCOMPARE(a->epoch, int64_t(3));
    const StepOutcome d = outcome(8, 1.0, 2, 2);
    QVERIFY(claimOne(s, "worker:1", 2, &d, &epochs).ok());
    QCOMPARE(epochs.size(), std::size_t(1));
    QCOMPARE(epochs[0].epoch, int64_t(2));
    QCOMPARE(epochs[0].tally.steps, int64_t(4));
    QCOMPARE(epochs[0].tally.count, int64_t(8));
    QCOMPARE(epochs[0].tally.correct, int64_t(5));
    QVERIFY(epochs[0].tally.seconds >= 1.5);  // the interrupted attempt's time counts
    const ScheduleSnapshot snap = s.snapshot();
    QCOMPARE(snap.completed, int64_t(8));
    QCOMPARE(snap.epochSoFar.steps, int64_t(0));
}

void TestStepSchedule::snapshotRoundTrips()
{
    const ScheduleSnapshot s{12345678901LL, StepTally{17, 3.25, 9, 544, 2.5}};
    const std::vector<float> bits = encodeScheduleSnapshot(s);
    QCOMPARE(bits.size(), std::size_t(12));
    auto back = decodeScheduleSnapshot(bits.data(), static_cast<int64_t>(bits.size()));
    QVERIFY(back.has_value());
    QCOMPARE(back->completed, s.completed);
    QCOMPARE(back->epochSoFar.steps, int64_t(17));
    QCOMPARE(back->epochSoFar.lossSum, 3.25);
    QCOMPARE(back->epochSoFar.count, int64_t(544));
    QCOMPARE(back->epochSoFar.seconds, 2.5);
    QVERIFY(!decodeScheduleSnapshot(bits.data(), 11).has_value());
}

void TestStepSchedule::handsOutBlocks()
{
    // 2 workers x 300 batches: 600-step epochs, so 8 steps a claim (each still gets 32+ claims
    // an epoch); max_steps 20 cuts the last block short.
    StepSchedule s(schedule(2, 1, 20, 0));
    QCOMPARE(int(s.claim("worker:0", 300, {}, nullptr)->kind), int(StepGrant::Kind::Wait));
    auto a = s.claim("worker:1", 300, {}, nullptr);
    auto b = s.claim("worker:0", 300, {}, nullptr);
    QVERIFY(a.ok() && b.ok());
    QCOMPARE(a->step, int64_t(1));
    QCOMPARE(a->count, int64_t(8));
    QCOMPARE(b->step, int64_t(9));
    QCOMPARE(b->count, int64_t(8));
    std::vector<StepOutcome> all;
    for (int64_t i = 1; i <= 8; ++i) all.push_back(outcome(i));
    std::vector<EpochDone> epochs;
    auto c = s.claim("worker:1", 300, all, &epochs);
    QVERIFY(c.ok());
    QCOMPARE(c->step, int64_t(17));
    QCOMPARE(c->count, int64_t(4));
    QCOMPARE(s.completed(), int64_t(8));
    // A claim telling a step it does not hold tells nothing: all or none.
    auto wrong = s.claim("worker:1", 300, {outcome(17), outcome(9)}, &epochs);
    QVERIFY(!wrong.ok());
    QCOMPARE(s.completed(), int64_t(8));
    QCOMPARE(stepPosition(601, 600), (std::pair<int64_t, int64_t>(2, 1)));
    QCOMPARE(stepPosition(600, 600), (std::pair<int64_t, int64_t>(1, 600)));
    QCOMPARE(stepPosition(7, -1), (std::pair<int64_t, int64_t>(1, 7)));
}

void TestStepSchedule::concurrentClaims()
{
    // 4 workers on threads, 3 steps a claim, one worker lost half-way with a block in hand:
    // every step of 5 epochs of 4 x 25 steps is trained exactly once (the lost worker's block by
    // others), every epoch told once, in order.
    constexpr int kWorkers = 4;
    StepSchedule s(schedule(kWorkers, 5, 0, 3));
    std::mutex mutex;
    std::multiset<int64_t> trained;
    std::vector<EpochDone> epochs;
    std::atomic<int64_t> claims{0};
    std::vector<std::thread> threads;
    for (int w = 0; w < kWorkers; ++w)
        threads.emplace_back([&, w] {
            const std::string name = "worker:" + std::to_string(w);
            std::vector<StepOutcome> done;
            for (;;) {
                std::vector<EpochDone> told;
                auto g = s.claim(name, 25, std::exchange(done, {}), &told);
                if (!g.ok()) return;  // released
                {
                    std::lock_guard lock(mutex);
                    epochs.insert(epochs.end(), told.begin(), told.end());
                }
                if (g->kind == StepGrant::Kind::Done) return;
                if (g->kind == StepGrant::Kind::Wait) {
                    std::this_thread::yield();
                    continue;
                }
                if (w == 3 && ++claims == 20) {
                    s.release(name);  // lost while it holds this block: it is never trained here
                    return;
                }
                for (int64_t i = 0; i < g->count; ++i) {
                    std::lock_guard lock(mutex);
                    trained.insert(g->step + i);
                    done.push_back(outcome(g->step + i));
                }
            }
        });
    for (auto& t : threads) t.join();
    QCOMPARE(trained.size(), std::size_t(500));
    for (int64_t step = 1; step <= 500; ++step) QCOMPARE(trained.count(step), std::size_t(1));
    QCOMPARE(s.completed(), int64_t(500));
    std::sort(epochs.begin(), epochs.end(), [](const EpochDone& a, const EpochDone& b) { return a.lastStep < b.lastStep; });
    QCOMPARE(epochs.size(), std::size_t(5));
    for (int e = 0; e < 5; ++e) {
        QCOMPARE(epochs[static_cast<std::size_t>(e)].epoch, int64_t(e + 1));
        QCOMPARE(epochs[static_cast<std::size_t>(e)].tally.steps, int64_t(100));
    }
}

QTEST_APPLESS_MAIN(TestStepSchedule)
#include "tst_step_schedule.moc"
