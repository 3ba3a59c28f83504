// The completion endpoints. Whole responses wait for every choice on the connection thread; a
// streamed one becomes an httplib chunked content provider that drains the request's EventQueue
// into SSE chunks, one choice event at a time, and finishes with the usage chunk and [DONE].
#include "server/completion_routes.h"

#include "server/api_error.h"
#include "server/generation_plan.h"
#include "server/logprobs_json.h"
#include "server/response_builder.h"

namespace specdec::server {

namespace {

using nlohmann::json;

constexpr std::chrono::milliseconds kPollInterval{50};

json parse_body(const httplib::Request& req) {
  try {
    return json::parse(req.body);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number beyond double
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what(), "invalid_request_error");
  }
}

std::vector<GenerationRequest> engine_requests(GenerationPlan& plan) {
  std::vector<GenerationRequest> out;
  for (PlannedChoice& c : plan.choices) out.push_back(std::move(c.request));
  return out;
}

// A result that did not run to a stop or its length is the server's failure, not the client's.
void check_result(const GenerationResult& r) {
  if (r.finish == Finish::error) throw ApiError(500, "generation failed: " + r.error, "server_error");
  if (r.finish == Finish::cancelled)
    throw ApiError(503, "the request was cancelled: the server is shutting down", "server_error");
}

// The prompt's part of a completions choice: the echoed prompt's logprobs (echo with logprobs)
// and vLLM's prompt_logprobs, from the engine's scoring of the prompt.
struct PromptScores {
  bool echo = false;                   // echo with logprobs: the logprobs object starts with the prompt
  int echo_top = 0;                    // its alternatives
  std::optional<int> prompt_logprobs;  // the prompt_logprobs field and its alternatives

  explicit PromptScores(const CompletionRequest& r)
      : echo(r.echo && r.logprobs), echo_top(r.logprobs.value_or(0)), prompt_logprobs(r.prompt_logprobs) {}
  bool any() const { return echo || prompt_logprobs; }
  json echoed(const Engine& engine, int32_t first_token, const std::vector<TokenLogprob>& scored) const {
    return echo ? echo_logprobs(engine, first_token, scored, echo_top) : json(nullptr);
  }
  json field(const Engine& engine, const std::vector<TokenLogprob>& scored) const {
    return prompt_logprobs ? vllm_prompt_logprobs(engine, scored, *prompt_logprobs) : json(nullptr);
  }
};

// Per choice, its prompt's first token (an empty prompt, which the engine refuses, has none).
std::vector<int32_t> first_prompt_tokens(const GenerationPlan& plan) {
  std::vector<int32_t> out;
  for (const PlannedChoice& c : plan.choices)
    out.push_back(c.request.prompt_tokens.empty() ? 0 : c.request.prompt_tokens.front());
  return out;
}

void respond_whole(ServerState& state, const CompletionRequest& r, GenerationPlan plan, const ResponseHead& head,
                   httplib::Response& res) {
  std::vector<std::string> echoes;
  for (const PlannedChoice& c : plan.choices) echoes.push_back(r.echo ? c.prompt_text : std::string());
  const std::vector<int32_t> first_tokens = first_prompt_tokens(plan);
  const PromptScores scores(r);
  const Engine& engine = state.loaded_engine();
  Submission sub(state.loaded_engine(), state.admission, state.metrics, engine_requests(plan), nullptr);
  std::vector<ChoiceOutput> outputs;
  int completion_tokens = 0;
  for (size_t i = 0; i < sub.size(); ++i) {
    GenerationResult result = sub.wait(i);
    check_result(result);
    completion_tokens += static_cast<int>(result.tokens.size());
    json logprobs = nullptr;
    if (r.logprobs) {
      size_t offset = echoes[i].size();
      logprobs = r.endpoint == Endpoint::chat ? chat_logprobs(engine, result.logprobs)
                                              : completion_logprobs(engine, result.logprobs, offset);
    }
    if (scores.echo) {
      json all = scores.echoed(engine, first_tokens[i], result.prompt_logprobs);
      append_logprobs(all, logprobs);
      logprobs = std::move(all);
    }
    outputs.push_back(
        {echoes[i] + result.text, result.finish, std::move(logprobs), scores.field(engine, result.prompt_logprobs)});
  }
  res.set_content(full_response(head, outputs, plan.prompt_tokens, completion_tokens)
                      .dump(-1, ' ', false, json::error_handler_t::replace),
                  "application/json");
}

// One streamed response: its submission (cancelled if the stream ends early) and its progress.
struct Stream {
  const Engine* engine = nullptr;
  ResponseHead head;
  bool include_usage = false;
  bool logprobs = false;             // the request asked for them
  std::vector<size_t> text_offsets;  // per choice: completions' text_offset so far
  std::vector<std::string> echoes;   // per choice: the prompt text to send first, or empty
  // Prompt scores, when asked for, wait for the choice's first event: its echo chunk goes then.
  std::optional<PromptScores> scores;
  std::vector<int32_t> first_tokens;  // per choice: its prompt's first token
  std::vector<bool> head_pending;     // per choice: the echo / prompt_logprobs chunk is still to send
  std::shared_ptr<EventQueue> events = std::make_shared<EventQueue>();
  std::unique_ptr<Submission> submission;
  int prompt_tokens = 0, completion_tokens = 0;
  size_t finished = 0;
  bool started = false;

