// Always-on checks of invariants: TH_CHECK(cond) and the comparing forms
// TH_CHECK_EQ/NE/LT/LE/GT/GE(a, b). Unlike assert they are compiled in every
// build (release, sanitizers, fuzzing), because a broken invariant found in
// production is worth a crash report; a failed check prints the file, the
// line, the expression and, for the comparing forms, both values, then
// aborts. Use them for the program's own invariants only: never on bytes from
// the network, a file or a user, which get a Status instead (decoders return
// errors). Each costs one predictable branch when it holds.
#ifndef TENSORHUB_CHECK_H_
#define TENSORHUB_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace tensorhub::check_internal {

// Prints "file:line: check failed: what detail" to stderr and aborts.
[[noreturn]] inline void Fail(const char* file, int line, const char* what,
                              const std::string& detail) {
  std::fprintf(stderr, "%s:%d: check failed: %s %s\n", file, line, what,
               detail.c_str());
  std::fflush(stderr);
  std::abort();
}

template <typename A, typename B>
[[noreturn]] void FailCompare(const char* file, int line, const char* what,
                              const A& a, const B& b) {
  std::ostringstream values;
  values << "(" << a << " vs " << b << ")";
  Fail(file, line, what, values.str());
}

}  // namespace tensorhub::check_internal

#define TH_CHECK(cond)                                                  \
  do {                                                                  \
    if (__builtin_expect(!(cond), 0)) {                                 \
      ::tensorhub::check_internal::Fail(__FILE__, __LINE__, #cond, ""); \
    }                                                                   \
  } while (0)

#define TH_CHECK_OP_(op, a, b)                                              \
  do {                                                                      \
    const auto& th_check_a_ = (a);                                          \
    const auto& th_check_b_ = (b);                                          \
    if (__builtin_expect(!(th_check_a_ op th_check_b_), 0)) {               \
      ::tensorhub::check_internal::FailCompare(                             \
          __FILE__, __LINE__, #a " " #op " " #b, th_check_a_, th_check_b_); \
    }                                                                       \
  } while (0)

#define TH_CHECK_EQ(a, b) TH_CHECK_OP_(==, a, b)
#define TH_CHECK_NE(a, b) TH_CHECK_OP_(!=, a, b)
#define TH_CHECK_LT(a, b) TH_CHECK_OP_(<, a, b)
#define TH_CHECK_LE(a, b) TH_CHECK_OP_(<=, a, b)
#define TH_CHECK_GT(a, b) TH_CHECK_OP_(>, a, b)
#define TH_CHECK_GE(a, b) TH_CHECK_OP_(>=, a, b)

#endif  // TENSORHUB_CHECK_H_
