// Draft methods as instances: two draft models and two n-gram configurations serve rows side by
// side in one engine, each on its own rows; a draft cache too small for the rows pauses their
// speculation without failing a request; a method that needs a port the target lacks is refused
// when it is registered.
#include "core/error.h"
#include "engine_fixture.h"

namespace specdec::testing {
namespace {

const std::vector<std::string>& texts() {
  static const std::vector<std::string> t = {
      "def fibonacci(n):\n",
      "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
      "import os\nimport sys\n\n\ndef main():\n",
  };
  return t;
}

std::unique_ptr<EngineCore> bare_engine(EngineOptions options = {}) {
  if (options.kv_blocks == 0) options.kv_blocks = 1024;
  return std::make_unique<EngineCore>(*Bundled::get().target, *Bundled::get().tokenizer, options);
}

std::shared_ptr<DraftMethod> draft_model(const std::string& id, int depth, int kv_blocks = 1024) {
  DraftModelOptions o;
  o.num_draft = depth;
  o.kv_blocks = kv_blocks;
  return std::make_shared<DraftModelMethod>(Bundled::get().draft, id, o);
}

std::shared_ptr<DraftMethod> ngram(int max_ngram, int min_ngram, int depth) {
  NgramOptions o;
  o.max_ngram = max_ngram;
  o.min_ngram = min_ngram;
  o.num_draft = depth;
  return std::make_shared<NgramMethod>(o);
}

TEST(DraftInstances, TwoDraftModelsAndTwoNgramConfigsSideBySide) {
  auto engine = bare_engine();
  engine->add_method("draft-a", draft_model("bundled-a", 4));
  engine->add_method("draft-b", draft_model("bundled-b", 7));
  engine->add_method("ngram-3", ngram(3, 1, 6));
  engine->add_method("ngram-2", ngram(2, 2, 3));
  EXPECT_THROW(engine->add_method("ngram-2", ngram(3, 1, 4)), Error);  // ids are unique

  const std::vector<std::string> methods = {"draft-a", "draft-b", "ngram-3", "ngram-2", "", "draft-a"};
  std::vector<int64_t> ids;
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < methods.size(); ++i) {
    const auto prompt = encode(texts()[i % texts().size()]);
    // The draft models also at T = 0.8 (coupled draws); the n-gram rows greedy, where a short
    // code prompt repeats itself soon enough for lookups to hit.
    const bool sampled = i % 2 == 1 && methods[i].rfind("draft", 0) == 0;
    const float temperature = sampled ? 0.8f : 0.0f;
    want.push_back(plain(prompt, 40, temperature, 11 + i));
    Request r = make_request(prompt, 40, temperature, 11 + i);
    r.spec.method = methods[i];
    r.spec.adaptive = false;
    ids.push_back(engine->submit(std::move(r)));
    engine->step();  // rows join while others run
  }
  engine->run();
  for (size_t i = 0; i < methods.size(); ++i) {
    const RequestResult got = *engine->take_result(ids[i]);
    EXPECT_EQ(got.tokens, want[i]) << "row " << i << " (" << methods[i] << ")";
    const SpecTelemetry& t = got.stats.speculative;
    EXPECT_EQ(t.method, methods[i]);
    if (methods[i].empty()) continue;
    EXPECT_GT(t.drafted, 0) << methods[i];
    EXPECT_GT(t.accepted, 0) << methods[i];
    // Each instance drafts at its own depth: a round never proposes more than its maximum.
    const int max_depth = methods[i] == "draft-a" ? 4 : methods[i] == "draft-b" ? 7 : methods[i] == "ngram-3" ? 6 : 3;
    EXPECT_LE(t.drafted, static_cast<int64_t>(t.rounds) * max_depth) << methods[i];
  }
}

TEST(DraftInstances, FullDraftCachePausesSpeculation) {
  // Three blocks of 16 positions hold none of these prompts: every row decodes plainly, no request fails.
  auto engine = bare_engine();
  engine->add_method("tiny", draft_model("bundled-tiny", 4, 3));
  std::vector<int64_t> ids;
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < 3; ++i) {
    const auto prompt = encode(texts()[1] + texts()[2] + texts()[i] + texts()[1]);
    ASSERT_GT(prompt.size(), 48u);
    want.push_back(plain(prompt, 24, 0, 0));
    Request r = make_request(prompt, 24);
    r.spec.method = "tiny";
    r.spec.adaptive = false;
    ids.push_back(engine->submit(std::move(r)));
  }
  engine->run();
  for (size_t i = 0; i < ids.size(); ++i) {
    const RequestResult got = *engine->take_result(ids[i]);
    EXPECT_EQ(got.finish, FinishReason::length) << got.error;
    EXPECT_EQ(got.tokens, want[i]);
    EXPECT_EQ(got.stats.speculative.drafted, 0);
  }
}

