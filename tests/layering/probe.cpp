// One include, named by the probe's target (tests/layering/CMakeLists.txt).
#include VRAMSWAP_PROBE_HEADER
