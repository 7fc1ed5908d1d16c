/* Number text that does not depend on the process locale. A trainer may
 * set LC_NUMERIC to a locale with a decimal comma, which would change what
 * strtod reads and what %g writes; spec parsers and formatters switch the
 * calling thread to the "C" locale around such conversions. */
#ifndef FERRY_CLOCALE_H
#define FERRY_CLOCALE_H

#include <locale.h>

/* Switches the calling thread to the "C" locale and returns the previous
 * one (or (locale_t)0 when the switch failed: conversions then use the
 * current locale). Thread-safe. */
locale_t ferry__c_locale_enter(void);

/* Restores what ferry__c_locale_enter returned. */
void ferry__c_locale_leave(locale_t old);

#endif /* FERRY_CLOCALE_H */
