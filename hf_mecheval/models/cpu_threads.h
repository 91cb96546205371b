// Rows split between threads, for the compiled CPU kernels (selective_scan_cpu.cpp,
// short_conv_cpu.cpp, ssd_cpu.cpp, ssm_taps_cpu.cpp): each row is computed by one thread alone, so
// the results do not depend on how many threads there are.
#pragma once
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace cpu_threads {

// fn(r0, r1) over rows [0, rows) in `threads` parts (the calling thread takes the first; where
// no thread can be started, it takes the rest too).
template <typename F>
void split_rows(int64_t rows, int64_t threads, F fn) {
    const int64_t parts = std::max<int64_t>(1, std::min(threads, rows));
    std::vector<std::thread> others;
    int64_t mine = rows / parts;                  // rows [0, mine) run in this thread
    for (int64_t i = parts - 1; i >= 1; --i) {
        try {
            others.emplace_back(fn, rows * i / parts, rows * (i + 1) / parts);
        } catch (...) {                           // no thread to be had: this one takes the rest
            mine = rows * (i + 1) / parts;
            break;
        }
    }
    fn(0, mine);
    for (auto& thread : others) thread.join();
}

}  // namespace cpu_threads
