// vramswap version, for code that needs to check what it was built against.
#pragma once

#define VRAMSWAP_VERSION_MAJOR 0
#define VRAMSWAP_VERSION_MINOR 1
#define VRAMSWAP_VERSION_PATCH 0
