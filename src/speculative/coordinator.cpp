// Coordinator: draft groups keyed by method instance id, the depth each row drafts at, batched
// drafting per group with its measured cost, and the relay of prefill blocks and verified
// rounds. See coordinator.h for the contract.
#include "speculative/coordinator.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"

namespace specdec {

namespace {
using Clock = std::chrono::steady_clock;

// The share of a batch's time its paused rows' probes may take. A probe is one row's round of
// one draft, but in a batch it costs the whole iteration: the group's draft call for that row
// and every row's window padded to two tokens, most of a plain step on a GPU, and many steps
// when they are shapes not recorded yet (a batch's probes are few and far between, so theirs
// often are). Rows paused one by one each probe on their own back-off (4, 8, ... 64 rounds), so
// eight rows early in their requests put a probe into every third or fourth iteration.
constexpr double kProbeBudget = 0.02;

// Iterations over which probes that each cost `extra` seconds more than a plain iteration of
// `step` seconds take kProbeBudget of the time (bounded).
int probe_wait(double extra, double step) {
  return static_cast<int>(std::clamp(std::ceil(extra / (kProbeBudget * step)), 0.0, 4096.0));
}

// The wait after a probe of `depth` drafts in a batch of `rows`: its extra cost is what the
// group's probe iterations were measured to cost beyond plain ones (`measured`, 0 before any), or
// at least what the fits price: the draft call of one row, and every row's window padded to the
// probe's instead of one token. 0 until the costs are measured.
int probe_gap(const CostModel& costs, const DraftCost& draft, int rows, int depth, double measured) {
  if (!costs.calibrated()) return 0;
  const double step = costs.forward_cost(rows);
  const double priced = draft.cost(depth, costs.speed()) + std::max(0.0, costs.forward_cost((depth + 1) * rows) - step);
  return probe_wait(std::max(measured, priced), step);
}

constexpr double kPlainRate = 0.05;  // moving-average rate of a plain iteration's time
constexpr double kProbeRate = 0.5;   // and of a probe iteration's: there are few of them
}  // namespace

struct Coordinator::Group {
  std::shared_ptr<DraftMethod> method;
  std::vector<int> tap_layers;  // the method's declared taps
  int resume_taps = 1;          // and how many rounds before a probe it wants them again
  std::unique_ptr<DraftRows> rows;
  std::vector<SpecRow*> members;  // in the group's row order
  DraftCost draft_cost;           // seconds of this group's draft calls
  DraftCost fixed_draft_cost;     // what its rejection-mode rows price them at (fixed_costs_' units)
  int forced_probes_left = 0;     // this round's probes against the measured costs
  int probe_gap_left = 0;         // iterations before one of its paused rows may probe again
  int probe_spacing = 0;          // the wait set after the latest probe let go
  int queue_end = 0;              // iterations before the last probe turn given to a waiting row
  const SpecRow* prober = nullptr;  // the row let probe this iteration
  double probe_seconds = 0;       // moving average of iterations whose only draft was its probe
  // This round's asks (and who asked) and commits; kept between rounds so that a round
  // allocates nothing for them.
  std::vector<DraftRequestRow> asks;
  std::vector<SpecRow*> askers;
  std::vector<RowCommit> commits;

