# Warnings and sanitizers live on an INTERFACE target that each target links
# PRIVATE, so they never leak into consumers or into global flags.
add_library(sagapool_options INTERFACE)
add_library(sagapool::options ALIAS sagapool_options)
target_compile_features(sagapool_options INTERFACE cxx_std_20)
target_compile_options(sagapool_options INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
  -Wcast-align -Wunused -Woverloaded-virtual -Wconversion -Wsign-conversion
  -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough)

set(SAGA_SANITIZE "" CACHE STRING "Sanitizers to enable: address,undefined | thread")
if(SAGA_SANITIZE)
  target_compile_options(sagapool_options INTERFACE -fsanitize=${SAGA_SANITIZE} -fno-omit-frame-pointer)
  target_link_options(sagapool_options INTERFACE -fsanitize=${SAGA_SANITIZE})
endif()
