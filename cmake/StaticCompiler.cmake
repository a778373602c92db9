# The compiler linked from MLIR's and LLVM's static archives alone, for a
# kvc-run (and kvc-opt) that plans on a machine without LLVM: the GPU pack
# (scripts/gpu-check.sh). Debian's MLIR archives name the shared libLLVM as
# their dependency ("LLVM"); here that name stands for LLVM's archives
# instead, so nothing links libLLVM.so or libMLIR.so. The linker takes from
# the archives only the objects the tools reach.

set(KVC_MLIR_LIBS
  MLIRAffineToStandard MLIRAnalysis MLIRArithDialect MLIRArithToLLVM
  MLIRBuiltinToLLVMIRTranslation MLIRControlFlowDialect
  MLIRControlFlowInterfaces MLIRControlFlowToLLVM MLIRFuncDialect
  MLIRFuncToLLVM MLIRGPUDialect MLIRGPUToLLVMIRTranslation
  MLIRGPUToNVVMTransforms MLIRGPUTransforms MLIRIR MLIRLLVMDialect
  MLIRLLVMToLLVMIRTranslation MLIRMathDialect MLIRMathToLLVM
  MLIRMemRefDialect MLIRMemRefToLLVM MLIRNVVMDialect MLIRNVVMTarget
  MLIRNVVMToLLVMIRTranslation MLIROptLib MLIRPass
  MLIRReconcileUnrealizedCasts MLIRSCFDialect MLIRSCFToControlFlow
  MLIRSCFToGPU MLIRSideEffectInterfaces MLIRSupport MLIRTransforms
  MLIRVectorDialect MLIRVectorToLLVMPass)

# Every LLVM component archive there is (the NVPTX backend that writes PTX,
# the optimizer the NVVM target runs, and the other targets MLIR's GPU
# libraries name): the linker takes only what is referenced.
set(KVC_LLVM_ARCHIVES "")
foreach(lib ${LLVM_AVAILABLE_LIBS})
  if(lib MATCHES "^LLVM[A-Za-z0-9]+$" AND TARGET ${lib}
     AND NOT lib MATCHES "^LLVM(BOLT|Exegesis|OptDriver|CFIVerify|Diff|Debuginfod|LineEditor)")
    get_target_property(kind ${lib} TYPE)
    if(kind STREQUAL "STATIC_LIBRARY")
      list(APPEND KVC_LLVM_ARCHIVES ${lib})
    endif()
  endif()
endforeach()
list(LENGTH KVC_LLVM_ARCHIVES kvc_count)

# "LLVM" becomes an empty archive that brings LLVM's archives along.
set(kvc_no_dylib ${CMAKE_BINARY_DIR}/lib/libKVCNoLLVMDylib.a)
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/lib)
execute_process(COMMAND ${CMAKE_AR} qc ${kvc_no_dylib})
set_target_properties(LLVM PROPERTIES
  IMPORTED_LOCATION_RELWITHDEBINFO ${kvc_no_dylib}
  IMPORTED_SONAME_RELWITHDEBINFO ""
  IMPORTED_NO_SONAME TRUE
  INTERFACE_LINK_LIBRARIES "${KVC_LLVM_ARCHIVES}")
# Debian names Polly's archives but does not ship them; nothing kvc uses
# needs them.
foreach(missing Polly PollyISL)
  if(TARGET ${missing})
    set_target_properties(${missing} PROPERTIES
      IMPORTED_LOCATION_RELWITHDEBINFO ${kvc_no_dylib}
      INTERFACE_LINK_LIBRARIES "")
  endif()
endforeach()
message(STATUS "kvc: the compiler links MLIR and ${kvc_count} LLVM "
               "archives statically (${kvc_no_dylib} stands for libLLVM)")
