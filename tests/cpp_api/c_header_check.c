/* vramswap/vramswap.h must compile as plain C (C99, -pedantic): FFI generators and the
 * preload shim read it as C. Compiled, not run. */
#include "vramswap/vramswap.h"

int vramswap_c_header_check(void);
int vramswap_c_header_check(void) {
  vramswap_stats_t s;
  s.size = sizeof s;
  void* p = NULL;
  int rc = vramswap_malloc(&p, 256, 0);
  if (rc != VRAMSWAP_OK) return rc;
  rc = vramswap_lock(0, VRAMSWAP_PRIORITY_NORMAL, -1);
  if (rc == VRAMSWAP_OK) rc = vramswap_stats(0, &s);
  if (rc == VRAMSWAP_OK) rc = vramswap_unlock(0);
  (void)vramswap_last_error();
  (void)vramswap_status_name(rc);
  return vramswap_free(p, 0);
}
