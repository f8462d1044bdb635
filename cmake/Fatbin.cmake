# sparse_mla_add_fatbin(<d_qk> <out-file-var>): compiles every kernel of the registry
# (kernels/registry.h) for one head dim into a standalone fatbin, SASS for sm_90a.

# "90a", "90a-real" -> SASS for sm_90a (cmake/CudaArchitectures.cmake refused every other entry).
set(SPARSE_MLA_SASS_ARCHS "")
set(sparse_mla_gencode "")
foreach(arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
  string(REGEX REPLACE "-real$" "" arch "${arch}")
  list(APPEND SPARSE_MLA_SASS_ARCHS ${arch})
  list(APPEND sparse_mla_gencode "-gencode=arch=compute_${arch},code=sm_${arch}")
endforeach()

# The fatbin of a head dim is ${SPARSE_MLA_FATBIN_PREFIX}<d_qk>.fatbin; the native module loads it by
# that name (CMakeLists.txt passes the prefix to it).
set(SPARSE_MLA_FATBIN_PREFIX "sparse_mla_fp8_d")

# Every kernel header, in any folder under kernels/, is a dependency of every fatbin; each kernel's
# device code (sm90/<name>/prefill_kernel.cuh) is included by the generated source.
file(GLOB_RECURSE sparse_mla_kernel_headers CONFIGURE_DEPENDS
     ${PROJECT_SOURCE_DIR}/kernels/*.h ${PROJECT_SOURCE_DIR}/kernels/*.cuh)
file(GLOB sparse_mla_kernel_sources CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/kernels
     ${PROJECT_SOURCE_DIR}/kernels/sm90/*/prefill_kernel.cuh)
list(SORT sparse_mla_kernel_sources)
list(TRANSFORM sparse_mla_kernel_sources REPLACE "(.+)" "#include \"\\1\"")
list(JOIN sparse_mla_kernel_sources "\n" SPARSE_MLA_KERNEL_INCLUDES)

function(sparse_mla_add_fatbin d_qk out_file)
  # The 64-head kernel keeps three e4m3 kv tiles and Q in 64-column swizzle atoms, plus an fp16 V
  # tile, in shared memory: d_qk must hold d_v (512) in whole atoms, and 576 fits where 640 would not.
  if(NOT d_qk MATCHES "^(512|576)$")
    message(FATAL_ERROR "SPARSE_MLA_HEAD_DIMS: the SM90 kernels are built for d_qk 512 and 576, not ${d_qk}")
  endif()
  set(D_QK ${d_qk})
  set(src ${CMAKE_CURRENT_BINARY_DIR}/prefill_d${d_qk}.cu)
  configure_file(${PROJECT_SOURCE_DIR}/kernels/sm90/prefill_instance.cu.in ${src} @ONLY)
  set(fatbin ${SPARSE_MLA_FATBIN_PREFIX}${d_qk}.fatbin)
  add_custom_command(
    OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/${fatbin}
    COMMAND ${CMAKE_CUDA_COMPILER} -fatbin ${sparse_mla_gencode}
            -std=c++17 -O3 -lineinfo --use_fast_math --expt-relaxed-constexpr
            -Xptxas=-v
            -I${PROJECT_SOURCE_DIR}/kernels -I${CUTLASS_INCLUDE_DIR}
            -o ${CMAKE_CURRENT_BINARY_DIR}/${fatbin} ${src}
    DEPENDS ${src} ${sparse_mla_kernel_headers}
    COMMENT "sparse-mla-fp8: fatbin for d_qk=${d_qk} (sm_${SPARSE_MLA_SASS_ARCHS})"
    VERBATIM)
  add_custom_target(fatbin_d${d_qk} ALL DEPENDS ${CMAKE_CURRENT_BINARY_DIR}/${fatbin})
  set(${out_file} ${fatbin} PARENT_SCOPE)
endfunction()
