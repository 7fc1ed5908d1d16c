#include "clocale.h"

#include <pthread.h>

/* glibc hands back a static object for "C", created once. */
static locale_t c_loc;
static pthread_once_t c_loc_once = PTHREAD_ONCE_INIT;

static void c_loc_init(void) {
  c_loc = newlocale(LC_ALL_MASK, "C", (locale_t)0);
}

locale_t ferry__c_locale_enter(void) {
  pthread_once(&c_loc_once, c_loc_init);
  return c_loc != (locale_t)0 ? uselocale(c_loc) : (locale_t)0;
}

void ferry__c_locale_leave(locale_t old) {
  if (old != (locale_t)0)
    uselocale(old);
}
