# Every dependency is a Debian 12 package found through pkg-config
# (deploy/install-deps.sh installs them). CUDA is optional.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
pkg_check_modules(GRPC REQUIRED IMPORTED_TARGET grpc gpr)
pkg_check_modules(PROTOBUFC REQUIRED IMPORTED_TARGET libprotobuf-c)
pkg_check_modules(LIBUV REQUIRED IMPORTED_TARGET libuv)
pkg_check_modules(TURBOJPEG REQUIRED IMPORTED_TARGET libturbojpeg)
# The libjpeg API of the same libjpeg-turbo, for the decode fused with a
# crop and a DCT scale (jpeg_crop_scanline, jpeg_skip_scanlines).
pkg_check_modules(LIBJPEG REQUIRED IMPORTED_TARGET libjpeg)
pkg_check_modules(ZLIB REQUIRED IMPORTED_TARGET zlib)
# The daemons' metrics endpoint (ferry-metrics-http only).
pkg_check_modules(MICROHTTPD REQUIRED IMPORTED_TARGET libmicrohttpd)
# sd_notify for the daemons' Type=notify systemd units (ferry-notify only).
pkg_check_modules(LIBSYSTEMD REQUIRED IMPORTED_TARGET libsystemd)
set(FERRY_HAVE_UCX OFF)
if(FERRY_WITH_UCX STREQUAL "ON")
  pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)
  set(FERRY_HAVE_UCX ON)
elseif(FERRY_WITH_UCX STREQUAL "AUTO")
  pkg_check_modules(UCX IMPORTED_TARGET ucx)
  if(UCX_FOUND)
    set(FERRY_HAVE_UCX ON)
  endif()
elseif(NOT FERRY_WITH_UCX STREQUAL "OFF" AND FERRY_WITH_UCX)
  # An old cache's BOOL ON (TRUE, YES, 1) means required.
  pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)
  set(FERRY_HAVE_UCX ON)
endif()
if(FERRY_BUILD_TESTS)
  pkg_check_modules(CRITERION REQUIRED IMPORTED_TARGET criterion)
  # What every Criterion test program links: Criterion, and under
  # ThreadSanitizer the rand_r that places BoxFort's arena where TSan
  # lets it map (tests/tsan/criterion_arena.c says why).
  add_library(ferry-criterion INTERFACE)
  add_library(ferry::criterion ALIAS ferry-criterion)
  target_link_libraries(ferry-criterion INTERFACE PkgConfig::CRITERION)
  if(FERRY_SANITIZE MATCHES "thread")
    target_sources(ferry-criterion INTERFACE
      ${PROJECT_SOURCE_DIR}/tests/tsan/criterion_arena.c)
    target_link_libraries(ferry-criterion INTERFACE ${CMAKE_DL_LIBS})
  endif()
endif()
find_program(PROTOC_C NAMES protoc-c REQUIRED)

set(FERRY_HAVE_CUDA OFF)
if(FERRY_WITH_CUDA STREQUAL "ON" OR FERRY_WITH_CUDA STREQUAL "AUTO")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(FERRY_HAVE_CUDA ON)
  elseif(FERRY_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FERRY_WITH_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "Ferry: CUDA ${FERRY_HAVE_CUDA}, UCX ${FERRY_HAVE_UCX} (FERRY_WITH_UCX=${FERRY_WITH_UCX})")
