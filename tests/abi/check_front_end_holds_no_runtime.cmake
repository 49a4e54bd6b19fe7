# cmake -DFRONT_END=<module or shim> -DNAMESPACE=<its own namespace> -DNM=<nm> -P check_front_end_holds_no_runtime.cmake
# A front end (the Python module, the preload shim) links libvramswap.so and holds none of
# the runtime itself: none of its defined symbols, local ones included (nm reads the full
# symbol table), is an entity of vramswap::detail outside its own namespace
# (vramswap::detail::<NAMESPACE>); templates of the standard library or pybind11 instantiated
# over the face's types are its own code, and so are the face's header constants (read-only
# data). It calls the runtime's face (vramswap::detail::rt) as undefined symbols, bound to
# libvramswap.so's version node VRAMSWAP_RUNTIME_<version>.
execute_process(COMMAND ${NM} -C --defined-only ${FRONT_END} OUTPUT_VARIABLE defined RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm ${FRONT_END} failed (${rc}): ${err}")
endif()
string(REPLACE ";" "\\;" defined "${defined}")
string(REPLACE "\n" ";" lines "${defined}")
set(held)
set(own_count 0)
foreach(line IN LISTS lines)
  if(NOT line MATCHES "^[0-9a-f]* ([A-Za-z]) (.*)$")
    continue()
  endif()
  set(type "${CMAKE_MATCH_1}")
  string(REGEX REPLACE "^(guard variable for |typeinfo for |typeinfo name for |vtable for |VTT for )" "" entity "${CMAKE_MATCH_2}")
  if(entity MATCHES "^vramswap::detail::${NAMESPACE}::")
    math(EXPR own_count "${own_count} + 1")
  elseif(entity MATCHES "^vramswap::detail::rt::" AND type MATCHES "^[rR]$")
    continue()  # a constant of runtime.hpp
  elseif(entity MATCHES "^vramswap::detail::[^ (]*[*&]* (std|__gnu_cxx|pybind11)::")
    continue()  # a function template of theirs whose return type is the face's (std::__addressof<rt::queue_entry>)
  elseif(entity MATCHES "^vramswap::detail::")
    list(APPEND held "${type} ${entity}")
  endif()
endforeach()
if(held)
  list(LENGTH held n)
  string(REPLACE ";" "\n  " text "${held}")
  message(FATAL_ERROR "${FRONT_END} defines ${n} symbols of vramswap's layers: it carries part of the runtime, which must live in "
                      "libvramswap.so alone (link it, include only runtime/runtime.hpp):\n  ${text}")
endif()
if(own_count EQUAL 0)
  message(FATAL_ERROR "${FRONT_END} defines nothing in vramswap::detail::${NAMESPACE}: the check looks at the wrong file "
                      "or namespace (a stripped binary?)")
endif()
execute_process(COMMAND ${NM} -D --undefined-only ${FRONT_END} OUTPUT_VARIABLE undefined RESULT_VARIABLE rc)
string(REGEX MATCHALL "_ZN8vramswap6detail2rt[^ @\n]*@VRAMSWAP_RUNTIME_[0-9.]+" face_calls "${undefined}")
list(LENGTH face_calls calls)
if(calls EQUAL 0)
  message(FATAL_ERROR "${FRONT_END} calls nothing of the runtime's face from libvramswap.so (no undefined vramswap::detail::rt "
                      "symbol versioned VRAMSWAP_RUNTIME_*)")
endif()
message(STATUS "${FRONT_END}: ${own_count} symbols of its own (vramswap::detail::${NAMESPACE}), none of the layers'; "
               "${calls} calls into the runtime's face of libvramswap.so")
