// The session behind the public Engine: a model is warmed up when it is opened, so
// that the first request does not pay for mapping the weights and sizing the buffers.
#include <gtest/gtest.h>

#include <vector>

#include "api/session.h"
#include "model/model.h"

namespace specdec {
namespace {

const std::string kRoot = SPECDEC_SOURCE_DIR;

// A forward no wider than the warm-up's, on a fresh cache: nothing left to grow.
bool first_forward_was_one_off(Model& model) {
  auto cache = model.make_cache(1);
  const KvCache::SeqId seq = cache->create();
  EXPECT_TRUE(cache->reserve(seq, 8));
  return model.forward(ForwardRequest{{SequenceInput{seq, std::vector<int32_t>(8, 3), {7}}}, {}}, *cache).one_off;
}

TEST(Session, WarmsTheTargetAndDraftModelsUp) {
  EngineConfig config;
  config.model_dir = kRoot + "/models/target";
  config.device = DeviceKind::cpu;
  Session session = open_session(config);
  EXPECT_FALSE(first_forward_was_one_off(*session.model));
  DraftSpec spec;
  spec.kind = DraftKind::model;
  spec.path = kRoot + "/models/draft";
  ASSERT_NE(make_draft_method(session, spec), nullptr);
  EXPECT_FALSE(first_forward_was_one_off(*session.draft_models.at(spec.path)));
}

}  // namespace
}  // namespace specdec
