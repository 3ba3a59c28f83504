// Generator: one request at a time over an Engine it keeps, submitting and waiting.
#include "specdec/generator.h"

#include "core/error.h"

namespace specdec {

Generator::Generator(const EngineConfig& config) : engine_(std::make_unique<Engine>(config)) {}

Generator::~Generator() = default;

Generation Generator::generate(const std::string& prompt, const GenerateOptions& o,
                               const std::function<void(std::string_view)>& on_text) {
  GenerationRequest req;
  req.prompt = prompt;
  req.max_tokens = o.max_tokens;
  req.sampling = o.sampling;
  req.stop = o.stop;
  req.ignore_eos = o.ignore_eos;
  req.speculative = o.speculative;
  // The callback runs on the engine's thread while this one waits in wait(): it may use what
  // the caller's frame holds.
  if (on_text)
    req.on_event = [&on_text](const GenerationEvent& ev) {
      if (!ev.text.empty()) on_text(ev.text);
    };
  SPECDEC_CHECK(!prompt.empty(), "the prompt is empty");
  GenerationResult r = engine_->wait(engine_->submit(std::move(req)));
  SPECDEC_CHECK(r.finish != Finish::error, r.error);
  return Generation{std::move(r.text), std::move(r.tokens), std::string(to_string(r.finish)), std::move(r.stats)};
}

std::vector<int32_t> Generator::encode(const std::string& text) const { return engine_->encode(text); }

std::string Generator::decode(const std::vector<int32_t>& ids) const { return engine_->decode(ids); }

std::string Generator::device_name() const { return engine_->device_name(); }

Engine& Generator::engine() { return *engine_; }

}  // namespace specdec
