#include "ferry/version.h"

const char *ferry_version(void) { return FERRY_VERSION_STRING; }
