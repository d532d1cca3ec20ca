// Must not compile: tools/ may use only the internal headers that
// tools/CMakeLists.txt names, and the fetcher is not one of them. The ctest
// tools_include_boundary builds this and expects the include to fail.
#include "client/fetch/fetcher.h"

int main() { return 0; }
