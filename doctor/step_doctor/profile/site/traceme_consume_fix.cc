// A drop-in fix, loaded before TensorFlow (dlopen RTLD_GLOBAL: consume_fix.py), for a use-after-free in
// tsl::profiler::TraceMeRecorder::Consume(), found in TensorFlow 2.21. TensorFlow 2.17 and openxla/xla today reserve
// the vector before filling it, so it never grows there: tf_binary.py tells such a build from its binary, and this
// library is not loaded into it.
//
// Consume() fills std::vector<ThreadEvents> `result` with one std::deque<Event> per thread, while
// SplitEventTracker keeps raw pointers (end_events_) to end events of cross-thread ActivityStart/ActivityEnd
// pairs whose start has not been seen yet. libstdc++'s std::deque has a move constructor that is not noexcept,
// so ThreadEvents is not nothrow-movable and vector reallocation COPIES the deques and frees the originals:
// the stored pointers dangle, and HandleCrossThreadEvents() -> FindStartAndMerge() writes into freed memory
// (free(): invalid size, corrupted size vs. prev_size, SIGSEGV in FindStartAndMerge).
// Under MultiWorkerMirroredStrategy every step has such pairs: CollectiveExecutor::CompleteParams starts on a
// tf_Compute thread and ends on a collective_ops / GrpcWorkerEnvQueues thread.
//
// The one symbol this library replaces in TensorFlow (its version script, traceme_consume_fix.map, exports
// nothing else, so every other instantiation here stays private to it):
//   std::vector<tsl::profiler::TraceMeRecorder::ThreadEvents>::_M_realloc_insert<ThreadEvents>(iterator,
//   ThreadEvents&&)
// TensorFlow exports its own (weak) copy and calls it through its PLT, so this library's definition, loaded
// first, takes its place. Here ThreadEvents gets a noexcept move constructor (same layout as TensorFlow's), so
// reallocation moves the deques; a deque's move keeps its elements where they are, and the stored pointers stay
// valid. That move also builds an empty deque for the moved-from element with this library's own (private)
// std::_Deque_base<Event>::_M_initialize_map, which TensorFlow's destructor later frees: same type, same layout.
// Before this version script, _M_initialize_map and ~_Deque_base<Event> were exported too and TensorFlow bound
// them here as well (LD_DEBUG=bindings); now only the function above is bound.
//
// tf_binary.py checks, before this is loaded, that TensorFlow's library binds that function through its PLT,
// has no _M_realloc_append for the vector (libstdc++ 14's push_back) and uses the new std::string ABI (with the
// old one ThreadEvents is 96 bytes, not 120). The tests' thread_events.cc reproduces the dangling pointer with the
// same types and shows this library keeping it valid.
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#ifndef TRACEME_CONSUME_FIX_DIGEST
#error "build with -DTRACEME_CONSUME_FIX_DIGEST=\"...\" (consume_fix.py does): the digest of this source"
#endif

namespace tsl {
namespace profiler {
class TraceMeRecorder {
 public:
  struct Event {
    std::string name;
    int64_t start_time;
    int64_t end_time;
  };
  struct ThreadInfo {
    int64_t tid;
    std::string name;
  };
  struct ThreadEvents {
    ThreadInfo thread;
    std::deque<Event> events;
    ThreadEvents(const ThreadEvents&) = default;
    ThreadEvents(ThreadEvents&& other) noexcept : thread(std::move(other.thread)), events(std::move(other.events)) {}
    ThreadEvents& operator=(const ThreadEvents&) = default;
    ThreadEvents& operator=(ThreadEvents&&) = default;
    ~ThreadEvents() = default;
  };
};
}  // namespace profiler
}  // namespace tsl

using ThreadEvents = tsl::profiler::TraceMeRecorder::ThreadEvents;
static_assert(sizeof(ThreadEvents) == 8 + 32 + 80, "ThreadInfo (40 bytes) + std::deque (80 bytes)");

template void std::vector<ThreadEvents>::_M_realloc_insert<ThreadEvents>(std::vector<ThreadEvents>::iterator,
                                                                         ThreadEvents&&);

extern "C" int traceme_consume_fix_loaded() { return 1; }

// consume_fix.py reads this marker from the file before it loads it: a library built from another source is not
// loaded.
extern "C" const char* traceme_consume_fix_digest() { return "TRACEME_CONSUME_FIX_DIGEST=" TRACEME_CONSUME_FIX_DIGEST; }
