// The one Catch2 main: it is the heavy header, compiled once.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
