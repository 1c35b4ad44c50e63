#pragma once
// The step schedule's tally (distribute/step_schedule.h) in and out of its proto message
// (parameter_server.proto's Tally), for the ps service and its client alike.

#include "distribute/step_schedule.h"
#include "parameter_server.pb.h"

namespace ts::remote {

inline StepTally tallyFromProto(const Tally& t) { return StepTally{t.steps(), t.loss_sum(), t.correct(), t.count(), t.seconds()}; }

inline void tallyToProto(const StepTally& t, Tally* out)
{
    out->set_steps(t.steps);
    out->set_loss_sum(t.lossSum);
    out->set_correct(t.correct);
    out->set_count(t.count);
    out->set_seconds(t.seconds);
}

} // namespace ts::remote
