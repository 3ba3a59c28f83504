// Weight: the checks and descriptions that need more than the header's one-liners.
#include "core/weight.h"

#include "core/error.h"

namespace specdec {

const Tensor& Weight::dense(const char* op) const {
  SPECDEC_CHECK(!quantized(), op, ": weight ", shape_string(), " is block-quantized (", dtype_name(dtype),
                " codes, groups of ", group_size, "); this backend reads only dense f32, bf16 or f16 weights");
  return data;
}

std::string Weight::shape_string() const {
  if (!quantized()) return data.shape_string();
  return str_cat("[", rows(), ", ", cols(), "] in groups of ", group_size);
}

}  // namespace specdec
