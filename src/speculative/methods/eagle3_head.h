// An EAGLE-3 draft head in its published layout (docs/formats.md): config.json with architecture
// LlamaForCausalLMEagle3 and model.safetensors holding fc (three target taps fused into one
// hidden), one decoder layer whose attention reads [normed embedding; normed hidden], its own
// norm and LM head over a reduced draft vocabulary, and the draft-to-target id map d2t.
// The head runs as backend kernel calls on its own paged KV, like the target.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/weight.h"
#include "kv/kv_cache.h"
#include "model/config.h"
#include "model/replay.h"

namespace specdec {

class Carver;

struct Eagle3Config {
  // The decoder layer's shape, RoPE and norm epsilon; vocab_size is the target's vocabulary
  // (the ids the head's embedding reads), num_layers is 1.
  ModelConfig layer;
  int target_hidden = 0;  // width of each target tap (target_hidden_size, else hidden_size)
  int draft_vocab = 0;    // rows of lm_head (draft_vocab_size, else vocab_size)
  // eagle_aux_hidden_state_layer_ids as written (each: the output of that target layer); empty:
  // the loaders' default, the inputs of layers 2, L/2 and L-3.
  std::vector<int> aux_layer_ids;
  bool norm_before_residual = false;  // the layer's residual is the normed hidden (a vLLM option)

  // The target taps fc reads, in fc's order (seam numbering: i = the residual after layer i).
  std::vector<int> tap_layers(int target_layers) const;
};

// True when dir/config.json names the EAGLE-3 head architecture.
bool is_eagle3_dir(const std::filesystem::path& dir);
Eagle3Config load_eagle3_config(const std::filesystem::path& dir);

class Eagle3Head {
 public:
  // Reads and validates dir (every tensor present and shaped, d2t inside the target vocabulary)
  // and uploads the weights to `backend`. Errors name the folder and the tensor.
  static std::unique_ptr<Eagle3Head> load(const std::filesystem::path& dir, Backend& backend);
  ~Eagle3Head();
  Eagle3Head(const Eagle3Head&) = delete;
  Eagle3Head& operator=(const Eagle3Head&) = delete;

  const Eagle3Config& config() const { return config_; }
  Backend& backend() const { return backend_; }
  // Whether the checkpoint carries its own embed_tokens; without, forward() reads the target's.
  bool has_embedding() const { return !own_embed_.empty(); }
  // Target id of each logit column: the draft ids (d2t applied; the identity without d2t), then
  // the context rows' tokens (a filler row repeats draft id 0's).
  std::span<const int32_t> draft_to_target() const { return draft_to_target_; }

  // Context rows. A reduced draft vocabulary was cut by frequency over the training text, so the
  // head can never propose a rarer token, however often this request's text repeats it. Target
  // tokens that the drafter's rows hold and the draft vocabulary lacks (up to kContextRows, the
  // least recently seen giving way) get logit columns after the draft vocabulary's, from the
  // target's own LM-head rows scaled by the ratio of the head's row norms to the target's over
  // the draft vocabulary (the head's rows start from the target's and grow in training). Unused
  // columns repeat draft id 0's row and map to its token, so they change no draw.
  static constexpr int kContextRows = 256;
  // Sizes the context rows for this target's LM head and takes its scale. Nothing for a head over
  // the whole vocabulary, or an LM head that is quantized or of another shape than [vocab, hidden].
  // `rows`: at most this many context rows.
  void use_target_rows(const Weight& lm_head, int rows = kContextRows);
  // Tokens one of the drafter's rows holds (its prompt, its verified tokens): the new ones
  // outside the draft vocabulary take context rows, copied from `lm_head` (the one given to
  // use_target_rows).
  void note_context(std::span<const int32_t> tokens, const Weight& lm_head);
  // Columns of a forward's logits: the draft vocabulary, then the context rows once taken.
  int logit_columns() const { return config_.draft_vocab + context_rows_; }
  // The context rows' scale (0 until use_target_rows), and how many hold a token.
  float context_scale() const { return context_scale_; }
  int context_rows_used() const { return context_used_; }
  std::unique_ptr<KvCache> make_cache(int num_blocks) const;

  // One row of a forward: new tokens continuing the row's head KV, and which of them return
  // logits and hidden states.
  struct Row {
    KvCache::SeqId seq = 0;
    std::vector<int32_t> tokens;
    std::vector<int32_t> outputs_at;
  };
  struct Output {
    std::vector<float> logits;  // [outputs, logit_columns()], rows in request order
    std::vector<float> hidden;  // [outputs, hidden]: the layer's output before the final norm,
                                // the next chained step's hidden input
  };
  // inputs: f32 [tokens, 3 * target_hidden] fused taps when `fused`, else [tokens, hidden] (the
  // head's own earlier outputs), in host memory or the backend's (there read by the queued calls,
  // in order before anything queued later). `embedding` is the target's table [vocab, hidden],
  // used when the head has none. Each row's KV must be reserved for its new tokens.
  Output forward(std::span<const Row> rows, const Tensor& inputs, bool fused, const Tensor* embedding, KvCache& cache);
  // The same with inputs in host memory.
  Output forward(std::span<const Row> rows, std::span<const float> inputs, bool fused, const Tensor* embedding,
                 KvCache& cache);

