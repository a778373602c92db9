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

} // namespace