  int index_of(const SpecRow& row) const {
    auto it = std::find(members.begin(), members.end(), &row);
    SPECDEC_CHECK(it != members.end(), "row ", row.id, " is not in draft group '", row.method, "'");
    return static_cast<int>(it - members.begin());
  }
  // Drafts this round's asks; `speed`: the machine's (CostModel::speed), for the calls' price.
  void draft(double speed);
};

// A method that declared taps gets exactly its layers for exactly the positions it is told of,
// unless the forward did not tap the row; one that declared none gets none. A mismatch is the
// engine's bug, caught before the method.
void Coordinator::check_context(const Group& g, const SpecRow& row, const TargetContext& context, int64_t positions) {
  const bool fits = g.tap_layers.empty() || row.untapped
                        ? context.empty()
                        : context.taps.size() == g.tap_layers.size() && context.positions() == positions;
  SPECDEC_CHECK(fits, "draft context of ", context.taps.size(), " taps x ", context.positions(),
                " positions does not match the method's ", g.tap_layers.size(), " tap layers x ", positions,
                " positions");
}

Coordinator::Coordinator(TargetView target) : target_(target) {}

Coordinator::~Coordinator() = default;

void Coordinator::add_method(const std::string& id, std::shared_ptr<DraftMethod> method) {
  SPECDEC_CHECK(method != nullptr, "null draft method");
  SPECDEC_CHECK(!id.empty(), "a draft method needs a non-empty id");
  SPECDEC_CHECK(!groups_.count(id), "a draft method with id '", id, "' is already registered");
  const TargetNeeds needs = method->needs();
  check_ports(target_, needs, id);
  auto group = std::make_unique<Group>();
  group->tap_layers = needs.tap_layers;
  group->resume_taps = std::max(1, needs.resume_taps);
  const bool block = method->drafts_in_one_forward();
  const int own = method->own_depth();
  group->draft_cost = DraftCost(block ? DraftCost::Shape::per_block : DraftCost::Shape::per_draft, own);
  group->fixed_draft_cost = block
                                ? DraftCost::fixed(DraftCost::Shape::per_block, kFixedBlock, 0.0, own)
                                : DraftCost::fixed(DraftCost::Shape::per_draft, kFixedDraftStep, kFixedDraftStep, own);
  group->rows = method->open(target_);
  group->method = std::move(method);
  groups_[id] = std::move(group);
}

int Coordinator::default_depth(const std::string& id) const { return group(id).method->default_depth(); }

int Coordinator::own_depth(const std::string& id) const { return group(id).method->own_depth(); }

Coordinator::Group& Coordinator::group(const std::string& id) const {
  auto it = groups_.find(id);
  SPECDEC_CHECK(it != groups_.end(), "unknown draft method '", id, "'");
  return *it->second;
}

Coordinator::Group& Coordinator::group_of(const SpecRow& row) const { return group(row.method); }

bool Coordinator::has_room(const SpecRow& row, int tokens) const { return group_of(row).rows->has_room(tokens); }

size_t Coordinator::kv_touched_bytes() const {
  size_t bytes = 0;
  for (const auto& [id, g] : groups_) bytes += g->rows->kv_touched_bytes();
  return bytes;
}

void Coordinator::join(SpecRow& row) {
  Group& g = group_of(row);
  const Checkpoint* fresh = nullptr;
  PreparedChange change = g.rows->prepare_append(std::span<const Checkpoint* const>(&fresh, 1));
  g.members.push_back(&row);
  change.commit();
  row.joined = true;
  row.untapped = false;
}

void Coordinator::leave(std::span<SpecRow* const> rows) {
  for (auto& [id, g] : groups_) {
    const auto leaving = [&](const SpecRow* r) { return std::find(rows.begin(), rows.end(), r) != rows.end(); };
    if (std::none_of(g->members.begin(), g->members.end(), leaving)) continue;
    std::vector<int> keep;
    std::vector<SpecRow*> members;
    for (size_t i = 0; i < g->members.size(); ++i) {
      if (leaving(g->members[i])) {
        g->members[i]->joined = false;
        continue;
      }
      keep.push_back(static_cast<int>(i));
      members.push_back(g->members[i]);
    }
    g->rows->filter_rows(keep);
    g->members = std::move(members);
  }
}

std::span<const int> Coordinator::tap_layers(const SpecRow& row) const {
  if (!row.joined) return {};
  return group_of(row).tap_layers;
}

std::span<const int> Coordinator::forward_taps(const SpecRow& row) const {
  if (row.untapped) return {};
  return tap_layers(row);
}

bool Coordinator::quiet_next(const SpecRow& row) const {
  if (!row.joined || !row.policy) return false;
  // propose() taps a paused row again in at most the method's resume_taps rounds before the one
  // that ends its pause.
  const Group& g = group_of(row);
  return row.policy->plain_rounds() > (g.tap_layers.empty() ? 0 : g.resume_taps);
}

void Coordinator::prefill(SpecRow& row, std::span<const int32_t> tokens, const TargetContext& context) {
  if (!row.joined) return;
  Group& g = group_of(row);
  check_context(g, row, context, static_cast<int64_t>(tokens.size()));
  g.rows->prefill(g.index_of(row), tokens, context);
}

void Coordinator::prefill_shared(SpecRow& row, std::span<const int32_t> tokens) {
  if (!row.joined) return;
  Group& g = group_of(row);
  g.rows->prefill(g.index_of(row), tokens, TargetContext{});
}

void Coordinator::propose(std::span<const DraftAsk> asks, const CostModel& costs, int decoding) {
  for (auto& [id, g] : groups_) {
    g->forced_probes_left = 1;
    g->probe_gap_left = std::max(0, g->probe_gap_left - 1);
    g->queue_end = std::max(0, g->queue_end - 1);
    g->prober = nullptr;
    g->asks.clear();
    g->askers.clear();
  }
  for (const DraftAsk& a : asks) {
    SpecRow& row = *a.row;
    if (!row.joined) continue;
    Group& g = group_of(row);
    const bool blind = row.untapped && !g.tap_layers.empty();  // the round before this one was not tapped
    // A rejection-mode row decides alone, on fixed prices, as if it were the only row: what the
    // batch does and how long it takes must not move its depths.
    const bool reproducible = row.mode == SpecMode::rejection;
    int depth = reproducible
                    ? row.policy->next_depth(fixed_costs_, g.fixed_draft_cost, 1)
                    : row.policy->next_depth(costs, g.draft_cost, std::max(1, decoding), &g.forced_probes_left);
    // In a batch a group's paused rows probe one at a time, spaced so that probes take at most
    // kProbeBudget of the batch's time; a row whose probe must wait is paused until then, its
    // back-off unchanged. Waiting rows take turns, each given its own later turn one probe's wait
    // after the last one given: a row is tapped in the rounds before its probe, and rows that all
    // waited for the same iteration would all be tapped for probes that only one of them makes.
    //
    // A probe goes out only after a tapped round, so that the drafter has the taps of the
    // positions just before it: one whose taps were spared (a pause that the costs were to renew,
    // or a probe that was to be put off) but that comes all the same waits a round, holding the
    // group's turn.
    //
    // A rejection-mode row takes no turns (it probes when its own policy says), only the tapped
    // round before a probe.
    const bool shares = decoding > 1 && !reproducible;
    if (depth > 0 && row.policy->probing()) {
      if (shares && (g.prober || g.probe_gap_left > 0)) {
        g.queue_end = std::max({1, g.probe_gap_left, g.queue_end + g.probe_spacing});
        row.policy->defer_probe(g.queue_end);
        depth = 0;
      } else if (blind) {
        row.policy->defer_probe(1);
        depth = 0;
        if (shares) g.probe_gap_left = std::max(g.probe_gap_left, 1);
      } else if (shares) {
        g.prober = &row;
        const double measured = g.probe_seconds > 0 && plain_seconds_ > 0 ? g.probe_seconds - plain_seconds_ : 0.0;
        g.probe_gap_left = probe_gap(costs, g.draft_cost, decoding, depth, measured);
        g.probe_spacing = g.probe_gap_left;
      }
    }
    // A paused row is not tapped: each tapped round costs the forward a gather per tap layer and
    // the method a device copy per tap, which on a GPU whose plain step is a few launches is a
    // sizeable part of that step. Its drafter's context then misses those positions. It is tapped
    // again in the rounds just before a probe that decides whether it drafts again (as many as
    // its method asks for), or in the last one only (the taps a drafter needs to draft at all)
    // when the probe can only re-measure costs that leave no depth paying at any acceptance, and
    // not at all when the costs say the pause will be renewed without a probe.
    // In a batch, a pause that ends while the group's wait after its last probe still runs ends
    // in a probe put off again: no taps for it either.
    const int lead = !row.policy->cannot_pay() ? g.resume_taps : row.policy->probe_forced() ? 1 : 0;
    const int ahead = row.policy->rounds_to_draft();
    const bool put_off = shares && depth == 0 && g.probe_gap_left > ahead;
    row.untapped = !g.tap_layers.empty() && (ahead > lead || put_off);
    // Past the policy's deepest lies only what the request's text continues: it costs the drafter
    // nothing and is proposed only where the text repeats itself. Priced by the policy, those
    // positions would take its optimistic prior for untried depths, and every round would look
    // worth drafting on a row whose own drafts are seldom accepted.
    if (depth > 0 && depth >= row.policy->max_depth()) depth = std::max(depth, row.reach);
    depth = std::min(depth, a.limit);
    if (depth <= 0) continue;
    g.asks.push_back(
        DraftRequestRow{g.index_of(row), a.pending, depth, a.position, a.sampling, row.mode == SpecMode::rejection});
    g.asks.back().adaptive = row.policy->adaptive();
    if (costs.calibrated() && !reproducible) {
      DraftRequestRow& ask = g.asks.back();
      for (int w = 1; w <= depth + 1; ++w) ask.window_seconds.push_back(costs.row_cost(w, std::max(1, decoding)));
      ask.draft_seconds = g.draft_cost.cost(depth, costs.speed());
    }
    g.askers.push_back(&row);
  }
  // An iteration whose only drafting row is a probe (it had room for a draft) times that probe.
  last_asks_ = 0;
  probe_only_ = nullptr;
  for (auto& [id, g] : groups_) {
    last_asks_ += g->asks.size();
    if (g->askers.size() == 1 && g->askers[0] == g->prober) probe_only_ = g.get();
  }
  if (last_asks_ != 1) probe_only_ = nullptr;
  for (auto& [id, g] : groups_)
    if (!g->asks.empty()) g->draft(costs.speed());
}

void Coordinator::observe_iteration(double seconds) {
  if (last_asks_ == 0) {
    plain_seconds_ = plain_seconds_ == 0 ? seconds : plain_seconds_ + kPlainRate * (seconds - plain_seconds_);
  } else if (probe_only_) {
    double& p = probe_only_->probe_seconds;
    p = p == 0 ? seconds : p + kProbeRate * (seconds - p);
    // The wait that this probe set was priced before its cost was seen: lengthened to what it
    // cost, when that was more.
    if (plain_seconds_ > 0 && p > plain_seconds_)
      probe_only_->probe_gap_left =
          std::max(probe_wait(p - plain_seconds_, plain_seconds_), probe_only_->probe_gap_left);
  }
  last_asks_ = 0;
  probe_only_ = nullptr;
}

void Coordinator::Group::draft(double speed) {
  const auto t0 = Clock::now();
  std::vector<DraftProposal> got = rows->draft(asks);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  int depth = 0;
  bool unusual = false;
  for (size_t i = 0; i < got.size(); ++i) {
    depth = std::max(depth, static_cast<int>(got[i].tokens.size()));
    unusual = unusual || got[i].caught_up > 0 || got[i].one_off;
    askers[i]->proposal = std::move(got[i]);
  }
  // A call that also caught a row up on the tokens of rounds it did not draft in (after a
  // pause), or that recorded a shape of its forwards, would charge that one-off to every
  // drafted token and so prolong the pause it causes: a draft model on a GPU records its step
  // anew whenever a row's context crosses a padded length, a cost many times a step. Its time
  // still bounds a usual call's.
  const double share = secs / static_cast<double>(got.size());
  if (unusual) {
    draft_cost.observe_bound(depth, share, speed);
  } else {
    draft_cost.observe(depth, share, speed);
  }
  for (SpecRow* row : askers) row->telemetry.draft_ns += static_cast<int64_t>(secs * 1e9 / askers.size());
}

void Coordinator::commit(std::span<const RoundOutcome> outcomes) {
  for (auto& [id, g] : groups_) g->commits.clear();
  for (const RoundOutcome& o : outcomes) {
    SpecRow& row = *o.row;
    row.policy->observe(o.drafted, o.accepted);
    row.telemetry.record_round(o.drafted, o.accepted);
    if (!row.joined || o.finished) continue;
    Group& g = group_of(row);
    RowCommit c;
    c.row = g.index_of(row);
    c.pending = o.pending;
    c.accepted = o.accepted;
    c.emitted.assign(o.emitted.begin(), o.emitted.end());
    c.drafted = o.drafted;
    check_context(g, row, o.context, o.accepted + 1);
    c.context = o.context;
    g.commits.push_back(std::move(c));
  }
  for (auto& [id, g] : groups_)
    if (!g->commits.empty()) g->rows->commit(g->commits);
}

}  // namespace specdec
