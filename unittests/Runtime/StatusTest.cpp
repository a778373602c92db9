//===- StatusTest.cpp - Tests for errors as values
//-------------------------===//

#include "kvc/Runtime/Base/Status.h"

#include <gtest/gtest.h>

#include <memory>

using namespace kvc;

namespace {

TEST(StatusTest, NamesItsCodeAndKeepsItsDetail) {
  Status s(StatusCode::DataLoss, "chunk 3: bad checksum", 7);
  EXPECT_FALSE(s.isOk());
  EXPECT_EQ(s.detail(), 7);
  EXPECT_EQ(s.toString(), "data_loss: chunk 3: bad checksum");
  Status outer = s.withContext("restore");
  EXPECT_EQ(outer.code(), StatusCode::DataLoss);
  EXPECT_EQ(outer.detail(), 7);
  EXPECT_EQ(outer.message(), "restore: chunk 3: bad checksum");
  EXPECT_TRUE(Status::ok().withContext("restore").isOk());
}

TEST(StatusOrTest, HoldsAValueOrItsFailure) {
  StatusOr<std::unique_ptr<int>> value = std::make_unique<int>(5);
  ASSERT_TRUE(value);
  EXPECT_TRUE(value.status().isOk());
  EXPECT_EQ(**value, 5);
  StatusOr<int> failure = notFound("no such chunk");
  EXPECT_FALSE(failure);
  EXPECT_EQ(failure.status().code(), StatusCode::NotFound);
  EXPECT_EQ(failure.status().message(), "no such chunk");
}

// An OK status has no value to go with it: a StatusOr built from one is a
// caller's bug, and reads as an internal error, never as a failure whose
// status says OK.
TEST(StatusOrTest, AnOkStatusWithoutAValueIsAnInternalError) {
  StatusOr<int> result = Status::ok();
  EXPECT_FALSE(result);
  EXPECT_EQ(result.status().code(), StatusCode::Internal);
  EXPECT_FALSE(result.status().isOk());
  result = 3;
  ASSERT_TRUE(result);
  EXPECT_EQ(*result, 3);
}

} // namespace
