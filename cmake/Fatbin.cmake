# sparse_mla_add_fatbin(<d_qk> <out-file-var> <out-kernel-var>): compiles the kernel template for one
# head dim into a standalone fatbin, SASS for every arch in CMAKE_CUDA_ARCHITECTURES.

# "90a", "90a-real" -> SASS for sm_90a; "-virtual" entries would be PTX, which a fatbin loader can JIT,
# but the capability table lists only what runs as compiled, so they are refused.
set(SPARSE_MLA_SASS_ARCHS "")
set(sparse_mla_gencode "")
foreach(arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
  if(arch MATCHES "-virtual$")
    message(FATAL_ERROR "sparse-mla-fp8 builds SASS only; drop '-virtual' from '${arch}'")
  endif()
  string(REGEX REPLACE "-real$" "" arch "${arch}")
  list(APPEND SPARSE_MLA_SASS_ARCHS ${arch})
  list(APPEND sparse_mla_gencode "-gencode=arch=compute_${arch},code=sm_${arch}")
endforeach()

file(GLOB sparse_mla_kernel_headers CONFIGURE_DEPENDS
     ${PROJECT_SOURCE_DIR}/kernels/*.h ${PROJECT_SOURCE_DIR}/kernels/sm90/*.cuh ${PROJECT_SOURCE_DIR}/kernels/sm90/*.h
     ${PROJECT_SOURCE_DIR}/kernels/sm90/wide/*.cuh ${PROJECT_SOURCE_DIR}/kernels/sm90/wide/*.h
     ${PROJECT_SOURCE_DIR}/kernels/sm90/split/*.cuh ${PROJECT_SOURCE_DIR}/kernels/sm90/split/*.h
     ${PROJECT_SOURCE_DIR}/kernels/sm90/dual/*.cuh ${PROJECT_SOURCE_DIR}/kernels/sm90/dual/*.h)

function(sparse_mla_add_fatbin d_qk out_file out_kernel)
  # The 64-head kernel keeps three e4m3 kv tiles and Q in 64-column swizzle atoms, plus an fp16 V
  # tile, in shared memory: d_qk must hold d_v (512) in whole atoms, and 576 fits where 640 would not.
  # The fatbin holds it and the wide, split and dual kernels (prefill_instance.cu.in).
  if(NOT d_qk MATCHES "^(512|576)$")
    message(FATAL_ERROR "SPARSE_MLA_HEAD_DIMS: the SM90 kernels are built for d_qk 512 and 576, not ${d_qk}")
  endif()
  set(D_QK ${d_qk})
  set(kernel "sparse_mla_fp8_prefill_d${d_qk}")
  set(src ${CMAKE_CURRENT_BINARY_DIR}/prefill_d${d_qk}.cu)
  configure_file(${PROJECT_SOURCE_DIR}/kernels/sm90/prefill_instance.cu.in ${src} @ONLY)
  set(fatbin sparse_mla_fp8_d${d_qk}.fatbin)
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
  set(${out_kernel} ${kernel} PARENT_SCOPE)
endfunction()
