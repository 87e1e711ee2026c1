// TensorFlow's TraceMeRecorder types as TensorFlow 2.21 lays them out (no noexcept move: libstdc++'s deque move
// may throw), in a shared library built as TensorFlow's is (-fPIC: the vector's growth is a weak symbol called
// through the PLT). pointer_survives_growth() does what Consume() does: it keeps a pointer into the first thread's
// deque while the vector of threads grows. Without the shim the vector copies that deque and frees the original
// (the pointer dangles: 0); with the shim loaded first it moves it (the pointer stays valid: 1).
// tf_binary.py reads this library as it reads TensorFlow's; the macros make the builds it must refuse.
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
  };
  static std::vector<ThreadEvents> Consume();
};

std::vector<TraceMeRecorder::ThreadEvents> TraceMeRecorder::Consume() {
  std::vector<ThreadEvents> result;
#ifdef WITH_RESERVE  // the upstream fix
  result.reserve(64);
#endif
  for (int64_t tid = 0; tid < 64; ++tid) {
    std::deque<Event> events;
    events.push_back(Event{"activity " + std::to_string(tid), tid, tid + 1});
    result.push_back(ThreadEvents{ThreadInfo{tid, "thread " + std::to_string(tid)}, std::move(events)});
  }
  return result;
}
}  // namespace profiler
}  // namespace tsl

using tsl::profiler::TraceMeRecorder;

#ifdef WITH_APPEND  // what libstdc++ 14 calls instead of _M_realloc_insert
extern "C" void realloc_append() __asm__(
    "_ZNSt6vectorIN3tsl8profiler15TraceMeRecorder12ThreadEventsESaIS3_EE17_M_realloc_appendIJS3_EEEvDpOT_");
extern "C" void realloc_append() {}
#endif

extern "C" int pointer_survives_growth() {
  std::vector<TraceMeRecorder::ThreadEvents> result;
  std::deque<TraceMeRecorder::Event> first;
  first.push_back(TraceMeRecorder::Event{"an activity whose end another thread records", 1, 2});
  result.push_back(TraceMeRecorder::ThreadEvents{TraceMeRecorder::ThreadInfo{1, "tf_Compute"}, std::move(first)});
  const TraceMeRecorder::Event* kept = &result.front().events.front();  // as SplitEventTracker keeps it
  const size_t capacity = result.capacity();
  while (result.capacity() == capacity) {
    std::deque<TraceMeRecorder::Event> events(1, TraceMeRecorder::Event{"another", 3, 4});
    result.push_back(TraceMeRecorder::ThreadEvents{TraceMeRecorder::ThreadInfo{2, "collective_ops"},
                                                   std::move(events)});
  }
  return &result.front().events.front() == kept;
}
