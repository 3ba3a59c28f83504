// The n-gram (prompt lookup) draft method bound to the seam: each row keeps an index of its own
// token history and proposes what followed the longest earlier match of its suffix.
#pragma once

#include "speculative/draft.h"

namespace specdec {

struct NgramOptions {
  int max_ngram = 3;
  int min_ngram = 1;
  int num_draft = 10;
};

class NgramMethod : public DraftMethod {
 public:
  explicit NgramMethod(NgramOptions options = {});
  std::string name() const override { return "ngram"; }
  std::string checkpoint_namespace() const override;
  std::unique_ptr<DraftRows> open(const TargetView& target) override;
  int default_depth() const override { return options_.num_draft; }

 private:
  NgramOptions options_;
};

}  // namespace specdec
