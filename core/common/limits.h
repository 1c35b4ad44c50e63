#pragma once
// Bounds on what a run may ask for, shared by the places that check them (run configurations,
// CLI flags, pipeline specs, the studio's spin boxes).

namespace ts {

// The most CPU threads a run, or one pipeline stage, may ask for: more fails thread creation
// deep inside OpenMP or std::thread, and never helps.
inline constexpr int kMaxThreads = 1024;

} // namespace ts
