// The shim's exported dlsym: a trampoline over the real one (lookup.cpp decides what it
// answers; shim.hpp has the whole picture).
//
// glibc's dlsym looks at its caller: RTLD_NEXT, and RTLD_DEFAULT from an object loaded with
// RTLD_LOCAL (libcuda looks up its own dependencies' symbols that way), are resolved in the
// scope of the object that called. Forwarding with an ordinary call would make the shim that
// caller, and libcuda crashes on the symbols it then cannot find. So dlsym is a trampoline:
// it asks vramswap_dlsym_decide (with the caller's return address) whether to answer with a
// replacement, and otherwise jumps to the real dlsym with the stack as it found it, so the
// real one sees the original caller. x86-64 only (the CUDA platforms the shim targets).
//
// The decision's first steps are built without the sanitizers' instrumentation: a sanitizer
// runtime preloaded ahead of the shim (AddressSanitizer builds) calls dlsym(RTLD_NEXT, ...)
// while it initializes, before instrumented code can run. Only a driver name (cu...) goes on
// to lookup.cpp, and that happens long after.
#include "shim.hpp"

extern "C" {
__attribute__((visibility("hidden"))) void* vramswap_real_dlsym_ptr = nullptr;
}
extern "C" __attribute__((visibility("hidden"), no_sanitize("address", "undefined"))) void* vramswap_dlsym_decide(
    void* handle, const char* symbol, const void* caller) {
  if (vramswap_real_dlsym_ptr == nullptr) vramswap_real_dlsym_ptr = vramswap::detail::preload::resolve_real_dlsym();
  if (symbol == nullptr || symbol[0] != 'c' || symbol[1] != 'u') return nullptr;
  return vramswap::detail::preload::lookup_for(caller, handle, symbol);
}

#if !defined(__x86_64__)
#error "libvramswap_preload.so: the dlsym trampoline is written for x86-64"
#endif
__asm__(R"(
    .text
    .globl dlsym
    .type dlsym, @function
dlsym:
    push %rdi
    push %rsi
    sub $8, %rsp
    mov 24(%rsp), %rdx
    call vramswap_dlsym_decide
    add $8, %rsp
    pop %rsi
    pop %rdi
    test %rax, %rax
    jnz 1f
    jmp *vramswap_real_dlsym_ptr(%rip)
1:
    ret
    .size dlsym, .-dlsym
)");