TEST(DraftInstances, DraftCacheFillingMidRunPausesThoseRows) {
  // Room for one short row's context at a time: rows that fit draft, the ones that do not (or
  // outgrow the cache mid-run) decode plainly; every output is still the plain one.
  auto engine = bare_engine();
  engine->add_method("small", draft_model("bundled-small", 4, 5));
  std::vector<int64_t> ids;
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < 3; ++i) {
    const auto prompt = encode(texts()[i]);
    want.push_back(plain(prompt, 60, 0, 0));
    Request r = make_request(prompt, 60);
    r.spec.method = "small";
    r.spec.adaptive = false;
    ids.push_back(engine->submit(std::move(r)));
  }
  engine->run();
  int64_t drafted = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const RequestResult got = *engine->take_result(ids[i]);
    EXPECT_EQ(got.tokens, want[i]) << "row " << i;
    drafted += got.stats.speculative.drafted;
  }
  EXPECT_GT(drafted, 0);
}

// The target's KV is a port the engine does not offer (yet).
class NeedsTargetKv : public DraftMethod {
 public:
  std::string name() const override { return "needs-kv"; }
  std::string checkpoint_namespace() const override { return "needs-kv-v1"; }
  TargetNeeds needs() const override {
    TargetNeeds n;
    n.kv = true;
    return n;
  }
  std::unique_ptr<DraftRows> open(const TargetView&) override {
    ADD_FAILURE() << "open() must not run when a port is missing";
    return nullptr;
  }
  int default_depth() const override { return 4; }
};

class NeedsTapBeyondTheModel : public NeedsTargetKv {
 public:
  TargetNeeds needs() const override {
    TargetNeeds n;
    n.tap_layers = {1, 99};
    return n;
  }
};

TEST(DraftInstances, SampledDraftsDrawnOnTheBackendAreTheHostsDraws) {
  // A sampled row whose draw reads nothing but its logits draws its drafts where the drafter ran
  // (Backend::sample: in EAGLE-3's chain, after DFlash's block). A logit bias of 0 on one token
  // keeps the distribution and sends every draw through the host instead. On the CPU both are
  // specdec::sample of the same logits at the same keys: the rounds match draft for draft. (On a
  // GPU the device sampler's sums round otherwise, so only the tokens are compared there.)
  for (const std::string method : {"eagle3", "dflash"}) {
    for (size_t p = 0; p < 2; ++p) {
      const auto prompt = encode(texts()[p]);
      std::vector<RequestResult> runs;
      for (const bool host : {false, true}) {
        auto engine = bare_engine();
        if (method == "eagle3") {
          // A head of its own: the context rows a head keeps are what its earlier rows saw.
          Eagle3Options o;
          o.kv_blocks = 1024;
          engine->add_method(method, std::make_shared<Eagle3Method>(
                                         Eagle3Head::load(source_path("models/eagle3"), *Bundled::get().backend),
                                         "bundled-eagle3", Bundled::get().target->config().num_layers, o));
        } else {
          DflashOptions o;
          o.kv_blocks = 1024;
          o.confidence_cut = false;  // the cut weighs measured times: the rounds would differ by timing
          engine->add_method(method, bundled_dflash(o));
        }
        Request r = make_request(prompt, 40, 0.8f, 21 + p);
        r.spec.method = method;
        r.spec.adaptive = false;
        if (host) r.sampling.logit_bias = {{prompt[0], 0.0f}};
        runs.push_back(run_one(*engine, std::move(r)));
      }
      const std::string what = method + " prompt " + std::to_string(p);
      EXPECT_EQ(runs[0].tokens, plain(prompt, 40, 0.8f, 21 + p)) << what;
      EXPECT_EQ(runs[1].tokens, runs[0].tokens) << what;
      const SpecTelemetry &device = runs[0].stats.speculative, &host = runs[1].stats.speculative;
      EXPECT_GT(device.accepted, 0) << what;
      if (!test_on_gpu()) {
        EXPECT_EQ(device.rounds, host.rounds) << what;
        EXPECT_EQ(device.drafted, host.drafted) << what;
        EXPECT_EQ(device.accepted, host.accepted) << what;
      }
    }
  }
}

TEST(DraftInstances, MissingPortsAreRefusedAtRegistration) {
  auto engine = bare_engine();
  try {
    engine->add_method("kv", std::make_shared<NeedsTargetKv>());
    ADD_FAILURE() << "registered a method whose port is missing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache"), std::string::npos) << e.what();
  }
  try {
    engine->add_method("taps", std::make_shared<NeedsTapBeyondTheModel>());
    ADD_FAILURE() << "registered a method tapping a layer the target lacks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 99"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(engine->has_method("kv"));
  EXPECT_FALSE(engine->has_method("taps"));
  // The engine is unharmed.
  const auto prompt = encode(texts()[0]);
  EXPECT_EQ(run_one(*engine, make_request(prompt, 8)).tokens, plain(prompt, 8, 0, 0));
}

}  // namespace
}  // namespace specdec::testing
