# sparse_mla_python_package_missing(<what> <pip arguments>): stops the configure, naming the interpreter
# that was asked and the pip command that fixes it. A failed configure would otherwise leave that
# interpreter in the cache: after the user activates another environment and installs the package
# there, the next configure would still ask the cached one and fail the same way. So the interpreter
# FindPython chose is forgotten first (one given with -DPython_EXECUTABLE is the user's and stays).
function(sparse_mla_python_package_missing what pip_args)
  get_cmake_property(cached CACHE_VARIABLES)
  foreach(var IN LISTS cached)
    if(var MATCHES "^_Python_|^FIND_PACKAGE_MESSAGE_DETAILS_Python$")
      unset(${var} CACHE)
    endif()
  endforeach()
  message(FATAL_ERROR
    "sparse-mla-fp8: ${what} not found by ${Python_EXECUTABLE}. Install it there:\n"
    "  \"${Python_EXECUTABLE}\" -m pip install ${pip_args}\n"
    "or activate the environment that has it and configure again (this interpreter is not kept in the "
    "cache; -DPython_EXECUTABLE=... picks one explicitly). Building needs nanobind and the CuTe/CUTLASS "
    "headers of nvidia-cutlass 4.2.0.0 (or -DCUTLASS_DIR=/path/to/cutlass).")
endfunction()
