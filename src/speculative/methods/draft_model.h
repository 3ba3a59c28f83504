// The draft-model method: a second, smaller checkpoint with the target's vocabulary drafts
// autoregressively, batched across rows, on its own paged KV. In exact mode it samples each
// draft with the target's key for that position (a coupled draw), so a draft close to the
// target matches often at any temperature; it supplies q for rejection mode.
#pragma once

#include <filesystem>
#include <memory>

#include "speculative/draft.h"

namespace specdec {

class Model;

struct DraftModelOptions {
  // The most drafts a round asks for; the depth policy picks fewer where they do not pay.
  int num_draft = 8;
  int kv_blocks = 0;               // 0 = the engine's rows at the draft's full context, within kv_memory
  size_t kv_memory = 1ull << 30;   // cap on the draft KV's bytes when kv_blocks is 0
};

class DraftModelMethod : public DraftMethod {
 public:
  // The method shares ownership of the draft model; `id` names it in the checkpoint namespace.
  DraftModelMethod(std::shared_ptr<Model> draft, std::string id, DraftModelOptions options = {});
  std::string name() const override { return "draft"; }
  std::string checkpoint_namespace() const override;
  std::unique_ptr<DraftRows> open(const TargetView& target) override;
  int default_depth() const override { return options_.num_draft; }

 private:
  std::shared_ptr<Model> draft_;
  std::string id_;
  DraftModelOptions options_;
};

}  // namespace specdec
