// `specdec bench-serve --url URL`: a load generator for an OpenAI-compatible server. It replays a
// prompt set as streamed /v1/completions requests, at fixed concurrency (C clients, each sending
// its next request when the last one ends) or with Poisson arrivals at a rate, and reports
// throughput, time to first token and inter-token latency (per streamed chunk, as vLLM's
// benchmark measures it) as a table and as JSON.
#include "cli/bench_serve.h"

#include <httplib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <numeric>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <thread>

namespace specdec::cli {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchServeOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string prompts_file;  // JSONL: {"prompt": "...", "max_tokens": N (optional)} per line
  std::string model;
  std::string api_key;
  std::string speculative;  // none|ngram|draft: the request's `speculative.method`; empty: the server's
  int num_requests = 32;
  int concurrency = 0;  // 0: 1 without --rate, unbounded with it
  double rate = 0;      // requests per second (Poisson arrivals); 0: fixed concurrency
  int max_tokens = 64;
  double temperature = 0;
  uint64_t seed = 0;
  std::string json_out;
  std::string label;
};

struct Prompt {
  std::string text;
  int max_tokens = 0;  // 0: the --max-tokens default
};

// Short code prompts, the kind of work speculative decoding is for: completions that repeat
// names and structure from their context.
const std::vector<std::string> kBuiltinPrompts = {
    "import argparse\nimport sys\n\n\ndef parse_args(argv=None):\n    parser = argparse.ArgumentParser(description=",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "#include <vector>\n\nint sum(const std::vector<int>& values) {\n    int total = 0;\n    for (",
    "def read_config(path):\n    with open(path) as f:\n        lines = f.readlines()\n    config = {}\n    for line "
    "in",
    "function debounce(fn, ms) {\n  let timer = null;\n  return function (...args) {\n",
    "SELECT customers.name, COUNT(orders.id) AS order_count\nFROM customers\nLEFT JOIN orders ON",
    "def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n    while lo <= hi:\n",
};

std::vector<Prompt> load_prompts(const std::string& file) {
  std::vector<Prompt> out;
  if (file.empty()) {
    for (const std::string& p : kBuiltinPrompts) out.push_back({p, 0});
    return out;
  }
  std::ifstream in(file);
  if (!in) throw std::runtime_error("cannot read --prompts " + file);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const std::exception& e) {
      throw std::runtime_error(file + " line " + std::to_string(n) + ": " + e.what());
    }
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string())
      throw std::runtime_error(file + " line " + std::to_string(n) + ": expected {\"prompt\": \"...\"}");
    out.push_back({j["prompt"].get<std::string>(), j.value("max_tokens", 0)});
  }
  if (out.empty()) throw std::runtime_error("--prompts " + file + " holds no prompt");
  return out;
}

