# Sets CUTLASS_INCLUDE_DIR: from -DCUTLASS_DIR (a checkout or its include folder), else from the
# nvidia-cutlass wheel, located without importing it (its import pulls heavy dependencies).
if(NOT CUTLASS_DIR)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import importlib.util as u; s = u.find_spec('cutlass_library'); print(s.submodule_search_locations[0] + '/source' if s else '')"
    OUTPUT_VARIABLE cutlass_wheel_root OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(cutlass_root "${cutlass_wheel_root}")
else()
  set(cutlass_root "${CUTLASS_DIR}")
endif()

find_path(CUTLASS_INCLUDE_DIR cute/tensor.hpp
  HINTS "${cutlass_root}/include" "${cutlass_root}" NO_DEFAULT_PATH NO_CACHE)
if(NOT CUTLASS_INCLUDE_DIR)
  if(CUTLASS_DIR)
    message(FATAL_ERROR "sparse-mla-fp8: CUTLASS_DIR=${CUTLASS_DIR} holds no cute/tensor.hpp "
                        "(give a CUTLASS checkout or its include folder)")
  endif()
  # (the headers ship in the wheel; --no-deps skips its Python dependencies, which header use needs none of)
  sparse_mla_python_package_missing("the CuTe/CUTLASS headers (the nvidia-cutlass package)"
                                    "--no-deps nvidia-cutlass==4.2.0.0")
endif()
message(STATUS "sparse-mla-fp8: CuTe/CUTLASS headers in ${CUTLASS_INCLUDE_DIR}")
