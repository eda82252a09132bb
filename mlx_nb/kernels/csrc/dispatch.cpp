// Chooses the kernel table once per process from what the CPU (and OS) support.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "isa.h"

namespace mlxnb {
namespace {

bool supported(const Isa& t) {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (&t == &kAvx512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
  if (&t == &kAvx2)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
  return true;  // the portable table runs everywhere
}

const Isa* const kAll[] = {
#if defined(__x86_64__) || defined(_M_X64)
    &kAvx512, &kAvx2,
#endif
    &kPortable,
};

const Isa& choose() {
  const char* want = std::getenv("MLX_NB_ISA");
  for (const Isa* t : kAll)
    if (supported(*t) && (!want || !*want || std::strcmp(want, t->name) == 0)) return *t;
  return kPortable;  // an unknown or unsupported MLX_NB_ISA falls back to the portable code
}

std::atomic<const Isa*> current{nullptr};

}  // namespace

const Isa& isa() {
  const Isa* t = current.load(std::memory_order_acquire);
  if (!t) {
    t = &choose();
    current.store(t, std::memory_order_release);
  }
  return *t;
}

bool set_isa(const char* name) {
  for (const Isa* t : kAll)
    if (supported(*t) && std::strcmp(name, t->name) == 0) {
      current.store(t, std::memory_order_release);
      return true;
    }
  return false;
}

const char* isa_list() {
  static const std::string names = [] {
    std::string s;
    for (const Isa* t : kAll)
      if (supported(*t)) s += (s.empty() ? "" : ",") + std::string(t->name);
    return s;
  }();
  return names.c_str();
}

}  // namespace mlxnb
