# cmake -DLIBRARY=<libvramswap.so> -DNM=<nm> -DEXPECTED=<list> -P check_exported_symbols.cmake
# Fails, naming each symbol, when the library's defined dynamic symbols differ from the list.
execute_process(COMMAND ${NM} -D --defined-only -P ${LIBRARY}
                OUTPUT_VARIABLE table RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm -D ${LIBRARY} failed (${rc}): ${err}")
endif()
string(REPLACE "\n" ";" lines "${table}")
set(actual)
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ ]+) ")
    list(APPEND actual "${CMAKE_MATCH_1}")
  endif()
endforeach()
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
                      "See cpp_api/libvramswap.map.")
endif()
message(STATUS "${LIBRARY}: ${count} exported symbols, the public API")
