//===- SimulatorTest.cpp - Tests for the plan simulator -------------------===//

#include "kvc/Planning/Simulator.h"

#include <gtest/gtest.h>

using namespace kvc::planning;

namespace {

TEST(Simulator, ChainRunsInSequence) {
  JobGraph g;
  int r = g.addResource("r", 1);
  int a = g.addJob({r, 1.0});
  int b = g.addJob({r, 2.0}, {a});
  SimResult s = simulate(g, 0);
  EXPECT_DOUBLE_EQ(s.makespan, 3.0);
  EXPECT_DOUBLE_EQ(s.start[b], 1.0);
  EXPECT_DOUBLE_EQ(s.busy[r], 3.0);
}

TEST(Simulator, LanesRunInParallel) {
  JobGraph g;
  int r = g.addResource("ssd", 4);
  for (int i = 0; i < 8; ++i)
    g.addJob({r, 1.0});
  EXPECT_DOUBLE_EQ(simulate(g, 0).makespan, 2.0);
}

TEST(Simulator, PipelineOverlapsStages) {
  // Three chunks through fetch (1 s) then copy (1 s): 4 s, not 6.
  JobGraph g;
  int io = g.addResource("io", 1), copy = g.addResource("h2d", 1);
  for (int i = 0; i < 3; ++i) {
    int f = g.addJob({io, 1.0});
    g.addJob({copy, 1.0}, {f});
  }
  EXPECT_DOUBLE_EQ(simulate(g, 0).makespan, 4.0);
}

TEST(Simulator, StagingBudgetBoundsChunksInFlight) {
  // Each fetch holds 10 bytes until its copy ends. A budget of 10 allows one
  // chunk in flight, so fetch and copy no longer overlap: 6 s.
  JobGraph g;
  int io = g.addResource("io", 1), copy = g.addResource("h2d", 1);
  for (int i = 0; i < 3; ++i) {
    int f = g.addJob({io, 1.0, 0, 10});
    int c = g.addJob({copy, 1.0}, {f});
    g.job(f).releasedBy = c;
  }
  SimResult tight = simulate(g, 10);
  EXPECT_DOUBLE_EQ(tight.makespan, 6.0);
  EXPECT_EQ(tight.peakStagingBytes, 10);
  SimResult roomy = simulate(g, 20);
  EXPECT_DOUBLE_EQ(roomy.makespan, 4.0);
  EXPECT_EQ(roomy.peakStagingBytes, 20);
}

TEST(Simulator, OversizedJobRunsAlone) {
  JobGraph g;
  int io = g.addResource("io", 2);
  g.addJob({io, 1.0, 0, 100});
  g.addJob({io, 1.0, 0, 100});
  SimResult s = simulate(g, 50);
  EXPECT_DOUBLE_EQ(s.makespan, 2.0);
}

TEST(Simulator, HigherPriorityRunsFirst) {
  JobGraph g;
  int r = g.addResource("compute", 1);
  int low = g.addJob({r, 1.0, 0});
  int high = g.addJob({r, 1.0, 5});
  SimResult s = simulate(g, 0);
  EXPECT_DOUBLE_EQ(s.start[high], 0.0);
  EXPECT_DOUBLE_EQ(s.start[low], 1.0);
}

// A job released by the start or by a job on another resource arrives a
// hand-off later; one released on its own resource does not, and one that
// would wait behind a busy lane anyway pays nothing more.
TEST(Simulator, HandoffDelaysJobsReleasedAcrossResources) {
  JobGraph g;
  int io = g.addResource("io", 1), copy = g.addResource("h2d", 1);
  int f0 = g.addJob({io, 1.0});
  int f1 = g.addJob({io, 1.0}, {f0});
  int c0 = g.addJob({copy, 2.0}, {f0});
  int c1 = g.addJob({copy, 1.0}, {f1});
  SimResult s = simulate(g, 0, 0.25);
  EXPECT_DOUBLE_EQ(s.start[f0], 0.25); // After the start.
  EXPECT_DOUBLE_EQ(s.start[f1], 1.25); // Same lane: at once.
  EXPECT_DOUBLE_EQ(s.start[c0], 1.5);  // From io: a hand-off later.
  EXPECT_DOUBLE_EQ(s.start[c1], 3.5);  // Queued behind c0 (ready at 2.5).
  EXPECT_DOUBLE_EQ(s.makespan, 4.5);
  // Without hand-offs, the same graph as before.
  SimResult free = simulate(g, 0);
  EXPECT_DOUBLE_EQ(free.start[c0], 1.0);
  EXPECT_DOUBLE_EQ(free.makespan, 4.0);
}

// A job waits for the latest of its dependencies, hand-off included: a
// later dependency on its own resource does not hide an earlier one's
// hand-off that ends after it.
TEST(Simulator, HandoffCountsForEveryDependency) {
  JobGraph g;
  int a = g.addResource("a", 1), b = g.addResource("b", 1);
  int fromA = g.addJob({a, 1.0});
  int onB = g.addJob({b, 0.9});
  int join = g.addJob({b, 1.0}, {fromA, onB});
  SimResult s = simulate(g, 0, 0.5);
  EXPECT_DOUBLE_EQ(s.finish[onB], 1.4);
  EXPECT_DOUBLE_EQ(s.start[join], 2.0); // fromA ends at 1.5, + 0.5.
}

// A job whose input comes from outside the graph (a prefill's layer, an
// object on the link) starts no earlier than it is made, hand-off after;
// the lane it leaves free meanwhile runs the jobs that are ready.
TEST(Simulator, AJobWaitsForItsInputFromOutsideTheGraph) {
  JobGraph g;
  int r = g.addResource("r", 1), other = g.addResource("other", 1);
  SimJob late{r, 1.0};
  late.notBefore = 3.0;
  int waits = g.addJob(late);
  int ready = g.addJob({r, 1.0});
  int after = g.addJob({other, 0.5}, {waits});
  SimResult s = simulate(g, 0, 0.25);
  EXPECT_DOUBLE_EQ(s.start[ready], 0.25);
  EXPECT_DOUBLE_EQ(s.start[waits], 3.25);
  EXPECT_DOUBLE_EQ(s.start[after], 4.5);
  EXPECT_DOUBLE_EQ(s.makespan, 5.0);
}

} // namespace
