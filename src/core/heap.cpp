#include "core/heap.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace specdec {

void release_free_heap_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace specdec
