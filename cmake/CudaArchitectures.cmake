# Refuses, before anything is compiled, a CMAKE_CUDA_ARCHITECTURES the kernels cannot run on. They use
# Hopper's arch-specific instructions (wgmma, setmaxnreg, TMA), which exist only in the sm_90a target:
# 89 and 90 end in ptxas errors, and 100a compiles CuTe's trap in place of every wgmma, so a manifest
# listing it would promise kernels that abort. "-virtual" entries would ship PTX only, which the
# capability table cannot vouch for. Included before project(), so no compiler is needed to refuse.
set(SPARSE_MLA_SUPPORTED_CUDA_ARCHITECTURES "90a;90a-real")

if(NOT CMAKE_CUDA_ARCHITECTURES)
  message(FATAL_ERROR "sparse-mla-fp8: CMAKE_CUDA_ARCHITECTURES is empty; the kernels are built for 90a "
                      "(H100, H200): use -DCMAKE_CUDA_ARCHITECTURES=90a (or 90a-real)")
endif()
foreach(arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
  if(arch STREQUAL "90a-virtual")
    message(FATAL_ERROR "sparse-mla-fp8 builds SASS only (the capability table lists what runs as compiled): "
                        "use -DCMAKE_CUDA_ARCHITECTURES=90a or 90a-real, not 90a-virtual")
  endif()
  if(NOT arch IN_LIST SPARSE_MLA_SUPPORTED_CUDA_ARCHITECTURES)
    message(FATAL_ERROR
      "sparse-mla-fp8: CMAKE_CUDA_ARCHITECTURES=\"${CMAKE_CUDA_ARCHITECTURES}\" names ${arch}, which the "
      "kernels cannot run on: they use sm_90a's arch-specific instructions (wgmma, setmaxnreg) and are "
      "supported only as 90a or 90a-real (H100, H200). Use -DCMAKE_CUDA_ARCHITECTURES=90a, or "
      "-DSPARSE_MLA_CUDA=OFF for the CPU path alone.")
  endif()
endforeach()