  struct Drafts {
    std::vector<int32_t> ids;  // [depth][rows] target ids, -1 where a logit was NaN
    bool one_off = false;      // the chain ran call by call on a backend that records (a new shape)
  };
  // The width each row's step-0 positions are padded to when draft_chain records step 0 with
  // the chain: the most positions a row feeds, rounded up to a power of two. 0 when step 0 runs
  // call by call: on a backend that records nothing, or past the tile attention's 16 positions
  // a row (a prompt caught up on) or ReplayCache::kMaxPaddedWindowTokens in all.
  int step0_width(std::span<const Row> rows) const;
  // Whether chains are recorded and replayed (false once the backend has shown it records
  // nothing).
  bool replays_chains() const { return chain_replays_.available() && whole_replays_.available(); }
  // Drafts without the host between steps: step 0 is forward() of `rows` (fused taps, each row
  // returning one position), then depth - 1 chained steps, each row's next token chosen from its
  // previous step's logits and its next hidden input that step's output, all queued on the
  // backend. With `draws` empty each token is the argmax over the draft vocabulary (through d2t);
  // otherwise draws[k * rows + r] is row r's draw of draft k (Backend::sample) over the target's
  // vocabulary, every token the logit columns do not hold at zero probability: the host draw's
  // distribution. On a backend that records, the whole chain (step 0 too when step0_width(rows)
  // > 0) is recorded per shape (rows, width, depth, argmax or draws, rounded attention bounds,
  // cache) and replayed. fused_inputs: with a width, [rows * width, 3 * target_hidden], row r's
  // positions from r * width with its last repeated into the padding; else the rows' positions
  // one after another. Each row's KV must be reserved for its tokens plus depth - 1 positions;
  // afterwards it holds them all.
  Drafts draft_chain(std::span<const Row> rows, const Tensor& fused_inputs, int depth, const Tensor* embedding,
                     KvCache& cache, std::span<const SampleRow> draws = {});
  // Chains so far, and how many of them were replays (step 0 included or not).
  struct ChainStats {
    int64_t chains = 0, replayed = 0, step0_replayed = 0;
  };
  ChainStats chain_stats() const { return chain_stats_; }

  // The layer's per-token activations for T tokens, carved from a scratch buffer.
  struct Scratch {
    Tensor parts, cat, q, k, v, attn, normed, gate;
  };
  static Scratch scratch_of(Carver& a, const Eagle3Config& c, int64_t T);

 private:
  Eagle3Head(Eagle3Config config, Backend& backend);
  // A copy of host bytes in the backend's memory, kept for the head's lifetime.
  Tensor upload(DType dtype, std::initializer_list<int64_t> shape, const void* bytes);
  // A linear weight from upload(), packed where the backend reads its own layout faster
  // (Backend::pack_weight), the packed copy kept likewise.
  Weight linear_weight(const Tensor& uploaded);
  void ensure(Buffer& buffer, size_t bytes);
  // The layer on T tokens: x (the hidden the residual starts from) becomes the layer's output.
  // ids, positions and cat_index are the tokens' i32 arrays (cat_index interleaves [embedding;
  // hidden] rows, see forward()); `scratch` holds the per-token activations.
  void layer(const Tensor& embed, const Tensor& ids, const Tensor& x, const Tensor& positions, const Tensor& cat_index,
             const AttentionBatch& batch, const Scratch& scratch, int64_t T, KvCache& cache);
  // forward(), or with keep_hidden: the outputs' hidden states gathered there, nothing returned.
  Output run(std::span<const Row> rows, const Tensor& inputs, bool fused, const Tensor* embedding, KvCache& cache,
             const Tensor* keep_hidden);

  Eagle3Config config_;
  Backend& backend_;
  std::vector<Buffer> weights_;
  Weight fc_, q_proj_, k_proj_, v_proj_, o_proj_, gate_proj_, up_proj_, down_proj_, lm_head_;
  Tensor hidden_norm_, input_norm_, post_norm_, final_norm_, own_embed_;
  std::vector<int32_t> draft_to_target_;
  // Context rows: their columns (0 until taken), the target id's column (-1: none), each
  // column's last sighting, and the buffer behind lm_head_.
  float context_scale_ = 0.0f;
  int context_rows_ = 0, context_used_ = 0;
  std::vector<char> in_draft_;
  std::vector<int32_t> context_column_;
  std::vector<uint64_t> context_seen_;
  uint64_t context_tick_ = 0;
  Buffer lm_head_rows_;
  // Rows `ids` of a dense weight (the head's LM head or the target's), on the host as f32.
  std::vector<float> host_rows(const Weight& weight, std::span<const int32_t> ids);
  Buffer inv_freq_buffer_;
  Tensor inv_freq_;
  float rope_scaling_ = 1.0f;
  float attn_scale_ = 1.0f;
  Buffer meta_, activations_;  // reused across forwards, grown as needed
  Tensor draft_to_target_device_;   // d2t applied, [draft_vocab, 1] i32: the chain's input ids
  Buffer chain_meta_, chain_acts_;  // the chain's arrays and activations (their recordings point here)
  // Chains whose step 0 runs call by call, and chains recorded with their step 0.
  ReplayCache chain_replays_{backend_}, whole_replays_{backend_};
  ChainStats chain_stats_;
};

}  // namespace specdec
