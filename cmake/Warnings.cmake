# Warnings used for every target of the project. CI turns them into errors.
set(FERRY_WARNINGS -Wall -Wextra -Wshadow -Wstrict-prototypes
    -Wmissing-prototypes -Wpointer-arith -Wformat=2 -Wvla
    -Wno-unused-parameter)
if(FERRY_WERROR)
  list(APPEND FERRY_WARNINGS -Werror)
endif()

# ferry_target_warnings(target): the project's warning set, C sources only.
function(ferry_target_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:C>:${FERRY_WARNINGS}>)
endfunction()
