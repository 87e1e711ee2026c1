"""What the names in a TensorFlow host trace mean to the analysis: tf.data stages and op types.

A tf.data iterator event is named after its stage ("Iterator::Root::Prefetch::ParallelMapV2"):
which stages hand their input to other threads (asynchronous), which do no work of their own
(pass-through), which read files, run a user's function or shuffle. An op event is named
"scope/name:Type": what kind of work its type is (Python, decode, augmentation, resize, file
reads). input_wait.py reads these; causes are named with them. A step compiled with XLA
(`jit_compile=True`) runs no TensorFlow op of the model: its events are XLA's own (xla.py).
"""

from __future__ import annotations

import re

ASYNC = {
    "Prefetch",
    "ParallelMap",
    "ParallelMapV2",
    "MapAndBatch",
    "ParallelBatch",
    "ParallelInterleave",
    "ParallelInterleaveV2",
    "ParallelInterleaveV3",
    "ParallelInterleaveV4",
    "LegacyParallelInterleave",
    "ParallelFilter",
    "ParseExample",
    "DataService",
}
PASS_THROUGH = {
    "Root",
    "Prefetch",
    "Options",
    "Model",
    "MaxIntraOpParallelism",
    "PrivateThreadPool",
    "AssertNext",
    "AssertCardinality",
    "Shard",
}
READERS = {"TFRecord", "TextLine", "FixedLengthRecord", "SSTable", "ArrayRecord"}
FUNCTION_STAGES = {
    "Map",
    "ParallelMap",
    "ParallelMapV2",
    "MapAndBatch",
    "FlatMap",
    "Interleave",
    "ParallelInterleave",
    "ParallelInterleaveV2",
    "ParallelInterleaveV3",
    "ParallelInterleaveV4",
    "LegacyParallelInterleave",
    "Filter",
    "ParallelFilter",
    "Scan",
    "GroupByWindow",
    "Generator",
}
SHUFFLES = {"Shuffle", "ShuffleAndRepeat"}
PYTHON_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}
DECODE_OPS = {
    "DecodeJpeg",
    "DecodePng",
    "DecodeImage",
    "DecodeAndCropJpeg",
    "DecodeBmp",
    "DecodeGif",
    "DecodeWebP",
    "DecodeWav",
    "DecodeCSV",
    "DecodeProtoV2",
    "DecodeCompressed",
    "ParseExample",
    "ParseExampleV2",
    "ParseSingleExample",
    "ParseSequenceExampleV2",
    "ParseSingleSequenceExample",
}
AUGMENT_OPS = {
    "AdjustHue",
    "AdjustSaturation",
    "AdjustContrastv2",
    "ReverseV2",
    "ImageProjectiveTransformV2",
    "ImageProjectiveTransformV3",
    "SampleDistortedBoundingBox",
    "SampleDistortedBoundingBoxV2",
    "Multinomial",
}
RESIZE_OPS = {
    "ResizeBilinear",
    "ResizeBicubic",
    "ResizeNearestNeighbor",
    "ResizeArea",
    "ScaleAndTranslate",
    "CropAndResize",
}


def kind_of(name: str) -> str:
    """'Iterator::ParallelMapV2' -> 'ParallelMapV2'."""
    return name.removeprefix("Iterator::").split("[")[0]


def is_pass_through(kind: str) -> bool:
    return kind in PASS_THROUGH or kind.endswith(("Repeat", "Take", "Skip"))


def op_category(op_type: str) -> str:
    if op_type in PYTHON_OPS:
        return "python"
    if op_type in DECODE_OPS:
        return "decode"
    if op_type == "ReadFile":
        return "file read"
    if op_type in AUGMENT_OPS or "Random" in op_type or op_type.startswith("Stateless"):
        return "augmentation"
    if op_type in RESIZE_OPS:
        return "resize"
    return "other"


# XLA running a compiled program on the host: the model's compute when the step is compiled. Its HLO ops nest inside
# it (events named after the HLO instruction, with hlo_op, hlo_module and program_id stats), and the executable is
# launched from a TensorFlow kernel (kernel_type StatefulPartitionedCall). CPU name measured with TensorFlow 2.21
# (docs/xla.md); on a GPU, XLA's executable wraps its thunks in a TraceMe "<module>:XLA GPU module" (gpu_executable.cc)
# and the kernels it launches are on the device planes, counted with every other kernel.
XLA_RUNS = re.compile(r"^((Cpu|Gpu)Executable::Execute\w*|.+:XLA GPU module)$")
# XLA compiling a program: these events, nested in one another and run partly on XLA's own codegen threads (their
# union is the compile). CPU names measured with TensorFlow 2.21, the GPU ones read from XLA's sources
# (gpu_compiler.cc). The lowering from TensorFlow to HLO that comes first has no event of its own (xla.py).
XLA_COMPILES = re.compile(
    r"^((Cpu|Gpu|NVPTX|AMDGPU)Compiler::\w+|JitCompiler::Compile|FusionCompiler::Compile|CompileSingleModule"
    r"|HLO passes (through|after) layout assignment)$"
)
# One of these per compile of a program (its start): the count of compiles.
XLA_COMPILE_ONCE = {"CpuCompiler::RunBackend", "GpuCompiler::OptimizeHloModule"}
# /host:metadata holds one event name per XLA executable alive in the process: "<hlo module>(<program id>)".
XLA_EXECUTABLE = re.compile(r"^(.+)\((\d+)\)$")