  bool write(httplib::DataSink& sink, const std::string& data) { return sink.write(data.data(), data.size()); }
  bool start(httplib::DataSink& sink);
  bool finish(httplib::DataSink& sink);
  // Sends what the next event says; false when the client is gone.
  bool pump(httplib::DataSink& sink);
};

bool Stream::start(httplib::DataSink& sink) {
  started = true;
  for (size_t i = 0; i < echoes.size(); ++i) {
    const bool chat = head.endpoint == Endpoint::chat;
    if (head_pending[i]) continue;
    if ((chat || !echoes[i].empty()) &&
        !write(sink, sse_data(choice_chunk(head, int(i), echoes[i], Finish::none, chat, include_usage))))
      return false;
  }
  return true;
}

bool Stream::finish(httplib::DataSink& sink) {
  // Every one has ended: no blocking. Usage counts the output tokens as a whole response does
  // (an end-of-sequence token streamed with the last event is not one).
  completion_tokens = 0;
  for (size_t i = 0; i < submission->size(); ++i)
    completion_tokens += static_cast<int>(submission->wait(i).tokens.size());
  submission.reset();
  if (include_usage && !write(sink, sse_data(usage_chunk(head, prompt_tokens, completion_tokens)))) return false;
  if (!write(sink, kSseDone)) return false;
  sink.done();
  return true;
}

bool Stream::pump(httplib::DataSink& sink) {
  if (!started) return start(sink);
  std::optional<ChoiceEvent> e = events->pop(kPollInterval);
  if (!e) return sink.is_writable();
  const auto i = static_cast<size_t>(e->index);
  if (head_pending[i]) {
    head_pending[i] = false;
    json chunk = choice_chunk(head, e->index, echoes[i], Finish::none, false, include_usage,
                              scores->echoed(*engine, first_tokens[i], e->prompt_logprobs));
    if (scores->prompt_logprobs) chunk["choices"][0]["prompt_logprobs"] = scores->field(*engine, e->prompt_logprobs);
    if (!write(sink, sse_data(chunk))) return false;
  }
  json logprobs = nullptr;
  if (this->logprobs && !e->logprobs.empty())
    logprobs = head.endpoint == Endpoint::chat
                   ? chat_logprobs(*engine, e->logprobs)
                   : completion_logprobs(*engine, e->logprobs, text_offsets[static_cast<size_t>(e->index)]);
  if ((!e->text.empty() || !logprobs.is_null()) &&
      !write(sink,
             sse_data(choice_chunk(head, e->index, e->text, Finish::none, false, include_usage, std::move(logprobs)))))
    return false;
  if (e->finish == Finish::none) return true;
  if (e->finish == Finish::error || e->finish == Finish::cancelled) {
    const char* what = e->finish == Finish::error ? "generation failed" : "the request was cancelled";
    if (!write(sink, sse_data(error_body(what, "server_error")))) return false;
  } else if (!write(sink, sse_data(choice_chunk(head, e->index, "", e->finish, false, include_usage)))) {
    return false;
  }
  if (++finished < submission->size()) return true;
  return finish(sink);
}

void respond_stream(ServerState& state, const CompletionRequest& r, GenerationPlan plan, const ResponseHead& head,
                    httplib::Response& res) {
  auto stream = std::make_shared<Stream>();
  stream->engine = &state.loaded_engine();
  stream->head = head;
  stream->include_usage = r.include_usage;
  stream->logprobs = r.logprobs.has_value();
  stream->prompt_tokens = plan.prompt_tokens;
  for (const PlannedChoice& c : plan.choices) stream->echoes.push_back(r.echo ? c.prompt_text : std::string());
  for (const std::string& echo : stream->echoes) stream->text_offsets.push_back(echo.size());
  const PromptScores scores(r);
  if (scores.any()) stream->scores = scores;
  stream->first_tokens = first_prompt_tokens(plan);
  stream->head_pending.assign(plan.choices.size(), scores.any());
  stream->submission = std::make_unique<Submission>(state.loaded_engine(), state.admission, state.metrics,
                                                    engine_requests(plan), stream->events);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream", [stream](size_t, httplib::DataSink& sink) { return stream->pump(sink); },
      // Also when the client went away mid-stream: its requests are cancelled and released now.
      [stream](bool) { stream->submission.reset(); });
}

}  // namespace

void handle_completion(ServerState& state, Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  Engine& engine = state.loaded_engine();
  const json body = parse_body(req);
  const CompletionRequest r = parse_completion_request(body, endpoint, state.render);
  state.check_model(r.model);
  GenerationPlan plan = plan_generation(r, engine, state.options, state.end_of_turn);
  const ResponseHead head = response_head(endpoint, state.options.served_model_name);
  if (r.stream)
    respond_stream(state, r, std::move(plan), head, res);
  else
    respond_whole(state, r, std::move(plan), head, res);
}

}  // namespace specdec::server
