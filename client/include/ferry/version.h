/* Ferry's version, at compile time and at run time. */
#ifndef FERRY_VERSION_H
#define FERRY_VERSION_H

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 1
#define FERRY_VERSION_PATCH 0
#define FERRY_VERSION_STRING "0.1.0"

/* The version of the libferry actually loaded, e.g. "0.1.0". */
const char *ferry_version(void);

#endif /* FERRY_VERSION_H */