struct Outcome {
  bool ok = false;
  std::string error;
  double ttft = 0, e2e = 0;
  int output_tokens = 0;
  std::vector<double> itl;  // gaps between streamed chunks after the first
};

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// One streamed completion: SSE `data:` lines are read as they arrive.
Outcome run_one(const BenchServeOptions& o, const Prompt& p, uint64_t seed) {
  httplib::Client client(o.url);
  client.set_read_timeout(600, 0);
  client.set_connection_timeout(10, 0);
  if (!o.api_key.empty()) client.set_bearer_token_auth(o.api_key);
  json body = {{"prompt", p.text},
               {"max_tokens", p.max_tokens > 0 ? p.max_tokens : o.max_tokens},
               {"temperature", o.temperature},
               {"seed", seed},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (!o.model.empty()) body["model"] = o.model;
  if (!o.speculative.empty()) body["speculative"] = {{"method", o.speculative}};
  Outcome out;
  std::string buffer, error_body;
  bool done = false;
  int status = 0;
  Clock::time_point last;
  const Clock::time_point start = Clock::now();
  auto on_line = [&](const std::string& line) {
    if (line.rfind("data: ", 0) != 0) return;
    const std::string data = line.substr(6);
    if (data == "[DONE]") {
      done = true;
      return;
    }
    const json j = json::parse(data, nullptr, false);
    if (j.is_discarded()) return;
    if (j.contains("error")) {
      out.error = j["error"].value("message", "error event");
      return;
    }
    if (j.contains("usage") && j["usage"].is_object()) out.output_tokens = j["usage"].value("completion_tokens", 0);
    if (!j.contains("choices") || j["choices"].empty() || j["choices"][0].value("text", "").empty()) return;
    const Clock::time_point now = Clock::now();
    if (out.ttft == 0)
      out.ttft = seconds(start, now);
    else
      out.itl.push_back(seconds(last, now));
    last = now;
  };
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status != 200) {
      error_body.append(data, n);
      return true;
    }
    buffer.append(data, n);
    size_t at;
    while ((at = buffer.find('\n')) != std::string::npos) {
      on_line(buffer.substr(0, at));
      buffer.erase(0, at + 1);
    }
    return true;
  };
  const httplib::Result res = client.send(req);
  out.e2e = seconds(start, Clock::now());
  if (!res) {
    out.error = "connection failed: " + httplib::to_string(res.error());
  } else if (status != 200) {
    const json j = json::parse(error_body, nullptr, false);
    out.error = "HTTP " + std::to_string(status) +
                (j.is_object() && j.contains("error") ? ": " + j["error"].value("message", "") : std::string());
  } else if (!done && out.error.empty()) {
    out.error = "the stream ended without [DONE]";
  }
  out.ok = out.error.empty();
  return out;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

json summarize(const BenchServeOptions& o, const std::vector<Outcome>& outcomes, double wall) {
  std::vector<double> ttft, itl, e2e;
  int64_t tokens = 0;
  int ok = 0;
  json errors = json::object();
  for (const Outcome& r : outcomes) {
    if (!r.ok) {
      errors[r.error] = errors.value(r.error, 0) + 1;
      continue;
    }
    ++ok;
    tokens += r.output_tokens;
    ttft.push_back(r.ttft);
    e2e.push_back(r.e2e);
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
  }
  auto ms = [](double s) { return std::round(s * 1e5) / 100; };
  json j;
  if (!o.label.empty()) j["label"] = o.label;
  j["url"] = o.url;
  j["requests"] = outcomes.size();
  j["completed"] = ok;
  j["errors"] = static_cast<int>(outcomes.size()) - ok;
  j["error_kinds"] = errors;
  j["concurrency"] = o.concurrency;
  j["rate"] = o.rate > 0 ? json(o.rate) : json(nullptr);
  j["duration_s"] = wall;
  j["request_throughput"] = wall > 0 ? ok / wall : 0;
  j["output_tokens"] = tokens;
  j["output_throughput"] = wall > 0 ? static_cast<double>(tokens) / wall : 0;
  j["ttft_ms"] = {{"mean", ttft.empty() ? 0 : ms(std::accumulate(ttft.begin(), ttft.end(), 0.0) / ttft.size())},
                  {"p50", ms(percentile(ttft, 0.5))},
                  {"p99", ms(percentile(ttft, 0.99))}};
  j["itl_ms"] = {{"mean", itl.empty() ? 0 : ms(std::accumulate(itl.begin(), itl.end(), 0.0) / itl.size())},
                 {"p50", ms(percentile(itl, 0.5))},
                 {"p99", ms(percentile(itl, 0.99))}};
  j["e2e_ms"] = {{"p50", ms(percentile(e2e, 0.5))}, {"p99", ms(percentile(e2e, 0.99))}};
  return j;
}

void print_table(const json& j) {
  std::printf("%-28s %s\n", "url", j["url"].get<std::string>().c_str());
  std::printf("%-28s %d / %d (errors %d)\n", "completed", j["completed"].get<int>(), j["requests"].get<int>(),
              j["errors"].get<int>());
  for (const auto& [kind, n] : j["error_kinds"].items()) std::printf("  %-26s %d\n", kind.c_str(), n.get<int>());
  std::printf("%-28s %.2f s\n", "duration", j["duration_s"].get<double>());
  std::printf("%-28s %.3f\n", "requests/s", j["request_throughput"].get<double>());
  std::printf("%-28s %.1f\n", "output tokens/s", j["output_throughput"].get<double>());
  std::printf("%-28s %.1f / %.1f ms\n", "TTFT p50 / p99", j["ttft_ms"]["p50"].get<double>(),
              j["ttft_ms"]["p99"].get<double>());
  std::printf("%-28s %.1f / %.1f ms\n", "inter-token p50 / p99", j["itl_ms"]["p50"].get<double>(),
              j["itl_ms"]["p99"].get<double>());
  std::printf("%-28s %.1f / %.1f ms\n", "end-to-end p50 / p99", j["e2e_ms"]["p50"].get<double>(),
              j["e2e_ms"]["p99"].get<double>());
}

