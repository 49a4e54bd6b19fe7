# vramswap_component(<folder> [USES <folder>...] [LINK <library>...] SOURCES <file>...)
#
# One layer of the library: an OBJECT library vramswap_<folder> of SOURCES, and an INTERFACE
# target vramswap_<folder>_interface that says how to build against it. The interface gives
# an include root holding only <folder> (a link <binary dir>/include_roots/<folder>/<folder>
# to the source folder), so `#include "<folder>/x.hpp"` resolves only in targets that use the
# layer: a layer that includes one it does not declare in USES fails to build. USES lists the
# layers below this one (transitively visible to users of this one); LINK, the outside
# libraries its objects need (given to every final binary that holds them).
function(vramswap_component folder)
  cmake_parse_arguments(arg "" "" "USES;LINK;SOURCES" ${ARGN})
  set(root ${PROJECT_BINARY_DIR}/include_roots/${folder})
  file(MAKE_DIRECTORY ${root})
  file(CREATE_LINK ${CMAKE_CURRENT_SOURCE_DIR} ${root}/${folder} SYMBOLIC)

  add_library(vramswap_${folder}_interface INTERFACE)
  target_include_directories(vramswap_${folder}_interface INTERFACE ${root})
  foreach(used IN LISTS arg_USES)
    if(NOT TARGET vramswap_${used}_interface)
      message(FATAL_ERROR "vramswap: layer ${folder} uses ${used}, which is not defined yet (define the layers bottom up)")
    endif()
    target_link_libraries(vramswap_${folder}_interface INTERFACE vramswap_${used}_interface)
  endforeach()
  target_link_libraries(vramswap_${folder}_interface INTERFACE ${arg_LINK})

  add_library(vramswap_${folder} OBJECT ${arg_SOURCES})
  target_link_libraries(vramswap_${folder} PRIVATE vramswap_${folder}_interface vramswap_warnings)
  # Only the public API (VRAMSWAP_API, VRAMSWAP_C_API) is visible outside libvramswap.so.
  set_target_properties(vramswap_${folder} PROPERTIES CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
endfunction()
