# cmake -DLIBRARY=<libvramswap.so> -DNM=<nm> -DEXPECTED=<list> -DFACE_NODE=<node> -P check_exported_symbols.cmake
# Fails, naming each symbol, when the library's defined dynamic symbols differ from the list.
# The runtime's face (node FACE_NODE, runtime/runtime.hpp) is checked by its form instead:
# it changes with the runtime, and is no ABI; each of its symbols must be in
# vramswap::detail::rt, and no symbol of that namespace may be in the public node.
execute_process(COMMAND ${NM} -D --defined-only -P ${LIBRARY}
                OUTPUT_VARIABLE table RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm -D ${LIBRARY} failed (${rc}): ${err}")
endif()
string(REPLACE "\n" ";" lines "${table}")
set(actual)
set(face_count 0)
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ ]+) ")
    set(symbol "${CMAKE_MATCH_1}")
    if(symbol STREQUAL FACE_NODE)
      continue()  # the node's own definition
    elseif(symbol MATCHES "@@${FACE_NODE}$")
      if(NOT symbol MATCHES "^_Z(N|TIN|TSN|TVN)8vramswap6detail2rt")
        message(FATAL_ERROR "${LIBRARY}: ${symbol} is in the runtime's face (${FACE_NODE}) but not in vramswap::detail::rt: an internal symbol leaking")
      endif()
      math(EXPR face_count "${face_count} + 1")
      continue()
    elseif(symbol MATCHES "^_Z(N|TIN|TSN|TVN)8vramswap6detail2rt")
      message(FATAL_ERROR "${LIBRARY}: ${symbol}, of the runtime's face, is not in its node ${FACE_NODE} (cpp_api/libvramswap.map.in: the face's node must come last)")
    endif()
    list(APPEND actual "${symbol}")
  endif()
endforeach()
if(face_count LESS 10)
  message(FATAL_ERROR "${LIBRARY}: the runtime's face (${FACE_NODE}) exports ${face_count} symbols; the front ends need it all (runtime/runtime.hpp)")
endif()
list(SORT actual)
file(STRINGS ${EXPECTED} expected REGEX "^[^#]")
list(SORT expected)
set(extra ${actual})
list(REMOVE_ITEM extra ${expected})
set(missing ${expected})
list(REMOVE_ITEM missing ${actual})
list(LENGTH actual count)
if(extra OR missing)
  string(REPLACE ";" "\n  " extra_text "${extra}")
  string(REPLACE ";" "\n  " missing_text "${missing}")
  message(FATAL_ERROR "${LIBRARY} exports ${count} symbols, not the public API of ${EXPECTED}.\n"
                      "Exported but not listed (internal symbols leaking, or a new public symbol to list):\n  ${extra_text}\n"
                      "Listed but not exported (a public symbol lost):\n  ${missing_text}\n"
                      "See cpp_api/libvramswap.map.in.")
endif()
message(STATUS "${LIBRARY}: ${count} exported symbols, the public API; ${face_count} more in the runtime's face (${FACE_NODE})")