void bench_serve(BenchServeOptions o) {
  const std::vector<Prompt> prompts = load_prompts(o.prompts_file);
  if (o.rate <= 0 && o.concurrency <= 0) o.concurrency = 1;
  std::vector<Outcome> outcomes(static_cast<size_t>(o.num_requests));
  auto send = [&](int i) {
    const Prompt& p = prompts[static_cast<size_t>(i) % prompts.size()];
    outcomes[static_cast<size_t>(i)] = run_one(o, p, o.seed + static_cast<uint64_t>(i));
  };
  const Clock::time_point start = Clock::now();
  if (o.rate <= 0) {
    // Fixed concurrency: each client sends its next request as soon as its last one ended.
    std::atomic<int> next{0};
    std::vector<std::thread> clients;
    for (int c = 0; c < o.concurrency; ++c)
      clients.emplace_back([&] {
        for (int i; (i = next++) < o.num_requests;) send(i);
      });
    for (auto& t : clients) t.join();
  } else {
    // Poisson arrivals (exponential gaps); at most --concurrency in flight when it is given.
    std::mt19937_64 rng(o.seed);
    std::exponential_distribution<double> gap(o.rate);
    std::vector<std::thread> inflight;
    std::atomic<int> active{0};
    Clock::time_point at = start;
    for (int i = 0; i < o.num_requests; ++i) {
      at += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
      std::this_thread::sleep_until(at);
      while (o.concurrency > 0 && active >= o.concurrency) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++active;
      inflight.emplace_back([&, i] {
        send(i);
        --active;
      });
    }
    for (auto& t : inflight) t.join();
  }
  const json report = summarize(o, outcomes, seconds(start, Clock::now()));
  print_table(report);
  if (!o.json_out.empty()) {
    std::ofstream out(o.json_out);
    if (!out) throw std::runtime_error("cannot write --json " + o.json_out);
    out << report.dump(2) << "\n";
  }
}

}  // namespace

int run_bench_serve(const std::vector<std::string>& args) {
  BenchServeOptions o;
  CLI::App app("specdec bench-serve: streamed load against an OpenAI-compatible server", "specdec bench-serve");
  app.add_option("--url", o.url, "the server's base URL")->capture_default_str();
  app.add_option("--prompts", o.prompts_file,
                 "JSONL prompt set ({\"prompt\", \"max_tokens\"?} a line); "
                 "default: built-in code prompts");
  app.add_option("--num-requests,-n", o.num_requests, "requests to send")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--concurrency,-c", o.concurrency, "clients in flight (default 1; with --rate: unbounded)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rate", o.rate, "Poisson arrivals at this many requests per second")->check(CLI::NonNegativeNumber);
  app.add_option("--max-tokens", o.max_tokens, "tokens per request unless its line says")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--temperature", o.temperature, "sampling temperature")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 2.0));
  app.add_option("--seed", o.seed, "request i is sent with seed + i")->capture_default_str();
  app.add_option("--model", o.model, "the model name to send");
  app.add_option("--api-key", o.api_key, "sent as 'Authorization: Bearer KEY'");
  app.add_option("--speculative", o.speculative, "narrow each request's speculation: none, ngram or draft")
      ->check(CLI::IsMember({"none", "ngram", "draft"}));
  app.add_option("--json", o.json_out, "also write the report as JSON to this file");
  app.add_option("--label", o.label, "a label stored in the JSON report");
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  bench_serve(o);
  return 0;
}

}  // namespace specdec::cli
