// A drop-in fix, loaded before TensorFlow (dlopen RTLD_GLOBAL: consume_fix.py), for a use-after-free in
// tsl::profiler::TraceMeRecorder::Consume() (found in TensorFlow 2.21; the same code is in openxla/xla today).
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
// TensorFlow calls the (weak, exported) instantiation
//   std::vector<tsl::profiler::TraceMeRecorder::ThreadEvents>::_M_realloc_insert<ThreadEvents>(iterator, ThreadEvents&&)
// through its PLT, so this library's definition takes its place. Here ThreadEvents gets a noexcept move
// constructor (same layout as TensorFlow's), so reallocation moves the deques; a deque's move keeps its
// elements where they are, and the stored pointers stay valid.
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

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
