// The process heap as the system sees it.
#pragma once

namespace specdec {

// Gives the pages that the heap holds free (in every allocator arena) back to the system, so that
// resident memory falls to what is allocated. A long-lived process whose threads' peak
// allocations vary from burst to burst otherwise keeps each arena at its highest peak. Costs a
// walk of the free lists (well under a millisecond for an engine's heap); a no-op where the C
// library has no such call.
void release_free_heap_memory();

}  // namespace specdec
