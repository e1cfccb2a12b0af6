// The C++ unit tests of the core: one file per component, run by ctest (see
// docs/development.md). The black-box suites in tests/*.py test the same behaviour
// through every front.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
