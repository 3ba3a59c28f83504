// The public request and result types to the internal engine's and back: sampling defaults
// filled from the model, token events and results copied out, telemetry in both directions.
#pragma once

#include "engine/request.h"
#include "model/config.h"
#include "specdec/request.h"
#include "speculative/telemetry.h"

namespace specdec {

// Unset fields take the model's generation_config.json defaults.
SamplingParams sampling_params(const SamplingOptions& options, const GenerationDefaults& defaults);
// `prompt` is the request's prompt as token ids; on_event is wrapped to receive public events.
Request internal_request(GenerationRequest&& request, std::vector<int32_t> prompt, const GenerationDefaults& defaults,
                         const std::vector<int32_t>& eos_ids);
GenerationEvent public_event(const StreamEvent& event);
GenerationResult public_result(RequestResult&& result);
SpeculativeStats public_stats(const SpecTelemetry& telemetry);
SpecTelemetry internal_telemetry(const SpeculativeStats& stats);

}  // namespace specdec
